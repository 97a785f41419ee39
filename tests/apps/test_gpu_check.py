"""scripts/gpu_check.sh on a machine without a GPU: its arguments, its dry run and its table's summaries.

The steps themselves need an NVIDIA GPU; what the CPU can check is everything around them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"
STEPS = ["grading", "cuda-only", "bench", "notebook"]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def table_rows(stdout: str) -> dict[str, list[str]]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["step", "result"])
    return {line.split()[0]: line.split() for line in lines[start + 2:] if line.strip()}


def test_the_dry_run_lists_every_step_with_its_command_and_runs_nothing(tmp_path):
    proc = run("--dry-run", "--logs", str(tmp_path / "logs"))
    assert proc.returncode == 0, proc.stderr
    rows = table_rows(proc.stdout)
    assert list(rows) == STEPS
    assert all(row[1] == "dry-run" for row in rows.values())
    assert "pytest tests/grading --device cuda" in proc.stdout
    assert "sampling-course bench --device cuda --strict" in proc.stdout
    assert "-k 06b" in proc.stdout
    assert not (tmp_path / "logs").exists()


def test_the_step_limits_add_up_to_eight_minutes_at_most():
    """Eight minutes of steps, plus the install and the machine's start, fit a 15-minute GPU lease."""
    limits = [int(line.split("(limit ")[1].split(" s)")[0]) for line in run("--dry-run").stdout.splitlines()
              if line.startswith("would run")]
    assert len(limits) == len(STEPS) and sum(limits) <= 8 * 60


def test_only_chooses_steps_in_the_order_given():
    rows = table_rows(run("--dry-run", "--only", "notebook", "--only", "bench").stdout)
    assert list(rows) == ["notebook", "bench"]


@pytest.mark.parametrize("args, message", [
    (["--only", "benchmark"], "no such step"),
    (["--only"], "--only needs a step"),
    (["--logs"], "--logs needs a folder"),
    (["--frobnicate"], "unknown argument --frobnicate"),
])
def test_a_bad_argument_is_one_line_and_exit_code_2(args, message):
    proc = run(*args)
    assert proc.returncode == 2
    assert message in proc.stderr.splitlines()[0]


def test_help_names_every_step():
    proc = run("--help")
    assert proc.returncode == 0 and all(step in proc.stdout for step in STEPS)


def test_a_pytest_step_is_summed_up_by_its_last_counts_line(tmp_path):
    log = tmp_path / "grading.log"
    log.write_text("....s..F\nFAILED tests/grading/test_x.py::test_y - assert 1 == 2\n"
                   "========= 1 failed, 6 passed, 1 skipped in 12.30s =========\n")
    proc = run("--summarize", "grading", str(log))
    assert proc.stdout.strip() == "1 failed, 6 passed, 1 skipped in 12.30s"


def test_the_bench_step_is_summed_up_by_its_two_target_rows(tmp_path):
    log = tmp_path / "bench.log"
    log.write_text("Targets (ratios of tokens/s)\n"
                   "│ captured step vs HF eager, batch 1 │ float32 │ 6.10x │ >= 5.0x, same tokens │ ok │\n"
                   "│ captured step vs HF static cache compiled, batch 1 │ float32 │ 0.90x │ >= 1.0x │ MISSED │\n")
    summary = run("--summarize", "bench", str(log)).stdout.strip()
    assert summary == "eager/float32 6.10x ok; compiled/float32 0.90x MISSED"
