"""Check exercises from a notebook or the command line: ``check``, ``progress``, ``hint``, ``compare``.

The tests in ``tests/`` are the single source of truth. ``run_checks`` runs them with
pytest *in this process* (so a class defined in a notebook cell can be checked, and the
reference models stay loaded between checks) and turns the per-test reports into one
``Result`` per exercise:

* ``done``: every test that ran passed;
* ``not implemented yet``: a stub still raises ``NotImplementedError``;
* ``failing``: a test failed; the result carries the first failure's message and a hint;
* ``no tests yet``: no test carries that exercise's marker (or every one was skipped).

Each check imports the implementation under test afresh, so edits to ``exercises/``
are picked up without restarting the kernel; the modules that were imported before
are put back afterwards, so a check never disturbs the caller's own imports.

CLI wire-up: ``sampling-course check|progress|hint ARGS`` call ``cli_check(ARGS)``,
``cli_progress(ARGS)`` and ``cli_hint(ARGS)``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import io
import os
import pkgutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal
from unittest import mock

import pytest
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from sampling_course.course import EXERCISES, Exercise, UnknownExerciseError, get_exercise

__all__ = [
    "DONE",
    "NOT_IMPLEMENTED_YET",
    "FAILING",
    "NO_TESTS_YET",
    "Result",
    "CheckReport",
    "Comparison",
    "run_checks",
    "check",
    "progress",
    "hint",
    "compare",
    "substituted",
    "tests_dir",
    "cli_check",
    "cli_progress",
    "cli_hint",
]

IMPLS = ("solutions", "exercises")


def resolve_impl(impl: str | None = None) -> str:
    """The implementation to grade: ``impl``, else $SAMPLING_COURSE_IMPL, else ``exercises``."""
    impl = impl or os.environ.get("SAMPLING_COURSE_IMPL") or "exercises"
    if impl not in IMPLS:
        raise ValueError(f"impl (or SAMPLING_COURSE_IMPL) must be one of {', '.join(IMPLS)}, got {impl!r}")
    return impl


DONE = "done"
NOT_IMPLEMENTED_YET = "not implemented yet"
FAILING = "failing"
NO_TESTS_YET = "no tests yet"

# The key the course's pytest plugin puts in report.user_properties when a stub raised
# NotImplementedError (one source of truth: sampling_course.pytest_plugin).
from sampling_course.pytest_plugin import NOT_IMPLEMENTED as _NOT_IMPLEMENTED_KEY  # noqa: E402

_STYLE = {DONE: "green", NOT_IMPLEMENTED_YET: "yellow", FAILING: "red", NO_TESTS_YET: "blue"}
_SYMBOL = {DONE: "✓", NOT_IMPLEMENTED_YET: "…", FAILING: "✗", NO_TESTS_YET: "·"}

# A failure message is cut to this many lines (of at most _MAX_LINE_CHARS): enough for
# "what differs and by how much", short enough for a notebook cell.
_MAX_MESSAGE_LINES = 6
_MAX_LINE_CHARS = 160


# ---------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TestOutcome:
    """What happened to one test, all phases (setup, call, teardown) taken together."""

    __test__ = False  # not a pytest test class, despite the name

    nodeid: str
    exercises: tuple[str, ...]
    outcome: Literal["passed", "failed", "not implemented", "skipped"]
    message: str = ""
    stub: str = ""


@dataclass(frozen=True)
class Result:
    """The state of one exercise after running its tests."""

    exercise: Exercise
    status: str  # DONE, NOT_IMPLEMENTED_YET, FAILING or NO_TESTS_YET
    passed: int = 0
    total: int = 0  # tests collected for this exercise, skipped ones included
    failed: int = 0
    not_implemented: int = 0
    skipped: int = 0
    message: str | None = None  # the first failure's message, when failing
    failing_test: str | None = None  # that test's id, e.g. "test_transformer.py::test_x[tiny]"
    stubs: tuple[str, ...] = ()  # stubs that still raise NotImplementedError
    hint: str | None = None  # the exercise's first hint, when failing

    @property
    def name(self) -> str:
        return self.exercise.name

    @property
    def done(self) -> bool:
        return self.status == DONE

    @property
    def ran(self) -> int:
        """Tests that ran (were not skipped)."""
        return self.total - self.skipped

    def __repr__(self) -> str:
        return f"Result({self.name!r}, {self.status!r}, passed={self.passed}/{self.ran})"


@dataclass
class CheckReport:
    """The results of one check run; true when every exercise checked is done.

    Iterate over it (or index it by position or exercise name) for the ``Result``\\s.
    """

    results: list[Result]
    impl: str = "exercises"
    collection_errors: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.results) and all(r.done for r in self.results)

    def __iter__(self) -> Iterator[Result]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, key: int | str) -> Result:
        if isinstance(key, str):
            wanted = get_exercise(key).name
            for result in self.results:
                if result.name == wanted:
                    return result
            raise KeyError(f"{wanted} was not checked in this run")
        return self.results[key]

    @property
    def n_done(self) -> int:
        return sum(r.done for r in self.results)

    @property
    def ok(self) -> bool:
        """No exercise checked is failing or unimplemented (``no tests yet`` is fine)."""
        return not any(r.status in (FAILING, NOT_IMPLEMENTED_YET) for r in self.results)

    def __repr__(self) -> str:
        names = ", ".join(f"{r.name}: {r.status}" for r in self.results[:3])
        more = f", ... ({len(self.results) - 3} more)" if len(self.results) > 3 else ""
        return f"<CheckReport {self.impl}/: {self.n_done}/{len(self.results)} done; {names}{more}>"


def summarize(exercise: Exercise, outcomes: Sequence[TestOutcome]) -> Result:
    """One exercise's ``Result`` from the outcomes of the tests that grade it.

    A real failure outranks an unfilled stub (it is what the learner must look at), and
    a stub outranks passes: an exercise is done only when nothing failed and something ran.
    """
    counts = {kind: sum(o.outcome == kind for o in outcomes) for kind in ("passed", "failed", "not implemented", "skipped")}
    stubs = tuple(dict.fromkeys(o.stub for o in outcomes if o.outcome == "not implemented" and o.stub))
    common = dict(
        exercise=exercise,
        passed=counts["passed"],
        total=len(outcomes),
        failed=counts["failed"],
        not_implemented=counts["not implemented"],
        skipped=counts["skipped"],
        stubs=stubs,
    )
    if counts["failed"]:
        first = next(o for o in outcomes if o.outcome == "failed")
        return Result(status=FAILING, message=first.message, failing_test=first.nodeid, hint=exercise.hints[0], **common)
    if counts["not implemented"]:
        return Result(status=NOT_IMPLEMENTED_YET, **common)
    if counts["passed"]:
        return Result(status=DONE, **common)
    skipped = next((o.message for o in outcomes if o.outcome == "skipped"), None)
    return Result(status=NO_TESTS_YET, message=skipped, **common)


# ---------------------------------------------------------------------------------------
# Running the tests in-process
# ---------------------------------------------------------------------------------------


def tests_dir() -> Path:
    """The course's ``tests/`` directory (override with ``SAMPLING_COURSE_TESTS``)."""
    import sampling_course

    candidates = []
    if os.environ.get("SAMPLING_COURSE_TESTS"):
        candidates.append(Path(os.environ["SAMPLING_COURSE_TESTS"]))
    candidates.append(Path(sampling_course.__file__).resolve().parent.parent / "tests")
    for candidate in candidates:
        if (candidate / "conftest.py").is_file():
            return candidate
    raise FileNotFoundError(
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
    """A pytest plugin that records which tests grade which exercise, and how each went."""

    def __init__(self) -> None:
        self.exercises: dict[str, tuple[str, ...]] = {}
        self.outcomes: dict[str, TestOutcome] = {}
        self.collection_errors: list[str] = []

    # trylast: see the items after conftest.py has applied --exercise.
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        for item in items:
            names = tuple(m.args[0] for m in item.iter_markers("exercise") if m.args)
            self.exercises[item.nodeid] = names

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.collection_errors.append(f"{report.nodeid or 'collection'}: {_short_message(report)}")

    def pytest_runtest_logreport(self, report: Any) -> None:
        previous = self.outcomes.get(report.nodeid)
        names = self.exercises.get(report.nodeid, ())
        if report.failed:
            stub = next((value for key, value in report.user_properties if key == _NOT_IMPLEMENTED_KEY), None)
            if previous is not None and previous.outcome in ("failed", "not implemented"):
                return  # keep the first failure (a teardown error after a failed call adds nothing)
            if stub is not None:
                outcome = TestOutcome(report.nodeid, names, "not implemented", f"{stub}: not implemented yet", stub)
            else:
                outcome = TestOutcome(report.nodeid, names, "failed", _short_message(report))
            self.outcomes[report.nodeid] = outcome
        elif report.skipped and previous is None:
            self.outcomes[report.nodeid] = TestOutcome(report.nodeid, names, "skipped", _short_message(report))
        elif report.passed and report.when == "call" and previous is None:
            self.outcomes[report.nodeid] = TestOutcome(report.nodeid, names, "passed")


@contextmanager
def _isolated_modules(ours: Callable[[str, ModuleType], bool]) -> Iterator[None]:
    """Inside the block, modules for which ``ours(name, module)`` holds are imported afresh;
    afterwards the caller's own modules are put back and the fresh ones dropped."""
    saved = {name: module for name, module in list(sys.modules.items()) if module is not None and ours(name, module)}
    for name in saved:
        del sys.modules[name]
    importlib.invalidate_caches()
    try:
        yield
    finally:
        for name, module in list(sys.modules.items()):
            if module is not None and ours(name, module):
                del sys.modules[name]
        sys.modules.update(saved)


def _isolated_package(package: str):
    """Import ``package`` afresh inside the block; put the caller's modules back afterwards.

    Fresh: a learner's edits to exercises/*.py count without restarting the kernel.
    Put back: objects the caller already holds (a model, a class) keep working, and an
    outer pytest session that imported ``solutions`` is not disturbed by a nested check.
    """
    return _isolated_modules(lambda name, _: name == package or name.startswith(package + "."))


def _isolated_tests(tests: Path):
    """The same for conftest.py and the test modules: each check runs the tests on disk,
    and a nested run never touches the module objects of an outer pytest session."""

    def ours(name: str, module: ModuleType) -> bool:
        file = getattr(module, "__file__", None)
        if not file or not os.path.basename(file).startswith(("test_", "conftest")):
            return False  # cheap test first: sys.modules holds thousands of modules
        return Path(file).resolve().parent == tests

    return _isolated_modules(ours)


def _import_all(package: str) -> list[ModuleType]:
    """Every module of ``package`` that imports; broken ones are left for the tests to report."""
    root = importlib.import_module(package)
    modules = [root]
    for info in pkgutil.iter_modules(root.__path__):
        try:
            modules.append(importlib.import_module(f"{package}.{info.name}"))
        except Exception:  # a learner's syntax error: the tests will say so, with a message
            continue
    return modules


def resolve_target(exercise: Exercise, package: str) -> tuple[Any, str]:
    """``(owner, attribute)`` of the object an exercise asks for, in ``package``.

    ``owner`` is the module (for ``LayerNorm``) or the class (for
    ``TransformerSampler.sample_top_p``) whose attribute ``check(obj=...)`` replaces.
    """
    owner: Any = importlib.import_module(f"{package}.{exercise.module}")
    *path, attr = exercise.target.split(".")
    for part in path:
        owner = getattr(owner, part)
    if attr not in vars(owner):
        raise LookupError(f"{package}.{exercise.module} has no {exercise.target} (needed by exercise {exercise.name})")
    return owner, attr


def _replacement(obj: Any, owner: Any, attr: str) -> Any:
    """``obj`` in the form ``owner.attr`` needs: a staticmethod for a static method, and so on."""
    original = vars(owner)[attr]
    if isinstance(owner, ModuleType):
        return obj
    if inspect.ismethod(obj):  # a bound method: use the function underneath
        obj = obj.__func__
    if isinstance(obj, type) and not isinstance(original, type):
        # The learner passed their whole class for one method: take that method from it.
        try:
            obj = inspect.getattr_static(obj, attr)
        except AttributeError:
            raise TypeError(f"{obj.__name__} has no attribute {attr!r} to check") from None
    if isinstance(original, staticmethod) and not isinstance(obj, staticmethod):
        return staticmethod(obj)
    if isinstance(original, classmethod) and not isinstance(obj, (classmethod, staticmethod)):
        return classmethod(obj)
    return obj


@contextmanager
def substituted(package: str, exercise: Exercise | str, obj: Any) -> Iterator[None]:
    """Inside the block, ``package`` uses ``obj`` for the exercise's object.

    A module-level object (a class such as ``LayerNorm``) is replaced in every module
    of the package that holds it, so ``DemoTransformer`` builds its blocks from ``obj``.
    A method (``Beams.generate``, the static ``TransformerSampler.sample_top_p``) is
    replaced on its class, wrapped in ``staticmethod`` when the original was one.
    Everything is restored on exit.
    """
    exercise = get_exercise(exercise)
    modules = _import_all(package)
    owner, attr = resolve_target(exercise, package)
    original = vars(owner)[attr]
    replacement = _replacement(obj, owner, attr)
    owners = [m for m in modules if vars(m).get(attr, None) is original] if isinstance(owner, ModuleType) else [owner]
    if owner not in owners:
        owners.append(owner)
    saved = [(o, vars(o)[attr]) for o in owners]
    try:
        for o in owners:
            setattr(o, attr, replacement)
        yield
    finally:
        for o, value in saved:
            setattr(o, attr, value)


@contextmanager
def _scoped_env(**values: str | None) -> Iterator[None]:
    """Set (or, for None, remove) environment variables inside the block only."""
    # patch.dict restores the whole environment on exit, whatever the block changed.
    with mock.patch.dict(os.environ):
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield


@contextmanager
def _terminal_like() -> Iterator[None]:
    """Inside the block, libraries that detect Jupyter behave as in a terminal.

    The nested test session runs inside the notebook's kernel, where ``tqdm.auto`` would
    draw widgets and rich would render HTML: both bypass pytest's capture, so they would
    leak into the cell and hide output from the tests that check it. Restored on exit.
    """
    patches: list[tuple[Any, str, Any]] = []
    try:
        import tqdm.asyncio
        import tqdm.auto
        import tqdm.autonotebook
        import tqdm.std

        patches += [
            (tqdm.auto, "tqdm", tqdm.asyncio.tqdm), (tqdm.auto, "trange", tqdm.asyncio.trange),
            (tqdm.autonotebook, "tqdm", tqdm.std.tqdm), (tqdm.autonotebook, "trange", tqdm.std.trange),
        ]
    except ImportError:
        pass
    import rich.console

    if hasattr(rich.console, "_is_jupyter"):
        patches.append((rich.console, "_is_jupyter", lambda: False))
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches if hasattr(owner, name)]
    try:
        for owner, name, value in patches:
            if hasattr(owner, name):
                setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def _unique_exercises(names: Sequence[str | Exercise] | str | None) -> list[Exercise]:
    if names is None:
        return list(EXERCISES)
    if isinstance(names, (str, Exercise)):
        names = [names]
    chosen = [get_exercise(n) for n in names]
    order = {e.name: i for i, e in enumerate(EXERCISES)}
    return sorted(dict.fromkeys(chosen), key=lambda e: order[e.name])


def _run(names: Sequence[str | Exercise] | str | None, impl: str = "exercises", obj: Any = None) -> CheckReport:
    """Run the selected exercises' tests once, in-process, and summarise them per exercise."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    exercises = _unique_exercises(names)
    if obj is not None and len(exercises) != 1:
        raise ValueError("check(name, obj=...) checks one object: name exactly one exercise")

    tests = tests_dir().resolve()
    args = [str(tests), "--impl", impl]
    for exercise in exercises:
        args += ["--exercise", exercise.name]
    # Quiet, no cache files, and nothing that changes process-wide state the caller (maybe
    # an outer pytest session) relies on: faulthandler and random reseeding are left off.
    args += ["-q", "-p", "no:cacheprovider", "-p", "no:faulthandler", "-p", "no:randomly",
             "--continue-on-collection-errors"]  # one broken test file must not hide the others

    collector = _Collector()
    output = io.StringIO()
    # PYTEST_ADDOPTS could change what runs; PYTEST_CURRENT_TEST is deleted by the inner
    # session's last teardown and belongs to an outer session, if any: put it back.
    env = _scoped_env(PYTEST_ADDOPTS=None, PYTEST_CURRENT_TEST=os.environ.get("PYTEST_CURRENT_TEST"))
    with _isolated_package(impl), _isolated_tests(tests), env, _terminal_like():
        with substituted(impl, exercises[0], obj) if obj is not None else nullcontext():
            # The terminal reporter writes to sys.stdout as it is at configure time: our buffer.
            with redirect_stdout(output), redirect_stderr(output):
                exit_code = pytest.main(args, plugins=[collector])

    if exit_code == pytest.ExitCode.INTERRUPTED and not collector.collection_errors:
        raise KeyboardInterrupt
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
    return CheckReport(results, impl=impl, collection_errors=collector.collection_errors)


def run_checks(names: Sequence[str] | str | None = None, impl: str = "exercises", *, obj: Any = None) -> list[Result]:
    """Run the tests of the named exercises (all when None) against ``impl``; one ``Result`` each.

    ``impl`` is ``"exercises"`` (the learner's code) or ``"solutions"``. With ``obj``,
    that one exercise is checked with ``obj`` in place of the package's own object
    (see ``substituted``). Results come in course order.
    """
    return _run(names, impl, obj).results


# ---------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------


def _status_text(result: Result) -> Text:
    return Text(f"{_SYMBOL[result.status]} {result.status}", style=_STYLE[result.status])


def _tests_text(result: Result) -> str:
    if result.total == 0:
        return "-"
    text = f"{result.passed}/{result.ran}"
    return text + (f" ({result.skipped} skipped)" if result.skipped else "")


def render_result(result: Result) -> Panel:
    """A panel for one exercise: green done, yellow not implemented yet, red failing."""
    ex = result.exercise
    body: list[Any] = []
    if result.status == DONE:
        tests = f"All {result.ran} tests" if result.ran != 1 else "The 1 test"
        body.append(Text(f"✓ {tests} passed.", style="bold green"))
        if result.skipped:
            body.append(Text(f"({result.skipped} skipped, e.g. the real-GPT-2 tier when its weights are not cached)", style="dim"))
    elif result.status == NOT_IMPLEMENTED_YET:
        stubs = ", ".join(result.stubs) or ex.target
        body.append(Text(f"… Not implemented yet: {stubs}", style="bold yellow"))
        body.append(Text(f"Fill it in ({ex.location}), then run the check again."))
        body.append(Text(f"Task: {ex.task}", style="dim"))
        if result.passed:
            body.append(Text(f"{result.passed}/{result.ran} tests already pass.", style="dim"))
    elif result.status == FAILING:
        body.append(Text(f"✗ {result.failed} of {result.ran} tests failing", style="bold red")
                    + Text(f"  ({result.passed} passed)", style="dim"))
        if result.failing_test:
            body.append(Text(f"First failure: {result.failing_test}", style="red"))
        if result.message:
            body.append(Text(_indent(result.message)))
        if result.hint:
            body.append(Text("Hint: ", style="bold") + Text(result.hint))
        body.append(Text(f'More hints: hint("{ex.name}")  or  sampling-course hint {ex.name} --level 2', style="dim"))
    else:
        body.append(Text("· No tests for this exercise yet.", style="bold blue"))
        if result.message:
            body.append(Text(f"(all {result.total} tests skipped: {result.message})", style="dim"))
    title = f"[bold]{ex.name}[/]  [dim]part {ex.part}: {ex.part_title}[/]"
    return Panel(Group(*body), title=title, title_align="left", border_style=_STYLE[result.status], expand=False)


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def render_table(results: Sequence[Result], title: str | None = None) -> Table:
    """Every result as a row under its part's heading, in course order."""
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False, box=None, show_header=False)
    table.add_column("symbol", no_wrap=True)
    table.add_column("exercise", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("tests", justify="right", no_wrap=True, style="dim")
    part = None
    for result in results:
        if result.exercise.part != part:
            part = result.exercise.part
            table.add_row("", Text(f"Part {part}: {result.exercise.part_title}", style="bold"), "", "")
        style = _STYLE[result.status]
        table.add_row(
            Text(f"  {_SYMBOL[result.status]}", style=style),
            result.name,
            Text(result.status, style=style),
            _tests_text(result),
        )
    return table


def _bar(done: int, total: int, width: int = 25) -> Text:
    """A plain-text progress bar; it reads the same in a terminal, a notebook and a log file."""
    filled = round(width * done / total) if total else 0
    return Text("[", style="dim") + Text("#" * filled, style="green") + Text("-" * (width - filled), style="dim") + Text("]", style="dim")


def _next_up(results: Sequence[Result]) -> Result | None:
    """The first exercise to work on: one with tests that is not done, else one with no tests."""
    pending = [r for r in results if r.status in (FAILING, NOT_IMPLEMENTED_YET)]
    return pending[0] if pending else next((r for r in results if not r.done), None)


def render_progress(report: CheckReport | Sequence[Result]) -> Group:
    """The rustlings-style overview: a table of every exercise, a bar and 'N/M exercises done'."""
    results = list(report)
    n_done = sum(r.done for r in results)
    impl = report.impl if isinstance(report, CheckReport) else "exercises"
    parts: list[Any] = [render_table(results, title=f"Progress ({impl}/)")]
    parts.append(
        Text("Progress: ") + _bar(n_done, len(results))
        + Text(f" {n_done}/{len(results)} exercises done", style="bold green" if n_done == len(results) else "bold")
    )
    nxt = _next_up(results)
    if nxt is not None and nxt.status != NO_TESTS_YET:
        parts.append(Text(f"Next up: {nxt.name} ({nxt.status}): {nxt.exercise.task}", style=_STYLE[nxt.status]))
        parts.append(Text(f'  check("{nxt.name}")  ·  hint("{nxt.name}")  ·  sampling-course check {nxt.name}', style="dim"))
    elif results and n_done == len(results):
        parts.append(Text("Every exercise is done. Well done!", style="bold green"))
    if isinstance(report, CheckReport):
        parts.extend(_collection_warnings(report))
    return Group(*parts)


def _collection_warnings(report: CheckReport) -> list[Text]:
    return [Text(f"warning: a test file could not be collected: {error}", style="yellow") for error in report.collection_errors]


def render_report(report: CheckReport) -> Group:
    """One panel for one exercise; for several, the table plus the panel of the next one to fix."""
    results = list(report)
    parts: list[Any] = []
    if len(results) == 1:
        parts.append(render_result(results[0]))
    else:
        parts.append(render_table(results, title=f"Checked {len(results)} exercises ({report.impl}/)"))
        nxt = _next_up(results)
        if nxt is not None and nxt.status != NO_TESTS_YET:
            parts.append(render_result(nxt))
        n_done = sum(r.done for r in results)
        parts.append(Text(f"{n_done}/{len(results)} exercises done", style="bold"))
    parts.extend(_collection_warnings(report))
    return Group(*parts)


# ---------------------------------------------------------------------------------------
# Notebook entry points
# ---------------------------------------------------------------------------------------


def check(
    name: str | Sequence[str] | None = None,
    obj: Any = None,
    *,
    impl: str | None = None,
    display: bool = True,
    console: Console | None = None,
) -> CheckReport:
    """Run an exercise's tests and show the verdict: ``check("LayerNorm")``.

    ``name``: one exercise, a list of them, or None for all. ``obj``: a class or function
    defined in the notebook to check instead of the one in ``exercises/``, e.g.
    ``check("LayerNorm", obj=LayerNorm)`` or ``check("sample_top_p", obj=my_top_p)``.
    Returns a ``CheckReport``, true when every exercise checked is done.
    """
    report = _run(name, resolve_impl(impl), obj)
    if display:
        (console or Console()).print(render_report(report))
    return report


def progress(impl: str | None = None, *, display: bool = True, console: Console | None = None) -> CheckReport:
    """Check every exercise and show a table of where you are, like ``rustlings list``."""
    report = _run(None, resolve_impl(impl))
    if display:
        (console or Console()).print(render_progress(report))
    return report


# How many hints each exercise has revealed in this session, for hint(name) with no level.
_revealed: dict[str, int] = {}


def hint(name: str, level: int | Literal["all"] | None = None, *, console: Console | None = None) -> None:
    """Show a hint for an exercise: ``hint("LayerNorm")``.

    Without ``level``, each call reveals the next hint (1, then 2, then 3). ``level`` picks
    one (1 = gentle ... 3 = nearly the solution); ``level="all"`` shows all of them.
    """
    exercise = get_exercise(name)
    n = len(exercise.hints)
    if level is None:
        level = min(_revealed.get(exercise.name, 0) + 1, n)
    if level == "all":
        levels = list(range(1, n + 1))
    elif isinstance(level, int) and 1 <= level <= n:
        levels = [level]
    else:
        raise ValueError(f'level must be 1 to {n} or "all", got {level!r}')
    _revealed[exercise.name] = max(_revealed.get(exercise.name, 0), levels[-1])
    (console or Console()).print(render_hints(exercise, levels))


def render_hints(exercise: Exercise, levels: Sequence[int]) -> Panel:
    """A panel with the chosen hint levels of one exercise."""
    n = len(exercise.hints)
    body: list[Any] = [Text(exercise.task, style="italic"), Text("")]
    for level in levels:
        body.append(Text(f"Hint {level}/{n}", style="bold cyan"))
        body.append(Text(_indent(exercise.hint(level)) if level == n else exercise.hint(level)))
    if levels[-1] < n:
        body.append(Text(""))
        body.append(Text(f'Stuck? hint("{exercise.name}") again, or sampling-course hint {exercise.name} '
                         f"--level {levels[-1] + 1}", style="dim"))
    return Panel(Group(*body), title=f"[bold]{exercise.name}[/]  [dim]{exercise.location}[/]", title_align="left",
                 border_style="cyan", expand=False)


# ---------------------------------------------------------------------------------------
# compare: your sampler next to the solution's
# ---------------------------------------------------------------------------------------


@dataclass
class Side:
    """One column of a comparison: what one implementation produced, or why it did not."""

    label: str
    status: Literal["ok", "not implemented yet", "error"]
    output: str | list[tuple[float, str]] | None = None
    message: str = ""


@dataclass
class Comparison:
    """The learner's output next to the solution's on the same weights, prompt and seed."""

    method: str
    prompt: str
    reference: str
    seed: int
    learner: Side
    solution: Side
    match: bool | None  # None when the learner's side did not run
    first_difference: str | None = None  # e.g. "generated token 3" or "sequence 2, generated token 5"

    def __bool__(self) -> bool:
        return bool(self.match)

    def __repr__(self) -> str:
        verdict = {True: "match", False: f"differ at {self.first_difference}", None: self.learner.status}[self.match]
        return f"<Comparison {self.method} on {self.reference}: {verdict}>"


def _run_sampler(package: str, transformer_package: str, reference: Any, method: str, prompt: str,
                 seed: int, max_tokens_generated: int, kwargs: dict[str, Any]) -> Side:
    """Run ``package``'s TransformerSampler on a DemoTransformer from ``transformer_package``."""
    import torch

    from sampling_course.reference import load_demo

    label = f"{package}/" if package == transformer_package else f"{package}/ (model from {transformer_package}/)"
    isolate = _isolated_package(package) if package != "solutions" else nullcontext()
    with isolate:
        try:
            transformer = importlib.import_module(f"{transformer_package}.transformer")
            sampling = importlib.import_module(f"{package}.sampling")
            model = load_demo(reference, transformer)
            sampler = sampling.TransformerSampler(model, reference.tokenizer)
            torch.manual_seed(seed)
            if method == "sample":
                output = sampler.sample(prompt, max_tokens_generated=max_tokens_generated, **kwargs)
            else:
                output = [(float(lp), str(text)) for lp, text in sampler.beam_search(prompt, **kwargs)]
        except NotImplementedError as exc:
            tb = exc.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            code = tb.tb_frame.f_code if tb is not None else None
            stub = getattr(code, "co_qualname", getattr(code, "co_name", "")) if code is not None else ""
            return Side(label, "not implemented yet", message=stub)
        except Exception as exc:  # the learner's code may fail in any way; show it, do not crash
            return Side(label, "error", message=f"{type(exc).__name__}: {exc}")
    return Side(label, "ok", output)


def _first_token_difference(tokenizer: Any, a: str, b: str, prompt_len: int) -> str:
    ids_a, ids_b = tokenizer.encode(a), tokenizer.encode(b)
    i = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y), min(len(ids_a), len(ids_b)))
    return f"generated token {i - prompt_len}" if i >= prompt_len else f"token {i} (inside the prompt)"


def compare(
    prompt: str = "When I was a kid,",
    reference: str = "auto",
    seed: int = 0,
    max_tokens_generated: int = 20,
    method: Literal["sample", "beam_search"] = "sample",
    *,
    impl: str | None = None,
    transformer: str | None = None,
    display: bool = True,
    console: Console | None = None,
    **kwargs: Any,
) -> Comparison:
    """Run your ``TransformerSampler`` and the solution's side by side and show both outputs.

    Same reference weights (``reference``: "auto", "tiny" or "gpt2"), prompt and seed.
    ``method="sample"`` passes ``kwargs`` (temperature, top_k, top_p, frequency_penalty)
    to ``sample``; ``method="beam_search"`` passes ``num_beams``, ``num_return_sequences``,
    ``max_new_tokens`` (default ``max_tokens_generated``) and ``no_repeat_ngram_size``.
    Your sampler runs on your ``DemoTransformer``; pass ``transformer="solutions"`` to
    run it on the solution's model instead (handy before part 1 is done).
    """
    import torch

    from sampling_course.reference import load_reference

    if method not in ("sample", "beam_search"):
        raise ValueError(f'method must be "sample" or "beam_search", got {method!r}')
    impl = resolve_impl(impl)
    if transformer is not None and transformer not in IMPLS:
        raise ValueError(f"transformer must be one of {', '.join(IMPLS)}, got {transformer!r}")
    if method == "beam_search":
        kwargs.setdefault("num_beams", 3)
        kwargs.setdefault("num_return_sequences", kwargs["num_beams"])
        kwargs.setdefault("max_new_tokens", max_tokens_generated)
    ref = load_reference(reference)  # type: ignore[arg-type]
    args = (ref, method, prompt, seed, max_tokens_generated, kwargs)
    # fork_rng: building the models and sampling draw random numbers; the caller's
    # random state is the same before and after compare().
    with torch.random.fork_rng(devices=[]):
        learner = _run_sampler(impl, transformer or impl, *args)
        solution = _run_sampler("solutions", "solutions", *args)
    if solution.status != "ok":
        raise RuntimeError(f"the solutions themselves failed to run: {solution.message}")

    match: bool | None = None
    first_difference = None
    if learner.status == "ok":
        prompt_len = len(ref.tokenizer.encode(prompt))
        if method == "sample":
            match = learner.output == solution.output
            if not match:
                first_difference = _first_token_difference(ref.tokenizer, str(learner.output), str(solution.output), prompt_len)
        else:
            mine, theirs = list(learner.output or []), list(solution.output or [])
            match = len(mine) == len(theirs)
            for i, ((lp_a, a), (lp_b, b)) in enumerate(zip(mine, theirs)):
                if a != b:
                    first_difference = f"sequence {i + 1}, " + _first_token_difference(ref.tokenizer, a, b, prompt_len)
                    match = False
                    break
                if abs(lp_a - lp_b) > 1e-3 * max(1.0, abs(lp_b)):
                    first_difference = f"sequence {i + 1}, log-prob {lp_a:.4f} vs {lp_b:.4f}"
                    match = False
                    break
            else:
                if not match:
                    first_difference = f"{len(mine)} sequences vs {len(theirs)}"
    comparison = Comparison(method, prompt, ref.name, seed, learner, solution, match, first_difference)
    if display:
        (console or Console()).print(render_comparison(comparison, kwargs))
    return comparison


def _common_prefix_len(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _highlight(text: str, prompt: str, diverge_at: int | None, style: str) -> Text:
    """The prompt dim, the continuation plain, and everything from the first difference in ``style``."""
    out = Text()
    cut = len(prompt) if text.startswith(prompt) else 0
    diverge = len(text) if diverge_at is None else max(diverge_at, cut)
    out.append(text[:cut], style="dim")
    out.append(text[cut:diverge])
    out.append(text[diverge:], style=style)
    return out


def _side_cell(side: Side, other: Side, prompt: str, style: str) -> Text:
    if side.status == "not implemented yet":
        return Text(f"… not implemented yet" + (f" ({side.message})" if side.message else ""), style="yellow")
    if side.status == "error":
        return Text(f"✗ {side.message}", style="red")
    if isinstance(side.output, str):
        diverge = _common_prefix_len(side.output, other.output) if isinstance(other.output, str) else None
        return _highlight(side.output, prompt, diverge if other.status == "ok" else None, style)
    lines = Text()
    others = other.output if isinstance(other.output, list) else []
    for i, (logprob, text) in enumerate(side.output or []):
        diverge = _common_prefix_len(text, others[i][1]) if i < len(others) else 0
        lines.append(f"{logprob:8.3f}  ", style="cyan")
        lines.append_text(_highlight(text, prompt, diverge if other.status == "ok" else None, style))
        lines.append("\n")
    lines.rstrip()
    return lines


def render_comparison(comparison: Comparison, kwargs: dict[str, Any] | None = None) -> Table:
    """Both outputs side by side, the prompt dimmed and the first difference onwards highlighted."""
    settings = ", ".join(f"{k}={v!r}" for k, v in (kwargs or {}).items())
    title = f"{comparison.method}({settings}) on {comparison.reference!r}, seed {comparison.seed}"
    table = Table(title=title, title_justify="left", show_lines=True, expand=False)
    table.add_column(f"yours: {comparison.learner.label}", ratio=1)
    table.add_column(comparison.solution.label, ratio=1)
    table.add_row(
        _side_cell(comparison.learner, comparison.solution, comparison.prompt, "bold red"),
        _side_cell(comparison.solution, comparison.learner, comparison.prompt, "bold green"),
    )
    if comparison.match is True:
        table.caption = Text("✓ identical", style="bold green")
    elif comparison.match is False:
        table.caption = Text(f"✗ they differ, first at {comparison.first_difference}", style="bold red")
    else:
        table.caption = Text(f"your side did not run: {comparison.learner.status}", style="yellow")
    table.caption_justify = "left"
    return table


# ---------------------------------------------------------------------------------------
# Command line: sampling-course check | progress | hint
# ---------------------------------------------------------------------------------------


def _add_impl(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--impl",
        default=None,
        help="implementation to check: exercises (default) or solutions; also settable with SAMPLING_COURSE_IMPL",
    )


def _impl_of(args: argparse.Namespace) -> str:
    return resolve_impl(args.impl)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return int(exc.code or 0)


def _run_and_render(names: Sequence[str] | None, args: argparse.Namespace, render: Callable) -> int:
    """Check ``names`` (None: all), print ``render(report)``; exit 0 when all are done, 1 if not, 2 on bad input."""
    console = Console()
    try:
        report = _run(names, _impl_of(args))
    except ValueError as exc:  # an unknown exercise or --impl
        console.print(f"[red]error:[/] {exc}")
        return 2
    console.print(render(report))
    return 0 if report.ok else 1


def cli_check(argv: Sequence[str] | None = None) -> int:
    """``sampling-course check [EXERCISE ...] [--impl ...]``: 0 when nothing checked fails or is unimplemented."""
    parser = argparse.ArgumentParser(
        prog="sampling-course check", description="Run the tests of some exercises (all by default) and show the verdict."
    )
    parser.add_argument("exercise", nargs="*", help="exercise names, e.g. LayerNorm sample_top_p (case-insensitive)")
    _add_impl(parser)
    args = _parse(parser, argv)
    if isinstance(args, int):
        return args
    return _run_and_render(args.exercise or None, args, render_report)


def cli_progress(argv: Sequence[str] | None = None) -> int:
    """``sampling-course progress [--impl ...]``: the table of every exercise; 0 when none fails or is unimplemented."""
    parser = argparse.ArgumentParser(prog="sampling-course progress", description="Show every exercise and its status.")
    _add_impl(parser)
    args = _parse(parser, argv)
    if isinstance(args, int):
        return args
    return _run_and_render(None, args, render_progress)


def cli_hint(argv: Sequence[str] | None = None) -> int:
    """``sampling-course hint EXERCISE [--level N | --all]``: 0, or 2 for an unknown exercise."""
    parser = argparse.ArgumentParser(
        prog="sampling-course hint", description="Show a hint for an exercise: level 1 nudges, level 3 nearly solves it."
    )
    parser.add_argument("exercise", help="exercise name, e.g. LayerNorm (case-insensitive)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--level", type=int, choices=[1, 2, 3], default=1, help="which hint (default 1)")
    group.add_argument("--all", action="store_true", help="show every hint")
    args = _parse(parser, argv)
    if isinstance(args, int):
        return args
    console = Console()
    try:
        exercise = get_exercise(args.exercise)
    except UnknownExerciseError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    levels = list(range(1, len(exercise.hints) + 1)) if args.all else [args.level]
    console.print(render_hints(exercise, levels))
    return 0
