"""Check exercises from a notebook or the command line: ``check``, ``progress``, ``hint``.

In a notebook::

    from sampling_course import check, hint, progress
    check("LayerNorm")                  # run that exercise's tests on exercises/
    check("LayerNorm", obj=LayerNorm)   # ... or on a class defined in the notebook
    hint("LayerNorm")                   # each call reveals the next hint
    progress()                          # every exercise and its status

The hint level each exercise has reached is remembered in the course's cache folder
(``hints.json``), so ``hint`` in a notebook and ``sampling-course hint`` in a shell go on
from the same place.

The commands ``sampling-course check|progress|hint`` (``sampling_course.apps.course_commands``)
parse their arguments and call these same functions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape

from sampling_course.grading.course import get_exercise
from sampling_course.implementation import StaleInstallError, resolve_impl
from sampling_course.grading.render import render_hints, render_progress, render_report
from sampling_course.grading.results import CheckReport

__all__ = ["check", "progress", "hint"]


def check(
    name: str | Sequence[str] | None = None,
    obj: Any = None,
    *,
    impl: str | None = None,
    device: str | None = None,
    display: bool = True,
    console: Console | None = None,
    threads: int | None = None,
    recompute_oracle: bool = False,
) -> CheckReport:
    """Run an exercise's tests and show the verdict: ``check("LayerNorm")``.

    ``name``: one exercise, a list of them, or None for all. ``obj``: a class or function
    defined in the notebook to check instead of the one in ``exercises/``, e.g.
    ``check("LayerNorm", obj=LayerNorm)`` or ``check("sample_top_p", obj=my_top_p)``.
    Returns a ``CheckReport``, true when every exercise checked is done.

    ``device`` grades on that device (``"cuda"``, ``"mps"``, ``"cpu"`` or ``"auto"``): the
    references and your model run there. By default the checks run on the CPU (or on
    $SAMPLING_COURSE_DEVICE), whatever device the notebook computes on.

    A test still running after 60 s ($SAMPLING_COURSE_TEST_TIMEOUT) is stopped and the
    exercise shows "took longer than 60 s". When nothing can be checked (no tests/ found,
    or exercises/ imported from a stale ``pip install .``), one line says why and the
    report's ``error`` holds it.

    ``threads``: torch threads for the tests (default: $OMP_NUM_THREADS, else 1). With
    ``recompute_oracle``, the references' outputs are computed live again instead of reused.
    """
    return _show(_run(name, resolve_impl(impl), obj, device=device, threads=threads, recompute=recompute_oracle),
                 render_report, display, console)


def _run(names: str | Sequence[str] | None, impl: str, obj: Any = None, diagnose: bool = True,
         device: str | None = None, threads: int | None = None, recompute: bool = False) -> CheckReport:
    """``run_report``, with a problem of the setup (no tests, a stale install, a device this
    machine lacks) as the report's one-line error."""
    # The runner loads pytest and torch: only when something is checked (``hint`` needs neither).
    from sampling_course.grading.runner import TestsNotFoundError, run_report

    if device is not None:
        from sampling_course.devices import pick_device  # imports torch: only when a device is named

        try:
            device = str(pick_device(device))
        except ValueError as exc:
            return CheckReport([], impl=impl, error=str(exc))
    try:
        return run_report(names, impl, obj, diagnose=diagnose, device=device, threads=threads,
                          recompute_oracle=recompute)
    except (StaleInstallError, TestsNotFoundError) as exc:
        return CheckReport([], impl=impl, error=str(exc))


def _show(report: CheckReport, render: Callable, display: bool, console: Console | None) -> CheckReport:
    if display:
        console = console or Console()
        for notice in report.notices:
            console.print(f"[yellow]note:[/] {escape(notice)}", soft_wrap=True)
        if report.error:
            # soft_wrap: one line however narrow the terminal, so it reads (and greps) as one.
            console.print(f"[red]error:[/] {escape(report.error)}", soft_wrap=True)
        else:
            console.print(render(report))
    return report


def progress(
    impl: str | None = None, *, device: str | None = None, display: bool = True, console: Console | None = None,
    threads: int | None = None, recompute_oracle: bool = False, reuse: bool = True, jobs: int = 1,
) -> CheckReport:
    """Check every exercise and show a table of where you are, like ``rustlings list``; ``device`` as in ``check``.

    An exercise whose code, tests, course and libraries are as they were at the last ``progress``
    keeps its verdict without running its tests again (``reuse=False`` runs them all; see
    ``grading.verdicts``). ``jobs`` > 1 runs the rest in that many processes.
    """
    from sampling_course.grading.progress_run import progress_report
    from sampling_course.grading.runner import TestsNotFoundError

    impl = resolve_impl(impl)
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    try:
        if device is not None:
            from sampling_course.devices import pick_device

            device = str(pick_device(device))
        # The table names no mistakes, so progress skips looking for them.
        report = progress_report(impl, device=device, threads=threads, recompute=recompute_oracle, reuse=reuse,
                                 jobs=jobs)
    except (StaleInstallError, TestsNotFoundError, ValueError) as exc:
        report = CheckReport([], impl=impl, error=str(exc))
    return _show(report, render_progress, display, console)


class HintLevels:
    """The highest hint level shown so far, per exercise, kept in ``hints.json`` in the course's cache folder."""

    def __init__(self, path: Path | None = None):
        from sampling_course.files import cache_home

        self.path = path or cache_home() / "hints.json"

    def read(self) -> dict[str, int]:
        try:
            levels = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            levels = None
        if not isinstance(levels, dict) or not all(isinstance(v, int) for v in levels.values()):
            from sampling_course.files import notice

            notice(f"the hint levels in {self.path} were unreadable: every exercise starts again at level 1")
            return {}
        return levels

    def write(self, levels: dict[str, int]) -> None:
        from sampling_course.files import write_atomic

        try:
            write_atomic(self.path, (json.dumps(levels, indent=1, sort_keys=True) + "\n").encode())
        except OSError:
            pass  # a read-only home: the next hint simply starts from the same level

    def reset(self, exercise: str | None = None) -> None:
        """Forget the level of ``exercise`` (of every exercise when None)."""
        self.write({} if exercise is None else {k: v for k, v in self.read().items() if k != exercise})


def hint(name: str, level: int | Literal["all"] | None = None, *, console: Console | None = None) -> None:
    """Show a hint for an exercise: ``hint("LayerNorm")``.

    Without ``level``, each call reveals the next hint (1, then 2, then 3), remembered across
    sessions and shared with ``sampling-course hint``. ``level`` picks one (1 = gentle ...
    3 = nearly the solution); ``level="all"`` shows all of them.
    """
    exercise = get_exercise(name)
    n = len(exercise.hints)
    store = HintLevels()
    levels_shown = store.read()
    shown = levels_shown.get(exercise.name, 0)
    if level is None:
        level = min(shown + 1, n)
    if level == "all":
        levels = list(range(1, n + 1))
    elif isinstance(level, int) and not isinstance(level, bool) and 1 <= level <= n:
        levels = [level]
    else:
        raise ValueError(f'level must be 1 to {n} or "all", got {level!r}')
    if levels[-1] > shown:
        store.write({**levels_shown, exercise.name: levels[-1]})
    (console or Console()).print(render_hints(exercise, levels))
