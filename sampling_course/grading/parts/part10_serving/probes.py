"""Part 10's probes: the block pool, the block table and the scheduler's admit step on small, fixed cases.

Each probe returns plain values (block ids, counts, slots, which requests a step admits), and
records an error by its type, so that a mistake which raises is told apart from one which
returns a wrong value.
"""

from __future__ import annotations

from typing import Any

import torch

from sampling_course.grading.matching import plain
from sampling_course.grading.probing import Impl, demo_params, generator, loaded, probe, randn, small_config


def attempt(fn) -> Any:
    """``fn()``, or the name of the error it raises."""
    try:
        return fn()
    except (ValueError, RuntimeError, IndexError, TypeError) as error:
        return type(error).__name__


@probe("BlockPool")
def probe_block_pool(impl: Impl) -> Any:
    pool = impl.block_pool.BlockPool(3, 2)
    a, b, c = pool.allocate(), pool.allocate(), pool.allocate()
    pool.share(a)
    seen = [[a, b, c]]  # in the order handed out: first in, first out from a fresh pool
    # Free the shared block twice, then ask for a block: each result and the free count after it.
    for step in (lambda: pool.free(a), lambda: pool.free(a), lambda: pool.allocate() == a, lambda: pool.free(b),
                 lambda: pool.free(b)):
        seen += [attempt(step), pool.n_free]
    # Two blocks freed in turn: the one freed first is reused first.
    fresh = impl.block_pool.BlockPool(4, 2)
    held = [fresh.allocate() for _ in range(4)]
    fresh.free(held[2]), fresh.free(held[0])
    return seen + [attempt(lambda: [fresh.allocate(), fresh.allocate()])]


@probe("BlockTable")
def probe_block_table(impl: Impl) -> Any:
    bp = impl.block_pool
    pool, table = bp.BlockPool(8, 3), bp.BlockTable(3)
    counts = []
    for n in range(1, 8):
        counts.append(table.blocks_to_grow(n))
        table.grow(pool, n)
    # Released, the table's blocks go back last first: the end of the free list, as ids.
    order = bp.BlockPool(5, 2)
    released = bp.BlockTable(2)
    released.grow(order, 6)
    attempt(lambda: released.release(order))
    fragmented = bp.BlockTable(3)
    fragmented.blocks, fragmented.n_tokens = [6, 1, 4], 8
    return [counts, len(table.blocks), list(order.free_blocks), attempt(lambda: fragmented.slots(0, 8).tolist()),
            attempt(lambda: fragmented.slots(2, 5).tolist())]


@probe("PagedKVCache.update")
def probe_paged_update(impl: Impl) -> Any:
    bp = impl.block_pool
    cfg, g = small_config(), generator(101)
    pool, cache = bp.BlockPool(8, 2), bp.PagedKVCache(cfg, 8, 2)
    held, first, second = bp.BlockTable(2), bp.BlockTable(2), bp.BlockTable(2)
    held.grow(pool, 4)
    first.grow(pool, 3)
    held.release(pool)
    second.grow(pool, 5)  # blocks out of order, in front of the first request's
    seen = []

    def run(rows):
        step = cache.plan(rows)
        shape = (*step.tokens.shape, cfg.n_heads, cfg.d_head)
        for layer in range(cfg.n_layers):
            got = attempt(lambda: cache.update(layer, randn(g, *shape), randn(g, *shape)))
            seen.append(got if isinstance(got, str) else [plain(got[0]), plain(got[1])])

    # The first request's first 3 positions beside the second's 5 (rows of different widths, so padded) ...
    run([[bp.Segment([1] * 3, 0, first.slots(0, 3).tolist())], [bp.Segment([1] * 5, 0, second.slots(0, 5).tolist())]])
    # ... then one more position of the first, packed in one row with the second's sixth.
    first.grow(pool, 4)
    second.grow(pool, 6)
    run([[bp.Segment([1], 3, first.slots(0, 4).tolist()), bp.Segment([1], 5, second.slots(0, 6).tolist())]])
    return seen


@probe("Scheduler.schedule")
def probe_schedule(impl: Impl) -> Any:
    sch = impl.scheduler
    scheduler = sch.Scheduler(impl.block_pool.BlockPool(5, 4))
    requests = [sch.Request([1] * n, 2) for n in (6, 5, 9, 2)]
    for request in requests:
        scheduler.add(request)
    step = scheduler.schedule()
    seen = [[requests.index(r) for r in step.prefill], [requests.index(r) for r in scheduler.waiting],
            scheduler.pool.n_free]
    # A request back from a preemption (4 prompt tokens and 3 generated: 2 blocks) before a 1-block one, in 3 blocks.
    again = sch.Scheduler(impl.block_pool.BlockPool(3, 4))
    back, fresh = sch.Request([1] * 4, 6), sch.Request([2] * 4, 2)
    back.output = [3, 3, 3]
    for request in (back, fresh):
        again.add(request)
    step = attempt(again.schedule)
    admitted = step if isinstance(step, str) else [[back, fresh].index(r) for r in step.prefill]
    return seen + [admitted, [len(r.table.blocks) for r in (back, fresh)], again.pool.n_free]


@probe("Engine.step")
def probe_engine_step(impl: Impl) -> Any:
    cfg = small_config(n_ctx=24)
    model = loaded(impl.transformer.DemoTransformer(cfg), demo_params(cfg, generator(102)))
    # Blocks of 2, at most 4 positions a step: prompts are cut into chunks, and requests finish at different steps.
    engine = impl.engine.Engine(model, n_blocks=16, block_size=2, max_running=3, max_step_tokens=4)
    requests = [engine.add_request(prompt, new) for prompt, new in (([3, 1, 4, 1, 5], 3), ([2, 7], 2), ([1, 8, 2, 8, 1, 8, 2], 3))]
    errors = []
    for _ in range(30):  # a bounded run: a mistake may never finish
        if engine.scheduler.done:
            break
        error = attempt(engine.step)
        if isinstance(error, str):
            errors.append(error)
            break
    return [[list(r.output) for r in requests], [r.n_computed for r in requests], engine.n_steps,
            engine.n_prefill_tokens, engine.pool.n_free, errors]


@probe("block_hashes")
def probe_block_hashes(impl: Impl) -> Any:
    hashes = impl.prefix_cache.block_hashes
    base = hashes([1, 2, 3, 4, 5, 6, 7], 2)
    other_start, other_middle = hashes([9, 9, 3, 4, 5, 6], 2), hashes([1, 2, 3, 9, 5, 6], 2)
    # Equalities only: any hash function gives the same answers.
    return [len(base), [a == b for a, b in zip(base, other_start)], [a == b for a, b in zip(base, other_middle)],
            len(set(hashes([7, 7] * 4, 2))), hashes([5, 6], 2, parent=base[1]) == base[2:]]
