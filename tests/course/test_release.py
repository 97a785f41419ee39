"""The student release works on its own: made in a scratch folder, with correct code pasted into its
``exercises/``, installed with pip as its README says (``pip install -c constraints.txt -e .`` in a fresh
virtual environment), its README's commands and its tests pass where ``solutions/`` cannot be imported.

The fresh environment also sees the packages of the one running this test (a ``.pth`` file adds its
site-packages after the fresh one's): pip resolves the release's own requirements against ``constraints.txt``
and installs the release itself (its metadata, its package list, its ``sampling-course`` command), and the
pinned packages it finds installed at their pinned versions are not downloaded and unpacked again (a fully
fresh environment costs minutes of CI's time; CI's first step installs the same pins into an empty one from
the checkout). So this proves the release installs and runs as installed, not that pip can fetch its pins.
The checkout's own editable install, which that environment also sees, is taken off by a ``sitecustomize``
module in the fresh environment's site-packages, so every process the release starts (pytest's included)
imports only the release. Each command first checks that ``solutions`` cannot be found.

The release's whole suite runs (about 40 s of one core on the build machines, loaded), then its slow
grading tests; tests that need real GPT-2 weights, a CUDA GPU or an optional package skip as they do
for a learner.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from sampling_course.grading.classroom.release import make_release

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# Python runs ``sitecustomize`` after the site-packages' .pth files: it removes the editable finders that map
# a name into the checkout (the release's own finder maps into the release).
SITECUSTOMIZE = """
import sys
CHECKOUT = {checkout!r}

def _outside(finder):
    mapping = getattr(sys.modules.get(getattr(finder, "__module__", "")), "MAPPING", {{}})
    return any(str(path).startswith(CHECKOUT) for path in mapping.values())

sys.meta_path[:] = [f for f in sys.meta_path if not _outside(f)]
sys.path_importer_cache.clear()
"""
NO_SOLUTIONS = ("import importlib.util, sys; "
                "assert importlib.util.find_spec('solutions') is None, 'solutions can be imported'; "
                "assert importlib.util.find_spec('sampling_course').origin.startswith(sys.argv[1]), "
                "importlib.util.find_spec('sampling_course').origin")


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The release, with the solutions' files pasted into its exercises/, installed in a fresh virtual
    environment; the environment's interpreter and the variables it runs with."""
    root = tmp_path_factory.mktemp("release")
    out = root / "course"
    make_release(out)
    assert not (out / "solutions").exists()
    for path in (REPO / "solutions").glob("*.py"):
        shutil.copyfile(path, out / "exercises" / path.name)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "SAMPLING_COURSE_IMPL", "VIRTUAL_ENV"))}
    env.update(PYTHONDONTWRITEBYTECODE="1")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], env=env,
                               capture_output=True, text=True, check=True).stdout.strip())
    assert site != Path(sysconfig.get_path("purelib")), site
    # This environment's packages, after the fresh one's own (their .pth files processed, the checkout's among them).
    (site / "zz_this_environment.pth").write_text(f"import site; site.addsitedir({sysconfig.get_path('purelib')!r})\n")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(checkout=str(REPO)))
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    # The release README's install command (its -q left out, so that a failure says why).
    install = subprocess.run([python, "-m", "pip", "install", "-c", "constraints.txt", "-e", "."], cwd=out, env=env,
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return out, env, python


def run(release, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    out, env, python = release
    check = subprocess.run([python, "-c", NO_SOLUTIONS, str(out)], cwd=out, env=env, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stderr[-2000:]
    return subprocess.run([python, *args], cwd=out, env=env, capture_output=True, text=True, timeout=timeout)


def test_solutions_cannot_be_imported_where_the_release_runs(release):
    """The release's code is what the fresh environment imports, through what pip installed there."""
    done = run(release, "-c", "import exercises, sampling_course; print(exercises.__file__, sampling_course.__file__)")
    assert done.returncode == 0, done.stderr[-2000:]
    assert all(path.startswith(str(release[0])) for path in done.stdout.split()), done.stdout
    site = run(release, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip()
    assert list(Path(site).glob("sampling_course-*.dist-info")), f"pip installed no sampling-course in {site}"
    assert (release[2].parent / "sampling-course").is_file(), "pip installed no sampling-course command"


@pytest.mark.parametrize("command", [["check", "LayerNorm"], ["hint", "LayerNorm"], ["progress"],
                                     ["demo", "--reference", "tiny", "--max-tokens", "3"]])
def test_the_readme_s_commands_run_on_the_learner_s_code(release, command):
    """The README's commands (and ``demo``), with correct code pasted in: none needs solutions/."""
    if command[0] != "demo":
        assert f"sampling-course {command[0]}" in (release[0] / "README.md").read_text()
    run(release, "-c", "pass")  # solutions cannot be found where the command runs
    out, env, python = release
    done = subprocess.run([str(python.parent / "sampling-course"), *command], cwd=out, env=env, capture_output=True,
                          text=True, timeout=600)
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
