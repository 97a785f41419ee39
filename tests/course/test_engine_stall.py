"""Part 10's engine stops a loop that cannot move: with the planted admit mistake ("free blocks compared with
tokens") the scheduler leaves a request waiting while its blocks are free and nothing runs, and the engine's
first step raises ``EngineStalled``, saying that the blocks are free, instead of stepping until a test's time
limit. The probe that names the mistake is unchanged (``test_diagnosis``)."""

from __future__ import annotations

import time

import pytest

from sampling_course.grading.course import MISTAKES
from sampling_course.grading.planting import planted
from sampling_course.implementation import Impl, load_demo

ADMIT_MISTAKE = next(m for m in MISTAKES if m.name == "free blocks compared with tokens")


def test_the_admit_mistake_stalls_the_first_step_with_a_named_error(tiny):
    with planted(ADMIT_MISTAKE) as package:
        impl = Impl(package)
        engine = impl.engine.Engine(load_demo(tiny, impl.transformer), n_blocks=8, block_size=4)
        # 10 positions need 3 of the 8 free blocks; the mistake compares 10 tokens with 8 blocks and waits.
        request = engine.add_request(list(range(1, 11)), 2)
        started = time.perf_counter()
        with pytest.raises(impl.engine.EngineStalled, match=rf"request {request.request_id}, .* 10 positions, which "
                           r"need 3 blocks of 4; the pool has 8 of its 8 blocks free\. Its blocks are free, yet the "
                           r"scheduler did not admit it"):
            engine.run()
        assert time.perf_counter() - started < 5, "the stall was noticed only after many steps"
        assert engine.n_steps == 0, "the first step that could do nothing raises"


def test_the_solution_serves_the_same_request(tiny):
    with planted() as package:
        impl = Impl(package)
        engine = impl.engine.Engine(load_demo(tiny, impl.transformer), n_blocks=8, block_size=4)
        request = engine.add_request(list(range(1, 11)), 2)
        engine.run()
        assert len(request.output) == 2 and engine.pool.n_free == 8
