"""The checker's guards and shortcuts: code that never returns is stopped, a stale
`pip install .` is named, and a check only imports and runs what its verdict needs.

Each is tried on a small planted case (a test file with an endless loop, a fake installed
copy of exercises/, ...) rather than on the course's own tests, so each costs about a second.
"""

from __future__ import annotations

import io
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console

from sampling_course import implementation as impl
from sampling_course.apps import course_commands
from sampling_course.grading import checking, pytest_plugin, runner
from sampling_course.grading.results import NOT_IMPLEMENTED_YET, TOOK_TOO_LONG
from sampling_course.reference import _load, tiny_dir
from sampling_course.grading.time_limit import TookTooLong, time_limit

# A learner's loop that forgets to advance. The deadline only keeps this suite from hanging
# if the time limit is broken: then the planted test fails with "was not stopped" instead.
PLANTED_LOOP = """
import time

import pytest


def generate(tokens, n):
    deadline = time.monotonic() + 30
    while len(tokens) < n:  # never appends: the loop never ends
        if time.monotonic() > deadline:
            raise AssertionError("was not stopped")
    return tokens


@pytest.mark.exercise("LayerNorm")
def test_never_returns():
    generate([], 5)


@pytest.mark.exercise("LayerNorm")
def test_would_wait_as_long():
    generate([], 5)


@pytest.mark.exercise("Embed")
def test_another_exercise_still_runs():
    assert generate([1, 2], 2) == [1, 2]
"""

LIMIT = "0.5"


def recording_console() -> Console:
    return Console(file=io.StringIO(), width=200, record=True, color_system=None)


@pytest.fixture
def planted_course(tmp_path: Path, monkeypatch) -> Path:
    """A course folder whose only tests are the planted loop, with the course's pytest plugin."""
    (tmp_path / "pyproject.toml").write_text(
        "[tool.pytest.ini_options]\n"
        # importlib: the nested session leaves sys.path and this session's conftest module alone.
        'addopts = "-p no:cacheprovider --import-mode=importlib -p sampling_course.grading.pytest_plugin"\n'
    )
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_planted_loop.py").write_text(PLANTED_LOOP)
    monkeypatch.setattr(sys, "path", list(sys.path))  # whatever a nested session adds goes away
    return tests


# ---------------------------------------------------------------------------------------
# Code that never returns
# ---------------------------------------------------------------------------------------


def test_time_limit_stops_a_python_loop_and_leaves_nothing_behind():
    """time_limit raises TookTooLong in an endless loop, even past `except Exception`, and never after the block."""

    def swallowing_loop():
        deadline = time.monotonic() + 30  # only if the limit is broken
        while time.monotonic() < deadline:
            try:
                time.sleep(0.001)
            except Exception:  # a learner's catch-all must not hide the limit
                pass

    with pytest.raises(TookTooLong):
        with time_limit(0.2):
            swallowing_loop()
    for _ in range(50):  # blocks that end in time: nothing is raised later
        start = time.monotonic()
        try:
            with time_limit(0.01):
                sum(range(100))
        except TookTooLong:
            # Allowed only for a block that really ran out its time (on a loaded machine this
            # process can wait longer than 0.01 s for a core); a late raise left by an earlier
            # block would come in one that had not.
            assert time.monotonic() - start >= 0.01, "TookTooLong raised in a block that had time left"
    time.sleep(0.05)  # a raise after its block would land here


@pytest.mark.slow
def test_pytest_reports_an_endless_loop_on_one_line(planted_course, capsys):
    """pytest --impl exercises stops the looping test, says "took longer than N s" on one line, skips the
    exercise's other tests, and shows no traceback or FAILED line."""
    code = pytest.main([str(planted_course / "test_planted_loop.py"), "--impl", "exercises", "--test-timeout", LIMIT,
                        "-q", "-s", "-c", str(planted_course.parent / "pyproject.toml")])
    captured = capsys.readouterr()
    out = captured.out
    assert code == pytest.ExitCode.TESTS_FAILED, out + captured.err
    lines = [line for line in out.splitlines() if "took longer than" in line]
    assert lines == [f"tests/test_planted_loop.py::test_never_returns: took longer than {LIMIT} s, "
                     "stopped (is there a loop that never ends?)"], out
    assert "was not stopped" not in out and "Traceback" not in out
    assert not [line for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))], out
    assert "1 passed, 1 skipped" in out and "1 took too long" in out, out


@pytest.mark.slow
def test_check_and_progress_report_an_endless_loop(planted_course, monkeypatch):
    """check() and progress stop the loop after $SAMPLING_COURSE_TEST_TIMEOUT and show it as the exercise's status."""
    monkeypatch.setattr(runner, "tests_dir", lambda: planted_course)
    monkeypatch.setenv(pytest_plugin.TIMEOUT_ENV, LIMIT)
    console = recording_console()
    report = checking.check(["LayerNorm", "Embed"], console=console)
    result = report["LayerNorm"]
    assert result.status == TOOK_TOO_LONG and result.message == f"took longer than {LIMIT} s", result
    assert result.failing_test.endswith("test_never_returns") and not report.ok
    assert report["Embed"].done
    text = console.export_text()
    row = next(line for line in text.splitlines() if "LayerNorm" in line)
    assert row.split()[1:5] == ["LayerNorm", "took", "longer", "than"], row
    assert f"took longer than {LIMIT} s" in row and "Traceback" not in text

    progress = checking.progress(display=False)
    assert progress["LayerNorm"].status == TOOK_TOO_LONG


def test_timeout_setting_is_checked():
    """60 s for the exercises by default, none for the solutions; a bad value is a ValueError."""
    assert pytest_plugin.resolve_test_timeout(None, "exercises") == pytest_plugin.DEFAULT_TEST_TIMEOUT == 60
    assert pytest_plugin.resolve_test_timeout(None, "solutions") == 0
    assert pytest_plugin.resolve_test_timeout("2.5", "solutions") == 2.5
    for bad in ("soon", "-1", "nan"):
        with pytest.raises(ValueError, match="seconds"):
            pytest_plugin.resolve_test_timeout(bad, "exercises")


# ---------------------------------------------------------------------------------------
# A stale `pip install .`
# ---------------------------------------------------------------------------------------


@pytest.fixture
def stale_install(tmp_path: Path, monkeypatch) -> Path:
    """A checkout, and a copy of its exercises/ that `pip install .` put in a site-packages folder
    first on sys.path; returns the checkout."""
    checkout = tmp_path / "checkout"
    (checkout / "tests").mkdir(parents=True)
    (checkout / "tests" / "conftest.py").write_text("")
    (checkout / "exercises").mkdir()
    (checkout / "exercises" / "__init__.py").write_text("")
    site = tmp_path / "site-packages"
    (site / "exercises").mkdir(parents=True)
    (site / "exercises" / "__init__.py").write_text("# copied at install time\n")
    record = site / "sampling_course-0.1.0.dist-info"
    record.mkdir()
    (record / "METADATA").write_text("Metadata-Version: 2.1\nName: sampling-course\nVersion: 0.1.0\n")
    (record / "RECORD").write_text("exercises/__init__.py,,\nsampling_course-0.1.0.dist-info/METADATA,,\n")
    # Python must look the package up afresh (the outer session's modules come back afterwards).
    for name in [n for n in sys.modules if n == "exercises" or n.startswith("exercises.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(site))
    return checkout


def test_stale_install_is_detected(stale_install):
    """An installed copy shadowing the checkout's exercises/ gives one line saying to reinstall with -e."""
    message = impl.stale_install_message("exercises", stale_install)
    assert message is not None and "\n" not in message
    assert "pip install -e ." in message and str(stale_install / "exercises") in message
    # The same checkout seen from a notebook in a subfolder.
    (stale_install / "notebooks").mkdir()
    assert impl.find_checkout(stale_install / "notebooks") == stale_install


def test_a_copy_on_pythonpath_is_not_stale(stale_install, tmp_path):
    """A copy that pip did not install (one put first on PYTHONPATH on purpose) is graded as asked."""
    (tmp_path / "site-packages" / "sampling_course-0.1.0.dist-info" / "RECORD").write_text("")
    assert impl.stale_install_message("exercises", stale_install) is None


def test_check_cli_and_pytest_stop_on_a_stale_install(stale_install, monkeypatch, capsys):
    """check() prints the one line and checks nothing; the CLI exits 2; the pytest plugin refuses to start."""
    monkeypatch.setattr(runner, "tests_dir", lambda: stale_install / "tests")
    console = recording_console()
    report = checking.check("LayerNorm", impl="exercises", console=console)
    assert not report and report.error and not report.results
    lines = console.export_text().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "pip install -e ." in lines[0]
    assert course_commands.progress_main(["--impl", "exercises"]) == 2
    assert "pip install -e ." in capsys.readouterr().out

    class Config:
        rootpath = stale_install

        @staticmethod
        def getoption(name):
            return {"--impl": "exercises"}[name]

    with pytest.raises(pytest.UsageError, match=r"pip install -e \."):
        pytest_plugin.pytest_configure(Config())


# ---------------------------------------------------------------------------------------
# Checks in seconds: import and run only what the verdict needs
# ---------------------------------------------------------------------------------------

STUB_AND_UNRELATED = """
import pathlib

import pytest


def stub():
    raise NotImplementedError()


@pytest.mark.exercise("Embed")
def test_first_runs_into_the_stub():
    stub()


@pytest.mark.exercise("Embed")
def test_would_only_run_into_it_again():
    pathlib.Path(__file__).with_name("second-test-ran").touch()
    stub()
"""


def test_a_check_skips_other_files_and_tests_that_would_hit_the_same_stub(planted_course, monkeypatch):
    """check("Embed") does not import a test file without an Embed marker, and once a test hit
    Embed's stub the exercise's other tests are counted as waiting without being run."""
    (planted_course / "test_stub.py").write_text(STUB_AND_UNRELATED)
    (planted_course / "test_unrelated.py").write_text('raise RuntimeError("this file was imported")\n')
    monkeypatch.setattr(runner, "tests_dir", lambda: planted_course)
    report = runner.run_report(["Embed"], impl="exercises")
    assert report.collection_errors == []
    result = report["Embed"]
    assert (result.status, result.stubs) == (NOT_IMPLEMENTED_YET, ("stub",)), result
    # test_planted_loop.py marks Embed too: its quick test passes; both stub tests count as waiting.
    assert (result.passed, result.not_implemented) == (1, 2), result
    assert not (planted_course / "second-test-ran").exists()


@pytest.mark.slow
def test_reference_builds_its_transformer_lens_model_on_first_use():
    """A freshly loaded reference has no TransformerLens bridge (nor Hugging Face model) until .model is read;
    then it has one, once."""
    path = tiny_dir()
    fresh = _load.__wrapped__("tiny", path, "not the shared one")  # not the per-process shared one
    assert not fresh.model_loaded and not fresh.hf_model_loaded
    bridge = fresh.model
    assert fresh.model_loaded and fresh.model is bridge and hasattr(bridge, "run_with_cache")


def _parsed_markers(path: Path) -> set[str]:
    """The exercise names that Python's parser finds in ``pytest.mark.exercise("...")`` calls."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "exercise"
                and node.args and isinstance(node.args[0], ast.Constant)):
            names.add(node.args[0].value.lower())
    return names


def test_the_text_scan_of_test_files_misses_no_marker_the_parser_finds():
    """A check skips the test files that grade none of its exercises, deciding from their text:
    every marker the parser finds must be read (more names only cost an import), and no file of
    the course's tests may need importing to tell (that would cost every check its import)."""
    tests = Path(__file__).resolve().parents[1]
    files = sorted(tests.rglob("test_*.py"))
    assert len(files) > 40
    for path in files:
        scanned = pytest_plugin.marked_exercises(path)
        assert scanned is not None, f"{path.name}: an exercise marker the text scan cannot read"
        assert _parsed_markers(path) <= scanned, path.name


def test_the_text_scan_reads_each_way_a_marker_is_written(tmp_path):
    path = tmp_path / "test_planted_markers.py"
    path.write_text(textwrap.dedent('''
        import pytest
        from pytest import mark

        pytestmark = pytest.mark.exercise("LayerNorm")

        @pytest.mark.parametrize("x", [pytest.param(1, marks=mark.exercise( 'Embed' ))])
        @pytest.mark.exercise(
            "Beams.filter",
        )
        def test_x(x):
            pass  # a marker in a comment, pytest.mark.exercise("unembed"), only adds a name
    '''))
    assert pytest_plugin.marked_exercises(path) == {"layernorm", "embed", "beams.filter", "unembed"}
    assert _parsed_markers(path) == {"layernorm", "embed", "beams.filter"}
    # A name that is computed cannot be read from the text: the file is imported to find out.
    # (Spelled in two pieces so that this file's own text holds no computed marker.)
    computed = "@pytest.mark." + "exercise(NAME)"
    path.write_text(path.read_text() + f"\nNAME = 'Attention'\n\n{computed}\ndef test_y():\n    pass\n")
    assert pytest_plugin.marked_exercises(path) is None
    path.write_text("def test_z():\n    pass\n")
    assert pytest_plugin.marked_exercises(path) == frozenset()


def test_a_nested_run_loads_no_installed_pytest_plugin_and_restores_the_environment(monkeypatch):
    """Plugins installed beside the course (a notebook server has several) cost each check their
    import and could change what runs: the nested runs leave them off."""
    from sampling_course.grading.sandbox import NESTED_RUN_OPTIONS, nested_run_env

    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.setenv("PYTEST_ADDOPTS", "-x")
    with pytest.raises(RuntimeError), nested_run_env(PYTEST_ADDOPTS=None, SAMPLING_COURSE_PROBE="1"):
        import os

        assert os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
        assert "PYTEST_ADDOPTS" not in os.environ and os.environ["SAMPLING_COURSE_PROBE"] == "1"
        raise RuntimeError("the block fails: the environment must still come back")
    import os

    assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in os.environ and "SAMPLING_COURSE_PROBE" not in os.environ
    assert os.environ["PYTEST_ADDOPTS"] == "-x"
    assert "no:unraisableexception" in NESTED_RUN_OPTIONS and "no:cacheprovider" in NESTED_RUN_OPTIONS
