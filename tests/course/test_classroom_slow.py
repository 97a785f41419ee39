"""Class grading, the slow part (``python -m pytest -m classroom``): hostile submissions, executors, 200 students.

* The hostile corpus: submissions that loop forever, eat memory, fork, exit at import, replace
  torch's comparisons and pytest's reporting, write fake reports, read the hidden tests and
  another student's files, connect to the network and delete files outside their folder. Each
  is graded for what it solves (here: one exercise of three, or nothing), flagged with the
  reason, and none stops or stalls the grading of the others.
* The executors: a process pool of two, Dask on a LocalCluster of two workers, and the
  Gradescope bundle run in a folder laid out like Gradescope's.
* A synthetic class of 200 whose true grades are known in advance.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from sampling_course.grading.classroom.executors import grade_all
from sampling_course.grading.classroom.gradescope import make_autograder
from sampling_course.grading.classroom.settings import load_settings
from sampling_course.grading.classroom.submission import STUBS, find_submissions
from sampling_course.grading.classroom.synthetic import EXERCISES as SYNTHETIC_EXERCISES
from sampling_course.grading.planting import SOLUTIONS

from test_classroom import assert_true_grades, grade_synthetic_class

pytestmark = pytest.mark.classroom

REPO = Path(__file__).resolve().parents[2]
GRADED = ("greedy_search", "apply_temperature", "apply_frequency_penalty")

# The solutions' code for the three graded exercises, and wrong versions of two of them.
GOOD_GREEDY = "        return int(logits.argmax())\n"
GOOD_TEMPERATURE = "        return logits / temperature\n"
BAD_TEMPERATURE = "        return logits * temperature\n"


def stubbed_sampling(greedy: str, temperature: str, header: str = "") -> str:
    """exercises/sampling.py from the stubs, with greedy_search and apply_temperature filled in."""
    source = (STUBS / "sampling.py").read_text()
    marker = "        raise NotImplementedError()\n"
    for name, body in (("def greedy_search", greedy), ("def apply_temperature", temperature)):
        start = source.index(name)
        at = source.index(marker, start)
        source = source[:at] + body + source[at + len(marker):]
    future = "from __future__ import annotations\n"
    at = source.index(future) + len(future) if future in source else 0
    return source[:at] + header + source[at:]


def hostile_corpus(root: Path, port: int, canary: Path) -> dict[str, tuple[str, str, float, set[str]]]:
    """Write the corpus into ``root``; return {student: (what it tries, its sampling.py, true score, flag kinds)}."""
    tests = REPO / "tests" / "conftest.py"
    corpus = {
        "control": ("nothing (an honest, complete submission)", GOOD_GREEDY, GOOD_TEMPERATURE, 2, set()),
        "infinite_loop": ("an infinite loop in greedy_search", "        while True:\n            pass\n",
                          GOOD_TEMPERATURE, 1, {"time"}),
        "memory_bomb": ("allocates memory until it runs out", "        hog = []\n        while True:\n"
                        "            hog.append(bytearray(1 << 26))\n", GOOD_TEMPERATURE, 1, {"memory"}),
        "fork_bomb": ("a fork bomb", "        import os\n        while True:\n            os.fork()\n",
                      GOOD_TEMPERATURE, 1, {"process"}),
        "exit_at_import": ("os._exit(0) at import", GOOD_GREEDY, GOOD_TEMPERATURE, 0, {"process"}),
        "monkeypatch": ("replaces torch.allclose, torch.equal, torch.testing.assert_close and pytest's reporting",
                        "        return 0\n", BAD_TEMPERATURE, 0, {"replaced"}),
        "fake_report": ("writes results.json and a fake report", "        return 0\n", BAD_TEMPERATURE, 0,
                        {"write", "files"}),
        "reads_secrets": ("reads the hidden tests and another student's files", GOOD_GREEDY, BAD_TEMPERATURE, 1,
                          {"read"}),
        "network": ("opens a connection to 127.0.0.1", "        return 0\n", BAD_TEMPERATURE, 0, {"network"}),
        "deletes": ("deletes a file outside its folder and another student's folder", "        return 0\n",
                    BAD_TEMPERATURE, 0, {"delete"}),
    }
    headers = {
        "exit_at_import": "import os\nos._exit(0)\n",
        "monkeypatch": (
            "import torch, torch.testing\n"
            "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n"
            "torch.testing.assert_close = lambda *a, **k: None\n"
            "try:\n    import _pytest.reports\n"
            "    _pytest.reports.TestReport.passed = property(lambda self: True)\n"
            "    _pytest.reports.TestReport.failed = property(lambda self: False)\n"
            "except Exception:\n    pass\n"),
        "fake_report": (
            "import json, pathlib\nfake = json.dumps({'score': 100, 'tests': []})\n"
            "pathlib.Path('results.json').write_text(fake)\n"
            "for target in ('/autograder/results/results.json', '/tmp/results.json', "
            f"'{root.parent}/report/grades.csv'):\n"
            "    try:\n        pathlib.Path(target).write_text(fake)\n    except OSError:\n        pass\n"),
        "reads_secrets": (
            "import os\nstolen = []\n"
            f"for target in ('{tests}', '{root / 'control' / 'exercises' / 'sampling.py'}', '{SOLUTIONS / 'sampling.py'}'):\n"
            "    try:\n        stolen.append(open(target).read())\n    except OSError:\n        pass\n"),
        "network": (
            "import socket\ntry:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'leak')\n"
            "except OSError:\n    pass\n"),
        "deletes": (
            "import os, shutil\n"
            f"for action in (lambda: os.remove('{canary}'), lambda: shutil.rmtree('{root / 'control'}')):\n"
            "    try:\n        action()\n    except OSError:\n        pass\n"),
    }
    out = {}
    for student, (tries, greedy, temperature, score, flags) in corpus.items():
        package = root / student / "exercises"
        package.mkdir(parents=True)
        (package / "sampling.py").write_text(stubbed_sampling(greedy, temperature, headers.get(student, "")))
        out[student] = (tries, score, flags)
    return out


def test_hostile_submissions_are_graded_for_what_they_solve_and_flagged(tmp_path):
    """Each hostile submission gets exactly the points of what it solves and a flag naming what it tried,
    and none stops the others: the honest control is graded in full after all of them."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    connections = []
    threading.Thread(target=lambda: connections.append(listener.accept()), daemon=True).start()
    canary = tmp_path / "canary.txt"
    canary.write_text("still here")
    expected = hostile_corpus(tmp_path / "class", port, canary)
    settings = load_settings(None, exercises=list(GRADED), seconds_per_test=10, seconds_per_exercise=20,
                             seconds_per_submission=120, memory_mb=512)
    order = sorted(find_submissions(tmp_path / "class"), key=lambda s: s[0] == "control")  # control last
    started = time.monotonic()
    results = {r["student"]: r for r in grade_all(order, settings, jobs=1)}
    table = []
    for student, (tries, score, flags) in expected.items():
        result = results[student]
        kinds = {f["kind"] for f in result["flags"]}
        table.append(f"{student:15} | {tries} | {result['score']:g}/{result['max_score']:g} | "
                     + "; ".join(f["reason"] for f in result["flags"]))
        assert result["score"] == score, f"{student}: {result['score']} points, expected {score}\n{result}"
        assert flags <= kinds, f"{student}: flags {kinds}, expected at least {flags}"
    print("\n".join(table))
    assert not results["control"]["flags"] and results["control"]["score"] == 2
    assert canary.read_text() == "still here" and (tmp_path / "class" / "control" / "exercises").is_dir()
    assert not connections, "a submission reached the network"
    assert not Path("/tmp/results.json").exists() or Path("/tmp/results.json").stat().st_mtime < started - 1
    assert time.monotonic() - started < 600
    listener.close()


def test_process_pool_of_two(tmp_path):
    """--jobs 2: the same true grades from two grading processes."""
    students, _, results = grade_synthetic_class(tmp_path, 4, seed=5, exercises=GRADED, jobs=2)
    assert_true_grades(students, results)


def test_dask_local_cluster(tmp_path):
    """On a Dask LocalCluster of two workers, submissions travel as zips and come back graded as planted."""
    distributed = pytest.importorskip("distributed", reason="the grading extra is not installed: "
                                                            "pip install -c constraints.txt -e '.[grading]'")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        students, _, results = grade_synthetic_class(tmp_path, 4, seed=6, exercises=GRADED,
                                                     scheduler=cluster.scheduler_address)
    assert_true_grades(students, results)


def test_gradescope_autograder_runs_in_gradescope_folders(tmp_path):
    """The bundle's run_autograder, in folders laid out like Gradescope's, writes a results.json with the grade."""
    config = tmp_path / "grading.toml"
    config.write_text('[grading]\nexercises = ["greedy_search", "apply_temperature"]\n')
    bundle = make_autograder(tmp_path / "autograder.zip", config)
    root = tmp_path / "autograder"
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(root / "source")
        assert {"setup.sh", "run_autograder"} <= set(zf.namelist())
    (root / "submission").mkdir()
    (root / "submission" / "sampling.py").write_text(stubbed_sampling(GOOD_GREEDY, BAD_TEMPERATURE))
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": sys.executable, "PYTHONPATH": ""}
    run = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == 1
    assert [t["status"] for t in results["tests"]] == ["passed", "failed"]
    assert "This matches a classic mistake" in results["tests"][1]["output"]


def test_two_hundred_students_get_their_true_grades(tmp_path):
    """The synthetic class of 200 (seeded): every grade exactly as planted, graded with two jobs."""
    started = time.monotonic()
    students, settings, results = grade_synthetic_class(tmp_path, 200, seed=2026, exercises=SYNTHETIC_EXERCISES,
                                                        jobs=2, settings={"diagnose": False})
    assert_true_grades(students, results)
    minutes = (time.monotonic() - started) / 60
    print(f"\n200 submissions x {len(settings.exercises)} exercises graded in {minutes:.1f} min "
          f"({200 / minutes:.1f} per minute, --jobs 2)")
