"""Part 6: the attention-sink cache, a few first tokens and a sliding window, past n_ctx."""

from __future__ import annotations

from typing import Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sampling_course.config import Config
from sampling_course.devices import check_same_device, pick_device

from .caches import check_cache_and_tokens, placed_buffer
from .kv_cache import CacheStep

PositionRule = Literal["cache", "absolute"]


class SinkCache:
    """The first ``num_sink_tokens`` tokens and the most recent ones, in ``window_length`` slots.

    Language models put a large share of their attention on the first tokens of a text
    whatever those tokens are ("attention sinks"); a plain sliding window evicts them and
    the model's outputs degrade. This cache never evicts them: slots ``0 .. num_sink_tokens
    - 1`` hold the sinks, and the other ``window_length - num_sink_tokens`` slots form a
    ring that holds the most recent tokens, each new token overwriting the oldest.
    Attention does not care in which slot a key sits (softmax is a sum over keys), so the
    ring never moves anything.

    GPT-2's positions are learned and absolute, and each cached key was computed at its own
    position; a key cannot be moved to another one (rotary models can re-rotate theirs).
    So the cache decides the position of each new token, by ``position_rule``:

    * ``"cache"``: the token's index in the window, counting from the oldest token the
      window holds (the sinks first), the token itself included: 0, 1, ..., then
      ``window_length - 1`` for every token once the window is full;
    * ``"absolute"``: its position in the text, capped at ``n_ctx - 1``.

    ``model(tokens, cache)`` takes ``tokens``, the whole text so far (it may be longer than
    n_ctx), and runs the tokens the cache has not seen, in one pass. Every token attends to
    the sinks, to the ``window_length - num_sink_tokens - 1`` tokens before it and to itself;
    until the window fills, that is everything, as with a dynamic cache. While the new tokens
    fit in the free slots they go there; once the window is full, a single new token
    overwrites the oldest recent one (``update``, yours). Several new tokens that do not fit
    (a long prompt) would overwrite keys that the first of them still needs: those attend to
    the window as it was followed by themselves, through a mask, and only then is the window
    brought up to date (``_update_past_the_window``, given).
    """

    def __init__(
        self,
        buffer: Float[Tensor, "n_layers 2 batch window_length n_heads d_head"],
        num_sink_tokens: int,
        position_rule: PositionRule,
        n_ctx: int,
    ):
        self.buffer = buffer
        self.num_sink_tokens = num_sink_tokens
        self.position_rule = position_rule
        self.n_ctx = n_ctx
        self.seen = 0  # tokens of the text run so far
        self.ring = 0  # the next recent slot to overwrite, counted from the first slot after the sinks
        self.new_pos = 0  # tokens of the step under way (prepare sets it, commit counts them as seen)
        # A step of several tokens past the free slots: for each slot the step writes, the new token whose keys
        # it keeps (the last one sent there), and the ring's next value (None for any other step).
        self.overflow: tuple[list[int], list[int], int] | None = None
        # new_empty without a device or dtype: the first forward pass puts the buffer on the model's.
        self.follows_device = self.follows_dtype = False

    @classmethod
    def new_empty(
        cls,
        cfg: Config,
        batch: int = 1,
        window_length: int = 256,
        num_sink_tokens: int = 4,
        position_rule: PositionRule = "cache",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> "SinkCache":
        """An empty sink cache of ``window_length`` slots, ``num_sink_tokens`` of them for the sinks.

        ``device`` and ``dtype`` left out: the model's (as with ``StaticKeyValueCache.new_empty``).
        """
        if not isinstance(cfg, Config):
            raise TypeError(f"SinkCache.new_empty(cfg, ...) takes a Config, got {type(cfg).__name__}")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
        if isinstance(window_length, bool) or not isinstance(window_length, int) or not 2 <= window_length <= cfg.n_ctx:
            raise ValueError(
                f"window_length must be an integer in [2, n_ctx={cfg.n_ctx}] (positions inside the window must "
                f"be positions the model has learned), got {window_length!r}"
            )
        if isinstance(num_sink_tokens, bool) or not isinstance(num_sink_tokens, int) or not 0 <= num_sink_tokens < window_length:
            raise ValueError(
                f"num_sink_tokens must be an integer in [0, window_length - 1 = {window_length - 1}] "
                f"(at least one slot must hold recent tokens), got {num_sink_tokens!r}"
            )
        if position_rule not in ("cache", "absolute"):
            raise ValueError(f"position_rule must be 'cache' or 'absolute', got {position_rule!r}")
        buffer = torch.empty(cfg.n_layers, 2, batch, window_length, cfg.n_heads, cfg.d_head,
                             device=pick_device(device), dtype=dtype or torch.float32)
        cache = cls(buffer, num_sink_tokens, position_rule, cfg.n_ctx)
        cache.follows_device, cache.follows_dtype = device is None, dtype is None
        return cache

    @property
    def device(self) -> torch.device:
        return self.buffer.device

    @property
    def window_length(self) -> int:
        return self.buffer.shape[3]

    @property
    def batch(self) -> int:
        return self.buffer.shape[2]

    @property
    def seq_len(self) -> int:
        """The positions the cache holds: never more than ``window_length``."""
        return min(self.seen, self.window_length)

    def __repr__(self) -> str:
        return (
            f"SinkCache(batch={self.batch}, seq_len={self.seq_len}, seen={self.seen}, window_length={self.window_length}, "
            f"num_sink_tokens={self.num_sink_tokens}, position_rule={self.position_rule!r})"
        )

    def positions(self, new_pos: int) -> Int[Tensor, "new_pos"]:
        """The position ids of the next ``new_pos`` tokens of the text (tokens ``seen``, ``seen + 1``, ...)."""
        device = self.buffer.device
        ### BEGIN SOLUTION
        # Hint: token t of the text is at index min(t, window_length - 1) of the window ("cache"), or at t ("absolute").
        t = torch.arange(self.seen, self.seen + new_pos, device=device)
        last = self.window_length - 1 if self.position_rule == "cache" else self.n_ctx - 1
        return t.clamp(max=last)
        ### END SOLUTION

    def update(
        self,
        layer: int,
        k: Float[Tensor, "batch new_pos n_heads d_head"],
        v: Float[Tensor, "batch new_pos n_heads d_head"],
    ) -> tuple[Float[Tensor, "batch key_pos n_heads d_head"], Float[Tensor, "batch key_pos n_heads d_head"]]:
        """Store ``layer``'s new keys and values; return those the new tokens attend to.

        While the window has free slots, the ``new_pos`` tokens go to the next free slots and
        the filled slots are returned. Once it is full, a single new token overwrites the
        oldest recent token (ring slot ``ring``, after the sinks) and every slot is returned.
        (Several tokens that do not fit in the free slots are given code's, below.) ``seen``
        and ``ring`` move in ``commit``, after the last layer.
        """
        if layer == 0 and self.seen == 0:
            self.buffer = placed_buffer(self, k)  # a new text: where the model computes
        if self.overflow is not None:
            return self._update_past_the_window(layer, k, v)
        ### BEGIN SOLUTION
        # Hint: free slots first; once full, the slot is num_sink_tokens + ring, so the sinks are never overwritten.
        held, new_pos = self.seq_len, k.shape[1]
        if held + new_pos <= self.window_length:
            start, end = held, held + new_pos
        else:
            start = self.num_sink_tokens + self.ring
            end = start + 1
            held = self.window_length
        self.buffer[layer, 0, :, start:end] = k
        self.buffer[layer, 1, :, start:end] = v
        key_pos = max(held, end)
        return self.buffer[layer, 0, :, :key_pos], self.buffer[layer, 1, :, :key_pos]
        ### END SOLUTION

    def _update_past_the_window(
        self,
        layer: int,
        k: Float[Tensor, "batch new_pos n_heads d_head"],
        v: Float[Tensor, "batch new_pos n_heads d_head"],
    ) -> tuple[Float[Tensor, "batch key_pos n_heads d_head"], Float[Tensor, "batch key_pos n_heads d_head"]]:
        """Several new tokens that do not fit in the free slots: they attend to the window as it was, then
        to themselves (``prepare``'s mask says which of those keys each may see); the window then keeps the
        keys it would hold had they come one at a time."""
        held = self.seq_len
        keys = torch.cat([self.buffer[layer, 0, :, :held], k], dim=1)  # copies: the writes below change the window
        values = torch.cat([self.buffer[layer, 1, :, :held], v], dim=1)
        slots, sources, _ = self.overflow
        slot_index = torch.tensor(slots, device=k.device)
        source_index = torch.tensor(sources, device=k.device)
        self.buffer[layer, 0].index_copy_(1, slot_index, k.index_select(1, source_index))
        self.buffer[layer, 1].index_copy_(1, slot_index, v.index_select(1, source_index))
        return keys, values

    def _key_tokens(self) -> list[int]:
        """For each filled slot, the index in the text of the token whose keys it holds."""
        recent = self.window_length - self.num_sink_tokens
        if self.seen <= self.window_length:
            return list(range(self.seen))
        oldest = self.seen - recent  # the ring slot ``ring`` holds the oldest recent token
        ring_tokens = [oldest + (j - self.ring) % recent for j in range(recent)]
        return list(range(self.num_sink_tokens)) + ring_tokens

    def prepare(self, tokens: Int[Tensor, "batch pos"], attention_mask: Tensor | None = None) -> CacheStep:
        """The tokens of ``tokens`` this cache has not seen, at ``positions``; the keys each may see when they
        do not fit in the free slots (otherwise the model's causal mask is all it takes)."""
        if attention_mask is not None:
            raise ValueError("a SinkCache takes unpadded batches only: call the model without attention_mask")
        new_pos = tokens.shape[1] - self.seen
        self.new_pos, self.overflow = new_pos, None
        positions = self.positions(new_pos)[None]
        window, sinks = self.window_length, self.num_sink_tokens
        recent = window - sinks
        if new_pos <= window - self.seq_len or new_pos == 1:
            return CacheStep(tokens[:, self.seen :], positions)
        # Token t sees the sinks and the recent - 1 tokens before it: the tokens t - recent + 1 .. t.
        key_tokens = torch.tensor(self._key_tokens() + list(range(self.seen, tokens.shape[1])), device=tokens.device)
        query_tokens = torch.arange(self.seen, tokens.shape[1], device=tokens.device)[:, None]
        visible = (key_tokens[None, :] < sinks) | (key_tokens[None, :] > query_tokens - recent)
        # Where each new token would go, one at a time: the free slots, then the ring.
        held, ring, last_source = self.seq_len, self.ring, {}
        for source in range(new_pos):
            if held < window:
                last_source[held], held = source, held + 1
            else:
                last_source[sinks + ring], ring = source, (ring + 1) % recent
        self.overflow = (list(last_source), list(last_source.values()), ring)
        return CacheStep(tokens[:, self.seen :], positions, mask=visible[None, None])

    def commit(self) -> "SinkCache":
        """Every layer has stored its keys: count the step's tokens as seen and move the ring on."""
        if self.overflow is not None:
            self.ring = self.overflow[2]
        elif self.seen + self.new_pos > self.window_length:  # one token into a full window
            self.ring = (self.ring + 1) % (self.window_length - self.num_sink_tokens)
        self.seen += self.new_pos
        self.new_pos, self.overflow = 0, None
        return self

    def check_compatible(self, cfg: Config, tokens: Int[Tensor, "batch pos"]) -> None:
        """Fail loudly, saying what is wrong, rather than silently return wrong logits."""
        if self.seen:
            check_same_device("the SinkCache", self.buffer.device, tokens.device)
        check_cache_and_tokens(self, cfg, tokens, run=self.seen)
