"""Part 10: prefix caching and per-request stop strings in the serving loop.

``block_hashes`` is checked by its defining properties (equal hashes exactly when the tokens
from position 0 to the block's end are equal; full blocks only; the chain can be resumed from
a parent hash), not by hash values, so any hash function passes. The prefix-caching pool is
checked by reference counts and the free list; the engine with prefix caching against the
engine without it and against part 5's ``generate`` on each request alone, on a stream where
half the requests share a system prompt. Stop strings are checked against ``generate`` with the
same stop strings, alone.
"""

from __future__ import annotations

import pytest

from sampling_course.beside import made_beside
from sampling_course.op_recorder import own_record_held
from sampling_course.planned_steps import PlannedSteps
from sampling_course.sampling_settings import SamplerSettings

GREEDY = SamplerSettings(temperature=0.0)


# ---------------------------------------------------------------------------------------
# block_hashes
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("block_hashes")
def test_block_hashes_cover_full_blocks_only(impl):
    hashes = impl.prefix_cache.block_hashes
    assert [len(hashes(list(range(n)), 4)) for n in range(13)] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3]


@pytest.mark.exercise("block_hashes")
def test_block_hashes_are_equal_exactly_when_the_whole_prefix_is(impl):
    hashes = impl.prefix_cache.block_hashes
    base = hashes([1, 2, 3, 4, 5, 6, 7], 2)
    assert base == hashes([1, 2, 3, 4, 5, 6, 9], 2), "the partly filled last block must not count"
    other_start = hashes([9, 9, 3, 4, 5, 6], 2)
    assert all(a != b for a, b in zip(base, other_start)), (
        "blocks 1 and 2 have the same tokens after a different block 0: their keys and values differ, so must their hashes"
    )
    other_middle = hashes([1, 2, 3, 9, 5, 6], 2)
    assert other_middle[0] == base[0] and other_middle[1] != base[1] and other_middle[2] != base[2]
    assert len(set(hashes([7, 7] * 4, 2))) == 4, "equal tokens at different depths are different blocks"
    assert hashes([5, 6], 2, parent=base[1]) == [base[2]], "the chain resumes from the hash of the block before"


# ---------------------------------------------------------------------------------------
# The prefix-caching pool
# ---------------------------------------------------------------------------------------


# The prefix-caching tests are graded as block_hashes' only, the part's last exercise: they need it, and no
# check may need a later exercise (the course walked in order checks that).
@pytest.mark.exercise("block_hashes")
def test_pool_finds_registered_blocks_until_their_block_is_reused(impl):
    pc = impl.prefix_cache
    pool = pc.PrefixCachingPool(3, 2)
    h = pc.block_hashes([1, 2], 2)[0]
    block = pool.allocate()
    with pytest.raises(ValueError, match="free"):
        pool.register(pool.free_blocks[0], h)  # a free block cannot be registered
    pool.register(block, h)
    assert pool.lookup(h) == block and pool.ref_counts[block] == 2
    assert pool.lookup(pc.block_hashes([2, 1], 2)[0]) is None
    pool.free(block), pool.free(block)
    assert pool.n_free == 3 and pool.cached(h) == block, "a freed block keeps its contents until it is reused"
    assert pool.lookup(h) == block and pool.n_free == 2 and block not in list(pool.free_blocks)
    pool.free(block)
    taken = [pool.allocate() for _ in range(3)]  # every block, so the cached one too: handed out for new contents
    assert block in taken and pool.cached(h) is None and pool.lookup(h) is None, "a reused block kept its old hash"


# ---------------------------------------------------------------------------------------
# The engine with prefix caching
# ---------------------------------------------------------------------------------------


def shared_prompt_stream(tokenizer, block_size):
    """Six requests; the even ones start with one system prompt, cut to whole blocks."""
    system = tokenizer.encode("<|endoftext|>Once upon a time, there was a little girl named Lily. She lived in a small "
                              "house near the woods with her mom and dad. Every day she")
    system = system[: len(system) // block_size * block_size]
    questions = [" played with her dog.", " One day", " Tom saw a bird.", " The sun was hot and", " ran", " A big red ball"]
    prompts = [system + tokenizer.encode(q) if i % 2 == 0 else tokenizer.encode("<|endoftext|>" + q)
               for i, q in enumerate(questions)]
    jobs = [(p, GREEDY if i % 3 else SamplerSettings(temperature=0.9, top_k=40), None if i % 3 else 10 + i)
            for i, p in enumerate(prompts)]
    return system, jobs


def held_blocks_match_the_tables(engine):
    """Every block's count is the number of running requests whose table holds it; the free list holds the rest."""
    pool, holders = engine.pool, [0] * engine.pool.n_blocks
    for request in engine.scheduler.running:
        for block in request.table.blocks:
            holders[block] += 1
    assert pool.ref_counts == holders, "a block's reference count differs from the tables that hold it"
    assert sorted(pool.free_blocks) == [b for b in range(pool.n_blocks) if holders[b] == 0]


def kv_within_a_block_per_request(engine) -> PlannedSteps:
    """Right after each step is planned (what its forward pass holds), the pool and the running tables, written down
    where the engine runs (``kv_was_within_a_block_per_request`` judges them after the run)."""
    return made_beside(engine, PlannedSteps, engine)


def kv_was_within_a_block_per_request(planned: PlannedSteps):
    """At every planned step: the held blocks are the running tables' blocks, and their room exceeds the distinct
    (block, offset) places of the running requests' positions by at most one block per running request, however
    many requests share a block."""
    steps = planned.steps  # as plain data
    assert steps, "the engine never planned a step through its scheduler's schedule"
    for held_at_step in steps:
        running, size = held_at_step["tables"], held_at_step["block_size"]
        places = {(t["blocks"][p // size], p % size) for t in running for p in range(t["n_tokens"])}
        held = held_at_step["n_blocks"] - held_at_step["n_free"]
        assert held == len({b for t in running for b in t["blocks"]})
        assert held * size - len(places) <= len(running) * (size - 1), "more than a block per request unused"
    own_record_held(planned)  # written down where the engine runs: graded in another process, it convicts, never earns


def serve_stream(impl, model, tokenizer, jobs, prefix_caching, block_size=4, n_new=8, all_at_once=False):
    """One request arrives per step (``all_at_once``: every request before the first step); each step checks
    the pool against the tables."""
    engine = impl.engine.Engine(model, 96, block_size, tokenizer=tokenizer, prefix_caching=prefix_caching)
    requests = []
    for prompt, settings, seed in jobs:
        requests.append(engine.add_request(prompt, n_new, settings, seed))
        if not all_at_once:
            engine.step()
            held_blocks_match_the_tables(engine)
    while not engine.scheduler.done:
        engine.step()
        held_blocks_match_the_tables(engine)
    assert engine.pool.n_free == engine.pool.n_blocks
    return [r.output for r in requests], engine


@pytest.mark.exercise("block_hashes")
def test_a_shared_system_prompt_is_prefilled_once_and_outputs_do_not_change(impl, parity_demo, parity_reference):
    tok = parity_reference.tokenizer
    system, jobs = shared_prompt_stream(tok, 4)
    plain, without = serve_stream(impl, parity_demo, tok, jobs, prefix_caching=False)
    cached, with_ = serve_stream(impl, parity_demo, tok, jobs, prefix_caching=True)
    assert cached == plain, "prefix caching changed a request's tokens"
    assert without.n_prefill_tokens == sum(len(p) for p, _, _ in jobs)
    sharing = sum(1 for p, _, _ in jobs if p[: len(system)] == system)
    # The first request with the system prompt computes it; every later one reads all of its (full) blocks.
    saved = without.n_prefill_tokens - with_.n_prefill_tokens
    assert saved == (sharing - 1) * len(system), f"saved {saved} prefill positions, expected {(sharing - 1) * len(system)}"
    shared_fraction = sharing * len(system) / without.n_prefill_tokens
    assert saved / without.n_prefill_tokens >= shared_fraction * (sharing - 1) / sharing
    compared = 0
    for (prompt, settings, seed), out in zip(jobs, cached):
        text = [tok.decode(prompt)]
        if tok.encode(text[0]) != prompt:
            continue  # generate takes text: only prompts whose text encodes back to the same tokens compare
        alone = impl.generate.generate(parity_demo, tok, text, 8, settings=settings, seed=seed)
        assert out == alone[0, len(prompt):].tolist(), f"{text[0]!r}: served {out}, generate alone {alone[0, len(prompt):].tolist()}"
        compared += 1
    assert compared >= len(jobs) // 2, f"only {compared} prompts encode back to their tokens"


@pytest.mark.exercise("block_hashes")
def test_requests_admitted_in_one_step_share_the_first_one_s_prefix_blocks(impl, parity_demo, parity_reference):
    """Every request arrives before the first step, so all are admitted together: the first with the system
    prompt computes its blocks in that step's forward pass and the later ones read them in the same pass."""
    tok = parity_reference.tokenizer
    system, jobs = shared_prompt_stream(tok, 4)
    plain, without = serve_stream(impl, parity_demo, tok, jobs, prefix_caching=False, all_at_once=True)
    engine = impl.engine.Engine(parity_demo, 96, 4, prefix_caching=True)
    planned = kv_within_a_block_per_request(engine)
    requests = [engine.add_request(p, 8, s, seed) for p, s, seed in jobs]
    engine.step()
    assert not list(engine.scheduler.waiting), "the pool has room for every request in the first step"  # as plain data
    held_blocks_match_the_tables(engine)
    sharing = [r for r in requests if r.prompt[: len(system)] == system]
    n_system_blocks = len(system) // 4
    first = sharing[0].table.blocks[:n_system_blocks]
    for request in sharing[1:]:
        assert request.table.blocks[:n_system_blocks] == first, "a request admitted in the same step did not share " \
            "the system prompt's blocks"
    assert all(engine.pool.ref_counts[b] == len(sharing) for b in first)
    assert engine.n_prefill_tokens == without.n_prefill_tokens - (len(sharing) - 1) * len(system)
    while not engine.scheduler.done:
        engine.step()
        held_blocks_match_the_tables(engine)
    kv_was_within_a_block_per_request(planned)
    assert [r.output for r in requests] == plain, "sharing blocks within a step changed a request's tokens"


@pytest.mark.exercise("block_hashes")
def test_prefix_blocks_survive_preemption_and_shared_blocks_are_never_freed_while_held(impl, tiny_demo, tiny):
    tok = tiny.tokenizer
    system, jobs = shared_prompt_stream(tok, 2)
    longest = max(len(p) for p, _, _ in jobs) + 8
    engine = impl.engine.Engine(tiny_demo, -(-longest // 2) + 3, 2, prefix_caching=True)
    planned = kv_within_a_block_per_request(engine)
    requests = [engine.add_request(p, 8, s, seed) for p, s, seed in jobs]
    while not engine.scheduler.done:
        engine.step()
        held_blocks_match_the_tables(engine)
    kv_was_within_a_block_per_request(planned)
    assert any(r.n_preemptions for r in requests), "the pool was meant to be too small for every request at once"
    reference = impl.engine.Engine(tiny_demo, 256, 2)
    expected = [reference.add_request(p, 8, s, seed) for p, s, seed in jobs]
    reference.run()
    assert [r.output for r in requests] == [r.output for r in expected]


# ---------------------------------------------------------------------------------------
# Stop strings
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("Engine.step")  # the engine runs the scheduler: graded from its step on
def test_a_stop_string_ends_a_request_frees_its_blocks_and_matches_generate(impl, parity_demo, parity_reference):
    tok = parity_reference.tokenizer
    prompts = ["<|endoftext|>Once upon a time", "<|endoftext|>Lily had a red ball. She", "The cat sat on the mat"]
    engine = impl.engine.Engine(parity_demo, 64, 4, tokenizer=tok)
    stopped = [engine.add_request(tok.encode(p), 30, GREEDY, None, None, stop_strings=["."]) for p in prompts]
    free = [engine.add_request(tok.encode(p), 30, GREEDY, None, None) for p in prompts]
    engine.run()
    assert engine.pool.n_free == engine.pool.n_blocks, "a stopped request's blocks were not freed"
    for prompt, request, whole in zip(prompts, stopped, free):
        alone = impl.generate.generate(parity_demo, tok, [prompt], 30, settings=GREEDY, stop_strings=["."],
                                       eos_token_id=parity_demo.cfg.d_vocab)
        n = len(tok.encode(prompt))
        expected = alone[0, n : n + len(request.output)].tolist()
        assert request.output == expected == whole.output[: len(request.output)]
        if "." in tok.decode(whole.output):
            assert len(request.output) < 30 and "." in tok.decode(request.output[-2:]), f"{prompt!r}: did not stop"
            assert "." not in tok.decode(request.output[:-1]), f"{prompt!r}: stopped late"
    with pytest.raises(ValueError, match="tokenizer"):
        impl.engine.Engine(parity_demo, 8, 4).add_request([1], 2, stop_strings=["."])
