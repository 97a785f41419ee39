# GENERATED from solutions/block_pool.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: 5ebbfdf54a194e73b1655210118a2974bedbe6fe3de39cd5958465c5a7c285a7
"""Part 10: a KV cache in fixed-size blocks, addressed through block tables.

Part 4's cache gives every sequence one contiguous stretch of memory, as long as the longest
sequence of the batch. A server does not know in advance how long a request will run, and
reserving the most it might need wastes most of the memory. A paged cache (vLLM's
PagedAttention, Kwon et al. 2023) cuts the memory into blocks of ``block_size`` positions:

* a ``BlockPool`` hands out block ids and counts how many holders each block has, so two
  requests with the same prefix can hold the same block and it is reused only when the last
  holder lets it go;
* a ``BlockTable`` lists a request's blocks in order: position ``p`` of the request lives in
  block ``table[p // block_size]`` at offset ``p % block_size``, so a request grows one block
  at a time and never holds more than one block it does not fill;
* a ``PagedKVCache`` is one tensor of every block of every layer; the model writes a
  request's new keys and values through its table and reads them back, in order, the same way.
"""

from __future__ import annotations

import math
from collections import deque

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sampling_course.config import Config


def blocks_needed(n_tokens: int, block_size: int) -> int:
    """How many blocks hold ``n_tokens`` positions: every block full but the last."""
    # Ceiling division: 16 positions fill one block of 16 exactly; the 17th needs a second.
    return (n_tokens + block_size - 1) // block_size


class BlockPool:
    """``n_blocks`` blocks, each free or held by one or more holders (its reference count).

    ``allocate`` takes a free block (count 1), ``share`` adds a holder to a held block, and
    ``free`` drops one holder: the block goes back to the free list only when its count
    reaches 0, so a block that another request still shares is never handed out again while
    that request reads it. Freeing a block that is already free, or a block id the pool
    does not have, is an error: either means a request's table is wrong.
    """

    def __init__(self, n_blocks: int, block_size: int):
        for name, value in (("n_blocks", n_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.n_blocks = n_blocks
        self.block_size = block_size
        self.ref_counts = [0] * n_blocks
        # First in, first out: a freed block is reused last, the order vLLM's free list keeps.
        self.free_blocks: deque[int] = deque(range(n_blocks))

    @property
    def n_free(self) -> int:
        return len(self.free_blocks)

    def check_block(self, block: int) -> None:
        if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < self.n_blocks:
            raise ValueError(f"block ids of this pool are integers in [0, {self.n_blocks}), got {block!r}")

    def allocate(self) -> int:
        """A free block, now held once."""
        if not self.free_blocks:
            raise RuntimeError(
                f"the block pool is exhausted: all {self.n_blocks} blocks are held; free a request's "
                "blocks (or preempt it) before allocating more"
            )
        raise NotImplementedError()

    def share(self, block: int) -> int:
        """One more holder of a block that is already held (a shared prefix); returns the block."""
        self.check_block(block)
        if self.ref_counts[block] == 0:
            raise ValueError(f"block {block} is free: only a held block can be shared (allocate it first)")
        self.ref_counts[block] += 1
        return block

    def free(self, block: int) -> bool:
        """Drop one holder of ``block``; True when that was the last and the block is free again."""
        self.check_block(block)
        if self.ref_counts[block] == 0:
            raise ValueError(f"block {block} is already free: each holder frees a block once")
        raise NotImplementedError()


class BlockTable:
    """One request's blocks, in the order of its positions, and how many positions they hold."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.blocks: list[int] = []
        self.n_tokens = 0

    def blocks_to_grow(self, n_tokens: int) -> int:
        """How many more blocks the table needs to hold ``n_tokens`` positions in all."""
        # Hint: every block but the last is full, so n_tokens positions take ceil(n_tokens / block_size) blocks.
        raise NotImplementedError()

    def grow(self, pool: BlockPool, n_tokens: int) -> None:
        """Allocate the blocks that ``n_tokens`` positions need; nothing when they already fit."""
        if pool.block_size != self.block_size:
            raise ValueError(f"the pool's blocks hold {pool.block_size} positions, this table's {self.block_size}")
        if self.blocks_to_grow(n_tokens) > pool.n_free:
            raise RuntimeError(
                f"{n_tokens} positions need {self.blocks_to_grow(n_tokens)} more blocks, the pool has {pool.n_free} free"
            )
        for _ in range(self.blocks_to_grow(n_tokens)):
            self.blocks.append(pool.allocate())
        self.n_tokens = max(self.n_tokens, n_tokens)

    def release(self, pool: BlockPool) -> None:
        """Give every block back (one holder each), the last block first; the table is empty afterwards.

        The order matters with prefix caching: a freed block keeps its contents on the free list until
        ``allocate`` hands it out again, oldest freed first, and a cached prefix is found from its first
        block on. Freed last first, a request's first blocks are the last to be reused, so the prefix that
        other requests share is evicted from its end, as vLLM and nano-vllm free, not from its head.
        """
        # Hint: walk the table backwards (reversed), freeing each block once.
        raise NotImplementedError()
        self.blocks, self.n_tokens = [], 0

    def last_block_fill(self) -> int:
        """How many positions the last block holds (0 when the table is empty)."""
        if not self.blocks:
            return 0
        return self.n_tokens - (len(self.blocks) - 1) * self.block_size

    def slots(self, start: int, end: int) -> Int[Tensor, "n"]:
        """The flat slot (``block * block_size + offset``) of each position ``start .. end - 1``."""
        if not 0 <= start <= end <= len(self.blocks) * self.block_size:
            raise ValueError(
                f"positions [{start}, {end}) are outside this table's {len(self.blocks)} blocks of {self.block_size}"
            )
        # Hint: position p lives in the (p // block_size)-th block of the table, at offset p % block_size.
        raise NotImplementedError()


class PagedKVCache:
    """Every layer's keys and values in blocks: one tensor (n_layers, 2, n_heads, n_blocks, block_size, d_head).

    Index 0 of the second dimension holds keys, 1 values, as in part 4's ``KeyValueCache``.
    A request's positions are scattered over whichever blocks its table lists; ``write``
    puts new positions where the table says and ``gather`` reads a request's positions back
    in order, so attention sees exactly what a contiguous cache would hold.

    Heads come before blocks so that one block of one head (``block_size`` positions of
    ``d_head`` numbers) is one piece of memory: ``read_blocks`` copies whole blocks and hands
    attention keys already laid out as (n_heads, rows, positions, d_head), with no transpose.
    """

    def __init__(self, cfg: Config, n_blocks: int, block_size: int, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32):
        if not isinstance(cfg, Config):
            raise TypeError(f"PagedKVCache takes the model's Config, got {type(cfg).__name__}")
        self.block_size = block_size
        self.data: Float[Tensor, "n_layers 2 n_heads n_blocks block_size d_head"] = torch.zeros(
            cfg.n_layers, 2, cfg.n_heads, n_blocks, block_size, cfg.d_head, device=device, dtype=dtype
        )
        self.buffer: Tensor | None = None  # read_blocks(..., reuse=True) copies into it

    def flat(self, layer: int) -> Float[Tensor, "2 n_heads n_slots d_head"]:
        """A view of one layer with blocks and offsets merged into slots (no copy)."""
        n_layers, two, n_heads, n_blocks, block_size, d_head = self.data.shape
        return self.data[layer].view(two, n_heads, n_blocks * block_size, d_head)

    def write(self, layer: int, slots: Int[Tensor, "n"], keys: Float[Tensor, "n n_heads d_head"],
              values: Float[Tensor, "n n_heads d_head"]) -> None:
        """Store new positions' keys and values of ``layer`` at their slots (``BlockTable.slots``)."""
        kv = self.flat(layer)
        slots = slots.to(kv.device)
        kv[0].index_copy_(1, slots, keys.transpose(0, 1))
        kv[1].index_copy_(1, slots, values.transpose(0, 1))

    def gather(self, layer: int, table: BlockTable, n_tokens: int) -> tuple[
        Float[Tensor, "n_tokens n_heads d_head"], Float[Tensor, "n_tokens n_heads d_head"]
    ]:
        """A request's first ``n_tokens`` keys and values of ``layer``, in the order of its positions."""
        kv = self.flat(layer)
        # The table lists the blocks in position order, so the slots of positions 0 .. n_tokens - 1 are in order too.
        slots = table.slots(0, n_tokens).to(kv.device)
        picked = kv.index_select(2, slots).transpose(1, 2)
        return picked[0], picked[1]

    def read_blocks(self, layer: int, blocks: Int[Tensor, "n_rows n_row_blocks"], reuse: bool = False) -> Float[
        Tensor, "2 n_heads n_rows n_positions d_head"
    ]:
        """Keys (index 0) and values (1) of ``layer`` for rows of blocks, each row's blocks one after the other.

        Row ``r`` holds the positions of blocks ``blocks[r, 0], blocks[r, 1], ...`` in that order:
        ``n_positions = n_row_blocks * block_size``, including the unfilled end of a row's last
        block (the caller masks what a row does not hold). With ``reuse`` the copy goes into a
        buffer the cache keeps, which the next ``reuse`` call overwrites: a fresh tensor of
        megabytes costs the operating system a page fault per 4 KiB every time it is first written.
        """
        data = self.data[layer]
        n_rows, n_row_blocks = blocks.shape
        shape = (2, data.shape[1], n_rows * n_row_blocks, self.block_size, data.shape[-1])
        out = None
        if reuse:
            size = math.prod(shape)
            if self.buffer is None or self.buffer.numel() < size:
                self.buffer = data.new_empty(size)
            out = self.buffer[:size].view(shape)
        picked = torch.index_select(data, 2, blocks.flatten().to(data.device), out=out)
        return picked.view(2, data.shape[1], n_rows, n_row_blocks * self.block_size, data.shape[-1])
