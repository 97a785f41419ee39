"""The Gradescope bundle's setup.sh, read: what it pins, what it installs, and that it is a valid script.

Running it needs root, an Ubuntu root and the network: ``scripts/check_gradescope_setup.sh`` does that (a
documented command, not part of CI). Here: its pins agree with ``constraints.txt`` and the README's Python floor,
it installs ``python3-venv`` whatever python3 the image has, takes torch's CPU build from the CPU index, refuses
a bubblewrap older than the sandbox needs, and bash (and shellcheck, where installed) find no fault in it or in
``run_autograder``, which sets the offline switches so that grading reaches no network.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sampling_course.grading.classroom.gradescope import (PYTHON_VERSION, RUN_AUTOGRADER, SETUP_SH, TORCH_CPU,
                                                          UV_VERSION)

REPO = Path(__file__).resolve().parents[2]


def test_setup_pins_the_python_the_course_needs_and_the_cpu_torch_of_the_constraints():
    floor = re.search(r"Python (\d+)\.(\d+)\.(\d+) or newer", (REPO / "README.md").read_text())
    assert floor and tuple(map(int, PYTHON_VERSION.split("."))) >= tuple(map(int, floor.groups()))
    pinned = re.search(r"^torch==(\S+)$", (REPO / "constraints.txt").read_text(), re.MULTILINE).group(1)
    assert TORCH_CPU == f"torch=={pinned}+cpu"
    assert f"PYTHON_VERSION={PYTHON_VERSION}\n" in SETUP_SH and f"UV_VERSION={UV_VERSION}\n" in SETUP_SH
    assert 'python install --install-dir "$ROOT/python" "$PYTHON_VERSION"' in SETUP_SH
    assert '--no-deps --index-url "$TORCH_INDEX" "$TORCH"' in SETUP_SH
    assert "https://download.pytorch.org/whl/cpu" in SETUP_SH and "torch.version.cuda is None" in SETUP_SH
    assert '-c constraints.txt -e ".[grading]"' in SETUP_SH


def test_setup_installs_venv_and_bubblewrap_whatever_the_image_has():
    install = next(line for line in SETUP_SH.splitlines() if line.startswith("apt-get install"))
    assert {"bubblewrap", "python3", "python3-venv"} <= set(install.split())
    assert "command -v python3" not in SETUP_SH  # not only when python3 is missing


@pytest.mark.parametrize("version, refused", [("0.6.1", True), ("0.8.0", False), ("0.11.0", False)])
def test_setup_refuses_a_bubblewrap_older_than_0_8(tmp_path, version, refused):
    """setup.sh's version check, run on its own against a bwrap that says ``version``."""
    start = SETUP_SH.index('BWRAP_VERSION="')
    check = SETUP_SH[start:SETUP_SH.index("\nfi\n", start) + 4]
    fake = tmp_path / "bwrap"
    fake.write_text(f"#!/bin/sh\necho 'bubblewrap {version}'\n")
    fake.chmod(0o755)
    done = subprocess.run(["bash", "-c", check], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=30)
    assert (done.returncode == 1) is refused and ("older than 0.8" in done.stderr) is refused, done


def test_run_autograder_reaches_no_network():
    for switch in ("HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "PIP_NO_INDEX=1"):
        assert switch in RUN_AUTOGRADER
    assert "pip install" not in RUN_AUTOGRADER and "apt-get" not in RUN_AUTOGRADER


@pytest.mark.parametrize("name", ["setup.sh", "run_autograder"])
def test_the_scripts_are_valid_bash(tmp_path, name):
    script = tmp_path / name
    script.write_text(SETUP_SH if name == "setup.sh" else RUN_AUTOGRADER)
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    if shutil.which("shellcheck"):
        lint = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, timeout=60)
        assert lint.returncode == 0, lint.stdout
