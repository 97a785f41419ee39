# GENERATED from solutions/caches.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: 01d7d1b4a955326046abc9c07cf4177395035f041e7995927afaccdd9bdddd92
"""Part 6: caches for long and fast generation.

Part 4's ``KeyValueCache`` grows by concatenation: every step copies everything cached so
far into a new tensor, and it stops at n_ctx because each cached key was computed at its
own position. Production generators use two other designs, built here:

* ``StaticKeyValueCache``: one buffer sized for the whole generation, allocated once. A
  step writes its keys and values into the next free slots, in place, and attention reads
  the filled prefix only. ``crop(n)`` (speculative decoding) moves a counter back;
  ``reorder(rows)`` (beam search) gathers rows into the same buffer.
* ``SinkCache``: a fixed budget of ``window_length`` slots. The first ``num_sink_tokens``
  tokens (the "attention sinks") stay forever; the other slots hold the most recent
  tokens, so generation goes on past n_ctx with bounded memory.

Both caches run the model themselves: ``DemoTransformer.forward(tokens, kv_cache)`` hands
any cache that is not a ``KeyValueCache`` the whole pass, ``kv_cache.forward(model, tokens,
attention_mask)``. They share one forward pass, ``fast_forward``, the fast path:

    tokens -> embed + positions -> per layer: LayerNorm -> one fused QKV matmul
           -> cache.update writes K, V in place, returns the keys to attend
           -> scaled_dot_product_attention -> W_O -> MLP -> ... -> logits

A one-token decode step reads every weight of the model once and does little arithmetic
with each, so it is bound by memory bandwidth; the fast path's job is to add as little as
possible on top of that: no concatenation, no copies of the cache, few small operations.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Literal

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from sampling_course.config import Config
from sampling_course.devices import check_same_device, pick_device

# gelu_new: GPT-2's GELU (the tanh approximation), for fast_forward's MLP.
from .transformer import IGNORE, DemoTransformer, check_cache_fits, gelu_new, position_ids_from_mask

# ---------------------------------------------------------------------------------------
# The fast path, shared by both caches
# ---------------------------------------------------------------------------------------


@dataclass
class FusedAttention:
    """One layer's attention weights in the layout the fast path reads."""

    W_QKV: Float[Tensor, "d_model qkv"]  # qkv = 3 * n_heads * d_head: queries, keys, values side by side
    b_QKV: Float[Tensor, "qkv"]
    W_O: Float[Tensor, "heads_d_head d_model"]  # heads_d_head = n_heads * d_head
    b_O: Float[Tensor, "d_model"]


def fuse_qkv(attn) -> FusedAttention:
    """W_Q, W_K and W_V as one ``(d_model, 3 * n_heads * d_head)`` matrix, and W_O flattened.

    Columns are ordered (Q, K, V), then head, then d_head, so that the fused output
    ``x @ W_QKV + b_QKV`` of shape ``(..., 3 * n_heads * d_head)`` views as
    ``(..., 3, n_heads, d_head)``. One matmul reads the three weights in one sweep instead
    of three, and W_O as ``(n_heads * d_head, d_model)`` sums the heads inside its matmul.
    """
    # Hint: rearrange each (n_heads, d_model, d_head) weight to (d_model, n_heads * d_head), then cat the three.
    raise NotImplementedError()
    # Contiguous: a matmul streams a contiguous weight fastest (these copies are made once per model).
    return FusedAttention(W_QKV.detach().contiguous(), b_QKV.detach().contiguous(), W_O.detach().contiguous(), attn.b_O.detach())


@dataclass
class FastLayer:
    """One block's weights as the fast path reads them: plain tensors, with no nn.Module lookups per step."""

    ln1_w: Float[Tensor, "d_model"]
    ln1_b: Float[Tensor, "d_model"]
    attn: FusedAttention
    ln2_w: Float[Tensor, "d_model"]
    ln2_b: Float[Tensor, "d_model"]
    W_in: Float[Tensor, "d_model d_mlp"]
    b_in: Float[Tensor, "d_mlp"]
    W_out: Float[Tensor, "d_mlp d_model"]
    b_out: Float[Tensor, "d_model"]


def fast_layer(block) -> FastLayer:
    return FastLayer(
        block.ln1.w.detach(), block.ln1.b.detach(), fuse_qkv(block.attn), block.ln2.w.detach(), block.ln2.b.detach(),
        block.mlp.W_in.detach(), block.mlp.b_in.detach(), block.mlp.W_out.detach(), block.mlp.b_out.detach(),
    )


# The fast layers of each model, with the version of every block weight they were made from.
_FUSED: "weakref.WeakKeyDictionary[DemoTransformer, tuple[tuple, list[FastLayer]]]" = weakref.WeakKeyDictionary()


def fused_weights(model: DemoTransformer) -> list[FastLayer]:
    """``fast_layer`` of every block of ``model``, made once and reused while its weights stay the same.

    A weight changed in place (loading a state dict, training) bumps its ``_version``; one
    moved to another device is a new tensor. Either makes a fresh copy. The copies are
    detached: the fast path is for generation, and no gradient flows back through it.
    """
    key = tuple((p.data_ptr(), p._version) for p in model.blocks.parameters())
    cached = _FUSED.get(model)
    if cached is None or cached[0] != key:
        cached = (key, [fast_layer(block) for block in model.blocks])
        _FUSED[model] = cached
    return cached[1]


def fast_forward(
    model: DemoTransformer,
    new_tokens: Int[Tensor, "batch new_pos"],
    positions: Int[Tensor, "batch_or_1 new_pos"],
    cache,
    attn_mask: Tensor | None,
) -> Float[Tensor, "batch new_pos d_vocab"]:
    """The logits of ``new_tokens``, writing their keys and values into ``cache`` as it goes.

    ``positions`` are the position ids the new tokens are embedded at (the cache decides
    them). ``cache.update(layer, k, v)`` stores a layer's new keys and values and returns
    ``(keys, values)``, each ``(batch, key_pos, n_heads, d_head)``: every position the new
    queries may look at. ``attn_mask`` (broadcast to ``(batch, n_heads, new_pos, key_pos)``;
    True or 0.0 = may attend) narrows that further; None lets every query see every key.
    ``cache.fused`` holds a ``FastLayer`` per block: its LayerNorm and MLP weights and
    ``fuse_qkv`` of its attention.

    GPT-2's GELU is the tanh approximation, not the exact erf form: ``gelu_new`` (part 1's,
    imported above) or ``F.gelu(x, approximate="tanh")``; plain ``F.gelu(x)`` is the other
    function and moves the logits.
    """
    cfg = model.cfg
    batch, new_pos = new_tokens.shape
    rows, d_model, eps = batch * new_pos, (cfg.d_model,), cfg.layer_norm_eps
    # Hint: rows of (batch * new_pos, d_model); per layer: layer_norm, addmm to Q, K, V, cache.update, SDPA, W_O, MLP.
    raise NotImplementedError()


def causal_mask(new_pos: int, key_pos: int, device) -> Int[Tensor, "new_pos key_pos"]:
    """True where a query may attend: the last ``new_pos`` of ``key_pos`` positions, each up to itself."""
    query = torch.arange(key_pos - new_pos, key_pos, device=device)
    return torch.arange(key_pos, device=device)[None, :] <= query[:, None]


def placed_buffer(cache, model: DemoTransformer) -> Tensor:
    """The buffer of an empty ``cache``, on the model's device and in its dtype when ``new_empty`` was
    left to choose them (reallocated then, before anything is stored); checked against the model's otherwise."""
    weight = model.embed.W_E
    buffer = cache.buffer
    device = weight.device if cache.follows_device else buffer.device
    dtype = weight.dtype if cache.follows_dtype else buffer.dtype
    if buffer.device != device or buffer.dtype != dtype:
        buffer = torch.empty(buffer.shape, device=device, dtype=dtype)
    check_same_device(f"the {type(cache).__name__}", buffer.device, weight.device,
                      f"make it with {type(cache).__name__}.new_empty(cfg, ...) without a device (it follows the model) "
                      "or with the model's device")
    if buffer.dtype != weight.dtype:
        raise ValueError(f"the {type(cache).__name__} holds {buffer.dtype} but the model computes in {weight.dtype}: "
                         "make it without a dtype (it follows the model) or with the model's")
    return buffer


# ---------------------------------------------------------------------------------------
# The static cache: one buffer, allocated once
# ---------------------------------------------------------------------------------------


class StaticKeyValueCache:
    """Keys and values in one preallocated buffer ``(n_layers, 2, batch, max_len, n_heads, d_head)``.

    ``seq_len`` counts the positions filled so far; slots past it hold nothing meaningful
    and are never read. Accepted wherever a ``KeyValueCache`` is: ``model(tokens, cache)``
    returns ``(logits of the new positions, the same cache)``, filled further in place.
    """

    def __init__(self, buffer: Float[Tensor, "n_layers 2 batch max_len n_heads d_head"]):
        if not isinstance(buffer, Tensor) or buffer.ndim != 6 or buffer.shape[1] != 2:
            raise ValueError(
                "a StaticKeyValueCache's buffer has shape (n_layers, 2, batch, max_len, n_heads, d_head), "
                f"got {tuple(buffer.shape) if isinstance(buffer, Tensor) else type(buffer).__name__}"
            )
        self.buffer = buffer
        self.batch = buffer.shape[2]  # rows in use: reorder and an empty cache's first forward may change it
        self.seq_len = 0
        self.fused: list[FastLayer] | None = None
        # new_empty without a device or dtype: the first forward pass puts the buffer on the model's.
        self.follows_device = self.follows_dtype = False

    @classmethod
    def new_empty(
        cls,
        cfg: Config,
        batch: int = 1,
        max_len: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> "StaticKeyValueCache":
        """An empty cache with room for ``batch`` rows of ``max_len`` positions (n_ctx by default).

        ``device`` and ``dtype`` left out: the model's. The buffer is allocated on the
        course's device (``sampling_course.devices.pick_device``) in float32, and if the
        model it first runs with computes elsewhere, that first forward pass allocates it
        there instead, before anything is stored.
        """
        if not isinstance(cfg, Config):
            raise TypeError(f"StaticKeyValueCache.new_empty(cfg, batch, max_len) takes a Config, got {type(cfg).__name__}")
        max_len = cfg.n_ctx if max_len is None else max_len
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
        if isinstance(max_len, bool) or not isinstance(max_len, int) or not 1 <= max_len <= cfg.n_ctx:
            raise ValueError(f"max_len must be an integer in [1, n_ctx={cfg.n_ctx}], got {max_len!r}")
        # torch.empty, not zeros: every slot is written before it is read.
        buffer = torch.empty(cfg.n_layers, 2, batch, max_len, cfg.n_heads, cfg.d_head,
                             device=pick_device(device), dtype=dtype or torch.float32)
        cache = cls(buffer)
        cache.follows_device, cache.follows_dtype = device is None, dtype is None
        return cache

    @property
    def device(self) -> torch.device:
        return self.buffer.device

    @property
    def max_len(self) -> int:
        return self.buffer.shape[3]

    @property
    def k(self) -> Float[Tensor, "n_layers batch seq_len n_heads d_head"]:
        """The cached keys: a view of the filled part of the buffer."""
        return self.buffer[:, 0, : self.batch, : self.seq_len]

    @property
    def v(self) -> Float[Tensor, "n_layers batch seq_len n_heads d_head"]:
        return self.buffer[:, 1, : self.batch, : self.seq_len]

    def __repr__(self) -> str:
        return f"StaticKeyValueCache(batch={self.batch}, seq_len={self.seq_len}, max_len={self.max_len})"

    def update(
        self,
        layer: int,
        k: Float[Tensor, "batch new_pos n_heads d_head"],
        v: Float[Tensor, "batch new_pos n_heads d_head"],
    ) -> tuple[Float[Tensor, "batch key_pos n_heads d_head"], Float[Tensor, "batch key_pos n_heads d_head"]]:
        """Write ``layer``'s keys and values of the new positions into the next free slots.

        Only rows ``:self.batch`` are in use (the buffer may hold more: ``reorder`` and a
        smaller batch on an empty cache leave rows past ``batch`` unused), so write and
        return those rows only: ``k`` and ``v`` have ``self.batch`` rows.

        Returns the keys and values of every filled position, the new ones included, as
        views of the buffer. ``seq_len`` does not move: every layer writes the same slots,
        and ``forward`` advances it once, after the last layer.
        """
        # Hint: rows :self.batch, slots seq_len .. seq_len + new_pos - 1; return only the filled slots of those rows.
        raise NotImplementedError()

    def crop(self, n: int) -> None:
        """Forget every position from ``n`` on (speculative decoding's rejected proposals).

        Nothing moves: the counter goes back, and the next step overwrites the slots.
        """
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.seq_len:
            raise ValueError(f"n must be an integer between 0 and the cache's seq_len={self.seq_len}, got {n!r}")
        self.seq_len = n

    def reorder(self, rows: Int[Tensor, "new_batch"]) -> None:
        """Make row i of the cache hold what row ``rows[i]`` held (beam search), in the same buffer.

        ``rows`` may repeat rows and may be longer than the current batch (beam search
        turns one prompt into ``num_beams`` beams); the buffer grows the first time that
        happens and is reused from then on.
        """
        rows = torch.as_tensor(rows, device=self.buffer.device)
        if rows.ndim != 1 or rows.is_floating_point() or len(rows) == 0:
            raise ValueError(f"rows must be a non-empty 1-D tensor of row indices, got {rows!r:.80}")
        if not ((rows >= 0) & (rows < self.batch)).all():
            raise ValueError(f"rows must index the cache's {self.batch} rows (0 to {self.batch - 1}), got {rows.tolist()}")
        if len(rows) > self.buffer.shape[2]:  # more rows than ever before: grow once
            extra = len(rows) - self.buffer.shape[2]
            self.buffer = torch.cat([self.buffer, self.buffer.new_empty(self.buffer.shape[:2] + (extra,) + self.buffer.shape[3:])], dim=2)
        # Hint: the filled positions of the buffer are self.buffer[:, :, :, :self.seq_len]; rows are dimension 2.
        raise NotImplementedError()

    def check_compatible(self, cfg: Config, tokens: Int[Tensor, "batch pos"]) -> None:
        """Fail loudly, saying what is wrong, rather than silently return wrong logits."""
        if self.seq_len == 0 and tokens.shape[0] <= self.buffer.shape[2]:
            self.batch = tokens.shape[0]  # an empty cache takes any batch that fits its buffer
        check_cache_and_tokens(self, cfg, tokens, run=self.seq_len)
        if tokens.shape[1] > self.max_len:
            raise ValueError(
                f"the sequence has {tokens.shape[1]} positions but this StaticKeyValueCache was allocated for "
                f"max_len={self.max_len}; allocate it with a larger max_len (at most n_ctx={cfg.n_ctx})"
            )

    def forward(
        self, model: DemoTransformer, tokens: Int[Tensor, "batch pos"], attention_mask: Int[Tensor, "batch pos"] | None = None
    ) -> tuple[Float[Tensor, "batch new_pos d_vocab"], "StaticKeyValueCache"]:
        """``model(tokens, self)``: run the positions of ``tokens`` not cached yet, on the fast path.

        With ``attention_mask`` (part 5's left-padded batches), positions count real tokens
        only and pad keys are never attended, as in ``DemoTransformer.padded_forward``.
        """
        if self.seq_len == 0:
            self.buffer = placed_buffer(self, model)
        else:
            check_same_device("the StaticKeyValueCache", self.buffer.device, model.embed.W_E.device)
        self.check_compatible(model.cfg, tokens)
        past, new_pos = self.seq_len, tokens.shape[1] - self.seq_len
        if past == 0:  # a new generation: the weights in the fast path's layout
            self.fused = fused_weights(model)
        if attention_mask is None:
            positions = torch.arange(past, past + new_pos, device=tokens.device)[None]
            # One new token may see every cached key; several must not see each other's future.
            attn_mask = None if new_pos == 1 else causal_mask(new_pos, past + new_pos, tokens.device)
        else:
            positions = position_ids_from_mask(attention_mask)[:, past:]
            allowed = causal_mask(new_pos, past + new_pos, tokens.device) & (attention_mask[:, None, None, :] == 1)
            # Additive and finite (IGNORE, not -inf), like part 5's masked_forward: a pad query that may see
            # nothing gets a harmless uniform pattern in any attention kernel.
            attn_mask = torch.zeros(allowed.shape, dtype=self.buffer.dtype, device=tokens.device).masked_fill(~allowed, IGNORE)
        logits = fast_forward(model, tokens[:, past:], positions, self, attn_mask)
        self.seq_len += new_pos  # every layer has written its slots
        return logits, self


def check_cache_and_tokens(cache, cfg: Config, tokens: Int[Tensor, "batch pos"], run: int) -> None:
    """The cache was made for this model and this batch, and ``tokens`` holds positions it has not run yet."""
    name = type(cache).__name__
    check_cache_fits(name, cache.buffer.shape, cache.batch, cfg, tokens)
    if tokens.shape[1] <= run:
        raise ValueError(
            f"tokens has {tokens.shape[1]} positions but the {name} has already run {run}: pass the whole "
            "sequence so far, including at least one position not yet run"
        )


# ---------------------------------------------------------------------------------------
# The attention-sink cache: a few first tokens and a sliding window, past n_ctx
# ---------------------------------------------------------------------------------------

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

