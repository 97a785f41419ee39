"""The course's pytest plugin: which implementation to grade, and friendly stub reports.

The same tests grade the complete ``solutions`` (the default) or the learner's
``exercises``; choose with ``--impl exercises`` or ``SAMPLING_COURSE_IMPL=exercises``.
``--exercise NAME`` selects the tests marked ``@pytest.mark.exercise(NAME)``; test files
whose text marks none of the chosen exercises are not even imported (so the marker must
be written in the test file, with the name as a string).

A stub that still raises ``NotImplementedError`` is reported on one line,
``<stub>: not implemented yet``, instead of as a failure with a traceback.

With ``--impl exercises`` a test that runs past ``--test-timeout`` seconds (60 by default,
or $SAMPLING_COURSE_TEST_TIMEOUT) is stopped and reported on one line, ``took longer than
60 s``; the rest of that exercise's tests are skipped, so a loop that never ends costs
one wait, not one per test.

pyproject.toml loads this module with ``-p sampling_course.grading.pytest_plugin``.
"""

from __future__ import annotations

import argparse
import ast
import os
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest
import torch

from sampling_course.implementation import IMPLS, find_checkout, stale_install_message
from sampling_course.grading.time_limit import TookTooLong, time_limit

NOT_IMPLEMENTED = "not implemented"
TOOK_TOO_LONG = "took too long"  # the key in report.user_properties; its value is the limit in seconds
TIMEOUT_ENV = "SAMPLING_COURSE_TEST_TIMEOUT"
DEFAULT_TEST_TIMEOUT = 60.0

_timeout_key = pytest.StashKey[float]()
_slow_exercises_key = pytest.StashKey[set]()
_threads_key = pytest.StashKey[int]()


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
    # One torch thread unless OMP_NUM_THREADS asks for more: the stand-in's operations are far too
    # small to gain from several, and on a busy machine each parallel operation waits for a free
    # core (measured on 2 shared cores: the suite took 3.6x the CPU time with 2 threads).
    config.stash[_threads_key] = torch.get_num_threads()
    try:
        threads = max(1, int(os.environ.get("OMP_NUM_THREADS") or 1))
    except ValueError:
        threads = 1
    torch.set_num_threads(threads)


def pytest_unconfigure(config: pytest.Config) -> None:
    # A check runs inside the caller's process (a notebook kernel): give it its threads back.
    if _threads_key in config.stash:
        torch.set_num_threads(config.stash[_threads_key])


def pytest_report_header(config: pytest.Config) -> str:
    return f"sampling-course: testing {config.getoption('--impl')}/"


@cache
def _marked_exercises(path: Path, mtime_ns: int) -> frozenset[str] | None:
    """The exercise names (lower case) that the test file ``path`` marks; None when one is computed."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        return None  # pytest will collect it and report the error
    names = set()
    for node in ast.walk(tree):
        # pytest.mark.exercise(...) or mark.exercise(...), on a test or in pytest.param(marks=...)
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "exercise"):
            continue
        owner = node.func.value
        if not ((isinstance(owner, ast.Attribute) and owner.attr == "mark") or (isinstance(owner, ast.Name) and owner.id == "mark")):
            continue
        if not (node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            return None  # a computed name: cannot tell without importing the file
        names.add(node.args[0].value.lower())
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
    if not wanted:
        return
    keep, drop = [], []
    for item in items:
        names = {m.args[0].lower() for m in item.iter_markers("exercise")}
        (keep if names & wanted else drop).append(item)
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
        pytest.skip(f"not run: an earlier test of {', '.join(sorted(names))} took longer than {seconds:g} s")


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
    if report.failed and call.excinfo is not None and call.excinfo.errisinstance(NotImplementedError):
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
    if report.failed and any(key == TOOK_TOO_LONG for key, _ in report.user_properties):
        return TOOK_TOO_LONG, "T", "TOOK TOO LONG"
    return None


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
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
