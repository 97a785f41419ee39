"""Grade one submission: a pure function from a submission on disk to its result (plain data).

``grade_submission`` copies the submission into a fresh folder, starts a process for it in
bubblewrap's sandbox (``worker.py``, ``jail.py``) and runs the course's own tests *in this
process* (the grader's) against the package ``exercises`` as the bridge presents it
(``bridge.py``): every object of the submission is a handle, every value its code returns
arrives as data. The tests compare those
values with the references here, where the submission's code never runs, so nothing it does
in its own process (replacing ``torch.allclose``, pytest's reporting, writing a fake report)
can change a grade.

Limits count the time the grader waits for the submission and the time it spends serving the
submission's requests (computing a reference, which every student needs alike, does not
count): the code one test calls may run ``seconds_per_test`` seconds (then it is interrupted, and its process stopped if
it will not stop; either way the next test gets a fresh process, so a time limit in one exercise never costs a later
one); one exercise's tests together ``seconds_per_exercise``, after which its
remaining tests are not run; the whole submission ``seconds_per_submission``. A submission
whose process dies is restarted for the next test, at most ``MAX_RESTARTS`` times.

The result is a dict of plain values (JSON-able), so any executor can carry it back.
"""

from __future__ import annotations

import functools
import io
import os
import shutil
import socket
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from sampling_course.grading import runner
from sampling_course.grading.classroom import host, jail
from sampling_course.grading.classroom.bridge import Endpoint, SubmissionLost
from sampling_course.grading.classroom.proxies import ModuleMirror, RemoteObject
from sampling_course.grading.classroom.remote_package import RemotePackage
from sampling_course.grading.classroom.settings import GradeSettings
from sampling_course.grading.classroom.submission import SubmissionError, module_names, prepare_copy
from sampling_course.grading.classroom.worker import Worker
from sampling_course.grading.course import get_exercise
from sampling_course.grading.results import FAILING, TOOK_TOO_LONG, TestOutcome, summarize
from sampling_course.grading.sandbox import NESTED_RUN_OPTIONS, isolated_package, isolated_tests, nested_run_env, terminal_like
from sampling_course.grading.time_limit import TookTooLong
from sampling_course.op_recorder import take_unverified

__all__ = ["MAX_RESTARTS", "SANDBOX_MISSING", "SandboxMissing", "grade_submission", "not_graded", "sandbox_tool",
           "supervisor_flags"]

SANDBOX_MISSING = ("bubblewrap (bwrap) 0.8 or later is not installed or cannot make a sandbox here; install it "
                   "(Debian 12, Ubuntu 24.04: apt-get install bubblewrap; Ubuntu 22.04's is 0.6, too old) or pass "
                   "--unsafe-no-sandbox to grade unconfined")


class SandboxMissing(RuntimeError):
    """No sandbox, and the instructor did not ask to grade without one."""

MAX_RESTARTS = 3
GRACE_S = 3.0  # after an interruption, how long the submission has to give up before it is stopped
PACKAGE = "exercises"  # the name the tests import the implementation under test by
SUBMISSION_BYTES = 4 << 30  # what one process of a submission may send the grader in all
BASE_MEMORY = 2 << 30  # address space of Python and torch themselves, before the submission allocates anything


class Connection:
    """The grader's side of one submission's process: started on demand, restarted when it dies."""

    def __init__(self, copy: Path, settings: GradeSettings, bwrap: str | None):
        self.copy = copy
        self.settings = settings
        self.bwrap = bwrap
        self.worker: Worker | None = None
        self.endpoint: Endpoint | None = None
        # The double host (host.py) of the current process: started when a test first needs it, ended with it.
        self.host_worker: Worker | None = None
        self.host_endpoint: Endpoint | None = None
        self._host_end: socket.socket | None = None  # the host's end of the submission's connection to it
        self.started = 0
        self.stopped_for_time = 0  # processes the grader stopped because a call ran past its time limit
        self.flags: list[tuple[str, str]] = []  # (kind, reason), every distinct one in the order seen
        self.measures: dict[str, str] = {}
        self.allowance: float | None = None
        self.limit_s = settings.seconds_per_test
        self.context = ""  # the exercise being graded, for messages
        self._waited = 0.0  # time waited for processes of this submission that have ended
        self._cut: Endpoint | None = None  # the connection a time limit last interrupted

    def flag(self, kind: str, reason: str) -> None:
        if (kind, reason) not in self.flags:
            self.flags.append((kind, reason))

    def flagged(self, kind: str) -> bool:
        return any(k == kind for k, _ in self.flags)

    def connect(self) -> Endpoint:
        if self.endpoint is not None and self.endpoint.alive:
            return self.endpoint
        if self.worker is not None:
            if self.endpoint is self._cut:  # it answered after a time limit interrupted it: never held against it
                self.stopped_for_time += 1
            elif self.worker.process.poll() is not None:  # it ended on its own (the grader had not stopped it)
                self.flag("process", "its process ended during grading and was started again")
            self.retire()
        if self.started - self.stopped_for_time > MAX_RESTARTS:  # a time limit's restart is never held against it
            raise SubmissionLost(f"the submission's process was started {self.started} times; no more")
        ours, theirs = socket.socketpair()  # the submission's connection to its double host
        try:
            self.worker = Worker.start(self.copy, self._limits(), self.bwrap, peer_fd=theirs.fileno())
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._host_end = ours
        self.started += 1
        self.measures = self.worker.measures
        endpoint = Endpoint(self.worker.sock, peer_trusted=False, owns_modules=False)
        endpoint.on_wait = self._on_wait
        endpoint.on_error = self._on_error
        endpoint.allowance = self.allowance
        endpoint.budget = SUBMISSION_BYTES
        endpoint.made_apart = functools.partial(host.made_apart, endpoint, self._start_host)
        self.endpoint = endpoint
        return endpoint

    def _limits(self) -> dict[str, int]:
        return {"memory_bytes": (self.settings.memory_mb << 20) + BASE_MEMORY,
                "cpu_seconds": int(self.settings.seconds_per_submission), "file_bytes": 64 << 20, "open_files": 256}

    def _start_host(self) -> Endpoint:
        """The connection to the current process's double host, started the first time a test needs it."""
        if self.host_endpoint is not None:
            if not self.host_endpoint.alive:
                raise SubmissionLost("the double host stopped answering")
            return self.host_endpoint
        if self._host_end is None:
            raise SubmissionLost("the submission's process is gone")
        try:
            self.host_worker = Worker.start(None, self._limits(), self.bwrap, peer_fd=self._host_end.fileno())
        finally:
            self._host_end.close()
            self._host_end = None
        endpoint = Endpoint(self.host_worker.sock, peer_trusted=False, owns_modules=False, random_state=False)
        endpoint.on_wait = self._on_host_wait
        endpoint.allowance = self.allowance
        endpoint.budget = SUBMISSION_BYTES
        self.host_endpoint = endpoint
        return endpoint

    def _on_host_wait(self, endpoint: Endpoint) -> None:
        """The double host did not answer in time (the submission can keep it busy): both processes are
        retired, so the next test gets fresh ones."""
        endpoint.alive = False
        if self.endpoint is not None:
            self.endpoint.alive = False
        self.stopped_for_time += 1
        self.flag("time", f"ran past the time limit ({self.limit_s:g} s) in {self.context or 'a test'}")
        raise TookTooLong(f"stopped after {self.limit_s:g} s")

    def set_limit(self, seconds: float, context: str) -> None:
        """The next test may take ``seconds``: the submission's time and the grader's time serving it."""
        self.allowance, self.limit_s, self.context = seconds, seconds, context
        if self.endpoint is not None:
            self.endpoint.allowance = seconds
            self.endpoint.interrupted = False
        if self.host_endpoint is not None:
            self.host_endpoint.allowance = seconds

    def waited(self) -> float:
        """Seconds the grader spent waiting for this submission, all its processes together."""
        return self._waited + sum(e.waited for e in (self.endpoint, self.host_endpoint) if e is not None)

    def _on_wait(self, endpoint: Endpoint) -> None:
        """A call ran out of time: interrupt it; if it will not stop, stop the process."""
        if not endpoint.interrupted:
            endpoint.interrupted, endpoint.limit_s, self._cut = True, self.limit_s, endpoint
            self.flag("time", f"ran past the time limit ({self.limit_s:g} s) in {self.context or 'a test'}")
            if self.worker is not None:
                self.worker.interrupt()
            endpoint.allowance = GRACE_S
            return
        endpoint.alive = False
        self.stopped_for_time += 1
        self.retire()
        raise TookTooLong(f"stopped after {self.limit_s:g} s")

    def _on_error(self, error: dict[str, Any]) -> None:
        text = f"{error.get('type')}: {error.get('msg')}"
        if error.get("type") == "MemoryError" or "can't allocate memory" in text or "Cannot allocate memory" in text:
            self.flag("memory", f"ran out of memory (the limit is {self.settings.memory_mb} MiB) in "
                                f"{self.context or 'a test'}")

    def retire(self) -> None:
        if self.endpoint is not None and not self.endpoint.alive and not self.flagged("time"):
            self.flag("process", "its process ended or stopped answering during grading")
        for endpoint in (self.endpoint, self.host_endpoint):
            if endpoint is not None:
                self._waited += endpoint.waited
        for worker in (self.worker, self.host_worker):
            if worker is not None:
                worker.stop()
        if self._host_end is not None:
            self._host_end.close()
        self.worker, self.endpoint, self.host_worker, self.host_endpoint, self._host_end = None, None, None, None, None


class _Judge(runner._Collector):
    """The collector of ``grading.runner``, with the time limits and hidden tests of class grading."""

    def __init__(self, connection: Connection, settings: GradeSettings):
        super().__init__()
        self.connection = connection
        self.settings = settings
        self.hidden: set[str] = set()
        self.spent: dict[str, float] = {}
        self.unverified: dict[str, int] = {}  # per test: its verdicts that held on records the submission kept
        self.not_run: dict[str, str] = {}  # nodeid -> why the grader did not run it (a time limit reached first)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        super().pytest_collection_modifyitems(items)
        self.hidden.update(item.nodeid for item in items if item.get_closest_marker("hidden"))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: Any) -> None:
        take_unverified()  # none from an earlier test is this one's
        names = [name.lower() for name in self.exercises.get(item.nodeid, ())]
        used = self.connection.waited()
        shown = ", ".join(get_exercise(n).name for n in names) or item.nodeid
        if used >= self.settings.seconds_per_submission:
            self.connection.flag("time", f"the submission's time limit ({self.settings.seconds_per_submission:g} s) "
                                         "was reached; the tests after it did not run")
            self._not_run(item, "not run: the submission's time limit "
                                f"({self.settings.seconds_per_submission:g} s) was reached first")
        budget = min((self.settings.seconds_per_exercise - self.spent.get(n, 0.0) for n in names), default=1e9)
        if budget <= 0:
            self.connection.flag("time", f"{shown} used up its time limit ({self.settings.seconds_per_exercise:g} s); "
                                         "its remaining tests did not run")
            self._not_run(item, f"not run: {shown} used up its time limit ({self.settings.seconds_per_exercise:g} s)")
        _forget_lost_fixtures(item)  # a process was stopped: the fixtures that held its objects are made again
        super().pytest_runtest_setup(item)
        limit = min(self.settings.seconds_per_test, budget, self.settings.seconds_per_submission - used)
        self.connection.set_limit(limit, " / ".join(get_exercise(n).name for n in names) or item.nodeid)

    def _not_run(self, item: Any, why: str) -> None:
        """Skip ``item`` for time: it counts as not passed (the exercise is not earned), ``why`` its message."""
        self.not_run[item.nodeid] = why
        pytest.skip(why)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: Any, nextitem: Any):
        before = self.connection.waited()
        yield
        for name in {n.lower() for n in self.exercises.get(item.nodeid, ())}:
            self.spent[name] = self.spent.get(name, 0.0) + self.connection.waited() - before

    def pytest_runtest_logreport(self, report: Any) -> None:
        why = self.not_run.get(report.nodeid)
        if why is not None:
            if report.nodeid not in self.outcomes:
                self.outcomes[report.nodeid] = TestOutcome(report.nodeid, self.exercises.get(report.nodeid, ()),
                                                           "not run", why)
            return
        super().pytest_runtest_logreport(report)
        if report.when == "call" and report.passed:
            unverified = take_unverified()
            if unverified:
                self.unverified[report.nodeid] = unverified
        outcome = self.outcomes.get(report.nodeid)
        if outcome is not None and outcome.outcome == "took too long" and "0 s" in outcome.message:
            self.outcomes[report.nodeid] = TestOutcome(outcome.nodeid, outcome.exercises, outcome.outcome,
                                                       f"took longer than {self.connection.limit_s:g} s")


def _holds_lost_handle(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is, or holds in a list, tuple or dict, a handle to a process that was stopped."""
    if isinstance(value, (RemoteObject, ModuleMirror)):
        return not value._endpoint().alive
    if depth < 3 and isinstance(value, (list, tuple)):
        return any(_holds_lost_handle(v, depth + 1) for v in value)
    if depth < 3 and isinstance(value, dict):
        return any(_holds_lost_handle(v, depth + 1) for v in value.values())
    return False


def _forget_lost_fixtures(item: Any) -> None:
    """The fixture values ``item`` uses that hold handles to a stopped process are made again, so a time
    limit reached in one exercise never costs a later one its objects."""
    for definitions in item._fixtureinfo.name2fixturedefs.values():
        for definition in definitions:
            cached = getattr(definition, "cached_result", None)
            if cached is not None and _holds_lost_handle(cached[0]):
                try:  # torn down as pytest tears a fixture down (its finalizers too), so it is made afresh
                    definition.finish(item._request)
                except Exception:  # noqa: BLE001 - a teardown that needed the stopped process: nothing left to undo
                    pass


def _run_tests(connection: Connection, settings: GradeSettings, tests: Path) -> tuple[_Judge, list, str]:
    """Run the selected exercises' tests against the submission; return the judge, results and pytest's output."""
    judge = _Judge(connection, settings)
    args = [str(tests), "--impl", PACKAGE, "--test-timeout", "0", "-q", *NESTED_RUN_OPTIONS,
            "--continue-on-collection-errors"]
    for name in settings.exercises:
        args += ["--exercise", name]
    output = io.StringIO()
    package = RemotePackage(PACKAGE, module_names(), connection.connect)
    env = nested_run_env(PYTEST_ADDOPTS=None, PYTEST_CURRENT_TEST=os.environ.get("PYTEST_CURRENT_TEST"),
                             SAMPLING_COURSE_IMPL=None)
    with isolated_package(PACKAGE), isolated_tests(tests), env, terminal_like():
        sys.meta_path.insert(0, package)
        try:
            with redirect_stdout(output), redirect_stderr(output):
                pytest.main(args, plugins=[judge])
            exercises = [get_exercise(name) for name in settings.exercises]
            per_exercise: dict[str, list[TestOutcome]] = {e.name.lower(): [] for e in exercises}
            for nodeid, names in judge.exercises.items():
                outcome = judge.outcomes.get(nodeid) or TestOutcome(nodeid, names, "not run", "did not run")
                for name in {n.lower() for n in names}:
                    if name in per_exercise:
                        per_exercise[name].append(outcome)
            results = [summarize(e, per_exercise[e.name.lower()]) for e in exercises]
            if settings.diagnose:
                results = [_with_mistake(r, connection, settings) for r in results]
        finally:
            sys.meta_path.remove(package)
    return judge, results, output.getvalue()


def _with_mistake(result: Any, connection: Connection, settings: GradeSettings) -> Any:
    """The result with the classic mistake its output matches, when it is failing (diagnosis runs here)."""
    import dataclasses

    if result.status != FAILING:
        return result
    from sampling_course.grading.diagnosis import describe_match

    limit = min(settings.seconds_per_test, 30.0)
    connection.set_limit(limit, f"naming the mistake in {result.name}")
    try:
        return dataclasses.replace(result, mistake=describe_match(result.exercise, PACKAGE))
    except (Exception, TookTooLong):  # noqa: BLE001 - a diagnosis that fails names nothing
        return result


def _files_in(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and ".home" not in p.parts}


def grade_submission(submission: str | Path, settings: GradeSettings | None = None, student: str | None = None,
                     tests: str | Path | None = None) -> dict[str, Any]:
    """Grade one submission (a folder or zip, see ``submission.py``); return its result as plain data.

    Never raises for anything the submission does: a submission that cannot be graded at all
    gets every exercise at zero and an ``error`` saying why.
    """
    settings = settings or GradeSettings()
    submission = Path(submission).resolve()
    student = student or submission.stem
    tests = Path(tests).resolve() if tests else runner.tests_dir().resolve()
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="sampling-course-grade-"))
    os.chmod(workdir, 0o700)
    result: dict[str, Any] = {"student": student, "submission": str(submission), "flags": [], "notes": [],
                              "sandbox": {}, "error": None}
    connection = None
    try:
        graded_modules = {get_exercise(name).module for name in settings.exercises}
        copy, result["notes"] = prepare_copy(submission, workdir, graded_modules)
        before = _files_in(copy)
        bwrap = sandbox_tool(settings)
        connection = Connection(copy, settings, bwrap)
        judge, results, output = _run_tests(connection, settings, tests)
        result["exercises"] = [_exercise_entry(r, judge, settings) for r in results]
        connection.retire()
        left = sorted(_files_in(copy) - before)
        if left:
            connection.flag("files", f"wrote {', '.join(left[:5])} in its folder (ignored: grades come from the grader)")
        result["flags"] = supervisor_flags(connection)
        result["sandbox"] = dict(connection.measures)
        if "memory" in result["sandbox"]:  # the limit the instructor set, and what the process holds besides
            result["sandbox"]["memory"] = (f"{settings.memory_mb} MiB for the submission's work (its process may "
                                           f"hold {BASE_MEMORY >> 20} MiB more for Python and torch)")
        if judge.collection_errors:
            result["notes"].append("the grader's tests did not all load: " + "; ".join(judge.collection_errors)[:500])
    except SubmissionError as exc:
        result["error"] = str(exc)  # said once; each exercise only says it was not graded
        result["exercises"] = [not_graded(name, settings, "not graded: the submission could not be graded")
                               for name in settings.exercises]
    finally:
        if connection is not None:
            connection.retire()
        shutil.rmtree(workdir, ignore_errors=True)
    result["score"] = round(sum(e["points"] for e in result["exercises"]), 6)
    result["max_score"] = settings.max_score
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def supervisor_flags(connection: Connection) -> list[dict[str, str]]:
    """What the grader itself saw (time, memory, a process that ended, files written): never the submission's word."""
    return [{"kind": kind, "reason": reason} for kind, reason in connection.flags]


_BWRAP: list[str | None] = []


def sandbox_tool(settings: GradeSettings) -> str | None:
    """``bwrap``'s path; None when the instructor chose ``unsafe_no_sandbox``. Without it, SandboxMissing."""
    if settings.unsafe_no_sandbox:
        return None
    if not _BWRAP:
        _BWRAP.append(jail.available())
    if _BWRAP[0] is None:
        raise SandboxMissing(SANDBOX_MISSING)
    return _BWRAP[0]


def _exercise_entry(result: Any, judge: _Judge, settings: GradeSettings) -> dict[str, Any]:
    points = settings.points_of(result.name)
    hidden_failure = result.failing_test in judge.hidden if result.failing_test else False
    message = result.message
    if hidden_failure:
        message = "a hidden test failed"  # never its message: it could show the test's inputs
    elif result.status == TOOK_TOO_LONG:
        message = message or "took too long"
    # A test whose pass held on a record the submission's own process kept (OpRecorder.verdict, own_record_held:
    # MethodCalls, PlannedSteps) may convict, never
    # earn: its pass is left out of the count, and an exercise with no other passed test earns nothing.
    own = _unverified_tests(result.name, judge)
    done = result.done and result.counted > own
    status = result.status if done or not result.done else "failing"
    if status != result.status:
        message = OWN_RECORD_ONLY
    return {
        "exercise": result.name, "part": result.exercise.part, "status": status,
        # Over every test of the exercise in this run: one the grader did not run (time) counts as not passed.
        "points": round(points.score(result.passed - own, result.counted - own, done), 6), "max_points": points.points,
        "partial": points.partial, "passed": result.passed, "ran": result.ran, "not_run": result.not_run,
        "failed": result.failed,
        "not_implemented": result.not_implemented, "message": message, "hidden_failure": hidden_failure,
        "mistake": result.mistake, "hint": result.exercise.hints[0] if not done else None,
        "stubs": list(result.stubs), "unverified": own,
        "hidden_tests": sum(1 for nodeid, names in judge.exercises.items()
                            if nodeid in judge.hidden and result.name.lower() in {n.lower() for n in names}),
    }


OWN_RECORD_ONLY = ("every test that passed held on a record the submission's own process kept (the tensor "
                   "operations, method calls or KV blocks it recorded), and such a pass earns nothing")


def _unverified_tests(name: str, judge: _Judge) -> int:
    """How many of the exercise's passed tests held a verdict on a record kept in the submission's process (which it
    could change: a failure there counts, a pass earns nothing)."""
    return sum(1 for nodeid in judge.unverified
               if name.lower() in {e.lower() for e in judge.exercises.get(nodeid, ())})


def not_graded(name: str, settings: GradeSettings, why: str) -> dict[str, Any]:
    """An exercise's entry in a report when the submission could not be graded: no points, and ``why``."""
    exercise = get_exercise(name)
    return {"exercise": name, "part": exercise.part, "status": "not graded", "points": 0.0,
            "max_points": settings.points_of(name).points, "partial": settings.points_of(name).partial,
            "passed": 0, "ran": 0, "not_run": 0, "failed": 0, "not_implemented": 0, "message": why,
            "hidden_failure": False,
            "mistake": None, "hint": exercise.hints[0], "stubs": [], "unverified": 0, "hidden_tests": 0}
