"""Check exercises from a notebook or the command line: ``check``, ``progress``, ``hint``.

In a notebook::

    from sampling_course import check, hint, progress
    check("LayerNorm")                  # run that exercise's tests on exercises/
    check("LayerNorm", obj=LayerNorm)   # ... or on a class defined in the notebook
    hint("LayerNorm")                   # each call reveals the next hint
    progress()                          # every exercise and its status

The commands ``sampling-course check|progress|hint`` (``sampling_course.apps.course_commands``)
parse their arguments and call these same functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape

from sampling_course.grading.course import get_exercise
from sampling_course.implementation import StaleInstallError, resolve_impl
from sampling_course.grading.render import render_hints, render_progress, render_report
from sampling_course.grading.results import CheckReport
from sampling_course.grading.runner import TestsNotFoundError, run_report

__all__ = ["check", "progress", "hint"]


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
