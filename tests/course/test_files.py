"""The course's own files: shipped assets match their manifest, caches heal, damage is never the learner's.

Every cache here lives in a temporary SAMPLING_COURSE_HOME, so nothing a real run uses is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from sampling_course import files
from sampling_course.files import BrokenCourseFile
from sampling_course.grading.oracle import OracleStore


@pytest.fixture(autouse=True)
def own_notices(monkeypatch) -> None:
    """The notices of the damage done on purpose here stay out of the run's summary."""
    monkeypatch.setattr(files, "NOTICES", [])


@pytest.fixture()
def home(tmp_path, monkeypatch) -> Path:
    """A fresh, empty course cache folder for this test."""
    folder = tmp_path / "home"
    monkeypatch.setenv("SAMPLING_COURSE_HOME", str(folder))
    return folder


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# ---------------------------------------------------------------------------------------
# Shipped assets
# ---------------------------------------------------------------------------------------


def test_the_shipped_manifest_lists_every_asset_as_it_is():
    """assets/MANIFEST.json matches the files (rewrite it with files.write_asset_manifest() after a rebuild)."""
    listed = files.asset_listing()
    on_disk = files.describe(files.ASSETS_DIR)
    on_disk.pop(files.ASSET_MANIFEST.name, None)
    assert listed == on_disk


@pytest.mark.parametrize("damage", ["truncated", "flipped", "missing"])
def test_a_damaged_shipped_asset_is_named_in_one_line(tmp_path, damage):
    """A shipped file that does not match the manifest raises BrokenCourseFile: one line, the file, and to reinstall."""
    folder = tmp_path / "story_tokenizer"
    shutil.copytree(files.ASSETS_DIR / "story_tokenizer", folder)
    files.check_assets(folder)  # the copy is intact
    target = folder / "tokenizer.json"
    if damage == "truncated":
        _truncate(target)
    elif damage == "flipped":
        data = bytearray(target.read_bytes())
        data[100] ^= 1
        target.write_bytes(bytes(data))
    else:
        target.unlink()
    with pytest.raises(BrokenCourseFile) as raised:
        files.check_assets(folder, rebuild="python scripts/build_tokenizer.py --story")
    message = str(raised.value)
    assert "\n" not in message and str(target) in message and "reinstall" in message


# ---------------------------------------------------------------------------------------
# Cached folders: the stand-in model
# ---------------------------------------------------------------------------------------


def _build(folder: Path) -> None:
    (folder / "a.bin").write_bytes(os.urandom(1000))
    (folder / "b.txt").write_text("hello")


@pytest.mark.parametrize("damage", ["truncated", "manifest missing", "file missing"])
def test_a_damaged_cached_folder_is_rebuilt_and_said_in_one_line(tmp_path, capsys, damage):
    target = tmp_path / "cache"
    files.cached_folder(target, _build, "test")
    assert capsys.readouterr().err == ""
    if damage == "truncated":
        _truncate(target / "a.bin")
    elif damage == "manifest missing":
        (target / files.MANIFEST_NAME).unlink()
    else:
        (target / "b.txt").unlink()
    before = len(files.NOTICES)
    path, listed = files.cached_folder(target, _build, "test")
    assert path == target and files.problem_with(target, listed) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("note: rebuilt the test cache"), err
    assert len(files.NOTICES) == before + 1


def test_the_tiny_model_cache_heals(home, capsys):
    """A half-written stand-in checkpoint (a full disk, a killed process) is rebuilt, with one line, and loads."""
    from sampling_course.reference import _hf_config, _read_weights, tiny_dir

    folder = tiny_dir()
    good = _read_weights(folder)
    _truncate(folder / "model.safetensors")
    capsys.readouterr()
    assert tiny_dir() == folder
    err = capsys.readouterr().err
    assert "rebuilt the tiny model cache" in err and "model.safetensors" in err and err.count("\n") == 1
    healed = _read_weights(folder)
    assert healed.keys() == good.keys() and all(torch.equal(healed[k], good[k]) for k in good)
    assert _hf_config(folder).n_layer == 2


BUILD_AT_ONCE = textwrap.dedent("""
    import sys
    from sampling_course.reference import tiny_dir, _read_weights
    folder = tiny_dir()
    print(folder, len(_read_weights(folder)))
""")


@pytest.mark.slow
def test_two_processes_building_the_cache_at_once_both_succeed(home):
    """Two processes that find no stand-in cache build it at the same time: both load a whole checkpoint."""
    env = {**os.environ, "SAMPLING_COURSE_HOME": str(home), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_AT_ONCE], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    assert outputs[0][0] == outputs[1][0]
    assert not [p for p in home.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")], (
        "temporary folders were left behind")


# ---------------------------------------------------------------------------------------
# Cached files: the stored oracle outputs
# ---------------------------------------------------------------------------------------


def double(x: torch.Tensor) -> torch.Tensor:
    double.calls += 1
    return 2 * x


double.calls = 0


def test_an_oracle_output_is_computed_once_then_read_back(tmp_path):
    store = OracleStore(tmp_path)
    x = torch.arange(4.0)
    before = double.calls
    assert torch.equal(store(double, x), 2 * x)
    assert torch.equal(OracleStore(tmp_path)(double, x), 2 * x)  # another process, in effect
    assert double.calls == before + 1
    assert torch.equal(OracleStore(tmp_path)(double, x + 1), 2 * (x + 1))  # other inputs: computed
    assert double.calls == before + 2
    OracleStore(tmp_path, recompute=True)(double, x)  # on request: computed again
    assert double.calls == before + 3


def test_a_damaged_oracle_output_is_recomputed_in_one_line(tmp_path, capsys):
    store = OracleStore(tmp_path)
    x = torch.arange(6.0)
    store(double, x)
    (stored,) = tmp_path.rglob("*.pt")
    _truncate(stored)
    capsys.readouterr()
    before = double.calls
    assert torch.equal(OracleStore(tmp_path)(double, x), 2 * x)
    assert double.calls == before + 1
    err = capsys.readouterr().err
    assert "recomputed a stored reference output (double)" in err and err.count("\n") == 1


def test_oracle_functions_must_say_everything_they_read(tmp_path):
    store = OracleStore(tmp_path)
    with pytest.raises(TypeError, match="top level"):
        store(lambda x: x, torch.zeros(1))
    with pytest.raises(TypeError, match="seed"):
        store(double, torch.Generator())


def test_the_recompute_switch(monkeypatch, tmp_path):
    monkeypatch.setenv("SAMPLING_COURSE_RECOMPUTE_ORACLE", "1")
    assert OracleStore(tmp_path).recompute
    monkeypatch.setenv("SAMPLING_COURSE_RECOMPUTE_ORACLE", "0")
    assert not OracleStore(tmp_path).recompute


# ---------------------------------------------------------------------------------------
# Never the learner's mistake
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_check_on_broken_course_files_blames_the_course(monkeypatch):
    """With a shipped checkpoint damaged, check says the course's own files are broken and how to fix
    that; it gives no verdict on the exercise and no hint."""
    from sampling_course.grading import runner
    from sampling_course import reference

    def damaged(folder, rebuild=None):
        raise BrokenCourseFile(f"the course's file {folder}/model.safetensors is damaged (1 bytes instead of 2): "
                               f"{files.REINSTALL}")

    monkeypatch.setattr(reference, "check_assets", damaged)
    report = runner.run_report(["LayerNorm"], impl="solutions")
    assert report.broken and not report.results
    assert report.error.startswith("the course's own files are broken (not your code)")
    assert "model.safetensors" in report.error and "reinstall" in report.error and "\n" not in report.error


def test_the_story_model_error_is_not_chained_to_the_gpt2_notice(monkeypatch):
    """load_reference("auto") without GPT-2 and with a damaged story model raises the story model's own error."""
    from sampling_course import reference

    def no_gpt2(allow_download):
        raise reference.ReferenceUnavailable("no GPT-2 here")

    def damaged(name):
        raise BrokenCourseFile("the course's file story/model.safetensors is damaged")

    monkeypatch.setattr(reference, "_gpt2_dir", no_gpt2)
    monkeypatch.setattr(reference, "story_model_dir", damaged)
    with pytest.raises(BrokenCourseFile) as raised:
        reference.load_reference("auto", quiet=True)
    assert raised.value.__context__ is None and raised.value.__cause__ is None


def test_summary_of_skips_is_one_line():
    from sampling_course.grading.pytest_plugin import skip_summary

    reasons = ["no GPT-2; to enable: download it"] * 5 + ["solutions only"] * 2 + ["a", "b"]
    line = skip_summary(reasons)
    assert "\n" not in line
    assert line == ("9 skipped: 5 because no GPT-2 (to enable: download it); 2 because solutions only; "
                    "2 for 2 other reasons (`pytest -rs` lists them)")
    assert skip_summary([]) is None


def test_the_manifest_file_format(tmp_path):
    """A cached file carries its manifest (size and SHA-256) in its first line: one file, one atomic rename."""
    path = tmp_path / "x.bin"
    files.write_cached(path, b"payload")
    assert files.read_cached(path) == (b"payload", None)
    header = json.loads(path.read_bytes().split(b"\n", 1)[0].removeprefix(files._HEADER))
    assert header["size"] == 7
    path.write_bytes(path.read_bytes()[:-1])
    data, problem = files.read_cached(path)
    assert data is None and "6 bytes instead of 7" in problem
    assert files.read_cached(tmp_path / "absent") == (None, None)
