"""Part 10's probes: the block pool, the block table and the scheduler's admit step on small, fixed cases.

Each probe returns plain values (block ids, counts, slots, which requests a step admits), and
records an error by its type, so that a mistake which raises is told apart from one which
returns a wrong value.
"""

from __future__ import annotations

from typing import Any

from sampling_course.grading.probing import Impl, probe


def attempt(fn) -> Any:
    """``fn()``, or the name of the error it raises."""
    try:
        return fn()
    except (ValueError, RuntimeError, IndexError) as error:
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


@probe("block_hashes")
def probe_block_hashes(impl: Impl) -> Any:
    hashes = impl.prefix_cache.block_hashes
    base = hashes([1, 2, 3, 4, 5, 6, 7], 2)
    other_start, other_middle = hashes([9, 9, 3, 4, 5, 6], 2), hashes([1, 2, 3, 9, 5, 6], 2)
    # Equalities only: any hash function gives the same answers.
    return [len(base), [a == b for a, b in zip(base, other_start)], [a == b for a, b in zip(base, other_middle)],
            len(set(hashes([7, 7] * 4, 2))), hashes([5, 6], 2, parent=base[1]) == base[2:]]
