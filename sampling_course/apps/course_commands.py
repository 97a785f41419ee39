"""The course's own commands: ``sampling-course check | progress | hint | make-exercises | start-at | plant-mistakes``.

Each reads its arguments, checks them before anything heavy loads (an unknown exercise or a
bad option is one line and exit code 2), calls a plain function of the grader
(``grading.checking``, ``grading.stubs``, ``grading.mistakes``) and turns the outcome into
messages and an exit code: 0 when all is well, 1 when something checked is not (a failing
exercise, a stale ``exercises/``, a mistake the tests miss), 2 for a bad argument, 3 when
the course's own files are broken (see ``sampling_course.apps.options``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from sampling_course.apps.options import (
    EXIT_BROKEN,
    EXIT_NOT_OK,
    EXIT_OK,
    EXIT_USAGE,
    OneLineParser,
    UsageError,
    add_device_option,
    add_threads_option,
    command,
    device_from,
    integer,
    parse,
)

__all__ = ["check_main", "hint_main", "make_exercises_main", "plant_mistakes_main", "progress_main", "start_at_main"]


# ---------------------------------------------------------------------------------------
# check | progress | hint
# ---------------------------------------------------------------------------------------


def _add_impl(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--impl", choices=["exercises", "solutions"], default=None,
        help="implementation to check: exercises (default) or solutions; also settable with SAMPLING_COURSE_IMPL",
    )


GRADE_DEVICE_HELP = ("the device the checks grade on: cpu (the default, or $SAMPLING_COURSE_DEVICE), "
                     "cuda (or cuda:N), mps, or auto (a GPU when there is one)")


def _add_check_options(parser: argparse.ArgumentParser) -> None:
    _add_impl(parser)
    add_device_option(parser, default=None, help=GRADE_DEVICE_HELP)
    add_threads_option(parser)
    parser.add_argument("--recompute-oracle", action="store_true",
                        help="compute the reference outputs live again instead of reusing the stored ones "
                        "(also SAMPLING_COURSE_RECOMPUTE_ORACLE=1)")


def _checked_device(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """``--device`` checked (torch loads for it, so after the other arguments): a device this machine lacks is
    one line and exit 2, before any test runs."""
    return str(device_from(parser, args)) if args.device is not None else None


def _checked_impl(impl: str | None) -> str:
    from sampling_course.implementation import resolve_impl

    try:
        return resolve_impl(impl)
    except ValueError as exc:  # a bad $SAMPLING_COURSE_IMPL
        raise UsageError(str(exc)) from None


def _exit_code(report) -> int:
    """0 when every exercise checked is done, 1 if not, 2 when nothing could be checked, 3 when the course's files are broken."""
    if report.broken:
        return EXIT_BROKEN
    if report.error:
        return EXIT_USAGE
    return EXIT_OK if report.ok else EXIT_NOT_OK


@command("sampling-course check")
def check_main(argv: Sequence[str] | None = None) -> int:
    """``sampling-course check [EXERCISE ...] [--impl ...] [--threads N] [--recompute-oracle]``."""
    from sampling_course.grading.course import UnknownExerciseError, get_exercise

    parser = OneLineParser(
        prog="sampling-course check", description="Run the tests of some exercises (all by default) and show the verdict."
    )
    parser.add_argument("exercise", nargs="*", help="exercise names, e.g. LayerNorm sample_top_p (case-insensitive)")
    _add_check_options(parser)
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    try:  # before the grader (and torch) loads
        for name in args.exercise:
            get_exercise(name)
    except UnknownExerciseError as exc:
        raise UsageError(str(exc)) from None
    for name in args.exercise:
        note = same_name_elsewhere(name)
        if note:
            print(note, file=sys.stderr)
    impl = _checked_impl(args.impl)
    device = _checked_device(parser, args)
    from sampling_course.grading.checking import check

    return _exit_code(check(args.exercise or None, impl=impl, device=device, console=Console(), threads=args.threads,
                            recompute_oracle=args.recompute_oracle))


def same_name_elsewhere(name: str) -> str | None:
    """One line when ``name`` is one exercise's name and also what another part calls its own code (part 2's
    ``sample`` and part 5's ``sample``, graded as ``batched_sample``), saying which one is checked."""
    from sampling_course.grading.course import EXERCISES, get_exercise

    chosen = get_exercise(name)
    others = [e for e in EXERCISES if e is not chosen and e.target.lower() == name.strip().lower()]
    if not others:
        return None
    also = "; ".join(f"part {e.part}'s {e.target} ({e.location.split(':')[0]}) is checked as {e.name}" for e in others)
    return f"note: {chosen.name} is part {chosen.part}'s {chosen.target}; {also}"


@command("sampling-course progress")
def progress_main(argv: Sequence[str] | None = None) -> int:
    """``sampling-course progress [--impl ...] [--threads N]``: every exercise; 0 when none fails or is unimplemented."""
    parser = OneLineParser(prog="sampling-course progress", description="Show every exercise and its status.")
    _add_check_options(parser)
    parser.add_argument("--rerun", action="store_true",
                        help="run every exercise's tests, even those whose verdict is stored and nothing they depend on changed")
    parser.add_argument("--jobs", type=integer("--jobs", 1, 64), default=None, metavar="N",
                        help="processes that run the tests (default: one per core no other program is using)")
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    impl = _checked_impl(args.impl)
    device = _checked_device(parser, args)
    from sampling_course.grading.checking import progress

    if args.jobs is None:
        from sampling_course.apps.threads import free_cores

        args.jobs = free_cores()
    return _exit_code(progress(impl=impl, device=device, console=Console(), threads=args.threads,
                               recompute_oracle=args.recompute_oracle, reuse=not args.rerun, jobs=args.jobs))


@command("sampling-course hint")
def hint_main(argv: Sequence[str] | None = None) -> int:
    """``sampling-course hint EXERCISE [--level N | --all | --reset]``: each run shows the next hint."""
    from sampling_course.grading.checking import HintLevels, hint
    from sampling_course.grading.course import UnknownExerciseError, get_exercise

    parser = OneLineParser(
        prog="sampling-course hint",
        description="Show a hint for an exercise: each run shows the next one (level 1 nudges, level 3 nearly "
        "solves it); the level reached is remembered per exercise.",
    )
    parser.add_argument("exercise", nargs="?", help="exercise name, e.g. LayerNorm (case-insensitive)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--level", type=integer("--level", 1, 3), default=None, metavar="N",
                       help="show hint N (1 to 3) instead of the next one")
    group.add_argument("--all", action="store_true", help="show every hint")
    group.add_argument("--reset", action="store_true",
                       help="start the exercise's hints again at level 1 (every exercise's, without a name)")
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    console = Console()
    try:
        exercise = get_exercise(args.exercise) if args.exercise is not None else None
    except UnknownExerciseError as exc:
        raise UsageError(str(exc)) from None
    if args.reset:
        HintLevels().reset(exercise.name if exercise else None)
        console.print(f"hints of {exercise.name if exercise else 'every exercise'} start again at level 1")
        return EXIT_OK
    if exercise is None:
        raise UsageError("name an exercise, e.g. sampling-course hint LayerNorm (or --reset for all of them)")
    hint(exercise.name, "all" if args.all else args.level, console=console)
    return EXIT_OK


# ---------------------------------------------------------------------------------------
# make-exercises
# ---------------------------------------------------------------------------------------


def _existing_folder(name: str):
    def folder(text: str) -> Path:
        path = Path(text)
        if not path.is_dir():
            raise argparse.ArgumentTypeError(f"{name} must be an existing folder, got {text!r}")
        return path

    return folder



@command("sampling-course make-exercises")
def make_exercises_main(argv: Sequence[str] | None = None) -> int:
    """``sampling-course make-exercises [--force | --check]``: regenerate exercises/ from solutions/, and the
    lines each exercise's solution regions hold (``grading/workload.py``'s ``exercise_lines.json``, which the
    notebooks' workload tables read in place of the solutions, absent from the student release).

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

    parser = OneLineParser(
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
        "--solutions", type=_existing_folder("--solutions"), default=DEFAULT_SOLUTIONS_DIR, metavar="DIR",
        help=f"solutions directory (default: {DEFAULT_SOLUTIONS_DIR})",
    )
    parser.add_argument(
        "--exercises", type=Path, default=DEFAULT_EXERCISES_DIR, metavar="DIR",
        help=f"exercises directory (default: {DEFAULT_EXERCISES_DIR})",
    )
    parser.add_argument(
        "--lines", type=Path, default=None, metavar="FILE",
        help="the file of each exercise's solution lines (default: the course's own, "
             "sampling_course/assets/exercise_lines.json, when --solutions is the course's; else none)",
    )
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    if args.force and args.check:
        raise UsageError("--force writes and --check writes nothing: choose one")
    if args.lines is None and Path(args.solutions).resolve() == DEFAULT_SOLUTIONS_DIR.resolve():
        from sampling_course.grading.workload import LINES_FILE

        args.lines = LINES_FILE
    console = Console()
    err = Console(stderr=True)

    def show(path: Path) -> str:
        return escape(f"{path.parent.name}/{path.name}")

    try:
        report = make_exercises(args.solutions, args.exercises, force=args.force, check=args.check)
        lines = None
        if args.lines is not None:
            from sampling_course.grading.workload import sync_lines_file

            lines = sync_lines_file(args.solutions, args.lines, check=args.check)
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

    if lines == "written":
        console.print(f"[green]wrote[/]     {show(args.lines)} (each exercise's solution lines)")
    elif lines == "stale":
        console.print(f"[red]stale[/]     {show(args.lines)} (each exercise's solution lines differ from solutions/)")

    summary = f"{len(report.unchanged)} unchanged"
    if not args.check:
        summary = f"{len(report.written)} written, " + summary
    if report.skipped_edited:
        summary += f", {len(report.skipped_edited)} skipped (edited)"
    if report.stale:
        summary += f", {len(report.stale)} stale"
    console.print(f"make-exercises: {summary}")

    if report.stale or lines == "stale":
        err.print(f"[bold red]{escape(OUT_OF_DATE_MESSAGE)}[/]")
        return 1
    if report.skipped_edited:
        return 1
    return 0


# ---------------------------------------------------------------------------------------
# start-at
# ---------------------------------------------------------------------------------------


@command("sampling-course start-at")
def start_at_main(argv: Sequence[str] | None = None) -> int:
    """``sampling-course start-at N``: put the finished code of every exercise before part N into exercises/.

    0 when every earlier exercise is filled in; 1 when some of the learner's own functions still
    hold a stub of an earlier exercise (theirs to finish: they are never overwritten).
    """
    from sampling_course.grading.start_at import exercises_before, part_labels, start_at
    from sampling_course.grading.stubs import DEFAULT_EXERCISES_DIR

    labels = part_labels()
    parser = OneLineParser(
        prog="sampling-course start-at",
        description="Start the course at part N: the course's finished code of every exercise before part N goes "
                    "into exercises/, so that part N's checks and notebook run on it. Functions you have already "
                    "written are kept, and every file it changes is first copied to exercises/.backup/<time>/.",
    )
    parser.add_argument("part", choices=labels, metavar="N", help=f"the part to start at: {', '.join(labels)}")
    parser.add_argument(
        "--exercises", type=_existing_folder("--exercises"), default=DEFAULT_EXERCISES_DIR, metavar="DIR",
        help=f"exercises directory (default: {DEFAULT_EXERCISES_DIR})",
    )
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    console = Console(highlight=False)
    before = exercises_before(args.part)
    if not before:
        console.print(f"start-at {args.part}: part {args.part} is the first part; nothing comes before it.")
        return EXIT_OK
    report = start_at(args.part, args.exercises)
    earlier = sorted({e.part_label for e in before}, key=labels.index)
    span = earlier[0] if len(earlier) == 1 else f"{earlier[0]}-{earlier[-1]}"
    filled = sum(len(names) for names in report.filled.values())
    console.print(f"start-at {args.part}: the course's code for the exercises of parts {span} ({len(before)} in "
                  f"{len({e.module for e in before})} files), wherever you had not written your own:")
    for module, names in report.filled.items():
        console.print(f"  [green]filled in[/]   exercises/{module}.py ({len(names)} function{'s' * (len(names) != 1)})")
    if not filled:
        console.print("  nothing to fill in: every earlier exercise already holds code")
    for module, names in report.kept.items():
        console.print(f"  [cyan]kept yours[/]  exercises/{module}.py: {escape(', '.join(names))}")
    for module, names in report.unfinished.items():
        console.print(f"  [yellow]unfinished[/]  exercises/{module}.py: {escape(', '.join(names))} "
                      f"(you edited it and a stub is left: finish it, or copy it from solutions/{module}.py)")
    for module in report.unreadable:
        console.print(f"  [red]left alone[/]  exercises/{module}.py does not parse as Python: fix it and run again")
    if report.backup is not None:
        console.print(f"  backup of the {len(report.changed)} files it changed: {escape(str(report.backup))}")
    now = list(dict.fromkeys(e.module for e in exercises_at(args.part)))
    console.print(f"Part {args.part}'s exercises are yours: {escape(', '.join(f'exercises/{m}.py' for m in now))}.")
    return EXIT_NOT_OK if report.unfinished or report.unreadable else EXIT_OK


def exercises_at(part: str) -> list:
    """The exercises of part ``part`` (its notebook's), in course order."""
    from sampling_course.grading.course import EXERCISES

    return [e for e in EXERCISES if e.part_label == part]


# ---------------------------------------------------------------------------------------
# plant-mistakes
# ---------------------------------------------------------------------------------------

PLANT_MISTAKES_USAGE = """\
    sampling-course plant-mistakes               # mistakes and variants (several minutes)
    sampling-course plant-mistakes --part 2      # one part
    sampling-course plant-mistakes --variants    # only the correct variants
    sampling-course plant-mistakes --mistakes    # only the mistakes
"""


@command("sampling-course plant-mistakes")
def plant_mistakes_main(argv: Sequence[str] | None = None) -> int:
    """``sampling-course plant-mistakes``: the tests must catch every planted mistake and accept
    every planted correct variant; 0 when they do, 1 when one is missed or rejected."""
    from sampling_course.grading.course import PARTS

    parser = OneLineParser(
        prog="sampling-course plant-mistakes",
        description="Plant the classic mistakes of each exercise and check that the tests catch every one; "
        "plant correct variants in other styles and check that the tests accept every one.",
        epilog=PLANT_MISTAKES_USAGE, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--part", type=integer("--part", min(PARTS), max(PARTS)), action="append",
                        help=f"only this part ({min(PARTS)} to {max(PARTS)}; repeatable)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--mistakes", action="store_true", help="only plant the mistakes")
    which.add_argument("--variants", action="store_true", help="only plant the correct variants")
    parser.add_argument("--jobs", type=integer("--jobs", 1), default=os.cpu_count() or 1,
                        help="test runs at once (default: one per core)")
    parser.add_argument("--threads", type=integer("--threads", 1), default=None, metavar="N",
                        help="torch threads of each test run (default 1: the runs themselves are the parallelism)")
    add_device_option(parser, default=None, help=GRADE_DEVICE_HELP)
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    from rich.table import Table

    from sampling_course.grading.course import MISTAKES, VARIANTS
    from sampling_course.grading.mistakes import downstream_groups, judge_all

    console = Console()
    # One torch thread per run: the runs themselves are the parallelism.
    if args.threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.device is not None:
        # The workers' pytest runs read it (pytest --device defaults to $SAMPLING_COURSE_DEVICE).
        os.environ["SAMPLING_COURSE_DEVICE"] = str(device_from(parser, args))
    mistakes = [] if args.variants else [m for m in MISTAKES if not args.part or m.part in args.part]
    variants = [] if args.mistakes else [v for v in VARIANTS if not args.part or v.part in args.part]
    # Part 1's and 4's variants, a few at a time, as the model under the later parts' checks.
    groups = downstream_groups(variants)
    # One queue for every kind: the workers (and the references they hold) serve them all.
    verdicts = judge_all([*mistakes, *variants, *groups], args.jobs)
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
        own = verdicts[len(mistakes):len(mistakes) + len(variants)]
        for variant, verdict in zip(variants, own):
            table.add_row(str(variant.part), variant.exercise, variant.name,
                          "[green]yes[/]" if verdict.ok else "[red]NO[/]", verdict.detail[:70])
        later = verdicts[len(mistakes) + len(variants):]
        for group, verdict in zip(groups, later):
            table.add_row(str(group.part), "under later parts", group.name,
                          "[green]yes[/]" if verdict.ok else "[red]NO[/]", verdict.detail[:70])
        console.print(table)
        n_accepted, n_later = sum(v.ok for v in own), sum(v.ok for v in later)
        failures += len(variants) - n_accepted + len(groups) - n_later
        console.print(f"{n_accepted}/{len(variants)} planted correct variants accepted")
        if groups:
            console.print(f"{n_later}/{len(groups)} groups of part 1's and 4's variants accepted as the model "
                          "under the later parts' downstream tests")
    return 1 if failures else 0
