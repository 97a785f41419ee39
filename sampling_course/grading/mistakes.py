"""Plant the classic mistakes of each exercise and check that the tests catch every one;
plant correct variants in other styles and check that the tests accept every one.

A grading test is only worth something if it fails on wrong code. Each ``Mistake`` (listed
per part in ``grading/parts/``) rewrites one line of the solutions the way a learner might
get it wrong (temperature multiplied instead of divided, an exclusive top-p cutoff, a mask
off by one, ...); the tests of its exercise (``--exercise``, see ``planting.exercises_of``)
must then fail. The mirror image: each ``Variant`` rewrites an exercise in another correct
style (``Categorical(...).sample()``, top-p through ``searchsorted``, a ``-1e10`` mask, ...),
and then every test of that exercise must pass. A correct variant of part 1 (the model) or 4
(the cached model) is also the model the later parts run on: such variants are planted together,
one per exercise (``Downstream``, ``downstream_groups``), and the later parts' tests marked
``downstream`` must pass on each group.

How a change is judged. A worker process writes the planted copy of the solutions as a
package of its own name (``planting.write_package``) and runs the exercise's tests on it
with pytest *in the worker*, imported afresh (``sandbox.isolated_package``), as a learner's
``exercises`` would be graded. One worker judges change after change, so Python, torch and
the reference models load once per worker instead of once per change. Sharing a process is
safe as long as no run disturbs what the next one relies on: after each run the worker
compares the shared reference models' weights and torch's global settings with what they
were; when they changed, or the worker died, the change is judged again in a fresh worker
of its own, and the disturbed worker is replaced.

The same workers walk the course in order (``judge_step``, ``walk_course``; see ``grading/walk.py``).

``plant_mistakes`` and ``plant_variants`` judge many changes, ``jobs`` workers at a time;
``sampling-course plant-mistakes`` (``sampling_course.apps.course_commands``) prints the tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from itertools import count
from pathlib import Path
from typing import Any

from sampling_course.grading.catalogue import Mistake, Variant
from sampling_course.grading.planting import exercises_of, mistake_target, planted_sources, write_package
from sampling_course.grading.walk import Step, walk_sources

__all__ = ["DOWNSTREAM_OF", "Downstream", "Verdict", "downstream_files", "downstream_groups", "judge", "judge_step",
           "plant_mistakes", "plant_variants", "serve", "walk_course"]

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"

Change = Mistake | Variant

# A test of a planted copy that runs longer than this is stopped, as a learner's would be
# (the pytest plugin's DEFAULT_TEST_TIMEOUT; not imported from there, which would load torch here).
TEST_TIMEOUT_S = 60.0
# A worker that gives no verdict for this long is stopped (a hang outside any test's time limit).
CHANGE_TIMEOUT_S = 1800.0
# Parts whose correct variants are also run under the later parts' `downstream` tests (the model they run).
DOWNSTREAM_OF = (1, 4)
# The shipped references the tests load; the worker loads them once and watches their weights.
SHARED_REFERENCES = ("tiny", "story", "story-draft")


@dataclasses.dataclass(frozen=True)
class Downstream:
    """Correct variants of part 1 or 4, at most one per exercise, planted together: a learner's own
    model (or cached model), which the later parts' tests marked ``downstream`` must accept.

    Grouping runs those tests once per group instead of once per variant. Every variant is in a
    group, and a group is as correct as each of its members, so a group that fails names a
    variant (or a combination) that the later parts' tolerances reject.
    """

    part: int
    variants: tuple[Variant, ...]

    @property
    def name(self) -> str:
        return "; ".join(f"{v.exercise}: {v.name}" for v in self.variants)


def downstream_groups(variants: Sequence[Variant]) -> list[Downstream]:
    """The variants of the parts in ``DOWNSTREAM_OF``, in groups of at most one per exercise
    (each variant joins the first group without its exercise whose changes it can be planted
    beside): part 1's 29 variants make 5 groups."""
    groups: list[list[Variant]] = []
    for variant in (v for v in variants if v.part in DOWNSTREAM_OF):
        for group in groups:
            if group[0].part == variant.part and all(v.exercise != variant.exercise for v in group):
                try:
                    planted_sources(*group, variant)
                except ValueError:  # it rewrites text another member already rewrote
                    continue
                group.append(variant)
                break
        else:
            groups.append([variant])
    return [Downstream(group[0].part, tuple(group)) for group in groups]


Job = Mistake | Variant | Step | Downstream


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the tests said about one planted change.

    ``ok``: the mistake was caught, or the variant accepted. ``detail``: the test that caught
    the mistake, or the summary of the run. ``disturbed``: the run changed state the worker
    shares between runs (then its verdict is not trusted and the change is judged again alone).
    """

    ok: bool
    detail: str
    disturbed: bool = False
    # A walk's step only (see ``judge_step``): the stubs the next exercise's first unpassed test ran into.
    stubs: tuple[str, ...] = ()
    # A walk's step only: the wall-clock and CPU seconds (this worker's process) of the graded exercise's tests.
    seconds: float | None = None
    cpu_seconds: float | None = None


# ---------------------------------------------------------------------------------------
# In the worker: one change, one in-process pytest run
# ---------------------------------------------------------------------------------------


class _Reports:
    """A pytest plugin that keeps what a verdict needs: failures, errors and counts."""

    def __init__(self) -> None:
        self.failed: list[str] = []  # a test's own failure, in its call
        self.stopped: list[str] = []  # a test stopped by the time limit
        self.errors: list[str] = []  # a fixture or collection that broke
        self.passed = 0
        self.skipped = 0
        self.stubs: list[str] = []  # the stubs that raised NotImplementedError, by qualified name

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.errors.append(f"{report.nodeid or 'collection'} (collection error)")

    def pytest_runtest_logreport(self, report: Any) -> None:
        from sampling_course.grading.pytest_plugin import NOT_IMPLEMENTED, TOOK_TOO_LONG

        keys = {key for key, _ in report.user_properties}
        if report.failed and report.when == "call":
            if TOOK_TOO_LONG in keys:
                self.stopped.append(f"{report.nodeid}: took longer than {TEST_TIMEOUT_S:g} s")
            elif NOT_IMPLEMENTED in keys:
                stub = dict(report.user_properties)[NOT_IMPLEMENTED]
                self.stubs.append(stub)
                self.errors.append(f"{report.nodeid}: {stub} not implemented")
            else:
                self.failed.append(f"{report.nodeid} - {_first_line(report)}")
        elif report.failed:
            self.errors.append(f"{report.nodeid} (error in {report.when}) - {_first_line(report)}")
        elif report.passed and report.when == "call":
            self.passed += 1
        elif report.skipped:
            self.skipped += 1

    def summary(self) -> str:
        parts = [f"{self.passed} passed"]
        parts += [f"{n} {what}" for n, what in ((len(self.failed), "failed"), (len(self.errors), "errors"),
                                                (self.skipped, "skipped")) if n]
        return ", ".join(parts)


def _first_line(report: Any) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr or "")
    return (text.strip().splitlines() or [""])[0][:200]


def _selection(change: Change) -> list[str] | str:
    """The pytest arguments that select the tests of the change's exercises, or why there are none."""
    if isinstance(change, Variant):
        return ["--exercise", change.exercise]
    exercises = exercises_of(change)
    if not exercises:
        return f"its code ({mistake_target(change)}) belongs to no part-{change.part} exercise"
    # A mistake is caught by its first failing test: stop there.
    return [arg for e in exercises for arg in ("--exercise", e.name)] + ["-x"]


def downstream_files(part: int) -> list[str]:
    """For part 1 (the model) or 4 (the cached model): the later parts' test files, whose tests
    marked ``downstream`` run the learner's own model and compare its numbers with Hugging Face's.
    A learner's earlier parts are what their later parts run on, so those tests must accept every
    correct variant too. Empty for any other part."""
    if part not in DOWNSTREAM_OF:
        return []
    return [str(path) for path in sorted((TESTS / "grading").glob("test_part*.py"))
            if int("".join(c for c in path.stem.split("_")[1] if c.isdigit())) > part]


def _run_tests(change: Job, package: str, selection: list[str], paths: Sequence[str] = (),
               marks: str = "not gpt2") -> tuple[int, _Reports, str]:
    """pytest on the tests of ``selection`` in ``paths`` (all the tests by default) carrying ``marks``,
    in this process, grading the planted ``package``."""
    from sampling_course.grading.sandbox import NESTED_RUN_OPTIONS, isolated_package, isolated_tests, nested_run_env

    args = [*(paths or [str(TESTS)]), *selection, "--planted-impl", package, "--test-timeout", str(TEST_TIMEOUT_S),
            "-q", "-m", marks, "--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml"), *NESTED_RUN_OPTIONS]
    reports = _Reports()
    output = io.StringIO()
    with isolated_package(package), isolated_tests(TESTS), nested_run_env(), \
            contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        import pytest

        code = pytest.main(args, plugins=[reports])
    return int(code), reports, output.getvalue()


def _shared_state() -> dict[str, str]:
    """Fingerprints of what the runs in one worker share: torch's settings and each loaded
    reference's weights: the checkpoint's tensors, and its Hugging Face and TransformerLens
    models once a test has built them (reading them here would build them for nothing)."""
    import torch

    from sampling_course.reference import load_reference

    state = {"torch": repr((torch.is_grad_enabled(), torch.get_default_dtype(), torch.get_num_threads()))}
    for name in SHARED_REFERENCES:
        reference = load_reference(name)
        models = {"weights": reference.weights,
                  **({"hf": reference.hf_model} if reference.hf_model_loaded else {}),
                  **({"tl": reference.model} if reference.model_loaded else {})}
        for kind, model in models.items():
            tensors = model if isinstance(model, dict) else model.state_dict()
            digest = hashlib.blake2b(repr(getattr(model, "training", None)).encode(), digest_size=16)
            for key, tensor in tensors.items():
                digest.update(key.encode())
                digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
            state[f"{name}/{kind}"] = digest.hexdigest()
    return state


def judge(change: Change | Downstream, directory: Path, package: str) -> Verdict:
    """Plant ``change`` as ``directory/package`` and run its exercise's tests on it, in this process;
    for a ``Downstream`` group, plant its variants together and run the later parts' ``downstream`` tests.

    ``directory`` must be on ``sys.path``. The package is removed again afterwards.
    """
    if isinstance(change, Downstream):
        changes, selection, paths, marks = change.variants, [], downstream_files(change.part), "downstream and not gpt2"
    else:
        selection = _selection(change)
        if isinstance(selection, str):
            return Verdict(False, selection)
        changes, paths, marks = (change,), (), "not gpt2"
    before = _shared_state()
    write_package(directory, *changes, name=package)
    try:
        code, reports, output = _run_tests(change, package, selection, paths, marks)
    finally:
        shutil.rmtree(directory / package, ignore_errors=True)
    after = _shared_state()
    disturbed = any(before[key] != after[key] for key in before.keys() & after.keys())
    if code in (3, 4):  # pytest's internal error, usage error: the run said nothing about the change
        tail = " | ".join(output.strip().splitlines()[-3:])
        return Verdict(False, f"pytest could not run (exit code {code}): {tail}", disturbed)
    if isinstance(change, Mistake):
        # Caught: a test failed in its own code or was stopped for never returning; not a
        # fixture error, a collection error or a stub.
        if reports.failed or reports.stopped:
            return Verdict(True, (reports.failed + reports.stopped)[0].split(" - ")[0], disturbed)
        return Verdict(False, (reports.errors[:1] or [reports.summary()])[0], disturbed)
    if code == 0 and reports.passed and not (reports.failed or reports.stopped or reports.errors):
        return Verdict(True, reports.summary(), disturbed)
    return Verdict(False, (reports.failed + reports.stopped + reports.errors + [reports.summary()])[0], disturbed)


def judge_step(step: Step, directory: Path, package: str) -> Verdict:
    """One step of the course walked in order (``grading/walk.py``), in this process: with every
    exercise up to ``step.graded`` solved and every later one a stub, ``step.graded``'s tests must
    all pass (``ok``), and ``step.next``'s first unpassed test must run into a stub (``stubs``: the
    ones it ran into, for the caller to check they are ``step.next``'s own). One package serves both.
    ``seconds`` and ``cpu_seconds``: how long ``step.graded``'s tests took (``time_checks.py --record`` keeps them).
    """
    before = _shared_state()
    write_package_sources(directory / package, walk_sources(step.index))
    ok, detail, stubs = True, "", ()
    seconds = cpu_seconds = None
    try:
        if step.graded is not None:
            start, cpu = time.perf_counter(), time.process_time()
            code, reports, output = _run_tests(step, package, ["--exercise", step.graded.name])
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
            ok = code == 0 and bool(reports.passed) and not (reports.failed or reports.stopped or reports.errors)
            detail = (reports.failed + reports.stopped + reports.errors + [reports.summary()])[0]
            if code in (3, 4):
                ok, detail = False, f"pytest could not run (exit code {code}): " + output.strip()[-300:]
        if step.next is not None:
            # A learner's check stops running an exercise's tests at its first stub: so do we (-x).
            code, reports, output = _run_tests(step, package, ["--exercise", step.next.name, "-x"])
            stubs = tuple(reports.stubs)
            if not stubs:
                detail += f"; {step.next.name} stubbed: " + (reports.failed + reports.errors + [reports.summary()])[0]
    finally:
        shutil.rmtree(directory / package, ignore_errors=True)
    after = _shared_state()
    disturbed = any(before[key] != after[key] for key in before.keys() & after.keys())
    return Verdict(ok, detail, disturbed, stubs, seconds, cpu_seconds)


def write_package_sources(package: Path, sources: dict[str, str]) -> None:
    """Write ``sources`` (module name -> source) as the package folder ``package``."""
    package.mkdir(parents=True)
    for module, source in sources.items():
        (package / f"{module}.py").write_text(source)


def _to_json(change: Job) -> str:
    return json.dumps({"kind": type(change).__name__, **dataclasses.asdict(change)})


def _from_json(line: str) -> Job:
    fields = json.loads(line)
    kind = fields.pop("kind")
    if kind == "Downstream":
        return Downstream(fields["part"], tuple(Variant(**variant) for variant in fields["variants"]))
    return {"Mistake": Mistake, "Variant": Variant, "Step": Step}[kind](**fields)


def serve() -> None:
    """The worker's loop: one change per line of stdin (JSON), one verdict per line of stdout (JSON).

    Whatever else writes to stdout (a test's print, a library's warning) goes to stderr, so
    the verdicts channel carries verdicts only.
    """
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    names = (f"planted_{os.getpid()}_{i}" for i in count())
    with tempfile.TemporaryDirectory(prefix="planted-") as tmp:
        sys.path.insert(0, tmp)
        for line in sys.stdin:
            if not line.strip():
                continue
            job = _from_json(line)
            verdict = (judge_step if isinstance(job, Step) else judge)(job, Path(tmp), next(names))
            channel.write(json.dumps(dataclasses.asdict(verdict)) + "\n")


# ---------------------------------------------------------------------------------------
# In the caller: workers, a queue of changes, verdicts in order
# ---------------------------------------------------------------------------------------


class _Worker:
    """A worker process (``serve``) and a thread that reads its verdicts."""

    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        for key in ("SAMPLING_COURSE_IMPL", "PYTEST_ADDOPTS"):
            env.pop(key, None)
        self.log = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from sampling_course.grading.mistakes import serve; serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
            cwd=tempfile.gettempdir(),
        )
        self.verdicts: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.verdicts.put(line)
        self.verdicts.put(None)  # the worker ended

    def ask(self, change: Job, timeout: float = CHANGE_TIMEOUT_S) -> Verdict | None:
        """The worker's verdict on ``change``; None when it died or gave none in time."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(_to_json(change) + "\n")
            self.process.stdin.flush()
            line = self.verdicts.get(timeout=timeout)
        except (OSError, queue.Empty):
            return None
        if line is None:
            return None
        fields = json.loads(line)
        return Verdict(**{**fields, "stubs": tuple(fields.get("stubs", ()))})

    def last_words(self) -> str:
        self.log.seek(0)
        return " | ".join(self.log.read().strip().splitlines()[-3:])[-300:]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.process.stdin:
                self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def _judge_alone(change: Job) -> Verdict:
    """Judge ``change`` in a fresh worker of its own."""
    worker = _Worker()
    try:
        verdict = worker.ask(change)
        if verdict is None:
            try:
                code = worker.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                code = None
            how = "hung" if code is None else f"died (exit code {code})"
            return Verdict(False, f"the test run {how}: {worker.last_words() or 'no output'}")
        return dataclasses.replace(verdict, disturbed=False)  # alone, there was nothing to disturb
    finally:
        worker.close()


def judge_all(changes: Sequence[Job], jobs: int, on_verdict: Callable[[int, Verdict], None] | None = None
              ) -> list[Verdict]:
    """A verdict on every change, ``jobs`` workers at a time, in the changes' order."""
    todo: queue.Queue[int] = queue.Queue()
    for i in range(len(changes)):
        todo.put(i)
    verdicts: list[Verdict | None] = [None] * len(changes)

    def drive() -> None:
        worker: _Worker | None = None
        try:
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                worker = worker or _Worker()
                verdict = worker.ask(changes[i])
                if verdict is None or verdict.disturbed:
                    # Died, hung, or left the shared state changed: start afresh, and judge
                    # this change again in a process of its own.
                    worker.close()
                    worker = None
                    verdict = _judge_alone(changes[i])
                verdicts[i] = verdict
                if on_verdict is not None:
                    on_verdict(i, verdict)
        finally:
            if worker is not None:
                worker.close()

    threads = [threading.Thread(target=drive) for _ in range(max(1, min(jobs, len(changes))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [v if v is not None else Verdict(False, "not judged") for v in verdicts]


def plant_mistakes(mistakes: Sequence[Mistake], jobs: int = 1) -> list[Verdict]:
    """Whether the tests catch each mistake: ``Verdict.ok`` when one of its exercise's tests fails."""
    return judge_all(mistakes, jobs)


def plant_variants(variants: Sequence[Variant], jobs: int = 1) -> list[Verdict]:
    """Whether the tests accept each variant: ``Verdict.ok`` when every test of its exercise passes."""
    return judge_all(variants, jobs)


def walk_course(steps: Sequence[Step], jobs: int = 1) -> list[Verdict]:
    """The course walked in order, one verdict per step (see ``judge_step``)."""
    return judge_all(steps, jobs)
