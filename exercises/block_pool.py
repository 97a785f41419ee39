# GENERATED from solutions/block_pool.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: a5e7fa7d29ee7d64271ddd39ebbdd75fe332ddb7c97c08d07ad9e1eaf067a6f5
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
* a ``PagedKVCache`` is one tensor of every block of every layer, and a cache of the course's
  protocol (``kv_cache.py``): the model's one forward pass runs through it as through part 4's
  cache. Its ``update`` writes each request's new keys and values into the slots its table gives
  them and reads back, for every request of the pass, all its keys and values through its table.

A forward pass through the paged cache is laid out as part 5 lays out a padded batch
(``paged_step``): each row of the model's tokens is one or more requests' new tokens, and each
row's keys are those requests' positions, read through their tables; rows are left-padded to the
longest. The step's mask lets a query see only its own request's keys, up to its own position.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sampling_course.config import Config

from .kv_cache import CacheStep


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


@dataclass
class Segment:
    """One request's share of a forward pass: its new ``tokens``, at positions ``start``, ``start + 1``, ...,
    and ``slots``, the slot of each of its positions ``0 .. start + len(tokens) - 1`` (``BlockTable.slots``):
    where the new ones are written and where all of them are read from. ``slots`` may be a list of ints or
    a 1-D integer tensor (the engine keeps each table's slots as a tensor and hands out views of it)."""

    tokens: list[int]
    start: int
    slots: list[int] | Int[Tensor, "n_positions"]


def slot_list(slots: list[int] | Tensor) -> list[int]:
    return slots.tolist() if isinstance(slots, Tensor) else list(slots)


@dataclass
class PagedStep:
    """The layout of one forward pass through a ``PagedKVCache`` (``paged_step``).

    ``tokens`` and ``positions`` are what the model embeds; ``valid`` marks the real queries (the others
    pad a row); ``write_slots`` is the slot of each real query, in row-major order (the order of
    ``keys[valid]``); ``read_slots`` the slot of each key a row reads; ``mask`` is True where a query may
    see a key: a key of its own request, at its position or before. ``last`` indexes each segment's last
    query among the ``rows * new_pos`` queries (row-major), where its next token's logits are.
    """

    tokens: Int[Tensor, "rows new_pos"]
    positions: Int[Tensor, "rows new_pos"]
    valid: Bool[Tensor, "rows new_pos"]
    write_slots: Int[Tensor, "n_valid"]
    read_slots: Int[Tensor, "rows key_pos"]
    mask: Bool[Tensor, "rows 1 new_pos key_pos"]
    last: Int[Tensor, "n_segments"]


def paged_step(rows: list[list[Segment]], device: torch.device | str | None = None) -> PagedStep:
    """Row ``r`` of the pass holds the new tokens of ``rows[r]``'s segments one after the other, and reads the keys of
    those segments' positions one after the other; every row is left-padded to the longest (queries and keys alike).

    Left padding keeps the model's own causal mask right: it lets query ``i`` see key ``j`` when ``j <= i + key_pos -
    new_pos``, and with both padded on the left a request's query at position ``p`` may see its keys up to ``p``
    (with more than one segment a row, at least that far); the step's mask then narrows what each query sees to
    its own request's keys up to its own position, and hides the padding.
    """
    if not rows or not all(rows):
        raise ValueError("a paged step needs at least one row, each with at least one segment")
    if all(len(row) == 1 for row in rows):
        return one_segment_a_row([row[0] for row in rows], device)
    width = max(sum(len(s.tokens) for s in row) for row in rows)
    n_keys = max(sum(len(s.slots) for s in row) for row in rows)
    # Each row's queries and keys as pieces, laid end to end over all rows: its padding (owner -1 for queries,
    # -2 for keys, so that no padding ever matches), then each segment's (owner: the segment's number).
    tokens, write_slots, read_slots = [], [], []
    query_pieces, key_pieces, first_position = [], [], []  # (owner, length); the position each query piece starts at
    segment = 0
    for row in rows:
        pad = width - sum(len(s.tokens) for s in row)
        key_pad = n_keys - sum(len(s.slots) for s in row)
        tokens += [0] * pad
        read_slots += [0] * key_pad  # any slot: the mask hides it
        query_pieces.append((-1, pad))
        key_pieces.append((-2, key_pad))
        first_position.append(0)
        for s in row:
            end = s.start + len(s.tokens)
            if not s.tokens or len(s.slots) != end:
                raise ValueError(f"a segment runs positions {s.start}..{end - 1} and needs the slots of positions "
                                 f"0..{end - 1}, got {len(s.slots)} slots for {len(s.tokens)} new tokens")
            slots = slot_list(s.slots)
            tokens += s.tokens
            write_slots += slots[s.start:]
            read_slots += slots
            query_pieces.append((segment, len(s.tokens)))
            key_pieces.append((segment, end))
            first_position.append(s.start)
            segment += 1

    def spread(pieces, starts):
        """Per query (or key): its owner, and its position (the piece's first position plus its index in it)."""
        owner, length = torch.tensor(pieces).T
        begins = torch.cumsum(length, 0) - length
        offset = torch.arange(int(length.sum())) - torch.repeat_interleave(begins, length)
        return torch.repeat_interleave(owner, length), torch.repeat_interleave(torch.tensor(starts), length) + offset

    query_of, positions = spread(query_pieces, first_position)
    key_of, key_positions = spread(key_pieces, [0] * len(key_pieces))
    query_of, positions = query_of.view(len(rows), width), positions.view(len(rows), width)
    key_of, key_positions = key_of.view(len(rows), n_keys), key_positions.view(len(rows), n_keys)
    positions = positions.masked_fill(query_of < 0, 0)
    mask = (query_of[:, :, None] == key_of[:, None, :]) & (key_positions[:, None, :] <= positions[:, :, None])
    last = torch.nonzero(query_of.flatten()[1:] != query_of.flatten()[:-1])[:, 0]  # where a piece ends ...
    last = torch.cat([last, torch.tensor([query_of.numel() - 1])])
    last = last[query_of.flatten()[last] >= 0]  # ... and it is a segment's, not padding's
    return PagedStep(torch.tensor(tokens, device=device).view(len(rows), width), positions.to(device),
                     (query_of >= 0).to(device), torch.tensor(write_slots, dtype=torch.long, device=device),
                     torch.tensor(read_slots, dtype=torch.long, device=device).view(len(rows), n_keys),
                     mask[:, None].to(device), last.to(device))


def one_segment_a_row(segments: list[Segment], device: torch.device | str | None = None) -> PagedStep:
    """``paged_step`` for rows of one segment each (a step's decodes: one new token a row), the same layout
    computed per row at once: row ``r``'s query ``i`` sits at position ``start + i - pad``, its key ``j`` at
    ``j - key_pad``, and a query sees the row's real keys up to its own position.

    Built from the segments' slot tensors (one ``cat``) rather than from lists of Python ints: turning a
    decode step's few thousand slots into a tensor one int at a time costs about 0.2 ms on a CPU."""
    slots = [torch.as_tensor(s.slots, dtype=torch.long) for s in segments]
    n_new_list = [len(s.tokens) for s in segments]
    n_held_list = [row.shape[0] for row in slots]  # (len() of a tensor is a Python call: several times slower)
    for s, n, held in zip(segments, n_new_list, n_held_list):
        if not n or held != s.start + n:
            raise ValueError(f"a segment runs positions {s.start}..{s.start + n - 1} and needs the slots of "
                             f"positions 0..{s.start + n - 1}, got {held} slots")
    width, n_keys = max(n_new_list), max(n_held_list)
    tokens = []
    for s, n in zip(segments, n_new_list):
        tokens += [0] * (width - n) + s.tokens
    write_slots = torch.cat([row[s.start:] for row, s in zip(slots, segments)])
    pad = torch.zeros(n_keys, dtype=torch.long)  # padding reads any slot (0): the mask hides it
    read_slots = torch.cat([piece for row, n in zip(slots, n_held_list) for piece in (pad[: n_keys - n], row)])
    n_new, n_held = torch.tensor(n_new_list), torch.tensor(n_held_list)
    query = torch.arange(width)[None] - (width - n_new)[:, None]  # index among the row's new tokens (< 0: padding)
    valid = query >= 0
    positions = torch.where(valid, query + (n_held - n_new)[:, None], 0)
    key_positions = torch.arange(n_keys)[None] - (n_keys - n_held)[:, None]  # < 0: padding
    mask = (key_positions[:, None, :] >= 0) & (key_positions[:, None, :] <= positions[:, :, None]) & valid[:, :, None]
    last = torch.arange(len(segments)) * width + width - 1
    shape = (len(segments), width)
    return PagedStep(torch.tensor(tokens, device=device).view(shape), positions.to(device), valid.to(device),
                     write_slots.to(device), read_slots.view(len(segments), n_keys).to(device),
                     mask[:, None].to(device), last.to(device))


class PagedKVCache:
    """Every layer's keys and values in slots: one tensor (n_layers, 2, n_blocks * block_size, n_heads, d_head).

    Index 0 of the second dimension holds keys, 1 values, as in part 4's ``KeyValueCache``; slot
    ``block * block_size + offset`` is position ``offset`` of block ``block``. A request's positions
    are scattered over whichever blocks its table lists.

    A cache of the protocol (``kv_cache.py``), for the pass ``plan`` lays out: ``prepare`` gives the
    model the step's tokens, positions and mask, ``update`` (in every layer's attention) writes the
    new keys and values and returns every key and value the step's rows read, ``commit`` ends the pass.
    """

    def __init__(self, cfg: Config, n_blocks: int, block_size: int, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32):
        if not isinstance(cfg, Config):
            raise TypeError(f"PagedKVCache takes the model's Config, got {type(cfg).__name__}")
        self.cfg, self.block_size = cfg, block_size
        # Slot by slot, every head of a slot side by side: reading a slot is one contiguous row of n_heads * d_head
        # numbers, so update's gather copies one row per key rather than one short row per key and head (about
        # half the time at a decode step's sizes on a CPU; the fast path's attention kernel reads either layout).
        self.data: Float[Tensor, "n_layers 2 n_slots n_heads d_head"] = torch.zeros(
            cfg.n_layers, 2, n_blocks * block_size, cfg.n_heads, cfg.d_head, device=device, dtype=dtype
        )
        self.step: PagedStep | None = None
        self.read_buffer = torch.empty(0, device=device, dtype=dtype)

    def flat(self, layer: int) -> Float[Tensor, "2 n_slots n_heads d_head"]:
        """One layer's keys (index 0) and values (1), slot by slot (a view, no copy)."""
        return self.data[layer]

    def reading(self, n_slots: int) -> tuple[
        Float[Tensor, "n_slots width"] | None, Float[Tensor, "n_slots width"] | None
    ]:
        """Where ``update`` may read ``n_slots`` slots' keys and values into (``out=`` of ``index_select``): two
        ``(n_slots, n_heads * d_head)`` views of one buffer the cache keeps, so that every layer of every step
        writes over the same memory. (Reading into a fresh pair of tensors at every layer made part 10's server
        about 7% slower in CPU time on the serving bench, ``bench-serving --all-at-once``, on a CPU.) What ``update``
        returns then holds until the next ``update``; attention reads it at once.

        (None, None) where autograd records the step (``index_select`` with ``out=`` refuses it): fresh tensors then.
        """
        if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
            return None, None
        width = self.cfg.n_heads * self.cfg.d_head
        # An inference tensor (made under torch.inference_mode) cannot be written outside it: then a new buffer.
        if self.read_buffer.numel() < 2 * n_slots * width or (self.read_buffer.is_inference()
                                                             and not torch.is_inference_mode_enabled()):
            # At least twice the old size: decode steps read one more key a row each step, and would regrow it often.
            self.read_buffer = torch.empty(max(2 * n_slots * width, 2 * self.read_buffer.numel()),
                                           device=self.data.device, dtype=self.data.dtype)
        both = self.read_buffer[: 2 * n_slots * width].view(2, n_slots, width)
        return both[0], both[1]

    def plan(self, rows: list[list[Segment]]) -> PagedStep:
        """Lay out the next forward pass (``paged_step``); its ``tokens`` are what to give the model."""
        self.step = paged_step(rows, self.data.device)
        return self.step

    def check_compatible(self, cfg: Config, tokens: Int[Tensor, "rows new_pos"]) -> None:
        if (cfg.n_layers, cfg.n_heads, cfg.d_head) != (self.cfg.n_layers, self.cfg.n_heads, self.cfg.d_head):
            raise ValueError("this paged cache was made for another model's layers, heads or head size")
        if self.step is None or tuple(tokens.shape) != tuple(self.step.tokens.shape):
            raise ValueError("run the model on the tokens of the cache's plan (PagedKVCache.plan(...).tokens)")

    def prepare(self, tokens: Int[Tensor, "rows new_pos"], attention_mask: Tensor | None = None) -> CacheStep:
        """Every token of the plan is new; its positions and mask are the plan's."""
        if attention_mask is not None:
            raise ValueError("a paged cache pads its rows itself: run it without an attention_mask")
        step = self.step
        return CacheStep(tokens, step.positions, step.mask)

    def update(self, layer: int, keys: Float[Tensor, "rows new_pos n_heads d_head"],
               values: Float[Tensor, "rows new_pos n_heads d_head"]) -> tuple[
        Float[Tensor, "rows key_pos n_heads d_head"], Float[Tensor, "rows key_pos n_heads d_head"]
    ]:
        """Write the real queries' new keys and values of ``layer`` at their slots (``step.write_slots``), then
        read every key and value each row attends to, through its requests' tables (``step.read_slots``)."""
        step = self.step
        # Hint: write first (a prefill reads its own new keys); keys[step.valid] lines up with step.write_slots.
        raise NotImplementedError()

    def commit(self) -> "PagedKVCache":
        """The pass is over: the new keys and values are in their slots."""
        return self

    def gather(self, layer: int, table: BlockTable, n_tokens: int) -> tuple[
        Float[Tensor, "n_tokens n_heads d_head"], Float[Tensor, "n_tokens n_heads d_head"]
    ]:
        """A request's first ``n_tokens`` keys and values of ``layer``, in the order of its positions."""
        slots = table.slots(0, n_tokens).to(self.data.device)
        kv = self.flat(layer)
        return kv[0][slots], kv[1][slots]
