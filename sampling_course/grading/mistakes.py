"""Plant the classic mistakes of each exercise and check that the tests catch every one;
plant correct variants in other styles and check that the tests accept every one.

A grading test is only worth something if it fails on wrong code. Each ``Mistake`` (listed
per part in ``grading/parts/``) rewrites one line of the solutions the way a learner might
get it wrong (temperature multiplied instead of divided, an exclusive top-p cutoff, a mask
off by one, ...). The
runner copies ``solutions/`` into a scratch package named ``exercises``, plants one
mistake, runs the tests of its exercise (``--exercise``, see ``planting.exercises_of``)
with ``--impl exercises`` and expects one to fail.

The mirror image: each ``Variant`` rewrites an exercise in another correct style
(``Categorical(...).sample()``, top-p through ``searchsorted``, a ``-1e10`` mask, ...),
and then every test of that exercise must pass.

    sampling-course plant-mistakes               # mistakes and variants (several minutes)
    sampling-course plant-mistakes --part 2      # one part
    sampling-course plant-mistakes --variants    # only the correct variants
    sampling-course plant-mistakes --mistakes    # only the mistakes
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sampling_course.grading.catalogue import Mistake, Variant
from sampling_course.grading.course import MISTAKES, VARIANTS
from sampling_course.grading.planting import exercises_of, mistake_target, write_package

REPO = Path(__file__).resolve().parents[2]


def _pytest_on_planted(change: Mistake | Variant, selection: list[str]) -> subprocess.CompletedProcess:
    """Run pytest on ``selection`` with ``--impl=exercises`` pointing at a planted copy of the solutions."""
    with tempfile.TemporaryDirectory(prefix="planted-") as tmp:
        workdir = Path(tmp)
        write_package(workdir, change)
        env = {**os.environ, "PYTHONPATH": f"{workdir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        env.pop("SAMPLING_COURSE_IMPL", None)
        return subprocess.run(
            [sys.executable, "-m", "pytest", *selection, "--impl=exercises",
             "-q", "-rf", "-p", "no:cacheprovider", "-m", "not gpt2", "--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml")],
            cwd=workdir, env=env, capture_output=True, text=True,
        )


def caught(mistake: Mistake) -> tuple[bool, str]:
    """Run the tests of the mistake's exercises against the planted copy; True when one fails."""
    exercises = exercises_of(mistake)
    if not exercises:
        return False, f"its code ({mistake_target(mistake)}) belongs to no part-{mistake.part} exercise"
    selection = [str(REPO / "tests"), "-x"]
    for exercise in exercises:
        selection += ["--exercise", exercise.name]
    proc = _pytest_on_planted(mistake, selection)
    # Caught means a test failed on an assertion (or was stopped for never returning): not a
    # crash, not an import error.
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
    if failed:
        return True, failed[0].removeprefix("FAILED ").split(" - ")[0]
    stopped = [line for line in proc.stdout.splitlines() if ": took longer than " in line]
    if stopped:
        return True, stopped[0].split(", stopped")[0]
    last = proc.stdout.strip().splitlines()[-1:] or [proc.stderr.strip()[-200:]]
    return False, last[0]


def accepted(variant: Variant) -> tuple[bool, str]:
    """Run every test of the variant's exercise against the planted copy; True when all pass."""
    proc = _pytest_on_planted(variant, [str(REPO / "tests"), "--exercise", variant.exercise])
    summary = (proc.stdout.strip().splitlines() or [proc.stderr.strip()[-200:]])[-1]
    if proc.returncode == 0 and " passed" in summary:
        return True, summary.strip("= ")
    failed = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return False, (failed[0].removeprefix("FAILED ") if failed else summary)


def _run_all(items: list, check, jobs: int) -> list[tuple[bool, str]]:
    """``check`` on every item, ``jobs`` subprocesses at a time, results in the items' order."""
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(check, items))


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    parser = argparse.ArgumentParser(prog="sampling-course plant-mistakes", description=__doc__.splitlines()[0])
    parser.add_argument("--part", type=int, action="append", help="only this part (repeatable)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--mistakes", action="store_true", help="only plant the mistakes")
    which.add_argument("--variants", action="store_true", help="only plant the correct variants")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="test runs at once (default: one per core)")
    args = parser.parse_args(argv)
    console = Console()
    # One torch thread per run: the runs themselves are the parallelism.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    failures = 0
    if not args.variants:
        selected = [m for m in MISTAKES if not args.part or m.part in args.part]
        results = _run_all(selected, caught, args.jobs)
        table = Table("part", "planted mistake", "caught", "by", title="Classic mistakes")
        for mistake, (ok, detail) in zip(selected, results):
            table.add_row(str(mistake.part), mistake.name, "[green]yes[/]" if ok else "[red]NO[/]", detail[:90])
        console.print(table)
        n_caught = sum(ok for ok, _ in results)
        failures += len(results) - n_caught
        console.print(f"{n_caught}/{len(selected)} planted mistakes caught")
    if not args.mistakes:
        selected_v = [v for v in VARIANTS if not args.part or v.part in args.part]
        results = _run_all(selected_v, accepted, args.jobs)
        table = Table("part", "exercise", "correct variant", "accepted", "result", title="Correct variants")
        for variant, (ok, detail) in zip(selected_v, results):
            table.add_row(str(variant.part), variant.exercise, variant.name, "[green]yes[/]" if ok else "[red]NO[/]", detail[:70])
        console.print(table)
        n_accepted = sum(ok for ok, _ in results)
        failures += len(results) - n_accepted
        console.print(f"{n_accepted}/{len(selected_v)} planted correct variants accepted")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
