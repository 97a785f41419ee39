"""The course's own commands: ``sampling-course check | progress | hint | make-exercises | plant-mistakes``.

Each reads its arguments, calls a plain function of the grader (``grading.checking``,
``grading.stubs``, ``grading.mistakes``) and turns the outcome into messages and an exit
code: 0 when all is well, 1 when something checked is not (a failing exercise, a stale
``exercises/``, a mistake the tests miss), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

__all__ = ["check_main", "hint_main", "make_exercises_main", "plant_mistakes_main", "progress_main"]


# ---------------------------------------------------------------------------------------
# check | progress | hint
# ---------------------------------------------------------------------------------------


def _add_impl(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--impl",
        default=None,
        help="implementation to check: exercises (default) or solutions; also settable with SAMPLING_COURSE_IMPL",
    )


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return int(exc.code or 0)


def _exit_code(run) -> int:
    """``run(console)`` checks and shows a report; 0 when all are done, 1 if not, 2 on bad input."""
    console = Console()
    try:
        report = run(console)
    except ValueError as exc:  # an unknown exercise or --impl
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 2
    if report.error:
        return 2
    return 0 if report.ok else 1


def check_main(argv: Sequence[str] | None = None) -> int:
    """``sampling-course check [EXERCISE ...] [--impl ...]``: 0 when nothing checked fails or is unimplemented."""
    from sampling_course.grading.checking import check

    parser = argparse.ArgumentParser(
        prog="sampling-course check", description="Run the tests of some exercises (all by default) and show the verdict."
    )
    parser.add_argument("exercise", nargs="*", help="exercise names, e.g. LayerNorm sample_top_p (case-insensitive)")
    _add_impl(parser)
    args = _parse(parser, argv)
    if isinstance(args, int):
        return args
    return _exit_code(lambda console: check(args.exercise or None, impl=args.impl, console=console))


def progress_main(argv: Sequence[str] | None = None) -> int:
    """``sampling-course progress [--impl ...]``: the table of every exercise; 0 when none fails or is unimplemented."""
    from sampling_course.grading.checking import progress

    parser = argparse.ArgumentParser(prog="sampling-course progress", description="Show every exercise and its status.")
    _add_impl(parser)
    args = _parse(parser, argv)
    if isinstance(args, int):
        return args
    return _exit_code(lambda console: progress(impl=args.impl, console=console))


def hint_main(argv: Sequence[str] | None = None) -> int:
    """``sampling-course hint EXERCISE [--level N | --all]``: 0, or 2 for an unknown exercise."""
    from sampling_course.grading.checking import hint
    from sampling_course.grading.course import UnknownExerciseError

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
        hint(args.exercise, "all" if args.all else args.level, console=console)
    except UnknownExerciseError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    return 0


# ---------------------------------------------------------------------------------------
# make-exercises
# ---------------------------------------------------------------------------------------


def make_exercises_main(argv: Sequence[str] | None = None) -> int:
    """``sampling-course make-exercises [--force | --check]``: regenerate exercises/ from solutions/.

    0 on success; 1 when ``--check`` finds stale files, when learner-edited files were
    skipped, or when a solution has malformed markers.
    """
    from sampling_course.grading.stubs import (
        DEFAULT_EXERCISES_DIR,
        DEFAULT_SOLUTIONS_DIR,
        OUT_OF_DATE_MESSAGE,
        StubError,
        make_exercises,
    )

    parser = argparse.ArgumentParser(
        prog="sampling-course make-exercises",
        description="Generate exercises/ (stubs for learners) from solutions/.",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="also overwrite exercises you have edited (your work in them is lost)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if exercises/ is out of date with solutions/",
    )
    parser.add_argument(
        "--solutions", type=Path, default=DEFAULT_SOLUTIONS_DIR, metavar="DIR",
        help=f"solutions directory (default: {DEFAULT_SOLUTIONS_DIR})",
    )
    parser.add_argument(
        "--exercises", type=Path, default=DEFAULT_EXERCISES_DIR, metavar="DIR",
        help=f"exercises directory (default: {DEFAULT_EXERCISES_DIR})",
    )
    args = parser.parse_args(argv)
    console = Console()
    err = Console(stderr=True)

    def show(path: Path) -> str:
        return escape(f"{path.parent.name}/{path.name}")

    try:
        report = make_exercises(args.solutions, args.exercises, force=args.force, check=args.check)
    except (StubError, FileNotFoundError) as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}")
        return 1

    for path in report.written:
        console.print(f"[green]wrote[/]     {show(path)}")
    for path in report.skipped_edited:
        err.print(
            f"[yellow]skipped[/]   {show(path)}: you have edited it, so it was not "
            "regenerated. Use --force to overwrite it, losing your work in that file."
        )
    for path in report.stale:
        what = "differs from" if path.exists() else "missing for"
        console.print(f"[red]stale[/]     {show(path)} ({what} its solution)")
    for path in report.orphans:
        console.print(f"[dim]orphan[/]    {show(path)} has no solution (left alone)")

    summary = f"{len(report.unchanged)} unchanged"
    if not args.check:
        summary = f"{len(report.written)} written, " + summary
    if report.skipped_edited:
        summary += f", {len(report.skipped_edited)} skipped (edited)"
    if report.stale:
        summary += f", {len(report.stale)} stale"
    console.print(f"make-exercises: {summary}")

    if report.stale:
        err.print(f"[bold red]{escape(OUT_OF_DATE_MESSAGE)}[/]")
        return 1
    if report.skipped_edited:
        return 1
    return 0


# ---------------------------------------------------------------------------------------
# plant-mistakes
# ---------------------------------------------------------------------------------------

PLANT_MISTAKES_USAGE = """\
    sampling-course plant-mistakes               # mistakes and variants (several minutes)
    sampling-course plant-mistakes --part 2      # one part
    sampling-course plant-mistakes --variants    # only the correct variants
    sampling-course plant-mistakes --mistakes    # only the mistakes
"""


def plant_mistakes_main(argv: Sequence[str] | None = None) -> int:
    """``sampling-course plant-mistakes``: the tests must catch every planted mistake and accept
    every planted correct variant; 0 when they do, 1 when one is missed or rejected."""
    from rich.table import Table

    from sampling_course.grading.course import MISTAKES, VARIANTS
    from sampling_course.grading.mistakes import judge_all

    parser = argparse.ArgumentParser(
        prog="sampling-course plant-mistakes",
        description="Plant the classic mistakes of each exercise and check that the tests catch every one; "
        "plant correct variants in other styles and check that the tests accept every one.",
        epilog=PLANT_MISTAKES_USAGE, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--part", type=int, action="append", help="only this part (repeatable)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--mistakes", action="store_true", help="only plant the mistakes")
    which.add_argument("--variants", action="store_true", help="only plant the correct variants")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="test runs at once (default: one per core)")
    args = parser.parse_args(argv)
    console = Console()
    # One torch thread per run: the runs themselves are the parallelism.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mistakes = [] if args.variants else [m for m in MISTAKES if not args.part or m.part in args.part]
    variants = [] if args.mistakes else [v for v in VARIANTS if not args.part or v.part in args.part]
    # One queue for both kinds: the workers (and the references they hold) serve them all.
    verdicts = judge_all([*mistakes, *variants], args.jobs)
    failures = 0
    if not args.variants:
        table = Table("part", "planted mistake", "caught", "by", title="Classic mistakes")
        for mistake, verdict in zip(mistakes, verdicts[: len(mistakes)]):
            table.add_row(str(mistake.part), mistake.name, "[green]yes[/]" if verdict.ok else "[red]NO[/]",
                          verdict.detail[:90])
        console.print(table)
        n_caught = sum(v.ok for v in verdicts[: len(mistakes)])
        failures += len(mistakes) - n_caught
        console.print(f"{n_caught}/{len(mistakes)} planted mistakes caught")
    if not args.mistakes:
        table = Table("part", "exercise", "correct variant", "accepted", "result", title="Correct variants")
        for variant, verdict in zip(variants, verdicts[len(mistakes):]):
            table.add_row(str(variant.part), variant.exercise, variant.name,
                          "[green]yes[/]" if verdict.ok else "[red]NO[/]", verdict.detail[:70])
        console.print(table)
        n_accepted = sum(v.ok for v in verdicts[len(mistakes):])
        failures += len(variants) - n_accepted
        console.print(f"{n_accepted}/{len(variants)} planted correct variants accepted")
    return 1 if failures else 0
