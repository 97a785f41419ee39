"""Part 10: the block pool, the paged KV cache, the scheduler and the serving loop.

The paged cache is checked against a brute-force contiguous cache (one tensor per request,
appended to in order) under interleaved writes over a fragmented pool, laid out in rows as the
engine lays out a step. The serving loop is
checked for exactness against part 5's ``generate`` run on each request alone (greedy, and
seeded sampling with the request's own generator), on the stand-in and the story model: in
mixed batches, with requests arriving while others run, and under a pool so small that
requests are preempted and recomputed. At the end every block is back in the pool.
"""

from __future__ import annotations

import random

import pytest
import torch

from sampling_course.beside import made_beside
from sampling_course.config import Config
from sampling_course.method_calls import MethodCalls
from sampling_course.op_recorder import own_record_held
from sampling_course.planned_steps import PlannedSteps
from sampling_course.sampling_settings import SamplerSettings

PROMPTS = [
    "The cat sat on the mat, and then",
    "Once",
    "When I was a kid, John and Mary went to the",
    "A short one",
    "Lily had a red ball. She",
]
NEW = 10


# ---------------------------------------------------------------------------------------
# The block pool and block tables
# ---------------------------------------------------------------------------------------


def test_blocks_needed_counts_a_partly_filled_last_block(impl):
    bp = impl.block_pool
    assert [bp.blocks_needed(n, 4) for n in range(10)] == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3]


@pytest.mark.exercise("BlockPool")
def test_pool_allocates_shares_and_frees_by_reference_count(impl):
    pool = impl.block_pool.BlockPool(3, 4)
    a, b, c = pool.allocate(), pool.allocate(), pool.allocate()
    assert sorted([a, b, c]) == [0, 1, 2] and pool.n_free == 0
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.allocate()
    pool.share(a)
    assert pool.free(a) is False, "a block another holder still shares must not be freed"
    assert pool.n_free == 0
    with pytest.raises(RuntimeError):
        pool.allocate()
    assert pool.free(a) is True and pool.n_free == 1
    assert pool.allocate() == a
    assert pool.free(b) is True
    with pytest.raises(ValueError, match="already free"):
        pool.free(b)
    with pytest.raises(ValueError, match="free"):
        pool.share(b)
    for bad in (-1, 3, 1.0, True):
        with pytest.raises(ValueError, match=r"\[0, 3\)"):
            pool.free(bad)
    with pytest.raises(ValueError, match="n_blocks"):
        impl.block_pool.BlockPool(0, 4)


@pytest.mark.exercise("BlockTable")
def test_table_grows_one_block_at_a_time_and_fills_the_last(impl):
    bp = impl.block_pool
    pool, table = bp.BlockPool(8, 4), bp.BlockTable(4)
    fills = []
    for n in range(1, 10):
        table.grow(pool, n)
        fills.append((len(table.blocks), table.last_block_fill()))
    assert fills == [(1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2), (2, 3), (2, 4), (3, 1)]
    table.release(pool)
    assert pool.n_free == 8 and table.blocks == [] and table.last_block_fill() == 0
    with pytest.raises(RuntimeError, match="more blocks"):
        table.grow(pool, 33)
    assert pool.n_free == 8, "a refused grow allocates nothing"


@pytest.mark.exercise("BlockTable")
def test_table_slots_follow_its_blocks_in_order(impl):
    bp = impl.block_pool
    table = bp.BlockTable(4)
    table.blocks, table.n_tokens = [5, 2, 7], 10  # not in id order, as a fragmented pool hands them out
    assert table.slots(0, 10).tolist() == [20, 21, 22, 23, 8, 9, 10, 11, 28, 29]
    assert table.slots(3, 6).tolist() == [23, 8, 9]
    with pytest.raises(ValueError, match="outside"):
        table.slots(0, 13)


def query_rows(step, new_of):
    """New keys (or values) laid out as a paged step's queries (``step.tokens``): row by row, each row left-padded,
    its segments one after the other, each ending at its ``step.last``; ``new_of`` lists each segment's own."""
    rows, width = step.tokens.shape
    out = torch.zeros(rows * width, *new_of[0].shape[1:])
    for end, new in zip(step.last.tolist(), new_of):
        out[end - len(new) + 1 : end + 1] = new
    return out.view(rows, width, *new_of[0].shape[1:])


def test_a_paged_step_is_laid_out_as_a_left_padded_batch(impl):
    """``paged_step`` (given code) against a brute-force layout, for rows of one segment (a step's decodes, laid out
    at once) and of several (packed prompts): each row's new tokens and keys one segment after the other, left-padded;
    a query sees exactly its own segment's keys up to its own position."""
    bp = impl.block_pool
    rng = random.Random(11)
    for trial in range(60):
        rows = [[bp.Segment([rng.randint(1, 9) for _ in range(n)], start, [rng.randrange(90) for _ in range(start + n)])
                 for n, start in [(rng.randint(1, 3), rng.randint(0, 5)) for _ in range(1 if trial % 2 else rng.randint(1, 3))]]
                for _ in range(rng.randint(1, 4))]
        step = bp.paged_step(rows)
        width = max(sum(len(s.tokens) for s in row) for row in rows)
        n_keys = max(sum(len(s.slots) for s in row) for row in rows)
        mask, last, write = [], [], []
        for r, row in enumerate(rows):
            queries = [None] * (width - sum(len(s.tokens) for s in row))  # (segment, position) of each query
            keys = [None] * (n_keys - sum(len(s.slots) for s in row))
            for k, s in enumerate(row):
                queries += [(k, s.start + i) for i in range(len(s.tokens))]
                keys += [(k, p) for p in range(len(s.slots))]
                last.append(r * width + len(queries) - 1)
                write += s.slots[s.start:]
            assert step.tokens[r].tolist() == [0] * queries.count(None) + [t for s in row for t in s.tokens]
            assert step.valid[r].tolist() == [q is not None for q in queries]
            assert step.positions[r].tolist() == [0 if q is None else q[1] for q in queries]
            assert step.read_slots[r].tolist()[keys.count(None):] == [x for s in row for x in s.slots]
            mask.append([[q is not None and k is not None and k[0] == q[0] and k[1] <= q[1] for k in keys] for q in queries])
        assert step.mask[:, 0].tolist() == mask, f"trial {trial}: the mask"
        assert step.last.tolist() == last and step.write_slots.tolist() == write


@pytest.mark.exercise("PagedKVCache.update")
def test_paged_cache_update_writes_through_the_tables_and_reads_each_request_in_order(impl):
    """Three requests grow in random interleaved chunks over a pool fragmented by another request's freed blocks,
    laid out one a row, all in one row, or in two rows of different widths (so padded). In every layer, ``update``
    returns for each request exactly its own contiguous cache (every key and value so far, in order) where the
    step's layout puts its keys; at the end each request's gather equals its contiguous cache."""
    bp = impl.block_pool
    cfg = Config(d_model=8, n_heads=2, d_head=4, n_layers=2, d_vocab=11, n_ctx=64, d_mlp=16)
    rng = random.Random(0)
    draws = torch.Generator().manual_seed(0)  # the test's inputs, drawn on the CPU
    pool, cache = bp.BlockPool(40, 3), bp.PagedKVCache(cfg, 40, 3)
    filler = bp.BlockTable(3)
    filler.grow(pool, 12)
    tables = [bp.BlockTable(3) for _ in range(3)]
    contiguous = [torch.empty(cfg.n_layers, 2, 0, cfg.n_heads, cfg.d_head) for _ in range(3)]
    for step in range(12):
        if step == 3:
            filler.release(pool)  # the freed blocks come back at the end of the free list
        chosen = rng.sample(range(3), rng.randint(1, 3))
        segments, new = [], []
        for r in chosen:
            start, n = contiguous[r].shape[2], rng.randint(1, 4)
            tables[r].grow(pool, start + n)
            segments.append(bp.Segment([1] * n, start, tables[r].slots(0, start + n).tolist()))
            new.append(torch.randn(cfg.n_layers, 2, n, cfg.n_heads, cfg.d_head, generator=draws))
        layout = ["a row each", "one row", "two rows"][step % 3]
        rows = ([[s] for s in segments] if layout == "a row each" or len(segments) == 1 else [segments]
                if layout == "one row" else [segments[:1], segments[1:]])
        plan = cache.plan(rows)
        whole = [torch.cat([contiguous[r], n_], dim=2) for r, n_ in zip(chosen, new)]  # in the order of segments
        n_keys = plan.read_slots.shape[1]
        for layer in range(cfg.n_layers):
            keys, values = cache.update(layer, query_rows(plan, [n_[layer, 0] for n_ in new]),
                                        query_rows(plan, [n_[layer, 1] for n_ in new]))
            assert keys.shape == values.shape == (len(rows), n_keys, cfg.n_heads, cfg.d_head)
            first = 0
            for r, row in enumerate(rows):
                end = n_keys  # a row's keys end at its right edge, its segments one after the other
                for held in reversed(whole[first : first + len(row)]):
                    span = slice(end - held.shape[2], end)
                    assert torch.equal(keys[r, span], held[layer, 0]), f"step {step} ({layout}), layer {layer}: keys"
                    assert torch.equal(values[r, span], held[layer, 1]), f"step {step} ({layout}), layer {layer}: values"
                    end -= held.shape[2]
                first += len(row)
        assert cache.commit() is cache
        for r, w in zip(chosen, whole):
            contiguous[r] = w
    for r in range(3):
        n = contiguous[r].shape[2]
        for layer in range(cfg.n_layers):
            keys, values = cache.gather(layer, tables[r], n)
            assert torch.equal(keys, contiguous[r][layer, 0]), f"request {r}, layer {layer}: keys out of order"
            assert torch.equal(values, contiguous[r][layer, 1]), f"request {r}, layer {layer}: values out of order"


@pytest.mark.exercise("PagedKVCache.update")
def test_the_model_through_the_paged_cache_gives_each_request_the_logits_of_its_own_tokens(impl, tiny_demo):
    """The model of parts 1 and 4, its one forward pass with the paged cache as its cache: three requests over a
    fragmented pool, first a chunk of each, one request a row (rows of different widths), then the rest of all three
    packed in one row. Every new position's logits are those of the model run on that request's tokens alone."""
    bp, cfg = impl.block_pool, tiny_demo.cfg
    rng = random.Random(3)
    sequences = [[rng.randrange(cfg.d_vocab) for _ in range(n)] for n in (9, 4, 13)]
    pool, cache = bp.BlockPool(32, 4), bp.PagedKVCache(cfg, 32, 4)
    filler = bp.BlockTable(4)
    filler.grow(pool, 10)
    tables = [bp.BlockTable(4) for _ in sequences]
    with torch.no_grad():
        alone = [tiny_demo(torch.tensor([s]))[0] for s in sequences]
        done = [0, 0, 0]
        for cut, packed in (([5, 3, 7], False), ([9, 4, 13], True)):
            if packed:
                filler.release(pool)
            segments = []
            for r, (s, end) in enumerate(zip(sequences, cut)):
                tables[r].grow(pool, end)
                segments.append(bp.Segment(s[done[r]:end], done[r], tables[r].slots(0, end).tolist()))
            plan = cache.plan([segments] if packed else [[segment] for segment in segments])
            logits, returned = tiny_demo(plan.tokens, cache)
            assert returned is cache, "model(tokens, paged_cache) returns the cache, filled in place"
            flat = logits.flatten(0, 1)
            for r, (segment, last) in enumerate(zip(segments, plan.last.tolist())):
                got = flat[last - len(segment.tokens) + 1 : last + 1]
                torch.testing.assert_close(got, alone[r][done[r] : cut[r]], rtol=1e-4, atol=1e-4,
                                           msg=lambda m, r=r: f"request {r}, positions {done[r]}..{cut[r] - 1}: {m}")
            done = cut


# ---------------------------------------------------------------------------------------
# The scheduler
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("Scheduler.schedule")
def test_scheduler_admits_while_blocks_allow_and_retires_at_once(impl):
    sch = impl.scheduler
    pool = impl.block_pool.BlockPool(4, 4)
    scheduler = sch.Scheduler(pool, max_running=8)
    first, second, third = (sch.Request([1] * n, 4) for n in (6, 7, 3))
    for request in (first, second, third):
        scheduler.add(request)
    step = scheduler.schedule()
    # 6 tokens take 2 blocks, 7 tokens 2 more; the third must wait (first come, first served).
    assert step.prefill == [first, second] and step.decode == [] and list(scheduler.waiting) == [third]
    assert pool.n_free == 0
    first.n_computed, second.n_computed = 6, 7
    first.append(5)
    first.state = sch.FINISHED
    assert scheduler.retire() == [first] and pool.n_free == 2
    second.append(5)
    step = scheduler.schedule()
    assert step.decode == [second] and step.prefill == [third]
    with pytest.raises(ValueError, match="could never finish"):
        scheduler.add(sch.Request([1] * 10, 7))
    with pytest.raises(ValueError, match="prompt"):
        sch.Request([], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        sch.Request([1], 0)


@pytest.mark.exercise("Scheduler.schedule")
def test_scheduler_preempts_the_last_admitted_when_the_pool_runs_out(impl):
    sch = impl.scheduler
    pool = impl.block_pool.BlockPool(2, 2)
    scheduler = sch.Scheduler(pool)
    old, new = sch.Request([1, 2], 2), sch.Request([3, 4], 2)
    scheduler.add(old)
    scheduler.add(new)
    assert scheduler.schedule().prefill == [old, new]
    for request in (old, new):
        request.n_computed = 2
        request.append(9)
    step = scheduler.schedule()  # each needs a third position, a second block: only one can have it
    assert step.preempted == [new] and step.decode == [old] and step.prefill == []
    assert new.state == sch.WAITING and new.n_computed == 0 and new.table.blocks == []
    assert list(scheduler.waiting) == [new] and new.output == [9], "a preempted request keeps its tokens"


# ---------------------------------------------------------------------------------------
# The serving loop: exactness against part 5's generate on each request alone
# ---------------------------------------------------------------------------------------


def generate_alone(impl, model, tokenizer, prompt: str, new: int, settings: SamplerSettings, seed: int | None):
    out = impl.generate.generate(model, tokenizer, [prompt], new, settings=settings, seed=seed)
    return out[0, len(tokenizer.encode(prompt)):].tolist()


# The engine's tests run the pool, the tables, the paged cache, the scheduler and the engine's step together: they
# are graded from the engine's step on (the part's fifth exercise), so that no earlier check needs a later one.
def serve(impl, model, tokenizer, jobs, n_blocks=64, block_size=4, max_running=16, arrive_every=0):
    """Run ``jobs`` (prompt, settings, seed) through one engine; with ``arrive_every`` > 0, a new request
    arrives every that many steps while the earlier ones run. Returns each job's tokens and the engine."""
    engine = impl.engine.Engine(model, n_blocks, block_size, max_running)
    eos = tokenizer.eos_token_id
    requests, pending = [], list(jobs)
    while pending or not engine.scheduler.done:
        if pending and (arrive_every == 0 or engine.n_steps % arrive_every == 0):
            for prompt, settings, seed in pending if arrive_every == 0 else pending[:1]:
                requests.append(engine.add_request(tokenizer.encode(prompt), NEW, settings, seed, eos))
            pending = [] if arrive_every == 0 else pending[1:]
        engine.step()
    return requests, engine


def assert_pool_empty(engine):
    pool = engine.pool
    assert pool.n_free == pool.n_blocks and all(c == 0 for c in pool.ref_counts), "blocks left held at the end"


GREEDY = SamplerSettings(temperature=0.0)
SAMPLED = [SamplerSettings(temperature=0.8, top_k=30), SamplerSettings(temperature=1.0, top_p=0.9),
           SamplerSettings(temperature=0.7, min_p=0.05)]


@pytest.fixture(scope="module")
def alone(impl, parity_demo, parity_reference):
    """Each job's tokens from part 5's generate on that prompt alone: greedy, then seeded sampling."""
    tok = parity_reference.tokenizer
    greedy = [(p, GREEDY, None) for p in PROMPTS]
    sampled = [(p, SAMPLED[i % 3], 100 + i) for i, p in enumerate(PROMPTS)]
    # Keyed by (prompt, seed): a seed belongs to one sampled job, None to the greedy ones.
    return {(p, seed): generate_alone(impl, parity_demo, tok, p, NEW, settings, seed) for p, settings, seed in greedy + sampled}


@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("Engine.step")
def test_greedy_requests_in_one_batch_equal_generate_alone(impl, parity_demo, parity_reference, alone):
    jobs = [(p, GREEDY, None) for p in PROMPTS]
    requests, engine = serve(impl, parity_demo, parity_reference.tokenizer, jobs)
    for job, out in zip(jobs, (r.output for r in requests)):
        assert out == alone[job[0], job[2]], f"{job[0]!r}: the engine gave {out}, generate alone {alone[job[0], job[2]]}"
    assert_pool_empty(engine)


@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("Engine.step")
def test_mixed_greedy_and_seeded_requests_arriving_over_time_equal_generate_alone(
    impl, parity_demo, parity_reference, alone
):
    """Each request's output is the same whatever it is batched with: greedy and seeded requests
    (each with its own settings) interleaved, arriving one every two steps, prefills beside decodes."""
    jobs = [job for pair in zip([(p, GREEDY, None) for p in PROMPTS],
                                [(p, SAMPLED[i % 3], 100 + i) for i, p in enumerate(PROMPTS)]) for job in pair]
    for arrive_every in (0, 2):
        requests, engine = serve(impl, parity_demo, parity_reference.tokenizer, jobs, arrive_every=arrive_every)
        for job, out in zip(jobs, (r.output for r in requests)):
            assert out == alone[job[0], job[2]], f"{job[0]!r} (seed {job[2]}): the engine gave {out}, generate alone {alone[job[0], job[2]]}"
        assert_pool_empty(engine)
    # And directly: a greedy and a seeded request served alone by the engine give what they gave in the mix.
    mixed = {(job[0], job[2]): r.output for job, r in zip(jobs, requests)}
    for job in jobs[2:4]:
        [request], _ = serve(impl, parity_demo, parity_reference.tokenizer, [job])
        assert request.output == mixed[job[0], job[2]], f"{job[0]!r} (seed {job[2]}): alone {request.output}, mixed in a batch {mixed[job[0], job[2]]}"


@pytest.mark.exercise("Engine.step")
def test_preemption_under_a_tiny_pool_gives_the_same_tokens(impl, parity_demo, parity_reference, alone):
    """A pool too small for all requests at once: some are preempted and recomputed, greedy and seeded,
    and still every request's tokens equal generate alone."""
    jobs = [(p, GREEDY, None) for p in PROMPTS[:3]] + [(p, SAMPLED[i % 3], 100 + i) for i, p in enumerate(PROMPTS[:3])]
    tok = parity_reference.tokenizer
    longest = max(len(tok.encode(p)) for p, _, _ in jobs) + NEW
    n_blocks = -(-longest // 2) + 2  # room for the longest request and a little more
    requests, engine = serve(impl, parity_demo, tok, jobs, n_blocks=n_blocks, block_size=2)
    assert any(r.n_preemptions > 0 for r in requests), "the pool was meant to be too small for every request at once"
    for job, out in zip(jobs, (r.output for r in requests)):
        assert out == alone[job[0], job[2]], f"{job[0]!r} (seed {job[2]}): after preemption {out}, generate alone {alone[job[0], job[2]]}"
    assert_pool_empty(engine)


@pytest.mark.exercise("Engine.step")
def test_a_tiny_pool_really_preempts(impl, tiny_demo, tiny):
    tok = tiny.tokenizer
    prompts = [tok.encode(p) for p in PROMPTS[:3]]
    longest = max(len(p) for p in prompts) + NEW
    # Room for the longest request and one block more: three requests cannot all run to the end at once.
    engine = impl.engine.Engine(tiny_demo, n_blocks=-(-longest // 2) + 1, block_size=2)
    requests = [engine.add_request(p, NEW, GREEDY, None, None) for p in prompts]
    engine.run()
    assert any(r.n_preemptions > 0 for r in requests), "the pool cannot hold three requests: one must be preempted"
    assert all(len(r.output) == NEW for r in requests)
    assert_pool_empty(engine)


@pytest.mark.exercise("Engine.step")
def test_the_engine_places_new_keys_where_the_table_s_own_slots_say(impl, tiny_demo):
    """The engine asks each request's ``BlockTable.slots`` where its positions go, not a formula of its own:
    with ``slots`` wrapped (same results), the wrapper is called and the tokens are those of the unwrapped engine."""
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5], [2, 7], [1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9]]

    def serve_all():
        engine = impl.engine.Engine(tiny_demo, n_blocks=12, block_size=3, max_running=2)
        requests = [engine.add_request(p, 7, GREEDY) for p in prompts]
        engine.run()
        return [r.output for r in requests]

    plain = serve_all()
    # wrapped where the engine runs: a wrapper written here would be an object of the grader's there
    slots = made_beside(impl.block_pool, MethodCalls, impl.block_pool.BlockTable, "slots")
    try:
        assert serve_all() == plain, "wrapping BlockTable.slots (same results) changed the engine's tokens"
    finally:
        slots.restore()
    assert slots.calls > 0, "the engine never called BlockTable.slots: it computes the slots some other way"
    own_record_held(slots)  # counted where the engine runs: graded in another process, it convicts, never earns


def assert_kv_within_a_block_per_request(held_at_step):
    """The blocks held are exactly those the running requests' tables list, and they hold at most one block's
    room per running request more than the distinct positions those requests hold (counted by brute force:
    the set of (block, offset) places their positions live in). ``held_at_step``: one of ``PlannedSteps.steps``,
    the pool and the running requests' tables right after a step was planned."""
    size, running = held_at_step["block_size"], held_at_step["tables"]
    places, listed = set(), set()
    for table in running:
        assert len(table["blocks"]) == -(-table["n_tokens"] // size), "a table holds a block it does not need"
        listed.update(table["blocks"])
        places.update((table["blocks"][p // size], p % size) for p in range(table["n_tokens"]))
    held = held_at_step["n_blocks"] - held_at_step["n_free"]
    assert held == len(listed), f"{held} blocks held, the running requests' tables list {len(listed)}"
    assert held * size - len(places) <= len(running) * (size - 1), (
        f"{held} blocks of {size} hold {len(places)} positions of {len(running)} running requests: more than one "
        "block per request is unused"
    )


def watch_every_step(engine) -> PlannedSteps:
    """The KV memory held right after each step is planned (the step's forward pass holds that memory), written
    down where the engine runs: a wrapper written here would be an object of the grader's there."""
    return made_beside(engine, PlannedSteps, engine)


@pytest.mark.exercise("Engine.step")
def test_kv_memory_stays_within_one_block_per_running_request_at_every_step(impl, tiny_demo):
    """A stream of requests of many lengths arriving over time through a pool small enough to preempt; blocks
    of 4 and of 3."""
    rng = random.Random(1)
    jobs = [([rng.randrange(tiny_demo.cfg.d_vocab) for _ in range(rng.randint(1, 14))], rng.randint(1, 12))
            for _ in range(12)]
    preempted = []
    for size, n_blocks in ((4, 12), (3, 40)):
        engine = impl.engine.Engine(tiny_demo, n_blocks, size, max_running=6)
        planned = watch_every_step(engine)
        requests, pending = [], list(jobs)
        while pending or not engine.scheduler.done:
            if pending and engine.n_steps % 2 == 0:
                prompt, n_new = pending.pop(0)
                requests.append(engine.add_request(prompt, n_new, GREEDY))
            engine.step()
        steps = planned.steps  # as plain data
        assert len(steps) == engine.n_steps and all(len(r.output) == n for r, (_, n) in zip(requests, jobs))
        for held_at_step in steps:
            assert_kv_within_a_block_per_request(held_at_step)
        assert_pool_empty(engine)
        preempted.append(sum(r.n_preemptions for r in requests))
    assert preempted[0] > 0, "12 blocks of 4 were meant to be too few for the stream: the bound must hold under preemption"
    own_record_held(planned)  # written down where the engine runs: graded in another process, it convicts, never earns


@pytest.mark.exercise("Engine.step")
def test_a_step_that_can_do_nothing_raises_at_once_naming_the_request(impl, tiny_demo):
    """Three of the pool's four blocks held outside the engine leave one free block for a request that needs two,
    and nothing runs that could give blocks back: the step raises ``EngineStalled``, naming the request, the
    blocks it needs and the pool's, instead of stepping for ever. Once the blocks come back, the request runs.
    (``EngineStalled`` is a RuntimeError, which is what is asked for: graded in another process, the error comes
    back as a RuntimeError with its message.)"""
    engine = impl.engine.Engine(tiny_demo, n_blocks=4, block_size=4)
    held = [engine.pool.allocate() for _ in range(3)]
    request = engine.add_request([1] * 6, 2, GREEDY)
    with pytest.raises(RuntimeError,
                       match=rf"Request {request.request_id}, .* 6 positions, which need 2 blocks of 4\.\nThe pool has "
                             r"1 of its 4 blocks free\.\nNo running request will give blocks back"):
        engine.step()
    assert not engine.scheduler.running and list(engine.scheduler.waiting) == [request]
    for block in held:
        engine.pool.free(block)
    engine.run()
    assert len(request.output) == 2
    assert_pool_empty(engine)


def test_engine_rejects_what_it_cannot_serve(impl, tiny_demo):
    engine = impl.engine.Engine(tiny_demo, n_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="could never finish"):
        engine.add_request([1] * 10, 10)
    with pytest.raises(ValueError, match="vocabulary"):
        engine.add_request([tiny_demo.cfg.d_vocab], 2)
    with pytest.raises(ValueError, match="mirostat"):
        engine.add_request([1], 2, SamplerSettings(temperature=1.0, mirostat=2))
