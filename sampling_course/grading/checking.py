"""Check exercises from a notebook or the command line: ``check``, ``progress``, ``hint``.

In a notebook::

    from sampling_course import check, hint, progress
    check("LayerNorm")                  # run that exercise's tests on exercises/
    check("LayerNorm", obj=LayerNorm)   # ... or on a class defined in the notebook
    hint("LayerNorm")                   # each call reveals the next hint
    progress()                          # every exercise and its status

``sampling-course check|progress|hint ARGS`` call ``cli_check(ARGS)``,
``cli_progress(ARGS)`` and ``cli_hint(ARGS)``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape

from sampling_course.grading.course import UnknownExerciseError, get_exercise
from sampling_course.implementation import StaleInstallError, resolve_impl
from sampling_course.grading.render import render_hints, render_progress, render_report
from sampling_course.grading.results import CheckReport
from sampling_course.grading.runner import TestsNotFoundError, run_report

__all__ = ["check", "progress", "hint", "cli_check", "cli_progress", "cli_hint"]


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

    A test still running after 60 s ($SAMPLING_COURSE_TEST_TIMEOUT) is stopped and the
    exercise shows "took longer than 60 s". When nothing can be checked (no tests/ found,
    or exercises/ imported from a stale ``pip install .``), one line says why and the
    report's ``error`` holds it.
    """
    return _show(_run(name, resolve_impl(impl), obj), render_report, display, console)


def _run(names: str | Sequence[str] | None, impl: str, obj: Any = None, diagnose: bool = True) -> CheckReport:
    """``run_report``, with a problem of the setup (no tests, a stale install) as the report's one-line error."""
    try:
        return run_report(names, impl, obj, diagnose=diagnose)
    except (StaleInstallError, TestsNotFoundError) as exc:
        return CheckReport([], impl=impl, error=str(exc))


def _show(report: CheckReport, render: Callable, display: bool, console: Console | None) -> CheckReport:
    if display:
        console = console or Console()
        if report.error:
            # soft_wrap: one line however narrow the terminal, so it reads (and greps) as one.
            console.print(f"[red]error:[/] {escape(report.error)}", soft_wrap=True)
        else:
            console.print(render(report))
    return report


def progress(impl: str | None = None, *, display: bool = True, console: Console | None = None) -> CheckReport:
    """Check every exercise and show a table of where you are, like ``rustlings list``."""
    # The table names no mistakes, so progress skips looking for them.
    return _show(_run(None, resolve_impl(impl), diagnose=False), render_progress, display, console)


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
        report = _run(names, _impl_of(args), diagnose=render is not render_progress)
    except ValueError as exc:  # an unknown exercise or --impl
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 2
    _show(report, render, True, console)
    if report.error:
        return 2
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
