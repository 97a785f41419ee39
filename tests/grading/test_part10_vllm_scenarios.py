"""Part 10: scenarios of vLLM's own tests of its block pool and prefix cache (``tests/v1/core/test_prefix_caching.py``,
``test_prefill`` and ``test_evict``), translated onto the course's pool and tables, with their literal block ids.

vLLM numbers its blocks from 1 (its block 0 is a placeholder it never hands out); the course's pool numbers
them from 0, so every id below is vLLM's minus one. A request is admitted here the way the course's scheduler
admits it (``Scheduler.match_prefix``, then ``BlockTable.grow``): its cached blocks are looked up in order,
up to the first miss and never the block that holds its last token (the step needs that token's logits), and
once computed its full blocks are registered. Also here: the free list's order, and the readmission of a
preempted request, which the serving loop relies on.
"""

from __future__ import annotations

import pytest

BLOCK = 16
COMMON = [i for i in range(3) for _ in range(BLOCK)]  # three full blocks, as vLLM's common_token_ids


def admit(impl, pool, tokens):
    """A table for ``tokens``: the longest cached prefix looked up (each hit one more holder), the rest allocated,
    every full block registered. Returns the table and the number of blocks found in the cache."""
    pc, bp = impl.prefix_cache, impl.block_pool
    table = bp.BlockTable(pool.block_size)
    for block_hash in pc.block_hashes(tokens[:-1], pool.block_size):
        block = pool.lookup(block_hash)
        if block is None:
            break
        table.blocks.append(block)
    hits = len(table.blocks)
    table.n_tokens = hits * pool.block_size
    table.grow(pool, len(tokens))
    for block, block_hash in zip(table.blocks, pc.block_hashes(tokens, pool.block_size)):
        pool.register(block, block_hash)
    return table, hits


# ---------------------------------------------------------------------------------------
# The free list: first in, first out, and a table's blocks given back last first
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("BlockPool")
def test_a_fresh_pool_hands_out_blocks_in_order_and_reuses_the_block_freed_longest_ago(impl):
    """vLLM's free queue starts as every block in id order and takes from its front; a freed block joins the end."""
    pool = impl.block_pool.BlockPool(4, BLOCK)
    held = [pool.allocate() for _ in range(4)]
    assert held == [0, 1, 2, 3], f"a fresh pool handed out {held}: the free list is first in, first out, from block 0"
    pool.free(held[2])
    pool.free(held[0])
    again = [pool.allocate(), pool.allocate()]
    assert again == [2, 0], (
        f"blocks 2 then 0 were freed, and allocate handed out {again}: the block freed longest ago is reused first "
        "(popleft), so a block just given back, whose contents prefix caching can still find, is kept longest")


@pytest.mark.exercise("BlockTable")
def test_a_released_table_gives_its_blocks_back_last_first(impl):
    """So that a prefix's first block, which every later block's lookup goes through, is the last to be reused."""
    bp = impl.block_pool
    pool, table = bp.BlockPool(6, 2), bp.BlockTable(2)
    table.grow(pool, 6)
    assert table.blocks == [0, 1, 2]
    table.release(pool)
    assert list(pool.free_blocks) == [3, 4, 5, 2, 1, 0], (
        f"after releasing blocks [0, 1, 2] the free list is {list(pool.free_blocks)}: a table's blocks go back last "
        "first (reversed), so the first block of a cached prefix is the last one reused")
    assert table.blocks == [] and table.n_tokens == 0 and pool.n_free == 6


# ---------------------------------------------------------------------------------------
# vLLM's test_prefill and test_evict
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("block_hashes")
def test_vllm_prefill_hits_the_common_prefix_and_evicts_it_from_its_end(impl):
    pool = impl.prefix_cache.PrefixCachingPool(10, BLOCK)
    first, hits = admit(impl, pool, COMMON + [3] * 7)
    assert (first.blocks, hits) == ([0, 1, 2, 3], 0)
    # A hit on the common prefix while its blocks are still held.
    second, hits = admit(impl, pool, COMMON + [3] * 5)
    assert (second.blocks, hits) == ([0, 1, 2, 4], 3)
    assert [pool.ref_counts[b] for b in range(3)] == [2, 2, 2] and pool.n_free == 5
    first.release(pool)
    second.release(pool)
    # Never used, then the first request's own block, the second's, then the common prefix from its end.
    assert list(pool.free_blocks) == [5, 6, 7, 8, 9, 3, 4, 2, 1, 0]
    # A hit on the common prefix once its blocks are free again.
    third, hits = admit(impl, pool, COMMON + [3] * 6)
    assert (third.blocks, hits) == ([0, 1, 2, 5], 3) and pool.n_free == 6
    third.release(pool)
    # A miss that takes every block: the eviction order, the common prefix last and its first block very last.
    fourth, hits = admit(impl, pool, [99] * (BLOCK * 10))
    assert (fourth.blocks, hits) == ([6, 7, 8, 9, 3, 4, 5, 2, 1, 0], 0)


@pytest.mark.exercise("block_hashes")
def test_vllm_evict_an_unrelated_request_takes_the_blocks_freed_first_not_the_prefix_s_head(impl):
    """Two requests share a 48-token prefix and are freed; an unrelated request takes two blocks; a request that is
    the prefix itself then finds its first two blocks, as vLLM does (its third holds its last token, which runs)."""
    pool = impl.prefix_cache.PrefixCachingPool(5, BLOCK)
    first, _ = admit(impl, pool, COMMON + [3] * 7)
    second, hits = admit(impl, pool, COMMON + [3] * 5)
    assert hits == 3 and pool.n_free == 0
    first.release(pool)
    second.release(pool)
    unrelated, hits = admit(impl, pool, [99] * (BLOCK + 4))
    assert (unrelated.blocks, hits) == ([3, 4], 0)
    prefix, hits = admit(impl, pool, COMMON)
    assert hits == 2, (f"the prefix's request found {hits} of its blocks, vLLM finds 2: freeing a table first to last "
                       "put the prefix's first block at the front of the free list, and the unrelated request took it")
    assert prefix.blocks[:2] == [0, 1]


# ---------------------------------------------------------------------------------------
# A preempted request comes back with every token it has
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("Scheduler.schedule")
def test_a_request_back_from_preemption_is_admitted_with_room_for_all_its_tokens(impl):
    """Preempted, a request keeps the tokens it generated and prefills them with its prompt when admitted again:
    it is admitted only when blocks for all of them are free, and its table is grown to all of them."""
    sch = impl.scheduler
    pool = impl.block_pool.BlockPool(3, 4)
    scheduler = sch.Scheduler(pool)
    back, fresh = sch.Request([1] * 4, 6), sch.Request([2] * 4, 2)
    back.output = [3, 3, 3]  # what it generated before it was preempted: 7 positions, 2 blocks
    for request in (back, fresh):
        scheduler.add(request)
    step = scheduler.schedule()
    assert step.prefill == [back, fresh], "both fit: 2 blocks for the first request's 7 tokens, 1 for the second's 4"
    assert (len(back.table.blocks), back.table.n_tokens) == (2, 7), (
        f"the request back from a preemption got {len(back.table.blocks)} blocks for {back.table.n_tokens} positions: "
        "it is admitted with all its tokens, prompt and generated (len(request.tokens)), not its prompt alone")
    assert pool.n_free == 0
