"""Class grading, the slow part (``python -m pytest -m classroom``): hostile submissions, executors, 200 students.

* The hostile corpus (``hostile_corpus.py``): at least 25 submissions, covering every way a
  submission could earn what it did not solve (the grader's objects, objects that judge
  themselves, links out of the folder, the environment and forged flags, the limits, answers
  from the release or Hugging Face, the reports) and honest ones beside them. Each earns
  exactly what it solves; no honest one is flagged. A race_sample drawn with torch.multinomial
  (part 6b) is graded apart, on that exercise alone.
* The executors: Dask on a LocalCluster of two workers, and the Gradescope bundle run in a
  folder laid out like Gradescope's (one submission, one at a time). A process pool of two
  grades the corpus and the six students of ``test_classroom.py``; the race_sample, Engine.step
  and part-11 submissions (two to five each) are graded one after another, each in a fork of
  this process, as ``grade --jobs 1`` does (a pool would start two more interpreters, each
  importing torch, for them).
* A synthetic class of 200 whose true grades are known in advance.
"""

from __future__ import annotations

import csv
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
from sampling_course.grading.classroom.submission import find_submissions
from sampling_course.grading.classroom.synthetic import EXERCISES as SYNTHETIC_EXERCISES

from hostile_corpus import CANARY_ENV, ENGINE_GRADED, ESCAPE_NAME, QUANT_GRADED, RACE_GRADED, write_corpus, write_engine_corpus, write_race_corpus
from hostile_corpus import stubbed_sampling, write_quant_corpus
from hostile_corpus import GRADED as CORPUS_GRADED
from sampling_course.grading.classroom.reports import escaped, safe_name, write_reports
from test_classroom import assert_true_grades, grade_synthetic_class

pytestmark = pytest.mark.classroom

REPO = Path(__file__).resolve().parents[2]
GRADED = ("greedy_search", "apply_temperature", "apply_frequency_penalty")

# The solutions' code for greedy_search, and a wrong apply_temperature.
GOOD_GREEDY = "        return int(logits.argmax())\n"
BAD_TEMPERATURE = "        return logits * temperature\n"


def test_hostile_corpus_earns_only_what_it_solves(tmp_path, monkeypatch):
    """Each hostile submission earns exactly the exercises it truly solves; no honest one loses a point or is
    flagged; nothing outside a submission's copy changes; the network is never reached."""
    listener = socket.create_server(("127.0.0.1", 0))
    connections = []
    threading.Thread(target=lambda: connections.append(listener.accept()), daemon=True).start()
    canary = tmp_path / "canary.txt"
    canary.write_text("still here")
    monkeypatch.setenv(CANARY_ENV, "the grader's secret")
    cases = write_corpus(tmp_path / "class", listener.getsockname()[1], canary)
    assert len(cases) >= 25 and {c.cause for c in cases.values()} == set("12345678")
    # Limits well above an honest submission's time under load, and short enough that the submissions that run past
    # them (a loop that never ends, a grader kept busy, memory used up) cost seconds, not minutes: each of those runs
    # until its exercise's limit, with a fresh process after each test it overran. An honest test here waits at most
    # 0.7 s for the submission, a whole honest exercise under 2 s (the most: print_flood's greedy_search, which
    # prints 50 MB three times), measured on 2 cores at load 4.3.
    settings = load_settings(None, exercises=list(CORPUS_GRADED), seconds_per_test=5, seconds_per_exercise=10,
                             seconds_per_submission=300, memory_mb=1536)
    started = time.monotonic()
    results = {r["student"]: r for r in grade_all(find_submissions(tmp_path / "class"), settings, jobs=2)}
    seconds = time.monotonic() - started
    table, wrong = [], []
    for student, case in cases.items():
        result = results[student]
        earned = tuple(e["exercise"] for e in result["exercises"] if e["status"] == "done")
        table.append(f"| {escaped(student, newlines=False)} | {case.cause} | {case.tries} | {', '.join(earned) or '-'} | "
                     f"{', '.join(case.passes) or '-'} | {'; '.join(dict.fromkeys(f['kind'] for f in result['flags'])) or '-'} | "
                     f"{result['seconds']:.0f} s |")
        if set(earned) != set(case.passes):
            wrong.append(f"{student}: earned {earned}, solves {case.passes}: {result['exercises']}")
        if (case.cause == "8" or set(case.passes) == set(CORPUS_GRADED)) and \
                {f["kind"] for f in result["flags"]} != set(case.flags):
            wrong.append(f"{student}: honest here, flagged {result['flags']} (expected {case.flags or 'none'})")
    print(f"\n{len(cases)} submissions in {seconds:.0f} s (--jobs 2)\n" + "\n".join(table))
    assert not wrong, "\n".join(wrong)
    assert canary.read_text() == "still here" and (tmp_path / "class" / "control" / "exercises").is_dir()
    assert not connections, "a submission reached the network"
    assert not (tmp_path / "class" / "escaped.py").exists() and not Path("/tmp/absolute_escape.py").exists()
    report = tmp_path / "report"
    write_reports(list(results.values()), settings, report)
    rows = list(csv.reader((report / "grades.csv").open()))
    assert all(not row[0].startswith(("=", "+", "-", "@")) for row in rows[1:])
    feedback = (report / "feedback" / "fence_breaker.md").read_text()
    assert "<script>" not in feedback and "\n# Score" not in feedback and "```" not in feedback
    for path in (p for p in report.rglob("*") if p.is_file()):  # every report written, none with a raw escape
        assert not {"\x1b", "\x07"} & set(path.read_bytes().decode("utf-8")), path.name
    assert "\\\\x1b\\]0;owned" in (report / "feedback" / f"{safe_name(ESCAPE_NAME)}.md").read_text()
    assert not any(f["kind"] == "files" for f in results["not_utf8_file"]["flags"])  # written in the sandbox's own
    assert "zz control2" in (report / "feedback" / f"{safe_name('zz control2')}.md").read_text()
    assert "zz\\_control2" in (report / "feedback" / "zz_control2.md").read_text()
    meta = next(e for e in results["meta_answer"]["exercises"] if e["exercise"] == "apply_frequency_penalty")
    assert meta["status"] == "failing" and "dense tensor" in meta["message"], meta  # a wrong type, not a stub
    assert "links are never followed, and it holds 1 link (mywork)" in results["linked_classmate"]["error"]
    listener.close()


def test_an_exercise_whose_tests_ran_out_of_time_earns_nothing(tmp_path):
    """A wrong apply_temperature (it divides by T squared: its peak-and-valley checks pass, its Hugging Face ones do
    not) beside a greedy_search that never returns: the clock runs out in greedy_search before the failing checks run.
    apply_temperature is not earned (its tests that did not run count as not passed), says why, and both time
    reasons are kept among the flags."""
    package = tmp_path / "class" / "clock" / "exercises"
    package.mkdir(parents=True)
    (package / "sampling.py").write_text(stubbed_sampling(greedy_search="        while True:\n            pass\n",
                                                         apply_temperature="        return logits / temperature**2\n"))
    settings = load_settings(None, exercises=["greedy_search", "apply_temperature"], seconds_per_test=6,
                             seconds_per_exercise=60, seconds_per_submission=6, diagnose=False)
    (result,) = grade_all(find_submissions(tmp_path / "class"), settings)
    entries = {e["exercise"]: e for e in result["exercises"]}
    temperature = entries["apply_temperature"]
    assert temperature["passed"] >= 1 and temperature["not_run"] >= 1, temperature  # the case this test is about
    assert temperature["status"] == "took too long" and temperature["points"] == 0 and result["score"] == 0, temperature
    assert "not run: the submission's time limit (6 s) was reached first" in temperature["message"]
    reasons = [f["reason"] for f in result["flags"] if f["kind"] == "time"]
    assert any("ran past the time limit" in r for r in reasons) and any("did not run" in r for r in reasons), reasons


def test_race_sample_drawn_by_torch_multinomial_earns_nothing(tmp_path):
    """A race_sample that draws with torch.multinomial follows softmax's law and its generator, but reads values
    back to the host: it earns nothing, and the operations recorded in its process (the one check of this that
    runs on the CPU; the CUDA sync check needs a GPU) are why: a record kept in its own process convicts it. The
    solutions' race_sample earns it, unflagged, on its other tests: its check on that record earns nothing."""
    cases = write_race_corpus(tmp_path / "class")
    settings = load_settings(None, exercises=list(RACE_GRADED), seconds_per_test=30, seconds_per_exercise=120,
                             seconds_per_submission=300, memory_mb=1536)
    results = {r["student"]: r for r in grade_all(find_submissions(tmp_path / "class"), settings)}
    for student, case in cases.items():
        (entry,) = results[student]["exercises"]
        earned = (entry["exercise"],) if entry["status"] == "done" else ()
        assert earned == case.passes, f"{student}: earned {earned}, solves {case.passes}: {entry}"
        assert not results[student]["flags"], f"{student}: flagged {results[student]['flags']}"
    (entry,) = results["race_multinomial"]["exercises"]
    assert entry["failed"] == 1 and "multinomial" in entry["message"], entry  # only the host reads: the law is right
    # A failure on the record its own process kept counts; the control's pass on its record is left out of the count.
    assert results["race_control"]["exercises"][0]["unverified"] == 1 and entry["unverified"] == 0



def test_an_engine_that_runs_past_the_cap_earns_nothing_with_its_pass_counter_patched(tmp_path):
    """An engine that runs an extra pass of each whole prompt, past any cap on the positions of a step, and patches
    the course's pass counter as its own process loads it (from exercises/__init__.py): the positions are counted
    in the double host, where the engine's calls of the model it was handed go, so it earns nothing for
    Engine.step; the solutions' engine earns it, unflagged. An engine that forges the call counter kept in its own
    process earns nothing from the test that reads it."""
    cases = write_engine_corpus(tmp_path / "class")
    settings = load_settings(None, exercises=list(ENGINE_GRADED), seconds_per_test=120, seconds_per_exercise=600,
                             seconds_per_submission=900, memory_mb=3072)
    results = {r["student"]: r for r in grade_all(find_submissions(tmp_path / "class"), settings)}
    for student, case in cases.items():
        (entry,) = results[student]["exercises"]
        earned = (entry["exercise"],) if entry["status"] == "done" else ()
        assert earned == case.passes, f"{student}: earned {earned}, solves {case.passes}: {entry}"
        assert not results[student]["flags"], f"{student}: flagged {results[student]['flags']}"
    (entry,) = results["engine_extra_pass"]["exercises"]
    assert "a forward pass ran" in entry["message"] and entry["points"] == 0, entry
    # The engine that never asks BlockTable.slots and forges its own process's call counter: that test passes on the
    # forged count, and so earns nothing, as the control's passes on its own record (the calls and the blocks held
    # per step) earn nothing; both earn Engine.step on their other tests, which their right outputs pass.
    forged, control = results["engine_forged_calls"]["exercises"][0], results["engine_control"]["exercises"][0]
    assert forged["unverified"] == control["unverified"] == 2 and forged["passed"] == control["passed"], (forged, control)

def test_part11_weights_kept_aside_in_float_earn_nothing(tmp_path):
    """quantise_model graded on its own: fake quantisation (the float weights kept, the submission's own weight_bytes
    reporting the codes' bytes) and codes stored beside a float copy that the forward pass reads each earned it
    before, the test reading only the model's outputs and weight_bytes; the test now reads the stored tensors as
    data, gives them new contents and dequantises them itself, so both earn nothing and the solutions' earn it.
    Double quantisation with zero codes whose DoubleQuantised.dequantise (given code) returns the absmaxes kept aside
    earned double_quantise: the test now dequantises the codes itself and checks the scales. int8 codes returned as a
    tensor subclass that says int8 over unrounded floats earn nothing (the quantisers' results must be plain tensors)."""
    cases = write_quant_corpus(tmp_path / "class")
    settings = load_settings(None, exercises=list(QUANT_GRADED), seconds_per_test=120, seconds_per_exercise=400,
                             seconds_per_submission=600, memory_mb=3072)
    results = {r["student"]: r for r in grade_all(find_submissions(tmp_path / "class"), settings)}
    for student, case in cases.items():
        entries = {entry["exercise"]: entry for entry in results[student]["exercises"]}
        earned = tuple(name for name in QUANT_GRADED if entries[name]["status"] == "done")
        assert earned == case.passes, f"{student}: earned {earned}, solves {case.passes}: {entries}"
        assert not results[student]["flags"], f"{student}: flagged {results[student]['flags']}"
    model = {r: {e["exercise"]: e for e in results[r]["exercises"]}["quantise_model"]["message"] for r in results}
    assert "not parametrised" in model["quant_fake"] and "does not read what it stores" in model["quant_float_copy"]


PROBE = """
import os
from pathlib import Path


def seen(tokenizer, text, folder, try_writing):
    wrote = "not tried"
    if try_writing:
        try:
            (Path(folder) / "tokenizer.json").write_text("changed")
            wrote = "wrote"
        except OSError:
            wrote = "refused"
    return [type(tokenizer).__module__ + "." + type(tokenizer).__qualname__, tokenizer.encode(text),
            sorted(os.listdir(folder)), wrote]
"""


@pytest.mark.parametrize("sandboxed", [True, False], ids=["bubblewrap", "unsafe"])
def test_gpt2s_tokenizer_reaches_a_sandboxed_submission_by_name(tmp_path, monkeypatch, sandboxed):
    """With GPT-2 small cached (a stand-in cache), the sandbox holds GPT-2's two tokenizer files, read-only, and
    the grader's GPT-2 tokenizer reaches the submission's code as a tokenizer of its own process, made from them;
    without the sandbox, from the cache itself."""
    from sampling_course.grading.classroom import jail
    from sampling_course.grading.classroom.grade import Connection
    from sampling_course.grading.classroom.settings import GradeSettings
    from sampling_course.tokenizer import Tokenizer

    from fake_hub import ADDED_TOKEN, fake_gpt2_cache

    folder = fake_gpt2_cache(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "probe.py").write_text(PROBE)
    bwrap = jail.available() if sandboxed else None
    assert bwrap or not sandboxed, "bubblewrap is needed: apt-get install bubblewrap"
    connection = Connection(tmp_path / "copy", GradeSettings(unsafe_no_sandbox=not sandboxed), bwrap=bwrap)
    ours = Tokenizer(folder)
    text = f"hello {ADDED_TOKEN}"
    try:
        probe = connection.connect().request("import", None, name="probe")
        where = jail.GPT2_TOKENIZER if sandboxed else str(folder)
        kind, ids, files, wrote = probe.seen(ours, text, where, sandboxed)
    finally:
        connection.retire()
    assert kind == "sampling_course.tokenizer.Tokenizer" and ids == ours.encode(text)
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(files)
    if sandboxed:  # nothing else of the cache, and nothing it may change
        assert files == ["tokenizer.json", "tokenizer_config.json"] and wrote == "refused"
    assert Tokenizer(folder).encode(text) == ids


def test_dask_local_cluster(tmp_path):
    """On a Dask LocalCluster of two workers, two submissions (one per worker: two mistakes and a variant) travel
    as zips and come back graded as planted."""
    distributed = pytest.importorskip("distributed", reason="the grading extra is not installed: "
                                                            "pip install -c constraints.txt -e '.[grading]'")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        students, _, results = grade_synthetic_class(tmp_path, 2, seed=6, exercises=GRADED,
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
    (root / "submission" / "sampling.py").write_text(stubbed_sampling(greedy_search=GOOD_GREEDY, apply_temperature=BAD_TEMPERATURE))
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
