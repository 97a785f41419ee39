"""Gradescope: a ``results.json`` per submission, and the autograder bundle that produces it there.

Gradescope runs an autograder from a zip that holds ``setup.sh`` (run once, when the image is
built) and ``run_autograder`` (run for every submission); it puts the zip's contents in
``/autograder/source``, the student's files in ``/autograder/submission`` and reads the grade
from ``/autograder/results/results.json``. ``make_autograder(OUT.zip)`` writes such a zip:
the course (its package, solutions, stubs and all tests, hidden ones included, since grading
happens there), an optional ``grading.toml``, and the two scripts, which install the course
with its grading extra and run ``sampling-course grade`` on the one submission.

``run_autograder`` reads ``AUTOGRADER_ROOT`` (default ``/autograder``) and ``AUTOGRADER_PYTHON``
(default the environment ``setup.sh`` made), so the same script runs in a local folder laid
out like Gradescope's: that is how the tests check it.
"""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path
from typing import Any

from sampling_course.grading.classroom.reports import UNVERIFIED, cleaned, feedback_text
from sampling_course.grading.planting import SOLUTIONS

__all__ = ["RUN_AUTOGRADER", "SETUP_SH", "gradescope_results", "make_autograder"]

CHECKOUT = SOLUTIONS.parent

SETUP_SH = """#!/usr/bin/env bash
# Runs once when Gradescope builds the autograder's image: install the course and its grading extra.
# The course pins torch to a CPU build; point PIP_INDEX_URL or PIP_EXTRA_INDEX_URL at a CPU-only
# wheel index if the default index would bring a CUDA build.
set -euo pipefail
cd /autograder/source
# bubblewrap: the sandbox every submission runs in (grading refuses to run without it).
apt-get update && apt-get install -y bubblewrap
if ! command -v python3 >/dev/null; then
    apt-get install -y python3 python3-venv python3-pip
fi
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install -q -c constraints.txt -e ".[grading]"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Runs for every submission: grade /autograder/submission, write /autograder/results/results.json.
set -uo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
PYTHON="${AUTOGRADER_PYTHON:-$ROOT/venv/bin/python}"
cd "$ROOT/source"
mkdir -p "$ROOT/results"
CONFIG=()
if [ -f grading.toml ]; then CONFIG=(--config grading.toml); fi
export OMP_NUM_THREADS=1
"$PYTHON" -m sampling_course.apps.cli grade "$ROOT/submission" --jobs 1 "${CONFIG[@]}" \\
    --gradescope "$ROOT/results/results.json" --out "$ROOT/results/report"
"""

_PACKAGED = ("sampling_course", "solutions", "exercises", "tests")
_SKIPPED_PARTS = {"__pycache__", ".ipynb_checkpoints"}


def gradescope_results(result: dict[str, Any]) -> dict[str, Any]:
    """Gradescope's ``results.json`` for one graded submission: one test entry per exercise (everything it quotes
    escaped, see ``reports.escaped``)."""
    result = cleaned(result)
    tests = []
    for number, e in enumerate(result["exercises"], start=1):
        lines = []
        if e["status"] != "done":
            if e.get("mistake"):
                lines.append(e["mistake"])
            if e["status"] == "not implemented yet":
                lines.append(f"{', '.join(e.get('stubs') or ['The stub'])} still raises NotImplementedError.")
            elif e.get("hidden_failure"):
                lines.append("A hidden test failed (its inputs stay hidden).")
            elif e.get("message"):
                lines.append(e["message"])
            if e.get("hint"):
                lines.append(f"Hint: {e['hint']}")
        if e.get("unverified"):
            lines.append(f"{e['unverified']} {UNVERIFIED}.")
        tests.append({
            "name": f"Part {e['part']}: {e['exercise']}", "number": str(number),
            "score": e["points"], "max_score": e["max_points"],
            "status": "passed" if e["status"] == "done" else "failed",
            "output": "\n\n".join(lines), "output_format": "text", "visibility": "visible",
        })
    return {
        "score": result["score"],
        "output": feedback_text(result),
        "output_format": "md",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
    }


def make_autograder(out: Path, config: Path | None = None, checkout: Path = CHECKOUT) -> Path:
    """Write Gradescope's autograder zip to ``out``; return it."""
    out, checkout = Path(out), Path(checkout)
    if out.suffix != ".zip":
        raise ValueError(f"the autograder bundle is a .zip, got {out.name}")
    out.parent.mkdir(parents=True, exist_ok=True)

    def executable(zf: zipfile.ZipFile, name: str, text: str) -> None:
        info = zipfile.ZipInfo(name)
        info.external_attr = (stat.S_IFREG | 0o755) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(info, text)

    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        executable(zf, "setup.sh", SETUP_SH)
        executable(zf, "run_autograder", RUN_AUTOGRADER)
        for name in ("pyproject.toml", "constraints.txt", "README.md"):
            if (checkout / name).is_file():
                zf.write(checkout / name, name)
        if config is not None:
            zf.write(config, "grading.toml")
        for folder in _PACKAGED:
            for path in sorted((checkout / folder).rglob("*")):
                relative = path.relative_to(checkout)
                if path.is_file() and not _SKIPPED_PARTS & set(relative.parts) and path.suffix != ".pyc":
                    zf.write(path, str(relative))
    return out
