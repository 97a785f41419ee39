"""The paged KV memory of every step a serving engine plans, written down where the engine runs.

A test that bounds the KV memory a serving engine holds checks it right after each step is
planned, when the step's forward pass holds that memory. ``PlannedSteps(engine)`` wraps the
engine's ``scheduler.schedule`` (on that scheduler only): each call plans the step as before and
then appends, to ``steps``, what the pool and the running requests' block tables hold at that
moment, as plain data: the pool's ``n_blocks``, ``n_free`` and ``block_size``, and for each running
request its table's ``blocks`` and ``n_tokens``. The test judges that record after the run.

It lives in the course's runtime so that it can be made beside the code under test
(``sampling_course.beside.made_beside``): graded in another process, the engine runs there, and a
wrapper written in the test would be an object of the grader's called by the submission's code.
There the record is the submission's to change: a check that fails on it convicts, one that holds
earns nothing (``op_recorder.own_record_held``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PlannedSteps"]


class PlannedSteps:
    """``engine.scheduler.schedule`` wrapped: ``steps`` holds the pool and the running tables after each plan."""

    def __init__(self, engine: Any):
        scheduler = getattr(engine, "scheduler", None)
        plan = getattr(scheduler, "schedule", None)
        if not callable(plan) or not hasattr(engine, "pool"):
            raise TypeError(f"PlannedSteps watches an engine with a pool and a scheduler.schedule, not {engine!r}")
        self.steps: list[dict[str, Any]] = []
        self._engine, self._own = engine, vars(scheduler).get("schedule") if hasattr(scheduler, "__dict__") else None

        def planned(*args: Any, **kwargs: Any) -> Any:
            step = plan(*args, **kwargs)
            self.steps.append(self._held())
            return step

        scheduler.schedule = planned

    def _held(self) -> dict[str, Any]:
        # Copied into ints and lists now: the tables change with the next step.
        pool = self._engine.pool
        tables = [{"blocks": [int(b) for b in request.table.blocks], "n_tokens": int(request.table.n_tokens)}
                  for request in self._engine.scheduler.running]
        return {"n_blocks": int(pool.n_blocks), "n_free": int(pool.n_free), "block_size": int(pool.block_size),
                "tables": tables}

    def restore(self) -> None:
        """Put the scheduler's own ``schedule`` back."""
        scheduler = self._engine.scheduler
        if self._own is None:
            del scheduler.schedule
        else:
            scheduler.schedule = self._own
