"""The course's pytest plugin: which implementation to grade, and friendly stub reports.

The same tests grade the complete ``solutions`` (the default) or the learner's
``exercises``; choose with ``--impl exercises`` or ``SAMPLING_COURSE_IMPL=exercises``.
``--exercise NAME`` selects the tests marked ``@pytest.mark.exercise(NAME)``; test files
whose text marks none of the chosen exercises are not even imported (so the marker must
be written in the test file, with the name as a string).

A stub that still raises ``NotImplementedError`` is reported on one line,
``<stub>: not implemented yet``, instead of as a failure with a traceback. A file of the
course itself that is damaged (``BrokenCourseFile``) is reported on one line too, as the
course's fault, never the learner's. Skipped tests are summed up in one line: why, and how
to run them.

``--device DEVICE`` (``auto``, ``cpu``, ``cuda``, ``mps``; default $SAMPLING_COURSE_DEVICE, else
``cpu``) grades on that device: the reference models, the model under test and every tensor
a test makes live there (see ``DeviceSession``), float32 matmuls run in full float32
(no TF32), and comparisons use that device's tolerances (``grading.tolerances``).

With ``--impl exercises`` a test that runs past ``--test-timeout`` seconds (60 by default,
or $SAMPLING_COURSE_TEST_TIMEOUT) is stopped and reported on one line, ``took longer than
60 s``; the rest of that exercise's tests are skipped, so a loop that never ends costs
one wait, not one per test.

pyproject.toml loads this module with ``-p sampling_course.grading.pytest_plugin``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
import torch

from sampling_course.devices import DEVICE_ENV, full_fp32_precision, pick_device, use_device
from sampling_course.grading.device_session import DeviceSession, on_the_cpu
from sampling_course.files import BrokenCourseFile
from sampling_course.implementation import IMPLS, find_checkout, stale_install_message
from sampling_course.grading.time_limit import TookTooLong, time_limit

NOT_IMPLEMENTED = "not implemented"
TOOK_TOO_LONG = "took too long"  # the key in report.user_properties; its value is the limit in seconds
COURSE_BROKEN = "course broken"  # the key in report.user_properties; its value is the one-line message
# A skip reason may end in "; to enable: <how>": the summary line groups skips by what comes before it.
TO_ENABLE = "; to enable: "
AFTER_TIMEOUT = "not run: an earlier test of "  # these skips are explained in the "took too long" section
TIMEOUT_ENV = "SAMPLING_COURSE_TEST_TIMEOUT"
DEFAULT_TEST_TIMEOUT = 60.0

_timeout_key = pytest.StashKey[float]()
_slow_exercises_key = pytest.StashKey[set]()
_threads_key = pytest.StashKey[int]()
_device_key = pytest.StashKey[torch.device]()
_device_contexts_key = pytest.StashKey[list]()


def resolve_test_timeout(option: float | str | None, impl: str) -> float:
    """Seconds a test may run: ``option``, else $SAMPLING_COURSE_TEST_TIMEOUT, else 60 for the
    exercises and no limit (0) for the solutions."""
    raw = option if option is not None else os.environ.get(TIMEOUT_ENV)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return DEFAULT_TEST_TIMEOUT if impl == "exercises" else 0.0
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # also rejects nan
        raise ValueError(f"the test timeout ({TIMEOUT_ENV} or --test-timeout) must be a number of seconds >= 0 "
                         f"(0 turns it off), got {raw!r}")
    return seconds



def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sampling-course")
    group.addoption(
        "--impl",
        choices=IMPLS,
        default=os.environ.get("SAMPLING_COURSE_IMPL", "solutions"),
        help="implementation under test: solutions (default) or exercises "
        "(also settable with SAMPLING_COURSE_IMPL)",
    )
    # For `plant-mistakes` only: grade a planted copy of the solutions imported under a name of
    # its own (so that one process can grade copy after copy), like a learner's exercises.
    group.addoption("--planted-impl", default=None, metavar="PACKAGE", help=argparse.SUPPRESS)
    group.addoption(
        "--exercise",
        action="append",
        default=[],
        metavar="NAME",
        help="only run the tests that grade this exercise (repeatable)",
    )
    group.addoption(
        "--reads-impl",
        action="store_true",
        default=False,
        help="only run the tests that read the implementation under test (through the impl fixture); "
        "the others give the same result whichever implementation is chosen",
    )
    group.addoption(
        "--threads",
        default=None,
        metavar="N",
        help="torch threads for the tests (default: $OMP_NUM_THREADS, else 1)",
    )
    group.addoption(
        "--recompute-oracle",
        action="store_true",
        default=False,
        help="compute every reference output live again instead of reusing the stored ones "
        "(also SAMPLING_COURSE_RECOMPUTE_ORACLE=1)",
    )
    group.addoption(
        "--device",
        default=None,
        metavar="DEVICE",
        help=f"grade on this device: auto, cpu, cuda (or cuda:N) or mps (default: ${DEVICE_ENV}, else cpu)",
    )
    group.addoption(
        "--test-timeout",
        default=None,
        metavar="SECONDS",
        help=f"stop a test after SECONDS and report that it took too long (default: {DEFAULT_TEST_TIMEOUT:g} "
        f"with --impl exercises, none for the solutions; also settable with {TIMEOUT_ENV}; 0 turns it off)",
    )


def pytest_configure(config: pytest.Config) -> None:
    impl = config.getoption("--impl")
    if impl not in IMPLS:
        raise pytest.UsageError(f"SAMPLING_COURSE_IMPL={impl!r} is not one of {', '.join(IMPLS)}")
    # After `pip install .` the tests would grade a copy made at install time, not the checkout's files.
    checkout = find_checkout(Path(config.rootpath))
    stale = stale_install_message(impl, checkout) if checkout is not None else None
    if stale:
        raise pytest.UsageError(stale)
    planted = config.getoption("--planted-impl")
    if planted:
        config.option.impl = planted  # what the `impl` fixture and the report header read
    try:
        # A planted copy is timed like the learner's code it stands for.
        config.stash[_timeout_key] = resolve_test_timeout(config.getoption("--test-timeout"),
                                                          "exercises" if planted else impl)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[_slow_exercises_key] = set()
    start_device_session(config)
    # One torch thread unless OMP_NUM_THREADS asks for more: the stand-in's operations are far too
    # small to gain from several, and on a busy machine each parallel operation waits for a free
    # core (measured on 2 shared cores: the suite took 3.6x the CPU time with 2 threads).
    config.stash[_threads_key] = torch.get_num_threads()
    raw = config.getoption("--threads")
    if raw is not None:
        try:
            threads = int(raw)
        except ValueError:
            threads = 0
        if threads < 1:
            raise pytest.UsageError(f"--threads must be an integer >= 1, got {raw!r}")
    else:
        try:
            threads = max(1, int(os.environ.get("OMP_NUM_THREADS") or 1))
        except ValueError:
            threads = 1
    torch.set_num_threads(threads)
    _skip_the_dtensor_import()


def _skip_the_dtensor_import() -> None:
    """torch.testing.assert_close imports torch.distributed.tensor on every call to unwrap DTensors
    (about half a second the first time: a third of a quick check). No DTensor can exist before that
    module is imported, so until then the unwrapping is skipped; afterwards torch's own runs."""
    try:
        from torch.testing import _comparison
    except ImportError:
        return
    original = getattr(_comparison, "_unwrap_dtensor_for_comparison", None)
    if original is None or getattr(original, "_course_wrapped", False):
        return

    def unwrap(actual, expected):
        if "torch.distributed.tensor" not in sys.modules:
            return actual, expected
        return original(actual, expected)

    unwrap._course_wrapped = True
    _comparison._unwrap_dtensor_for_comparison = unwrap


def pytest_unconfigure(config: pytest.Config) -> None:
    # A check runs inside the caller's process (a notebook kernel): give it its threads back.
    if _threads_key in config.stash:
        torch.set_num_threads(config.stash[_threads_key])
    # ... and its device settings, innermost first.
    for context in reversed(config.stash.get(_device_contexts_key, [])):
        context.__exit__(None, None, None)
    config.stash[_device_contexts_key] = []


def pytest_report_header(config: pytest.Config) -> str:
    device = config.stash.get(_device_key, None)
    return f"sampling-course: testing {config.getoption('--impl')}/ on {device}"


# ---------------------------------------------------------------------------------------
# The device a session grades on
# ---------------------------------------------------------------------------------------


def session_device(config: pytest.Config) -> torch.device:
    """The device this session grades on (``--device``); the ``device`` fixture reads it."""
    return config.stash[_device_key]


@pytest.fixture(scope="module")
def cpu_session() -> Iterator[None]:
    """A test module's tests on the CPU whatever ``--device`` (``pytestmark = pytest.mark.usefixtures("cpu_session")``)."""
    with on_the_cpu():
        yield


def start_device_session(config: pytest.Config) -> None:
    """Resolve ``--device`` and set the session up on it; ``pytest_unconfigure`` undoes it all."""
    option = config.getoption("--device") or os.environ.get(DEVICE_ENV) or "cpu"
    try:
        device = pick_device(option)
    except ValueError as exc:  # no such device here, or no such device at all
        raise pytest.UsageError(f"--device {option}: {exc}") from None
    contexts = [use_device(device)]  # loaders left to their default use it
    if device.type == "cuda":
        contexts.append(full_fp32_precision())  # no TF32: float32 parity at float32's tolerances
    # Also when torch's default device is already the session's (a notebook on a GPU sets it): only
    # DeviceSession draws from the tests' seeded CPU generators on the CPU and moves the result.
    if device.type != "cpu" or device != torch.get_default_device():
        contexts.append(DeviceSession(device))
    for context in contexts:
        context.__enter__()
    config.stash[_device_key] = device
    config.stash[_device_contexts_key] = contexts


# `mark.exercise(` (as in `pytest.mark.exercise(` or `marks=mark.exercise(`), then the literal
# name that must follow it. Reading the text with these is about 50 times faster than parsing it, and a
# first check reads every test file's text.
_EXERCISE_MARK = re.compile(rb"\bmark\s*\.\s*exercise\s*\(\s*")
_LITERAL_NAME = re.compile(rb"""[rRuU]?(['"])([^'"\\\n]*)\1\s*[,)]""")


@cache
def _marked_exercises(path: Path, mtime_ns: int) -> frozenset[str] | None:
    """The exercise names (lower case) that the test file ``path`` marks; None when one is not a
    plain string literal (a computed name: the file must be imported to know).

    The text is searched, not parsed: a marker in a comment or docstring only adds a name (the
    file is then collected and its tests deselected), so no file that grades an exercise is ever
    skipped for it."""
    text = path.read_bytes()
    names = set()
    for mark in _EXERCISE_MARK.finditer(text):
        literal = _LITERAL_NAME.match(text, mark.end())
        if literal is None:
            return None
        names.add(literal.group(2).decode("utf-8", "replace").lower())
    return frozenset(names)


def marked_exercises(path: Path) -> frozenset[str] | None:
    """Which exercises a test file grades, read from its text (cached until the file changes)."""
    return _marked_exercises(path, path.stat().st_mtime_ns)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With --exercise, skip importing test files that grade none of the chosen exercises.

    Importing a test file costs its imports (nbformat, scipy, ...); for a single check that
    is most of the time, and deselecting its tests afterwards would not give it back.
    """
    wanted = {name.lower() for name in config.getoption("--exercise")}
    if not wanted or not (collection_path.name.startswith("test_") and collection_path.suffix == ".py"):
        return None
    try:
        marked = marked_exercises(collection_path)
    except OSError:
        return None  # let pytest report it
    return True if marked is not None and not marked & wanted else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = {name.lower() for name in config.getoption("--exercise")}
    reads_impl = config.getoption("--reads-impl")
    if not wanted and not reads_impl:
        return
    keep, drop = [], []
    for item in items:
        names = {m.args[0].lower() for m in item.iter_markers("exercise")}
        # fixturenames is the whole closure: a test reads the implementation through any fixture that does.
        chosen = (not wanted or names & wanted) and (not reads_impl or "impl" in getattr(item, "fixturenames", ()))
        (keep if chosen else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep


# ---------------------------------------------------------------------------------------
# A time limit per test
# ---------------------------------------------------------------------------------------


def _exercises_of(item: pytest.Item) -> set[str]:
    return {m.args[0].lower() for m in item.iter_markers("exercise") if m.args}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip the rest of an exercise's tests once one took too long: each would wait as long."""
    seconds = item.config.stash.get(_timeout_key, 0.0)
    names = _exercises_of(item)
    if seconds and names and names <= item.config.stash[_slow_exercises_key]:
        pytest.skip(f"{AFTER_TIMEOUT}{', '.join(sorted(names))} took longer than {seconds:g} s")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    # Only the test function itself is timed: there the exception lands in the test's or the
    # learner's code. Fixture setup is left alone, since an exception arriving in the middle
    # of pytest's own fixture bookkeeping would break the tests after it.
    with time_limit(item.config.stash.get(_timeout_key, 0.0)):
        return (yield)


# ---------------------------------------------------------------------------------------
# "not implemented yet" and "took longer than N s" instead of a traceback
# ---------------------------------------------------------------------------------------


def _stub_name(excinfo: pytest.ExceptionInfo) -> str:
    """The qualified name of the function whose stub raised, e.g. ``LayerNorm.forward``."""
    code = excinfo.traceback[-1].frame.code.raw
    return getattr(code, "co_qualname", code.co_name)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None and call.excinfo.errisinstance(BrokenCourseFile):
        message = str(call.excinfo.value)
        report.longrepr = f"the course's own files are broken, not your code: {message}"
        report.sections = []
        report.user_properties.append((COURSE_BROKEN, message))
    elif report.failed and call.excinfo is not None and call.excinfo.errisinstance(NotImplementedError):
        stub = _stub_name(call.excinfo)
        report.longrepr = f"{stub}: not implemented yet"
        report.sections = []
        report.user_properties.append((NOT_IMPLEMENTED, stub))
    elif report.failed and call.excinfo is not None and call.excinfo.errisinstance(TookTooLong):
        seconds = item.config.stash.get(_timeout_key, 0.0)
        report.longrepr = f"took longer than {seconds:g} s"
        report.sections = []
        report.user_properties.append((TOOK_TOO_LONG, seconds))
        item.config.stash[_slow_exercises_key].update(_exercises_of(item))


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    # Their own categories: counted in the summary line and the exit code, but kept out of
    # the FAILURES section, so an untouched stub or an endless loop costs one line, not a traceback.
    if report.failed and any(key == NOT_IMPLEMENTED for key, _ in getattr(report, "user_properties", ())):
        return NOT_IMPLEMENTED, "N", "NOT IMPLEMENTED"
    if report.failed and any(key == TOOK_TOO_LONG for key, _ in getattr(report, "user_properties", ())):
        return TOOK_TOO_LONG, "T", "TOOK TOO LONG"
    if report.failed and any(key == COURSE_BROKEN for key, _ in getattr(report, "user_properties", ())):
        return COURSE_BROKEN, "B", "COURSE FILES BROKEN"
    return None


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr or "")
    return reason.removeprefix("Skipped: ")


def skip_summary(reasons: list[str]) -> str | None:
    """One line saying why tests were skipped and how to run them, from their skip reasons."""
    if not reasons:
        return None
    groups: dict[str, list] = {}
    for reason in reasons:
        why, _, enable = reason.partition(TO_ENABLE)
        groups.setdefault(why, [0, enable])[0] += 1
    ordered = sorted(groups.items(), key=lambda item: -item[1][0])
    parts = [f"{count} because {why}" + (f" (to enable: {enable})" if enable else "") for why, (count, enable) in ordered[:2]]
    rest = sum(count for _, (count, _) in ordered[2:])
    if rest:
        parts.append(f"{rest} for {len(ordered) - 2} other reason{'s' * (len(ordered) > 3)} (`pytest -rs` lists them)")
    return f"{len(reasons)} skipped: " + "; ".join(parts)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    from sampling_course.files import NOTICES

    for message in NOTICES:  # caches rebuilt during the run (they were printed when it happened, maybe captured)
        terminalreporter.write_line(f"note: {message}", yellow=True)
    broken = terminalreporter.stats.get(COURSE_BROKEN, [])
    if broken:
        terminalreporter.section("the course's own files are broken", red=True)
        messages = dict.fromkeys(value for report in broken for key, value in report.user_properties if key == COURSE_BROKEN)
        for message in messages:
            terminalreporter.write_line(f"{message} ({len(broken)} tests could not run; this is not your code)")
    skipped = [reason for reason in (_skip_reason(r) for r in terminalreporter.stats.get("skipped", []) if r.skipped)
               if not reason.startswith(AFTER_TIMEOUT)]
    line = skip_summary(skipped)
    if line:
        terminalreporter.write_line(line)
    slow = terminalreporter.stats.get(TOOK_TOO_LONG, [])
    if slow:
        terminalreporter.section("took too long", red=True)
        for report in slow:
            terminalreporter.write_line(f"{report.nodeid}: {report.longrepr}, stopped (is there a loop that never ends?)")
    reports = terminalreporter.stats.get(NOT_IMPLEMENTED, [])
    if not reports:
        return
    tests_per_stub: dict[str, int] = defaultdict(int)
    for report in reports:
        for key, stub in report.user_properties:
            if key == NOT_IMPLEMENTED:
                tests_per_stub[stub] += 1
    terminalreporter.section("not implemented yet", yellow=True)
    for stub, count in tests_per_stub.items():
        terminalreporter.write_line(f"{stub}: not implemented yet ({count} test{'s' * (count != 1)} waiting)")


# ---------------------------------------------------------------------------------------
# Seeds: every test taking `seed` runs once per seed in SAMPLING_COURSE_TEST_SEED (7, 1-200 or 1,5,9-12)
# ---------------------------------------------------------------------------------------


def _seeds() -> list[int]:
    raw = os.environ.get("SAMPLING_COURSE_TEST_SEED", "0").strip()
    seeds: list[int] = []
    try:
        for part in raw.split(","):
            first, _, last = part.strip().partition("-")
            seeds.extend(range(int(first), int(last or first) + 1))
    except ValueError:
        raise pytest.UsageError(
            f"SAMPLING_COURSE_TEST_SEED must be a seed (7), a range (1-200) or a list (1,5,9-12), got {raw!r}"
        ) from None
    if not seeds:
        raise pytest.UsageError(f"SAMPLING_COURSE_TEST_SEED={raw!r} names no seed")
    return seeds


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that takes ``seed`` runs once per seed of SAMPLING_COURSE_TEST_SEED."""
    if "seed" in metafunc.fixturenames:
        metafunc.parametrize("seed", _seeds(), ids=lambda s: f"seed{s}")
