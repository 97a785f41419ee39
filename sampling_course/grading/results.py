"""What a check run found: one ``Result`` per exercise, gathered in a ``CheckReport``.

* ``done``: every test that ran passed;
* ``not implemented yet``: a stub still raises ``NotImplementedError``;
* ``failing``: a test failed; the result carries the first failure's message and a hint;
* ``took too long``: a test ran past its time limit and was stopped (a loop that never ends?);
* ``no tests yet``: no test carries that exercise's marker (or every one was skipped).

A test the test itself skips (no GPU here, a check of the solutions only) is not one of the
exercise's tests in that run. A test the *runner* did not run (class grading's time limits
stopped it before it started) is: it counts as not passed, so an exercise whose tests ran out
of time is never done (its status says so: ``took too long``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from sampling_course.grading.course import Exercise, get_exercise

DONE = "done"
NOT_IMPLEMENTED_YET = "not implemented yet"
FAILING = "failing"
TOOK_TOO_LONG = "took too long"
NO_TESTS_YET = "no tests yet"


@dataclass(frozen=True)
class TestOutcome:
    """What happened to one test, all phases (setup, call, teardown) taken together."""

    __test__ = False  # not a pytest test class, despite the name

    nodeid: str
    exercises: tuple[str, ...]
    outcome: Literal["passed", "failed", "not implemented", "took too long", "skipped", "not run"]
    message: str = ""
    stub: str = ""


@dataclass(frozen=True)
class Result:
    """The state of one exercise after running its tests."""

    exercise: Exercise
    status: str  # DONE, NOT_IMPLEMENTED_YET, FAILING, TOOK_TOO_LONG or NO_TESTS_YET
    passed: int = 0
    total: int = 0  # tests collected for this exercise, skipped ones included
    failed: int = 0  # took too long included
    not_implemented: int = 0
    skipped: int = 0  # skipped by the test itself: not among the exercise's tests in this run
    message: str | None = None  # the first failure's message, when failing or too long; else the first skip's reason
    failing_test: str | None = None  # that test's id, e.g. "grading/test_part1_transformer.py::test_x[tiny]"
    stubs: tuple[str, ...] = ()  # stubs that still raise NotImplementedError
    hint: str | None = None  # the exercise's first hint, when failing or too long
    mistake: str | None = None  # "This matches a classic mistake: ...", when failing like a planted one
    not_run: int = 0  # tests the runner did not run (a time limit reached before they started): not passed

    @property
    def counted(self) -> int:
        """The exercise's tests in this run: those that ran and those the runner did not run (they count as not
        passed); a test that skipped itself is not one."""
        return self.total - self.skipped

    @property
    def name(self) -> str:
        return self.exercise.name

    @property
    def done(self) -> bool:
        return self.status == DONE

    @property
    def ran(self) -> int:
        """Tests that ran (were neither skipped nor left not run)."""
        return self.total - self.skipped - self.not_run

    def __repr__(self) -> str:
        return f"Result({self.name!r}, {self.status!r}, passed={self.passed}/{self.ran})"


@dataclass
class CheckReport:
    """The results of one check run; true when every exercise checked is done.

    Iterate over it (or index it by position or exercise name) for the ``Result``\\s.
    """

    results: list[Result]
    impl: str = "exercises"
    collection_errors: list[str] = field(default_factory=list)
    error: str | None = None  # why nothing could be checked (e.g. a stale `pip install .`)
    notices: list[str] = field(default_factory=list)  # caches rebuilt during the run, one line each
    broken: bool = False  # the error is a damaged file of the course itself
    # Per exercise: the implementation's files (relative to its package) its verdict depends on: those its tests
    # asked for and everything they import (``grading.depends``), with modules asked for but absent.
    imported: dict[str, frozenset[str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.results) and all(r.done for r in self.results)

    def __iter__(self) -> Iterator[Result]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, key: int | str) -> Result:
        if isinstance(key, str):
            wanted = get_exercise(key).name
            for result in self.results:
                if result.name == wanted:
                    return result
            raise KeyError(f"{wanted} was not checked in this run")
        return self.results[key]

    @property
    def n_done(self) -> int:
        return sum(r.done for r in self.results)

    @property
    def ok(self) -> bool:
        """No exercise checked is failing or unimplemented (``no tests yet`` is fine), and the check could run."""
        return self.error is None and not any(r.status in (FAILING, TOOK_TOO_LONG, NOT_IMPLEMENTED_YET) for r in self.results)

    def __repr__(self) -> str:
        if self.error:
            return f"<CheckReport {self.impl}/: nothing checked: {self.error}>"
        names = ", ".join(f"{r.name}: {r.status}" for r in self.results[:3])
        more = f", ... ({len(self.results) - 3} more)" if len(self.results) > 3 else ""
        return f"<CheckReport {self.impl}/: {self.n_done}/{len(self.results)} done; {names}{more}>"


def summarize(exercise: Exercise, outcomes: Sequence[TestOutcome]) -> Result:
    """One exercise's ``Result`` from the outcomes of the tests that grade it.

    A test stopped for taking too long comes first (each check waits for it), then a real
    failure, which outranks an unfilled stub (it is what the learner must look at), and a
    stub outranks passes: an exercise is done only when nothing failed and something ran. A test
    the runner did not run (``not run``: a time limit was reached first) keeps the exercise from
    being done: ``took too long``, with the reason it was not run, unless something failed.
    """
    kinds = ("passed", "failed", "not implemented", "took too long", "skipped", "not run")
    counts = {kind: sum(o.outcome == kind for o in outcomes) for kind in kinds}
    stubs = tuple(dict.fromkeys(o.stub for o in outcomes if o.outcome == "not implemented" and o.stub))
    common = dict(
        exercise=exercise,
        passed=counts["passed"],
        total=len(outcomes),
        failed=counts["failed"] + counts["took too long"],
        not_implemented=counts["not implemented"],
        skipped=counts["skipped"],
        not_run=counts["not run"],
        stubs=stubs,
    )
    if counts["took too long"]:
        first = next(o for o in outcomes if o.outcome == "took too long")
        return Result(status=TOOK_TOO_LONG, message=first.message, failing_test=first.nodeid,
                      hint=exercise.hints[0], **common)
    if counts["failed"]:
        first = next(o for o in outcomes if o.outcome == "failed")
        return Result(status=FAILING, message=first.message, failing_test=first.nodeid, hint=exercise.hints[0], **common)
    if counts["not implemented"]:
        return Result(status=NOT_IMPLEMENTED_YET, **common)
    if counts["not run"]:
        first = next(o for o in outcomes if o.outcome == "not run")
        return Result(status=TOOK_TOO_LONG, message=first.message, failing_test=first.nodeid,
                      hint=exercise.hints[0], **common)
    skipped = next((o.message for o in outcomes if o.outcome == "skipped"), None)
    if counts["passed"]:
        return Result(status=DONE, message=skipped, **common)  # why tests were skipped, if any were
    return Result(status=NO_TESTS_YET, message=skipped, **common)


