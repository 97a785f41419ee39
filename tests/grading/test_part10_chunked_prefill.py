"""Part 10: chunked prefill, a cap on the positions one step of the engine runs (``max_step_tokens``).

The cap is checked by brute force: the engine is handed the model wrapped in a counter that records
the positions of every forward pass it is asked for, whatever the scheduler says it planned
(``sampling_course.pass_counter``); graded in a sandbox, the counter is kept in the double host,
where the code under test cannot change it. Under every cap tried, each
request gets the tokens part 5's ``generate`` gives it alone (greedy, and seeded sampling with
the request's own generator), also with prefix caching, where a shared prompt's blocks are
filled over several steps. A prompt longer than the cap is prefilled over several steps while
the requests already decoding get a token at every one of them. Caps the scheduler cannot keep
are refused.
"""

from __future__ import annotations

import pytest

from sampling_course.beside import made_apart
from sampling_course.pass_counter import PassCounter
from sampling_course.sampling_settings import SamplerSettings

GREEDY = SamplerSettings(temperature=0.0)
SAMPLED = SamplerSettings(temperature=0.9, top_k=40)
PROMPTS = [
    "When I was a kid, John and Mary went to the shop and bought a red ball and a big blue kite",
    "Once",
    "The cat sat on the mat, and then",
    "Lily had a red ball. She",
    "A short one",
]
NEW = 8


def count_positions(model) -> PassCounter:
    """``model`` wrapped in a counter that records the positions of each forward pass asked of it (``passes``),
    kept where the code under test cannot change it (in the double host when ``model`` lives in a submission's
    process, ``made_apart``). The engine is handed the counter in place of the model."""
    return made_apart(model, PassCounter)


def ran(passes: list[int]) -> list[int]:
    """``passes``, checked not to be empty: an engine that never calls the model it was given leaves nothing."""
    assert passes, "no forward pass of the model the engine was given: the engine must run each step through it"
    return passes


def jobs_of(tokenizer):
    """Each prompt twice: greedy, and sampled with a seed of its own."""
    return [(tokenizer.encode(p), settings, seed) for i, p in enumerate(PROMPTS)
            for settings, seed in ((GREEDY, None), (SAMPLED, 50 + i))]


def alone(impl, model, tokenizer, prompt: list[int], settings, seed) -> list[int] | None:
    """Part 5's ``generate`` on the prompt alone; None when its text does not encode back to its tokens."""
    text = tokenizer.decode(prompt)
    if tokenizer.encode(text) != prompt:
        return None
    return impl.generate.generate(model, tokenizer, [text], NEW, settings=settings, seed=seed)[0, len(prompt):].tolist()


def serve(impl, model, jobs, cap, eos, max_running=4, arrive_every=0, prefix_caching=False, block_size=4):
    """``jobs`` through an engine with ``max_step_tokens=cap``, each ending at ``eos`` or after NEW tokens; with
    ``arrive_every`` > 0 one job arrives every that many steps. Returns the requests and the positions of every
    forward pass."""
    counter = count_positions(model)
    engine = impl.engine.Engine(counter, 96, block_size, max_running, prefix_caching=prefix_caching, max_step_tokens=cap)
    requests, pending = [], list(jobs)
    while pending or not engine.scheduler.done:
        if pending and (arrive_every == 0 or engine.n_steps % arrive_every == 0):
            for prompt, settings, seed in pending if arrive_every == 0 else pending[:1]:
                requests.append(engine.add_request(prompt, NEW, settings, seed, eos))
            pending = [] if arrive_every == 0 else pending[1:]
        engine.step()
    assert engine.pool.n_free == engine.pool.n_blocks, "blocks left held at the end"
    return requests, ran(counter.passes)


@pytest.mark.exercise("Engine.step")
def test_every_cap_gives_the_tokens_of_generate_alone_and_no_pass_runs_more(impl, parity_demo, parity_reference):
    tok = parity_reference.tokenizer
    jobs = jobs_of(tok)
    expected = [alone(impl, parity_demo, tok, *job) for job in jobs]
    assert sum(e is not None for e in expected) >= len(jobs) // 2, "too few prompts encode back to their tokens"
    longest = max(len(prompt) for prompt, _, _ in jobs)
    uncapped, _ = serve(impl, parity_demo, jobs, None, tok.eos_token_id)
    for cap in (4, 5, 7, 16):
        assert cap < longest, "each cap must be shorter than the longest prompt, so that it is chunked"
        for arrive_every in (0, 3):
            requests, passes = serve(impl, parity_demo, jobs, cap, tok.eos_token_id, arrive_every=arrive_every)
            assert max(passes) <= cap, f"max_step_tokens={cap}: a forward pass ran {max(passes)} positions"
            for (prompt, settings, seed), want, request, plain in zip(jobs, expected, requests, uncapped):
                assert request.output == plain.output, (
                    f"max_step_tokens={cap} (seed {seed}): {request.output}, without a cap {plain.output}")
                if want is not None:
                    assert request.output == want, f"max_step_tokens={cap} (seed {seed}): {request.output}, generate alone {want}"


@pytest.mark.exercise("Engine.step")
def test_a_prompt_longer_than_the_cap_is_prefilled_over_steps_while_the_others_decode(impl, tiny_demo, tiny):
    tok = tiny.tokenizer
    short = [tok.encode("Once"), tok.encode("The cat")]
    long_prompt = tok.encode(PROMPTS[0] + PROMPTS[2] + PROMPTS[3])
    cap, max_running = 6, 3
    assert len(long_prompt) > 4 * cap
    counter = count_positions(tiny_demo)
    engine = impl.engine.Engine(counter, 96, 4, max_running, max_step_tokens=cap)
    decoding = [engine.add_request(p, 40, GREEDY) for p in short]
    engine.step()
    engine.step()
    long_request = engine.add_request(long_prompt, NEW, GREEDY, None, tok.eos_token_id)
    steps = 0
    while not long_request.output:
        before = [len(r.output) for r in decoding]
        engine.step()
        steps += 1
        assert [len(r.output) for r in decoding] == [n + 1 for n in before], (
            "a request being decoded got no token in a step that prefilled a chunk of the long prompt")
    engine.run()
    passes = ran(counter.passes)
    assert max(passes) <= cap, f"a forward pass ran {max(passes)} positions, more than max_step_tokens={cap}"
    # Each step leaves one position to each decoding request: the prompt takes the rest, cap - 2 a step.
    assert steps == -(-len(long_prompt) // (cap - len(decoding))), f"the long prompt took {steps} steps"
    want = alone(impl, tiny_demo, tok, long_prompt, GREEDY, None)
    if want is not None:
        assert long_request.output == want, f"the chunked prompt gave {long_request.output}, generate alone {want}"


@pytest.mark.exercise("block_hashes")
def test_chunks_with_prefix_caching_read_only_blocks_already_filled(impl, parity_demo, parity_reference):
    """Every request arrives before the first step. The first one with the system prompt fills its blocks a chunk
    at a time; requests admitted meanwhile may read only the blocks written so far, and all get the tokens of the
    engine without cap and without prefix caching (and of generate alone)."""
    tok = parity_reference.tokenizer
    system = tok.encode("<|endoftext|>Once upon a time, there was a little girl named Lily. She lived in a small "
                        "house near the woods with her mom and dad. Every day she")
    system = system[: len(system) // 4 * 4]
    questions = [" played with her dog.", " One day", " Tom saw a bird.", " ran"]
    jobs = [(system + tok.encode(q), GREEDY if i % 2 else SAMPLED, None if i % 2 else 70 + i)
            for i, q in enumerate(questions)]
    plain, _ = serve(impl, parity_demo, jobs, None, tok.eos_token_id)
    for cap, arrive_every in ((4, 0), (6, 0), (5, 2)):
        requests, passes = serve(impl, parity_demo, jobs, cap, tok.eos_token_id, arrive_every=arrive_every, prefix_caching=True)
        assert max(passes) <= cap, f"max_step_tokens={cap}: a forward pass ran {max(passes)} positions"
        assert [r.output for r in requests] == [r.output for r in plain], (
            f"max_step_tokens={cap} with prefix caching changed a request's tokens")
    # Preempted after its first chunk, a request may find only the blocks that chunk filled when it is admitted again.
    engine = impl.engine.Engine(parity_demo, 96, 4, 4, prefix_caching=True, max_step_tokens=4)
    first = engine.add_request(jobs[0][0], NEW, *jobs[0][1:], tok.eos_token_id)
    engine.step()
    assert first.n_computed == 4 and not first.output, "the first step runs the first 4 positions of the prompt"
    engine.scheduler.preempt(first)
    engine.run()
    assert first.output == plain[0].output, "after a preemption mid-prompt, the request read blocks never filled"
    for (prompt, settings, seed), request in zip(jobs, plain):
        want = alone(impl, parity_demo, tok, prompt, settings, seed)
        if want is not None:
            assert request.output == want


@pytest.mark.parametrize("cap", [0, -1, 3, True, 4.0, "8"])
def test_a_cap_the_scheduler_cannot_keep_is_refused(impl, tiny_demo, cap):
    """The cap must leave every running request (at most max_running = 4) one position a step."""
    with pytest.raises(ValueError, match=r"max_step_tokens must be None \(no limit\) or an integer >= max_running"):
        impl.engine.Engine(tiny_demo, 16, 4, max_running=4, max_step_tokens=cap)
