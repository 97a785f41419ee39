"""Run the grading tests in this process and summarise them per exercise.

The tests in ``tests/`` are the single source of truth. ``run_checks`` runs them with
pytest *in this process* (so a class defined in a notebook cell can be checked, and the
reference models stay loaded between checks) and turns the per-test reports into one
``Result`` per exercise (see ``sampling_course.grading.results``).

Each check imports the implementation under test afresh, so edits to ``exercises/``
are picked up without restarting the kernel; the modules that were imported before
are put back afterwards, so a check never disturbs the caller's own imports.
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys
from collections.abc import Sequence
from contextlib import nullcontext, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from sampling_course.grading.depends import RootRecorder, import_closure
from sampling_course.grading.course import EXERCISES, Exercise, get_exercise
from sampling_course.implementation import IMPLS, StaleInstallError, find_checkout, stale_install_message
# The keys the course's pytest plugin puts in report.user_properties when a stub raised
# NotImplementedError or a test ran out of time (one source of truth: the plugin).
from sampling_course.grading.pytest_plugin import COURSE_BROKEN as _COURSE_BROKEN_KEY
from sampling_course.grading.pytest_plugin import NOT_IMPLEMENTED as _NOT_IMPLEMENTED_KEY
from sampling_course.grading.pytest_plugin import TOOK_TOO_LONG as _TOOK_TOO_LONG_KEY
from sampling_course.grading.pytest_plugin import resolve_test_timeout
from sampling_course.grading.sandbox import (NESTED_RUN_OPTIONS, isolated_package, isolated_tests, nested_run_env, substituted,
                                             terminal_like)
from sampling_course.grading.results import FAILING, CheckReport, Result, TestOutcome, summarize

# A failure message is cut to this many lines (of at most _MAX_LINE_CHARS): enough for
# "what differs and by how much", short enough for a notebook cell.
_MAX_MESSAGE_LINES = 6
_MAX_LINE_CHARS = 160


class TestsNotFoundError(FileNotFoundError):
    """The course's tests/ directory is nowhere to be found."""

    __test__ = False  # not a pytest test class, despite the name


def tests_dir() -> Path:
    """The course's ``tests/`` directory (override with ``SAMPLING_COURSE_TESTS``).

    Next to the ``sampling_course`` package in a checkout (an editable install), else in
    the checkout the working directory lies in (after ``pip install .``, which copies the
    package but not the tests).
    """
    candidates = []
    if os.environ.get("SAMPLING_COURSE_TESTS"):
        candidates.append(Path(os.environ["SAMPLING_COURSE_TESTS"]))
    # This file is sampling_course/grading/runner.py: the package's folder is two levels up.
    candidates.append(Path(__file__).resolve().parents[2] / "tests")
    checkout = find_checkout()
    if checkout is not None:
        candidates.append(checkout / "tests")
    for candidate in candidates:
        if (candidate / "conftest.py").is_file():
            return candidate
    raise TestsNotFoundError(
        "cannot find the course's tests/ directory (looked in "
        + ", ".join(str(c) for c in candidates)
        + "). Install the course from its source checkout with `pip install -e .`, "
        "or point SAMPLING_COURSE_TESTS at the tests/ directory."
    )


def _short_message(report: Any) -> str:
    """The exception line(s) of a failed or skipped report, trimmed for display."""
    longrepr = report.longrepr
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    elif isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, lineno, reason)
        text = str(longrepr[2])
    else:
        text = str(longrepr or "")
        # A plain-text traceback: its last non-empty line is the exception.
        if "\n" in text and not report.skipped:
            text = [line for line in text.splitlines() if line.strip()][-1]
    text = text.removeprefix("Skipped: ").removeprefix("AssertionError: ")
    # Drop pytest's "+  where x = <repr of a whole model>" introspection: noise for a learner.
    lines = [line.rstrip()[:_MAX_LINE_CHARS] for line in text.splitlines()
             if line.strip() and not line.lstrip().startswith("+ ")]
    # After a test's own message, pytest repeats the failed expression ("assert not [...]"): drop it.
    rewritten = next((i for i, line in enumerate(lines) if line.startswith("assert ")), 0)
    if rewritten > 0:
        lines = lines[:rewritten]
    if len(lines) > _MAX_MESSAGE_LINES:
        lines = lines[:_MAX_MESSAGE_LINES] + ["..."]
    return "\n".join(lines)


class _Collector:
    """A pytest plugin that records which tests grade which exercise, and how each went.

    Once a test of an exercise has run into an unfilled stub, the exercise's remaining
    tests would only run into it again (many first compute an expensive expected value,
    such as a Hugging Face beam search): they are counted as waiting for that stub
    without being run. A check of untouched stubs thus takes seconds, not minutes.
    """

    def __init__(self, package: str = "") -> None:
        self.package = package
        self.roots = RootRecorder(package)  # the package's modules asked for, per test file
        self.folder: Path | None = None  # the package's folder, once the run has imported it
        self.exercises: dict[str, tuple[str, ...]] = {}
        self.outcomes: dict[str, TestOutcome] = {}
        self.collection_errors: list[str] = []
        self.stub_of: dict[str, str] = {}  # exercise (lower case) -> the stub one of its tests ran into
        self.presumed: dict[str, str] = {}  # nodeid -> stub, for tests not run because of it
        self.broken: list[str] = []  # one-line messages: files of the course itself that are damaged

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: Any) -> None:
        names = [name.lower() for name in self.exercises.get(item.nodeid, ())]
        if names and all(name in self.stub_of for name in names):
            self.presumed[item.nodeid] = stub = self.stub_of[names[0]]
            pytest.skip(f"{stub}: not implemented yet")

    # trylast: see the items after conftest.py has applied --exercise.
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        for item in items:
            names = tuple(m.args[0] for m in item.iter_markers("exercise") if m.args)
            self.exercises[item.nodeid] = names

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.collection_errors.append(f"{report.nodeid or 'collection'}: {_short_message(report)}")

    def pytest_collection_finish(self) -> None:
        self.roots.enter(None)  # what collection loaded counts for every exercise

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: Any) -> Any:
        self.roots.enter(item.nodeid.split("::")[0])  # a test's requests count for its file
        yield
        self.roots.enter(None)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any) -> Any:
        shared = fixturedef.scope in ("session", "package")  # outlives its file: counts for every exercise
        bucket = self.roots.bucket
        if shared:
            self.roots.look()
            self.roots.bucket = self.roots.shared
        yield
        if shared:
            self.roots.look()
            self.roots.bucket = bucket

    def pytest_sessionfinish(self) -> None:
        root = sys.modules.get(self.package)
        folder = getattr(root, "__file__", None)
        self.folder = Path(folder).parent if folder else None

    def depends(self) -> dict[str, frozenset[str]]:
        """Per exercise (lower case), the package's files its verdict depends on (see ``grading.depends``)."""
        if self.folder is None:
            return {}
        sources = {str(p.relative_to(self.folder)): p.read_bytes() for p in sorted(self.folder.rglob("*.py"))
                   if p.is_file() and "__pycache__" not in p.parts}
        files_of: dict[str, set[str]] = {}
        for nodeid, names in self.exercises.items():
            for name in names:
                files_of.setdefault(name.lower(), set()).add(nodeid.split("::")[0])
        found, parsed = {}, {}
        for name, test_files in files_of.items():
            closure = import_closure(self.package, self.roots.roots(test_files), sources, parsed)
            found[name] = frozenset(sources if closure is None else closure)
        return found

    def pytest_runtest_logreport(self, report: Any) -> None:
        previous = self.outcomes.get(report.nodeid)
        names = self.exercises.get(report.nodeid, ())
        presumed = self.presumed.get(report.nodeid)
        if presumed is not None:
            if previous is None:
                self.outcomes[report.nodeid] = TestOutcome(
                    report.nodeid, names, "not implemented", f"{presumed}: not implemented yet", presumed)
            return
        broken = next((value for key, value in report.user_properties if key == _COURSE_BROKEN_KEY), None)
        if report.failed and broken is not None:
            if broken not in self.broken:
                self.broken.append(broken)
            return  # not the learner's: no outcome for the exercise
        if report.failed:
            stub = next((value for key, value in report.user_properties if key == _NOT_IMPLEMENTED_KEY), None)
            if stub is not None:
                for name in names:
                    self.stub_of.setdefault(name.lower(), stub)
            if previous is not None and previous.outcome in ("failed", "not implemented", "took too long"):
                return  # keep the first failure (a teardown error after a failed call adds nothing)
            if stub is not None:
                outcome = TestOutcome(report.nodeid, names, "not implemented", f"{stub}: not implemented yet", stub)
            elif any(key == _TOOK_TOO_LONG_KEY for key, _ in report.user_properties):
                outcome = TestOutcome(report.nodeid, names, "took too long", str(report.longrepr))
            else:
                outcome = TestOutcome(report.nodeid, names, "failed", _short_message(report))
            self.outcomes[report.nodeid] = outcome
        elif report.skipped and previous is None:
            self.outcomes[report.nodeid] = TestOutcome(report.nodeid, names, "skipped", _short_message(report))
        elif report.passed and report.when == "call" and previous is None:
            self.outcomes[report.nodeid] = TestOutcome(report.nodeid, names, "passed")


def _unique_exercises(names: Sequence[str | Exercise] | str | None) -> list[Exercise]:
    if names is None:
        return list(EXERCISES)
    if isinstance(names, (str, Exercise)):
        names = [names]
    chosen = [get_exercise(n) for n in names]
    order = {e.name: i for i, e in enumerate(EXERCISES)}
    return sorted(dict.fromkeys(chosen), key=lambda e: order[e.name])


def run_report(
    names: Sequence[str | Exercise] | str | None, impl: str = "exercises", obj: Any = None, *, diagnose: bool = True,
    device: str | None = None, threads: int | None = None, recompute_oracle: bool = False,
) -> CheckReport:
    """Run the selected exercises' tests once, in-process, and summarise them per exercise.

    With ``diagnose``, a failing exercise whose output matches one of its planted classic
    mistakes says which (see ``grading.diagnosis``).

    Raises ``TestsNotFoundError`` when there are no tests to run and ``StaleInstallError``
    when ``impl`` would be imported from an installed copy instead of the checkout.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    exercises = _unique_exercises(names)
    if obj is not None and len(exercises) != 1:
        raise ValueError("check(name, obj=...) checks one object: name exactly one exercise")

    tests = tests_dir().resolve()
    # After `pip install .`, Python imports a copy of exercises/ made at install time: grading
    # it would ignore every edit since.
    stale = stale_install_message(impl, tests.parent)
    if stale:
        raise StaleInstallError(stale)
    # A learner's loop that never ends is stopped, in the notebook as on the command line.
    args = [str(tests), "--impl", impl, "--test-timeout", str(resolve_test_timeout(None, "exercises"))]
    for exercise in exercises:
        args += ["--exercise", exercise.name]
    if device is not None:
        args += ["--device", str(device)]
    if threads is not None:
        args += ["--threads", str(threads)]
    if recompute_oracle:
        args += ["--recompute-oracle"]
    # Quiet, no cache files, and nothing that changes process-wide state the caller (maybe
    # an outer pytest session) relies on: faulthandler and random reseeding are left off.
    args += ["-q", *NESTED_RUN_OPTIONS, "--continue-on-collection-errors"]  # one broken test file must not hide the others

    from sampling_course.files import NOTICES

    collector = _Collector(impl)
    output = io.StringIO()
    first_notice = len(NOTICES)
    # PYTEST_ADDOPTS could change what runs; PYTEST_CURRENT_TEST is deleted by the inner
    # session's last teardown and belongs to an outer session, if any: put it back.
    env = nested_run_env(PYTEST_ADDOPTS=None, PYTEST_CURRENT_TEST=os.environ.get("PYTEST_CURRENT_TEST"))
    with isolated_package(impl), isolated_tests(tests), env, terminal_like():
        with substituted(impl, exercises[0], obj) if obj is not None else nullcontext():
            # The terminal reporter writes to sys.stdout as it is at configure time: our buffer.
            with redirect_stdout(output), redirect_stderr(output):
                with collector.roots.recording():
                    exit_code = pytest.main(args, plugins=[collector])

    notices = NOTICES[first_notice:]  # caches rebuilt during the run: said in the report, since the run's output is kept
    if exit_code == pytest.ExitCode.INTERRUPTED and not collector.collection_errors:
        raise KeyboardInterrupt
    if collector.broken:
        # Infrastructure, never the learner's mistake: no verdict, no hint, only what to fix.
        return CheckReport([], impl=impl, error=f"the course's own files are broken (not your code): {collector.broken[0]}",
                           notices=notices, broken=True)
    if exit_code in (pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR):
        tail = "\n".join(output.getvalue().strip().splitlines()[-25:])
        raise RuntimeError(f"pytest could not run the checks (exit code {int(exit_code)}):\n{tail}")

    per_exercise: dict[str, list[TestOutcome]] = {e.name.lower(): [] for e in exercises}
    for nodeid, names_of_test in collector.exercises.items():
        outcome = collector.outcomes.get(nodeid)
        if outcome is None:  # collected but never reported (should not happen); count it as not run
            outcome = TestOutcome(nodeid, names_of_test, "skipped", "did not run")
        for name in {n.lower() for n in names_of_test}:
            if name in per_exercise:
                per_exercise[name].append(outcome)
    results = [summarize(e, per_exercise[e.name.lower()]) for e in exercises]
    if diagnose and any(r.status == FAILING for r in results):
        from sampling_course.grading.diagnosis import describe_match  # imports torch: only when needed

        described = {r.name: describe_match(r.exercise, impl, obj) for r in results if r.status == FAILING}
        # A named mistake comes with its own why (and fix): the exercise's first, general hint
        # would only point elsewhere, so it gives way.
        results = [
            dataclasses.replace(r, mistake=described[r.name], hint=None if described[r.name] else r.hint)
            if r.name in described else r
            for r in results
        ]
    depends = collector.depends()
    imported = {e.name: depends[e.name.lower()] for e in exercises if e.name.lower() in depends}
    return CheckReport(results, impl=impl, collection_errors=collector.collection_errors, notices=notices,
                       imported=imported)


def run_checks(names: Sequence[str] | str | None = None, impl: str = "exercises", *, obj: Any = None) -> list[Result]:
    """Run the tests of the named exercises (all when None) against ``impl``; one ``Result`` each.

    ``impl`` is ``"exercises"`` (the learner's code) or ``"solutions"``. With ``obj``,
    that one exercise is checked with ``obj`` in place of the package's own object
    (see ``substituted``). Results come in course order.
    """
    return run_report(names, impl, obj).results
