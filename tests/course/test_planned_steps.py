"""``PlannedSteps``: the pool and the running tables after each planned step, copied as plain data."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sampling_course.planned_steps import PlannedSteps


class Scheduler:
    def __init__(self, running):
        self.running, self.planned = running, 0

    def schedule(self):
        self.planned += 1
        return f"step {self.planned}"


def engine_of(tables):
    requests = [SimpleNamespace(table=SimpleNamespace(blocks=blocks, n_tokens=n)) for blocks, n in tables]
    return SimpleNamespace(pool=SimpleNamespace(n_blocks=8, n_free=5, block_size=4), scheduler=Scheduler(requests))


def test_each_plan_is_recorded_as_it_was_then():
    engine = engine_of([([2, 0], 6), ([1], 3)])
    planned = PlannedSteps(engine)
    assert engine.scheduler.schedule() == "step 1"  # the plan itself is passed on unchanged
    engine.scheduler.running[0].table.blocks.append(7)  # the next step's tables: not the first record's
    engine.scheduler.running[0].table.n_tokens = 9
    engine.pool.n_free = 4
    engine.scheduler.schedule()
    assert planned.steps == [
        {"n_blocks": 8, "n_free": 5, "block_size": 4, "tables": [{"blocks": [2, 0], "n_tokens": 6},
                                                                 {"blocks": [1], "n_tokens": 3}]},
        {"n_blocks": 8, "n_free": 4, "block_size": 4, "tables": [{"blocks": [2, 0, 7], "n_tokens": 9},
                                                                 {"blocks": [1], "n_tokens": 3}]},
    ]


def test_restore_puts_the_scheduler_s_own_schedule_back():
    engine = engine_of([])
    planned = PlannedSteps(engine)
    planned.restore()
    assert "schedule" not in vars(engine.scheduler) and engine.scheduler.schedule() == "step 1"
    assert planned.steps == []


def test_what_is_not_an_engine_is_refused():
    with pytest.raises(TypeError, match="scheduler.schedule"):
        PlannedSteps(SimpleNamespace(pool=None))
