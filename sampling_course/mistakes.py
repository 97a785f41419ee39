"""Plant the classic mistakes of each exercise and check that the tests catch every one.

A grading test is only worth something if it fails on wrong code. Each ``Mistake`` below
rewrites one line of the solutions the way a learner might get it wrong (temperature
multiplied instead of divided, an exclusive top-p cutoff, a mask off by one, ...). The
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
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mistake:
    part: int
    name: str
    file: str  # a file in solutions/
    old: str  # text that must occur exactly once in that file
    new: str
    tests: str  # the test file expected to catch it


# ---------------------------------------------------------------------------------------
# Part 1: GPT-2 from scratch
# ---------------------------------------------------------------------------------------
PART1 = [
    Mistake(1, "LayerNorm with unbiased variance", "transformer.py",
            "residual.pow(2).mean(dim=-1, keepdim=True)",
            "residual.var(dim=-1, keepdim=True, unbiased=True)", "test_transformer.py"),
    Mistake(1, "LayerNorm eps outside the sqrt", "transformer.py",
            "(residual.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt()",
            "residual.pow(2).mean(dim=-1, keepdim=True).sqrt() + self.cfg.layer_norm_eps", "test_transformer.py"),
    Mistake(1, "LayerNorm without w", "transformer.py",
            "return residual / scale * self.w + self.b", "return residual / scale + self.b", "test_transformer.py"),
    Mistake(1, "LayerNorm without b", "transformer.py",
            "return residual / scale * self.w + self.b", "return residual / scale * self.w", "test_transformer.py"),
    Mistake(1, "attention scaled by d_model", "transformer.py",
            '"b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)',
            '"b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_model)', "test_transformer.py"),
    Mistake(1, "attention not scaled", "transformer.py",
            '"b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)',
            '"b q n h, b k n h -> b n q k")', "test_transformer.py"),
    Mistake(1, "causal mask hides the diagonal", "transformer.py",
            "diagonal=key_pos - query_pos + 1,", "diagonal=key_pos - query_pos,", "test_transformer.py"),
    Mistake(1, "causal mask lets one future token through", "transformer.py",
            "diagonal=key_pos - query_pos + 1,", "diagonal=key_pos - query_pos + 2,", "test_transformer.py"),
    Mistake(1, "MLP with relu", "transformer.py",
            "einops.einsum(gelu_new(pre),", "einops.einsum(torch.relu(pre),", "test_transformer.py"),
    Mistake(1, "MLP with erf gelu", "transformer.py",
            "einops.einsum(gelu_new(pre),", "einops.einsum(torch.nn.functional.gelu(pre),", "test_transformer.py"),
    Mistake(1, "positions not added", "transformer.py",
            "residual = self.embed(tokens) + self.pos_embed(tokens)\n", "residual = self.embed(tokens)\n",
            "test_transformer.py"),
    Mistake(1, "missing b_Q", "transformer.py",
            '"b s d, n d h -> b s n h") + self.b_Q', '"b s d, n d h -> b s n h")', "test_transformer.py"),
    Mistake(1, "missing b_V", "transformer.py",
            '"b s d, n d h -> b s n h") + self.b_V', '"b s d, n d h -> b s n h")', "test_transformer.py"),
    Mistake(1, "missing b_O", "transformer.py",
            '"b q n h, n h d -> b q d") + self.b_O', '"b q n h, n h d -> b q d")', "test_transformer.py"),
    Mistake(1, "missing b_in", "transformer.py",
            '"b s d, d m -> b s m") + self.b_in', '"b s d, d m -> b s m")', "test_transformer.py"),
    Mistake(1, "missing b_out", "transformer.py",
            '"b s m, m d -> b s d") + self.b_out', '"b s m, m d -> b s d")', "test_transformer.py"),
    Mistake(1, "missing b_U", "transformer.py",
            '"b s d, d v -> b s v") + self.b_U', '"b s d, d v -> b s v")', "test_transformer.py"),
]

# ---------------------------------------------------------------------------------------
# Part 2: sampling
# ---------------------------------------------------------------------------------------
PART2: list[Mistake] = []

# ---------------------------------------------------------------------------------------
# Part 3: beam search
# ---------------------------------------------------------------------------------------
PART3: list[Mistake] = []

# ---------------------------------------------------------------------------------------
# Part 4: KV cache
# ---------------------------------------------------------------------------------------
PART4: list[Mistake] = []

MISTAKES: list[Mistake] = PART1 + PART2 + PART3 + PART4


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
            [sys.executable, "-m", "pytest", str(REPO / "tests" / mistake.tests), "--impl", "exercises",
             "-x", "-q", "-rf", "-p", "no:cacheprovider", "-m", "not gpt2", "--rootdir", str(REPO)],
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
