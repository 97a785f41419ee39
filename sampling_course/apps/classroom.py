"""The instructor's commands for a class: ``release``, ``grade`` and ``autograder``.

    sampling-course release OUT                  # the student copy (no solutions, no hidden tests)
    sampling-course grade SUBMISSIONS --out REPORT [--jobs N | --scheduler ADDRESS] [--config FILE]
                          [--unsafe-no-sandbox]
    sampling-course autograder OUT.zip [--config FILE]   # Gradescope's autograder bundle

``grade`` writes ``grades.csv``, ``feedback/<student>.md``, ``class_report.html`` and
``results.json`` into REPORT (and, with ``--gradescope PATH``, one submission's Gradescope
``results.json``). Every submission runs in a bubblewrap sandbox of its own (``grade`` refuses
without bubblewrap unless given ``--unsafe-no-sandbox``, and then every report says so); the
grade is decided in the grader's process (see ``sampling_course.grading.classroom``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sampling_course.apps.options import OneLineParser, command, integer, parse


@command("sampling-course release")
def release_main(argv: list[str]) -> int:
    """`sampling-course release OUT`."""
    parser = OneLineParser(prog="sampling-course release",
                                     description="Write the student copy of the course: stubs, notebooks, public tests "
                                                 "and the package, without solutions/ and without hidden tests.")
    parser.add_argument("out", type=Path, help="a new (or empty) folder for the release")
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    from sampling_course.grading.classroom.release import ReleaseError, make_release

    try:
        left_out = make_release(args.out)
    except ReleaseError as exc:
        print(f"sampling-course release: {exc}", file=sys.stderr)
        return 2
    print(f"The student release is in {args.out} (solutions/ and the course's own tests left out).")
    for kind, items in left_out.items():
        if items:
            print(f"Left out {kind}: {', '.join(items)}")
    return 0


@command("sampling-course grade")
def grade_main(argv: list[str]) -> int:
    """`sampling-course grade SUBMISSIONS --out REPORT --jobs N`."""
    parser = OneLineParser(
        prog="sampling-course grade",
        description="Grade a class: every submission (a folder or .zip holding exercises/, in SUBMISSIONS) in a "
                    "confined process of its own, checked by the course's tests in the grader's process.")
    parser.add_argument("submissions", type=Path, help="a folder with one folder or .zip per student, or one submission")
    parser.add_argument("--out", type=Path, help="folder for grades.csv, feedback/, class_report.html, results.json")
    parser.add_argument("--jobs", type=integer("--jobs", 1), default=1, help="submissions graded at once on this machine")
    parser.add_argument("--scheduler", metavar="ADDRESS", help="grade on a Dask cluster (needs the grading extra)")
    parser.add_argument("--config", type=Path, help="a TOML file with points, partial credit and limits")
    parser.add_argument("--exercise", action="append", metavar="NAME", help="grade only this exercise (repeatable)")
    parser.add_argument("--gradescope", type=Path, metavar="PATH",
                        help="also write the (single) submission's Gradescope results.json to PATH")
    parser.add_argument("--title", default="Class report", help="title of the class report")
    parser.add_argument("--quiet", action="store_true", help="no line per graded submission")
    parser.add_argument("--unsafe-no-sandbox", action="store_true",
                        help="grade without bubblewrap: the submissions' code runs unconfined (every report says so)")
    parser.add_argument("--threads", type=integer("--threads", 1), default=None, metavar="N",
                        help="torch threads of the grading runs (default 1, or $OMP_NUM_THREADS)")
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    if not args.submissions.exists():
        parser.error(f"no submissions at {str(args.submissions)!r}: give a folder with one folder or .zip per student")
    if args.config is not None and not args.config.is_file():
        parser.error(f"--config must be an existing TOML file, got {str(args.config)!r}")
    if args.out is None and args.gradescope is None:
        parser.error("give --out REPORT (or --gradescope PATH for one submission)")
    if args.scheduler and args.jobs != 1:
        parser.error("--jobs and --scheduler exclude each other: the cluster decides how many run at once")

    if args.threads is not None:  # the grader's test runs and the submissions' processes read it
        import os

        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    from sampling_course.grading.classroom.executors import grade_all
    from sampling_course.grading.classroom.grade import SandboxMissing, sandbox_tool
    from sampling_course.grading.classroom.reports import escaped, write_reports
    from sampling_course.grading.classroom.settings import load_settings
    from sampling_course.grading.classroom.submission import SubmissionError, find_submissions

    try:
        settings = load_settings(args.config, exercises=args.exercise, unsafe_no_sandbox=args.unsafe_no_sandbox or None)
        submissions = find_submissions(args.submissions)
        sandbox_tool(settings)
    except (ValueError, OSError, SandboxMissing) as exc:  # SubmissionError and a bad config are ValueErrors
        print(f"sampling-course grade: {exc}", file=sys.stderr)
        return 2
    if settings.unsafe_no_sandbox:
        print("sampling-course grade: WARNING: grading without a sandbox (--unsafe-no-sandbox); the submissions' "
              "code runs unconfined", file=sys.stderr)
    if args.gradescope is not None and len(submissions) != 1:
        print(f"sampling-course grade: --gradescope grades one submission; {args.submissions} holds "
              f"{len(submissions)}", file=sys.stderr)
        return 2

    started = time.monotonic()

    def progress(result: dict) -> None:
        if not args.quiet:  # a name or message with terminal escapes is shown escaped, on one line
            flags = f"  flagged: {'; '.join(dict.fromkeys(f['kind'] for f in result['flags']))}" if result["flags"] else ""
            error = f"  not graded: {result['error']}" if result.get("error") else ""
            print(escaped(f"{result['student']}: {result['score']:g}/{result['max_score']:g} "
                          f"({result['seconds']:.1f} s){flags}{error}", newlines=False), flush=True)

    results = grade_all(submissions, settings, jobs=args.jobs, scheduler=args.scheduler, progress=progress)
    seconds = time.monotonic() - started
    if args.gradescope is not None:  # the grade first: the other reports never stand in its way
        from sampling_course.grading.classroom.gradescope import gradescope_results

        args.gradescope.parent.mkdir(parents=True, exist_ok=True)
        args.gradescope.write_text(json.dumps(gradescope_results(results[0]), indent=1))
    if args.out is not None:
        paths = write_reports(results, settings, args.out, title=args.title)
        print(f"Graded {len(results)} submissions in {seconds:.0f} s ({60 * len(results) / max(seconds, 1e-9):.1f} "
              f"per minute). Reports: {paths['csv']}, {paths['html']}, {paths['feedback']}/")
        if "problems" in paths:
            print(f"sampling-course grade: some reports could not be written; see {paths['problems']}", file=sys.stderr)
    return 0


@command("sampling-course autograder")
def autograder_main(argv: list[str]) -> int:
    """`sampling-course autograder OUT.zip`."""
    parser = OneLineParser(prog="sampling-course autograder",
                                     description="Write a Gradescope autograder bundle (setup.sh, run_autograder and "
                                                 "the course) that grades each submission with `sampling-course grade`.")
    parser.add_argument("out", type=Path, help="the .zip to write")
    parser.add_argument("--config", type=Path, help="a grading TOML file to bundle as grading.toml")
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    if args.config is not None and not args.config.is_file():
        parser.error(f"--config must be an existing TOML file, got {str(args.config)!r}")
    from sampling_course.grading.classroom.gradescope import make_autograder
    from sampling_course.grading.classroom.settings import load_settings

    try:
        if args.config is not None:
            load_settings(args.config)  # refuse a broken config now, not on Gradescope
        path = make_autograder(args.out, args.config)
    except (ValueError, OSError) as exc:
        print(f"sampling-course autograder: {exc}", file=sys.stderr)
        return 2
    print(f"Wrote {path}: upload it as the autograder of a Gradescope programming assignment.")
    return 0
