"""Part 10's engine stops a loop that cannot move: with the planted admit mistake ("free blocks compared with
tokens") the scheduler leaves a request waiting while its blocks are free and nothing runs, and the engine's
first step raises ``EngineStalled``, saying that the blocks are free, instead of stepping until a test's time
limit; with "admitted request given no work" (the request joins the running queue but not the step's prefill
list) it says that the request was admitted and given no work. The probe that names each mistake is unchanged
(``test_diagnosis``). A check's panel shows a failure's first lines, each cut to a width: the message is short
lines, each a whole sentence."""

from __future__ import annotations

import time

import pytest

from sampling_course.grading.course import MISTAKES
from sampling_course.grading.planting import planted
from sampling_course.grading.runner import _MAX_LINE_CHARS, _MAX_MESSAGE_LINES
from sampling_course.implementation import Impl, load_demo

ADMIT_MISTAKE = next(m for m in MISTAKES if m.name == "free blocks compared with tokens")
NO_WORK_MISTAKE = next(m for m in MISTAKES if m.name == "admitted request given no work")
# What a check's panel keeps of each line of a failure (grading/runner.py), less room for the exception's name.
PANEL_LINE = _MAX_LINE_CHARS - len("exercises.engine.EngineStalled: ")


def fits_the_panel(message: str) -> None:
    lines = message.splitlines()
    assert len(lines) <= _MAX_MESSAGE_LINES, f"{len(lines)} lines, the panel shows {_MAX_MESSAGE_LINES}"
    assert all(len(line) <= PANEL_LINE for line in lines), [line for line in lines if len(line) > PANEL_LINE]
    assert all(line.rstrip().endswith((".", ")", ":")) for line in lines), "a line stops mid-sentence"


def test_the_admit_mistake_stalls_the_first_step_with_a_named_error(tiny):
    with planted(ADMIT_MISTAKE) as package:
        impl = Impl(package)
        engine = impl.engine.Engine(load_demo(tiny, impl.transformer), n_blocks=8, block_size=4)
        # 10 positions need 3 of the 8 free blocks; the mistake compares 10 tokens with 8 blocks and waits.
        request = engine.add_request(list(range(1, 11)), 2)
        started = time.perf_counter()
        with pytest.raises(impl.engine.EngineStalled, match=rf"Request {request.request_id}, .* 10 positions, which "
                           r"need 3 blocks of 4\.\nThe pool has 8 of its 8 blocks free\.\nIts blocks are free, yet "
                           r"the scheduler did not admit it\.") as stalled:
            engine.run()
        assert time.perf_counter() - started < 5, "the stall was noticed only after many steps"
        assert engine.n_steps == 0, "the first step that could do nothing raises"
        fits_the_panel(str(stalled.value))


def test_an_admitted_request_given_no_work_is_said_to_be_admitted(tiny):
    with planted(NO_WORK_MISTAKE) as package:
        impl = Impl(package)
        engine = impl.engine.Engine(load_demo(tiny, impl.transformer), n_blocks=8, block_size=4)
        request = engine.add_request(list(range(1, 11)), 2)
        waiting = engine.add_request(list(range(1, 5)), 2)
        with pytest.raises(impl.engine.EngineStalled) as stalled:
            engine.run()
        message = str(stalled.value)
        assert f"Request {request.request_id} is running (it was admitted and holds 3 blocks), but the step gave it " \
               "no work." in message
        assert "goes into the step's prefill list" in message
        assert "not admit" not in message and f"Request {waiting.request_id}" not in message
        fits_the_panel(message)


def test_a_stall_with_blocks_held_outside_fits_the_panel(tiny):
    with planted() as package:
        impl = Impl(package)
        engine = impl.engine.Engine(load_demo(tiny, impl.transformer), n_blocks=4, block_size=4)
        held = [engine.pool.allocate() for _ in range(3)]
        engine.add_request([1] * 6, 2)
        with pytest.raises(impl.engine.EngineStalled) as stalled:
            engine.step()
        fits_the_panel(str(stalled.value))
        for block in held:
            engine.pool.free(block)


def test_the_solution_serves_the_same_request(tiny):
    with planted() as package:
        impl = Impl(package)
        engine = impl.engine.Engine(load_demo(tiny, impl.transformer), n_blocks=8, block_size=4)
        request = engine.add_request(list(range(1, 11)), 2)
        engine.run()
        assert len(request.output) == 2 and engine.pool.n_free == 8
