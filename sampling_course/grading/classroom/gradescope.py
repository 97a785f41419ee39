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
out like Gradescope's: that is how the tests check it. ``setup.sh`` reads ``AUTOGRADER_ROOT`` too,
``COURSE_PYTHON`` (an interpreter of the pinned version, instead of uv's download) and
``TORCH_INDEX_URL``, so that ``scripts/check_gradescope_setup.sh`` runs it where GitHub or PyTorch's
index is out of reach.
"""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path
from typing import Any

from sampling_course.grading.classroom.reports import UNVERIFIED, cleaned, feedback_text
from sampling_course.grading.planting import SOLUTIONS

__all__ = ["PYTHON_VERSION", "RUN_AUTOGRADER", "SETUP_SH", "TORCH_CPU", "UV_VERSION", "gradescope_results", "make_autograder"]

CHECKOUT = SOLUTIONS.parent

# What setup.sh pins. The CPython the course is tested on, as uv builds it (python-build-standalone): Gradescope's
# Ubuntu images bring a python3 too old for the pinned stack (22.04 has 3.10, numpy 2.4 needs 3.11), and
# Ubuntu's own python3.11 packages are older than 3.11.5.
PYTHON_VERSION = "3.11.7"
UV_VERSION = "0.13.9"
TORCH_CPU = "torch==2.13.0+cpu"  # constraints.txt's torch, the CPU build (the default index's Linux wheel is CUDA's)
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

SETUP_SH = f"""#!/usr/bin/env bash
# Runs once, as root, when Gradescope builds the autograder's image: bubblewrap, a pinned CPython, and a virtual
# environment with the course's pinned stack and the CPU build of torch. Everything is downloaded here;
# run_autograder needs no network. Choose Gradescope's Ubuntu 24.04 base image: 22.04's bubblewrap is too old.
set -euo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
PYTHON_VERSION={PYTHON_VERSION}
UV_VERSION={UV_VERSION}
TORCH="{TORCH_CPU}"
TORCH_INDEX="${{TORCH_INDEX_URL:-{TORCH_CPU_INDEX}}}"
cd "$ROOT/source"
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
# bubblewrap: the sandbox every submission runs in (grading refuses to run without it). python3-venv: the
# image's python3 makes the small environment that holds uv (Ubuntu's python3 has no ensurepip without it).
apt-get update -qq
apt-get install -y -qq --no-install-recommends bubblewrap python3 python3-venv ca-certificates
# The sandbox's options need bubblewrap 0.8 or later (Ubuntu 24.04 has 0.9; 22.04 has 0.6).
BWRAP_VERSION="$(bwrap --version | cut -d' ' -f2)"
if [ "$(printf '%s\\n' 0.8 "$BWRAP_VERSION" | sort -V | head -n1)" != 0.8 ]; then
    echo "setup.sh: bubblewrap $BWRAP_VERSION is older than 0.8: choose Gradescope's Ubuntu 24.04 base image" >&2
    exit 1
fi
python3 -m venv "$ROOT/uv"
"$ROOT/uv/bin/pip" install -q "uv==$UV_VERSION"
if [ -n "${{COURSE_PYTHON:-}}" ]; then
    PYTHON="$COURSE_PYTHON"  # an interpreter the image already has (it must be the pinned version: checked below)
else
    "$ROOT/uv/bin/uv" python install --install-dir "$ROOT/python" "$PYTHON_VERSION"
    PYTHON="$(UV_PYTHON_INSTALL_DIR="$ROOT/python" "$ROOT/uv/bin/uv" python find --managed-python --no-project \\
        "$PYTHON_VERSION")"
fi
"$PYTHON" -c "import platform, sys; v = platform.python_version(); sys.exit(None if v == '$PYTHON_VERSION' else v)"
"$PYTHON" -m venv "$ROOT/venv"
# torch first, from the CPU index and without its dependencies; the course's pins then bring those from PyPI
# (constraints.txt's torch==2.13.0 is met by 2.13.0+cpu).
"$ROOT/venv/bin/pip" install -q --no-deps --index-url "$TORCH_INDEX" "$TORCH"
"$ROOT/venv/bin/pip" install -q -c constraints.txt -e ".[grading]"
"$ROOT/venv/bin/python" -c "import torch; assert torch.version.cuda is None, torch.version.cuda"
# Whether bubblewrap can make a sandbox here. An image build may not allow the namespaces that grading is given:
# each grade checks again, and refuses to start (saying why, in Gradescope's output) when it cannot.
if ! "$ROOT/venv/bin/python" -c "import sys; from sampling_course.grading.classroom import jail; \\
        sys.exit(jail.available() is None)"; then
    echo "warning: bubblewrap cannot make a sandbox while the image is built" >&2
fi
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Runs for every submission: grade /autograder/submission, write /autograder/results/results.json.
set -uo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
PYTHON="${AUTOGRADER_PYTHON:-$ROOT/venv/bin/python}"
cd "$ROOT/source" || exit 1
mkdir -p "$ROOT/results"
CONFIG=()
if [ -f grading.toml ]; then CONFIG=(--config grading.toml); fi
export OMP_NUM_THREADS=1
# Grading needs no network: the course's models ship in its package, and no hub download is tried.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_NO_INDEX=1
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
