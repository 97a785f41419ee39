"""The student release works on its own: made in a scratch folder, with correct code pasted into its
``exercises/``, its README's commands and its tests pass where ``solutions/`` cannot be imported.

The release is run by this interpreter with its environment's packages (torch, transformers, ...), the
release's folder first on the import path, and the course's checkout out of reach: the editable install
of the checkout (a finder on ``sys.meta_path`` that maps ``sampling_course``, ``exercises`` and
``solutions`` to the checkout) is taken off by a ``sitecustomize`` module before anything is imported,
so every process the release starts (pytest's included) imports only the release. Each command first
checks that ``solutions`` cannot be found.

The release's whole suite runs (about 40 s of one core on the build machines, loaded), then its slow
grading tests; tests that need real GPT-2 weights, a CUDA GPU or an optional package skip as they do
for a learner.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sampling_course.grading.classroom.release import make_release

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# Python runs ``sitecustomize`` after the site-packages' .pth files: it removes the checkout's editable finder.
SITECUSTOMIZE = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path_hooks[:] = [h for h in sys.path_hooks if not getattr(h, "__module__", "").startswith("__editable__")]
sys.path_importer_cache.clear()
"""
NO_SOLUTIONS = ("import importlib.util, sys; "
                "assert importlib.util.find_spec('solutions') is None, 'solutions can be imported'; "
                "assert importlib.util.find_spec('sampling_course').origin.startswith(sys.argv[1]), "
                "importlib.util.find_spec('sampling_course').origin")


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The release, with the solutions' files pasted into its exercises/, and the environment that runs it."""
    root = tmp_path_factory.mktemp("release")
    out = root / "course"
    make_release(out)
    assert not (out / "solutions").exists()
    for path in (REPO / "solutions").glob("*.py"):
        shutil.copyfile(path, out / "exercises" / path.name)
    shim = root / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SAMPLING_COURSE_IMPL"))}
    env.update(PYTHONPATH=f"{shim}{os.pathsep}{out}", PYTHONDONTWRITEBYTECODE="1")
    return out, env


def run(release, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    out, env = release
    check = subprocess.run([sys.executable, "-c", NO_SOLUTIONS, str(out)], cwd=out, env=env, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stderr[-2000:]
    return subprocess.run([sys.executable, *args], cwd=out, env=env, capture_output=True, text=True, timeout=timeout)


def test_solutions_cannot_be_imported_where_the_release_runs(release):
    done = run(release, "-c", "import exercises, sampling_course; print(exercises.__file__, sampling_course.__file__)")
    assert done.returncode == 0, done.stderr[-2000:]
    assert all(path.startswith(str(release[0])) for path in done.stdout.split()), done.stdout


@pytest.mark.parametrize("command", [["check", "LayerNorm"], ["hint", "LayerNorm"], ["progress"],
                                     ["demo", "--reference", "tiny", "--max-tokens", "3"]])
def test_the_readme_s_commands_run_on_the_learner_s_code(release, command):
    """The README's commands (and ``demo``), with correct code pasted in: none needs solutions/."""
    if command[0] != "demo":
        assert f"sampling-course {command[0]}" in (release[0] / "README.md").read_text()
    done = run(release, "-m", "sampling_course.apps.cli", *command)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert "solutions" not in done.stderr, done.stderr[-3000:]


def test_the_release_s_whole_suite_passes_with_correct_code(release):
    """The README's test command (the release's pytest options: --impl exercises, the slow tests left out), then
    the release's slow grading tests (part 9's export among them), all on the code pasted into exercises/."""
    for args in ((), ("-m", "slow", "tests/grading")):
        done = run(release, "-m", "pytest", "-q", *args, timeout=900)
        tail = done.stdout[-3000:]
        assert done.returncode == 0, tail + done.stderr[-2000:]
        assert " passed" in tail and " failed" not in tail and " error" not in tail, tail


def test_notebook_two_s_compare_shows_the_learner_s_side_alone(release):
    """``compare`` (notebooks 02 and 03) runs the learner's sampler; the course's is not in the release."""
    code = ("from sampling_course import compare; "
            "c = compare('Once', reference='tiny', max_tokens_generated=3, impl='exercises', display=False); "
            "assert c.learner.status == 'ok' and c.match is None, c; "
            "assert 'not in the student release' in c.solution.message, c")
    done = run(release, "-c", code)
    assert done.returncode == 0, done.stderr[-3000:]
