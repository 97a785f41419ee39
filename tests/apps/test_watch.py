"""Tests of ``sampling-course watch`` (``sampling_course.apps.watch``).

The watch is pointed at a copy of ``solutions/transformer.py`` in a temporary folder, so that a
test can save it without touching the checkout; the end-to-end test checks the real
``solutions`` package through the real ``check``, so its panel is the one ``check`` prints.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rich.console import Console

from sampling_course.apps import watch as watch_module
from sampling_course.apps.watch import Watcher, changed_names, definitions, watch, watch_main
from sampling_course.grading.course import EXERCISES

REPO = Path(__file__).resolve().parents[2]
TRANSFORMER = (REPO / "solutions" / "transformer.py").read_text(encoding="utf-8")
PART1 = [e.name for e in EXERCISES if e.module == "transformer"]


def _save(path: Path, text: str) -> None:
    """Write ``text`` and move the modification time on, as a save does (even within one clock tick)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(before + 10**9, before + 10**9))


def _edit_layernorm(source: str, mark: str = "an edit") -> str:
    """The source with a comment inside ``LayerNorm.forward`` changed."""
    line = "# Hint: use the biased variance (unbiased=False), and put eps inside the square root."
    assert source.count(line) == 1
    return source.replace(line, f"{line} ({mark})")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "transformer.py").write_text(TRANSFORMER, encoding="utf-8")
    return tmp_path


def test_definitions_separate_methods_from_their_class():
    source = "import x\n\nclass A:\n    k = 1\n\n    def f(self):\n        return 1\n\ndef g():\n    return 2\n"
    found = definitions(source)
    assert set(found) == {"", "A", "A.f", "g"}
    assert "return 1" in found["A.f"] and "return 1" not in found["A"] and "k = 1" in found["A"]
    assert "import x" in found[""] and "def g" not in found[""]


def test_changed_names_are_the_edited_definitions_only():
    before = "class A:\n    def f(self):\n        return 1\n\n    def h(self):\n        return 3\n\ndef g():\n    return 2\n"
    assert changed_names(before, before.replace("return 1", "return 10")) == {"A.f"}
    assert changed_names(before, before.replace("return 2", "return 20")) == {"g"}
    assert changed_names(before, "X = 1\n" + before) == {""}
    assert changed_names(before, before) == set()
    assert changed_names(None, before) is None  # no earlier version: cannot tell
    assert changed_names("def broken(:\n", before) is None


def test_a_saved_file_names_its_changed_exercise(folder: Path):
    watcher = Watcher(folder, EXERCISES)
    assert watcher.saved() == []
    _save(folder / "transformer.py", _edit_layernorm(TRANSFORMER))
    saved = watcher.saved()
    assert saved == ["transformer.py"]
    assert [e.name for e in watcher.to_check(saved)] == ["LayerNorm"]
    # Saved again unchanged: nothing to check.
    _save(folder / "transformer.py", _edit_layernorm(TRANSFORMER))
    assert watcher.to_check(watcher.saved()) == []


def test_a_change_outside_every_exercise_checks_the_whole_file(folder: Path):
    watcher = Watcher(folder, EXERCISES)
    _save(folder / "transformer.py", "HELPER_CONSTANT = 3\n" + TRANSFORMER)
    assert [e.name for e in watcher.to_check(watcher.saved())] == PART1
    assert len(PART1) > 1


def test_only_the_named_exercises_are_checked(folder: Path):
    watcher = Watcher(folder, EXERCISES, only=frozenset({"Embed"}))
    _save(folder / "transformer.py", "HELPER_CONSTANT = 3\n" + TRANSFORMER)
    assert [e.name for e in watcher.to_check(watcher.saved())] == ["Embed"]


def test_dependents_follow_the_files_a_check_imported(folder: Path):
    (folder / "sampling.py").write_text("def greedy_search(logits):\n    return 0\n", encoding="utf-8")
    watcher = Watcher(folder, EXERCISES, dependents=True)
    _save(folder / "transformer.py", _edit_layernorm(TRANSFORMER))
    # Nothing learnt yet, and sampling.py does not import transformer.py: only LayerNorm.
    assert "greedy_search" not in [e.name for e in watcher.to_check(watcher.saved())]

    class Report:
        imported = {"greedy_search": frozenset({"sampling.py", "transformer.py"})}

    watcher.learn(Report())
    _save(folder / "transformer.py", _edit_layernorm(TRANSFORMER, "another edit"))
    names = [e.name for e in watcher.to_check(watcher.saved())]
    assert names[0] == "LayerNorm" and "greedy_search" in names


def test_a_broken_file_is_reported_and_the_watch_goes_on(folder: Path):
    """A syntax error is one line (file and line) with no check run; the fixed file is checked at the next save."""
    watcher = Watcher(folder, EXERCISES)
    console = Console(record=True, width=200)
    checked: list[list[str]] = []
    broken = TRANSFORMER.replace("class LayerNorm", "class LayerNorm(:", 1)
    line = broken[:broken.index("class LayerNorm(:")].count("\n") + 1
    saves = iter([broken, _edit_layernorm(TRANSFORMER)])

    def fake_pause(seconds: float) -> None:
        _save(folder / "transformer.py", next(saves))

    def fake_check(exercises):
        checked.append([e.name for e in exercises])

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(watch_module, "pause", fake_pause)
        watch(watcher, fake_check, console, rounds=2)
    text = console.export_text()
    assert f"does not compile: {folder.name}/transformer.py, line {line}: SyntaxError" in text
    assert "still watching" in text
    assert checked == [["LayerNorm"]]


def test_watch_rechecks_a_saved_file_and_ctrl_c_ends_it_in_one_line(folder: Path, monkeypatch, capsys):
    """End to end, through ``watch_main`` and the real ``check`` of the solutions: a save re-checks LayerNorm
    (``check``'s panel, passed), a syntax error is reported, Ctrl-C ends it with one line and exit code 130."""
    saves = iter([_edit_layernorm(TRANSFORMER), TRANSFORMER.replace("class Embed", "class Embed(:", 1)])

    def fake_pause(seconds: float) -> None:
        try:
            _save(folder / "transformer.py", next(saves))
        except StopIteration:
            raise KeyboardInterrupt from None

    monkeypatch.setattr(watch_module, "pause", fake_pause)
    monkeypatch.setattr(watch_module, "watched_folder", lambda impl: folder)
    monkeypatch.setattr(watch_module, "warm_up", lambda console: None)  # the check below loads what it needs
    monkeypatch.setenv("COLUMNS", "200")
    code = watch_main(["--impl", "solutions", "--interval", "0.05"])
    out, err = capsys.readouterr()
    assert code == 130
    assert "transformer.py saved: checking LayerNorm" in out
    assert "LayerNorm" in out and "passed" in out.lower()
    assert "does not compile" in out and "SyntaxError" in out
    assert err.strip().splitlines() == ["sampling-course watch: stopped"]


def test_bad_arguments_are_one_line(capsys):
    assert watch_main(["no_such_exercise"]) == 2
    assert watch_main(["--interval", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("sampling-course watch: error:") for line in err)
