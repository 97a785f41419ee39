# GENERATED from solutions/sink_cache.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: 9f2abcdf728f68b2ab8b8d625bcee0bf27eaf517cd32c1423ea732f83af9b101
"""Part 6: the attention-sink cache, a few first tokens and a sliding window, past n_ctx."""

from __future__ import annotations

from typing import Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sampling_course.config import Config
from sampling_course.devices import check_same_device, pick_device

from .caches import check_cache_and_tokens, placed_buffer
from .fast_path import FastLayer, causal_mask, fast_forward, fused_weights
from .transformer import DemoTransformer

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
    n_ctx), and runs the tokens the cache has not seen: in one pass while they fit in the
    free slots, then one at a time, each evicting the oldest recent token. Every token
    attends to the sinks, to the ``window_length - num_sink_tokens - 1`` tokens before it
    and to itself; until the window fills, that is everything, as with a dynamic cache.
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
        self.fused: list[FastLayer] | None = None
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
        # Hint: token t of the text is at index min(t, window_length - 1) of the window ("cache"), or at t ("absolute").
        raise NotImplementedError()

    def update(
        self,
        layer: int,
        k: Float[Tensor, "batch new_pos n_heads d_head"],
        v: Float[Tensor, "batch new_pos n_heads d_head"],
    ) -> tuple[Float[Tensor, "batch key_pos n_heads d_head"], Float[Tensor, "batch key_pos n_heads d_head"]]:
        """Store ``layer``'s new keys and values; return those the new tokens attend to.

        While the window has free slots, the ``new_pos`` tokens (``forward`` never sends
        more than fit) go to the next free slots and the filled slots are returned. Once it
        is full, ``forward`` sends one token at a time: it overwrites the oldest recent
        token (ring slot ``ring``, after the sinks) and every slot is returned. ``seen``
        and ``ring`` move in ``forward``, after the last layer.
        """
        # Hint: free slots first; once full, the slot is num_sink_tokens + ring, so the sinks are never overwritten.
        raise NotImplementedError()

    def forward(
        self, model: DemoTransformer, tokens: Int[Tensor, "batch pos"], attention_mask: Tensor | None = None
    ) -> tuple[Float[Tensor, "batch new_pos d_vocab"], "SinkCache"]:
        """``model(tokens, self)``: run the tokens of ``tokens`` this cache has not seen yet."""
        if attention_mask is not None:
            raise ValueError("a SinkCache takes unpadded batches only: call the model without attention_mask")
        if self.seen == 0:
            self.buffer = placed_buffer(self, model)
        else:
            check_same_device("the SinkCache", self.buffer.device, model.embed.W_E.device)
        check_cache_and_tokens(self, model.cfg, tokens, run=self.seen)
        if self.seen == 0:
            self.fused = fused_weights(model)
        window, recent = self.window_length, self.window_length - self.num_sink_tokens
        logits = []
        while self.seen < tokens.shape[1]:
            free = window - self.seq_len
            # While slots are free, as many tokens as fit in one pass; then one at a time, each evicting one.
            new_pos = min(tokens.shape[1] - self.seen, free) if free else 1
            positions = self.positions(new_pos)[None]
            attn_mask = None if new_pos == 1 else causal_mask(new_pos, self.seq_len + new_pos, tokens.device)
            logits.append(fast_forward(model, tokens[:, self.seen : self.seen + new_pos], positions, self, attn_mask))
            if not free:
                self.ring = (self.ring + 1) % recent
            self.seen += new_pos
        return torch.cat(logits, dim=1), self
