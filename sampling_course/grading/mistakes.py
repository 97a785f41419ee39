"""Plant the classic mistakes of each exercise and check that the tests catch every one.

A grading test is only worth something if it fails on wrong code. Each ``Mistake`` (listed
per part in ``grading/parts/``) rewrites one line of the solutions the way a learner might
get it wrong (temperature multiplied instead of divided, an exclusive top-p cutoff, a mask
off by one, ...). The
runner copies ``solutions/`` into a scratch package named ``exercises``, plants one
mistake, runs that part's test file with ``--impl exercises`` and expects it to fail.

    sampling-course plant-mistakes            # all of them (a few minutes)
    sampling-course plant-mistakes --part 2   # one part
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sampling_course.grading.catalogue import Mistake
from sampling_course.grading.course import PART_MODULES

REPO = Path(__file__).resolve().parents[2]

MISTAKES: list[Mistake] = [mistake for module in PART_MODULES for mistake in module.MISTAKES]


def plant(mistake: Mistake, workdir: Path) -> Path:
    """Copy solutions/ to ``workdir/exercises`` with ``mistake`` planted; return the package dir."""
    package = workdir / "exercises"
    shutil.copytree(REPO / "solutions", package, ignore=shutil.ignore_patterns("__pycache__"))
    target = package / mistake.file
    source = target.read_text()
    count = source.count(mistake.old)
    if count != 1:
        raise ValueError(f"{mistake.name!r}: expected the text once in solutions/{mistake.file}, found it {count} times")
    target.write_text(source.replace(mistake.old, mistake.new))
    return package


def caught(mistake: Mistake) -> tuple[bool, str]:
    """Run the mistake's test file against the planted copy; True when the tests fail."""
    with tempfile.TemporaryDirectory(prefix="planted-") as tmp:
        workdir = Path(tmp)
        plant(mistake, workdir)
        env = {**os.environ, "PYTHONPATH": f"{workdir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        env.pop("SAMPLING_COURSE_IMPL", None)
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", str(REPO / "tests" / mistake.tests), "--impl=exercises",
             "-x", "-q", "-rf", "-p", "no:cacheprovider", "-m", "not gpt2", "--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml")],
            cwd=workdir, env=env, capture_output=True, text=True,
        )
    # Caught means a test failed on an assertion: not a crash, not an import error.
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
    if failed:
        return True, failed[0].removeprefix("FAILED ").split(" - ")[0]
    last = proc.stdout.strip().splitlines()[-1:] or [proc.stderr.strip()[-200:]]
    return False, last[0]


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    parser = argparse.ArgumentParser(prog="sampling-course plant-mistakes", description=__doc__.splitlines()[0])
    parser.add_argument("--part", type=int, action="append", help="only this part (repeatable)")
    args = parser.parse_args(argv)
    selected = [m for m in MISTAKES if not args.part or m.part in args.part]
    table = Table("part", "planted mistake", "caught", "by", title="Classic mistakes")
    missed = 0
    for mistake in selected:
        ok, detail = caught(mistake)
        missed += not ok
        table.add_row(str(mistake.part), mistake.name, "[green]yes[/]" if ok else "[red]NO[/]", detail[:90])
    console = Console()
    console.print(table)
    console.print(f"{len(selected) - missed}/{len(selected)} planted mistakes caught")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
