"""`sampling-course start-at N`: the finished code of every exercise before part N, put into a fresh copy of
exercises/ without losing what the learner wrote; and the notebooks' EARLIER_IMPL switch, which reaches
the imports inside the learner's own later parts."""

from __future__ import annotations

import importlib
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sampling_course.grading.course import EXERCISES
from sampling_course.grading.start_at import BACKUP_FOLDER, exercises_before, files_before, start_at
from sampling_course.grading.stubs import STUB_LINE
from sampling_course.grading.walk import regions

REPO = Path(__file__).resolve().parents[2]


def stubs_in(text: str) -> int:
    return sum(line.strip() == STUB_LINE for line in text.splitlines())


@pytest.fixture
def fresh_exercises(tmp_path):
    """A fresh copy of the generated exercises/, as a package of its own name (it never shadows `exercises`)."""
    copy = tmp_path / "started_exercises"
    shutil.copytree(REPO / "exercises", copy, ignore=shutil.ignore_patterns("__pycache__", BACKUP_FOLDER))
    return copy


def test_the_files_part_n_needs_come_from_the_catalogue():
    """Part 10 needs the files of parts 1-9, part 5's sampler chain among them; part 5 those of parts 1-4."""
    assert files_before(5) == ("transformer", "sampling", "beams", "kv_cache")
    for module in ("padding", "generate", "batched_sampling", "filters", "outputs", "penalties", "modern_filters", "llama"):
        assert module in files_before(10)
    assert {e.part for e in exercises_before(10)} == set(range(1, 10))
    assert {e.part_label for e in exercises_before("6b")} == {"1", "2", "3", "4", "5", "5b", "6"}
    assert {e.part for e in exercises_before(11)} == set(range(1, 11))  # part 11 runs the models of parts 1-10
    with pytest.raises(ValueError, match="part must be one of"):
        exercises_before(12)


@pytest.mark.parametrize("part", [5, 9, 10, 11])
def test_start_at_fills_every_earlier_exercise_and_leaves_part_n_to_write(fresh_exercises, part):
    """Every region of an earlier exercise is filled in, every region of part N and later is still its stub
    (exercises/transformer.py and kv_cache.py keep part 5's padding stubs when starting at part 5), and every file imports."""
    report = start_at(part, fresh_exercises)
    earlier = set(exercises_before(part))
    assert set(report.changed) == set(files_before(part))
    assert report.backup is not None and report.backup.parent.name == BACKUP_FOLDER
    for module in files_before(part):
        text = (fresh_exercises / f"{module}.py").read_text()
        later = [r for r in regions(module) if r.owner not in earlier]
        assert stubs_in(text) == len(later), f"{module}: {stubs_in(text)} stubs, part {part} on has {len(later)} regions"
        assert "### BEGIN SOLUTION" not in text
        assert (report.backup / f"{module}.py").read_text() == (REPO / "exercises" / f"{module}.py").read_text()
    if part == 5:
        # position_ids_from_mask and masked_forward (the line of Attention.forward that hides pad keys);
        # padded_forward is the padded branch of step_after, in kv_cache.py.
        assert stubs_in((fresh_exercises / "transformer.py").read_text()) == 2
        assert stubs_in((fresh_exercises / "kv_cache.py").read_text()) == 1
    # Every module imports (a stub only raises when it is called).
    sys.path.insert(0, str(fresh_exercises.parent))
    try:
        package = importlib.import_module(fresh_exercises.name)
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{fresh_exercises.name}.{info.name}")
    finally:
        sys.path.remove(str(fresh_exercises.parent))
        for name in [n for n in sys.modules if n == fresh_exercises.name or n.startswith(fresh_exercises.name + ".")]:
            del sys.modules[name]


def test_start_at_keeps_what_the_learner_wrote(fresh_exercises):
    """A function the learner wrote is kept, one they started is reported and kept, the file is backed up
    first, and a second run changes nothing."""
    path = fresh_exercises / "sampling.py"
    original = path.read_text()
    at = original.index(STUB_LINE, original.index("def greedy_search"))
    mine = original[:at] + "return int(torch.argmax(logits))  # my own" + original[at + len(STUB_LINE):]
    at = mine.index(STUB_LINE, mine.index("def sample_top_p"))
    mine = mine[:at] + "n_kept = 1  # started\n        " + mine[at:]
    path.write_text(mine)

    report = start_at(5, fresh_exercises)
    written = path.read_text()
    assert "return int(torch.argmax(logits))  # my own" in written and "n_kept = 1  # started" in written
    assert report.kept == {"sampling": ["TransformerSampler.greedy_search"]}
    assert report.unfinished == {"sampling": ["TransformerSampler.sample_top_p"]}
    assert "TransformerSampler.sample_basic" in report.filled["sampling"]
    assert (report.backup / "sampling.py").read_text() == mine
    assert stubs_in(written) == 1  # the started top-p only

    again = start_at(5, fresh_exercises)
    assert again.changed == [] and again.filled == {} and again.backup is None
    assert path.read_text() == written


def test_make_exercises_never_overwrites_a_started_file(fresh_exercises):
    """The filled-in files count as the learner's: make-exercises skips them (only --force regenerates)."""
    from sampling_course.grading.stubs import DEFAULT_SOLUTIONS_DIR, make_exercises

    start_at(5, fresh_exercises)
    report = make_exercises(DEFAULT_SOLUTIONS_DIR, fresh_exercises)
    assert {p.stem for p in report.skipped_edited} == set(files_before(5))


def test_the_earlier_impl_switch_reaches_the_later_parts_imports():
    """earlier_parts(10, "exercises", "solutions"): the engine the notebook imports from exercises/ runs the
    course's part-5 chain and model; a check still grades the learner's own generate; switching back undoes it."""
    from sampling_course.apps.notebook import earlier_parts

    saved = {n: m for n, m in sys.modules.items() if n == "exercises" or n.startswith("exercises.")}
    try:
        assert "generate" in earlier_parts(10, "exercises", "solutions")
        engine = importlib.import_module("exercises.engine")
        assert engine.choose_tokens.__module__ == "solutions.batched_sampling"
        assert engine.process_logits.__module__ == "solutions.penalties"
        assert engine.BlockPool.__module__ == "exercises.block_pool"  # part 10's own stays the learner's
        assert earlier_parts(10, "exercises", "exercises") == ()
        engine = importlib.import_module("exercises.engine")
        assert engine.choose_tokens.__module__ == "exercises.batched_sampling"
    finally:
        for name in [n for n in sys.modules if n == "exercises" or n.startswith("exercises.")]:
            del sys.modules[name]
        sys.modules.update(saved)


@pytest.mark.slow
@pytest.mark.parametrize("part, graded", [(5, "cached_beam_search"), (9, "exact_laws"), (10, "generate")])
def test_start_at_from_a_fresh_copy_passes_the_earlier_checks(tmp_path, part, graded):
    """In a fresh copy of the course, `sampling-course start-at N` then the grading tests of an earlier
    exercise (the last one before part N, or the generate that part 10's engine runs) on exercises/: they pass."""
    copy = tmp_path / "course"
    copy.mkdir()
    for name in ("sampling_course", "solutions", "exercises", "tests"):
        shutil.copytree(REPO / name, copy / name, ignore=shutil.ignore_patterns("__pycache__", BACKUP_FOLDER))
    shutil.copy2(REPO / "pyproject.toml", copy / "pyproject.toml")
    env = {**os.environ, "PYTHONPATH": str(copy)}
    env.pop("SAMPLING_COURSE_IMPL", None)
    started = subprocess.run([sys.executable, "-m", "sampling_course.apps.cli", "start-at", str(part)],
                             cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "backup of the" in started.stdout and f"Part {part}'s exercises are yours" in started.stdout
    assert graded in {e.name for e in exercises_before(part)}
    checked = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "--impl", "exercises", "--exercise", graded,
         "-m", "not gpt2", "tests/grading"],
        cwd=copy, env=env, capture_output=True, text=True, timeout=900)
    assert checked.returncode == 0 and " passed" in checked.stdout, checked.stdout[-3000:] + checked.stderr[-2000:]


def test_every_exercise_of_a_part_comes_after_the_ones_before_it():
    """exercises_before relies on the catalogue listing each part's exercises together, in course order."""
    labels = [e.part_label for e in EXERCISES]
    assert all(labels.index(label) + labels.count(label) - 1 == len(labels) - 1 - labels[::-1].index(label)
               for label in set(labels))
