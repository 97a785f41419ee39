"""Part 4: the KV cache.

Generation runs the model once per new token, and without a cache each run recomputes the
keys and values of every earlier position, which never change: a causal model's position i
depends on positions 0..i only. The cache keeps them. ``KeyValueCache`` holds every layer's
keys and values for the positions run so far; ``DemoTransformer.forward(tokens, kv_cache)``
(solutions/transformer.py) runs only the new positions, at their place in the sequence, and
returns the cache extended with them.

The model meets every cache of the course the same way, through three calls (the cache
protocol, docs/design.md): ``prepare`` once before the first layer (which tokens are new, at
which positions, and which keys each may see), ``update`` in every layer's attention (store
the new keys and values, return every key and value to attend to), ``commit`` once after the
last layer. ``KeyValueCache`` is a tensor, and a tensor does not change: the model runs it
through a ``GrowingCache``, which concatenates each layer's new keys and values to the cached
ones and whose ``commit`` gives the extended ``KeyValueCache``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sampling_course.config import Config
from sampling_course.devices import check_same_device


class KeyValueCache(torch.Tensor):
    """The keys and values of every layer for the positions generated so far.

    One tensor of shape (n_layers, 2, batch, seq_len, n_heads, d_head): index 0 of the
    second dimension holds keys, index 1 values. Generation feeds the model only the
    newest token and reads everything earlier from here, so each step costs one
    position instead of the whole sequence.

    Torch operations on a cache give plain tensors (so a cache never leaks into the
    activations computed from it); indexing that keeps all six dimensions, such as
    ``cache[:, :, beam_indices]`` for beam search, gives a KeyValueCache again.
    """

    # Like nn.Parameter: results of torch functions are plain tensors, not caches.
    __torch_function__ = torch._C._disabled_torch_function_impl

    def __new__(cls, data: Float[Tensor, "n_layers 2 batch seq_len n_heads d_head"]) -> "KeyValueCache":
        if data.ndim != 6 or data.shape[1] != 2:
            raise ValueError(
                "a KeyValueCache has shape (n_layers, 2, batch, seq_len, n_heads, d_head), "
                f"got {tuple(data.shape)}"
            )
        return torch.Tensor._make_subclass(cls, data)

    @classmethod
    def new_empty(
        cls, cfg: Config, batch: int = 1, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> "KeyValueCache":
        """An empty cache (seq_len 0) for a model with config ``cfg``.

        An empty cache holds nothing, so where it was made does not matter: at its first
        forward pass it moves to the model's device and dtype (``device`` and ``dtype`` may
        be left out).
        """
        if not isinstance(cfg, Config):
            raise TypeError(f"KeyValueCache.new_empty(cfg, batch) takes a Config, got {type(cfg).__name__}")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        ### BEGIN SOLUTION
        return cls(torch.empty(cfg.n_layers, 2, batch, 0, cfg.n_heads, cfg.d_head, device=device, dtype=dtype))
        ### END SOLUTION

    @property
    def k(self) -> Float[Tensor, "n_layers batch seq_len n_heads d_head"]:
        ### BEGIN SOLUTION
        return self.as_subclass(torch.Tensor)[:, 0]
        ### END SOLUTION

    @property
    def v(self) -> Float[Tensor, "n_layers batch seq_len n_heads d_head"]:
        ### BEGIN SOLUTION
        return self.as_subclass(torch.Tensor)[:, 1]
        ### END SOLUTION

    @property
    def batch(self) -> int:
        ### BEGIN SOLUTION
        return self.shape[2]
        ### END SOLUTION

    @property
    def seq_len(self) -> int:
        ### BEGIN SOLUTION
        return self.shape[3]
        ### END SOLUTION

    def __getitem__(self, index) -> Tensor:
        out = super().__getitem__(index)
        return KeyValueCache(out) if out.ndim == 6 and out.shape[1] == 2 else out

    def __deepcopy__(self, memo) -> "KeyValueCache":
        return KeyValueCache(self.as_subclass(torch.Tensor).clone())

    def __repr__(self) -> str:
        return f"KeyValueCache(batch={self.batch}, seq_len={self.seq_len}, shape={tuple(self.shape)})"

    def on_device_of(self, weight: Tensor) -> "KeyValueCache":
        """This cache where ``weight`` (a weight of the model) lives, in its dtype.

        An empty cache is moved, which copies nothing. A cache that holds positions stays
        where it is and must already be on the model's device: moving it behind the
        caller's back would copy every key and value at every step.
        """
        if self.shape[3] == 0 and (self.device != weight.device or self.dtype != weight.dtype):
            return KeyValueCache(self.as_subclass(torch.Tensor).to(device=weight.device, dtype=weight.dtype))
        check_same_device("the KeyValueCache", self.device, weight.device,
                          "make it with KeyValueCache.new_empty(cfg) (it follows the model) or move it with .to(...)")
        return self

    def check_compatible(self, cfg: Config, tokens: Int[Tensor, "batch pos"]) -> None:
        """Fail loudly, saying what is wrong, rather than silently return wrong logits."""
        check_cache_fits("KeyValueCache", self.shape, self.batch, cfg, tokens)
        if tokens.shape[1] <= self.seq_len:
            raise ValueError(
                f"tokens has {tokens.shape[1]} positions but the KeyValueCache already holds {self.seq_len}: "
                "pass the whole sequence so far, including at least one position not yet cached"
            )
        if tokens.shape[1] > cfg.n_ctx:
            raise ValueError(
                f"the sequence has {tokens.shape[1]} positions, past the model's n_ctx={cfg.n_ctx}, and "
                "a KeyValueCache cannot slide: the cached keys were computed at their old positions. "
                "Start a fresh cache from the last n_ctx tokens, or sample without a cache (which "
                "keeps the last n_ctx tokens at every step)"
            )


def check_cache_fits(name: str, shape: tuple[int, ...], batch: int, cfg: Config, tokens: Int[Tensor, "batch pos"]) -> None:
    """A cache of ``shape`` (n_layers, 2, batch, pos, n_heads, d_head), holding ``batch`` rows,
    was made for this model and has one row per sequence of ``tokens``; ``name`` is its class."""
    expected = (cfg.n_layers, 2, cfg.n_heads, cfg.d_head)
    actual = (shape[0], shape[1], shape[4], shape[5])
    if actual != expected:
        raise ValueError(
            f"this {name} was built for another model: (n_layers, 2, n_heads, d_head) is {actual}, "
            f"the model needs {expected}; create it with {name}.new_empty(model.cfg)"
        )
    if tokens.shape[0] != batch:
        raise ValueError(
            f"tokens has batch size {tokens.shape[0]} but the {name} holds {batch} sequences; "
            f"use one cache row per sequence ({name}.new_empty(cfg, batch=...))"
        )


# ---------------------------------------------------------------------------------------
# The cache protocol, and part 4's cache as one of its caches
# ---------------------------------------------------------------------------------------


class CacheStep(NamedTuple):
    """What a cache's ``prepare`` tells the model before the first layer of a forward pass.

    ``new_tokens``: the tokens to run now. ``positions``: the position of each new token in
    its sequence (the row dimension may be 1, shared by every row). ``mask``: True where a
    new query may see a key, over the keys ``update`` will return (``key_pos`` of them);
    None when the model's causal mask alone decides. ``key_positions``: the position of each
    key ``update`` will return, for a model that needs it (a rotary model re-rotating keys);
    None when the model does not ask.
    """

    new_tokens: Int[Tensor, "batch new_pos"]
    positions: Int[Tensor, "batch_or_1 new_pos"]
    mask: Bool[Tensor, "batch_or_1 1 new_pos key_pos"] | None = None
    key_positions: Int[Tensor, "batch_or_1 key_pos"] | None = None


class LayerCache:
    """One layer's side of a cache, what ``Attention.forward`` receives as ``past_kv``.

    ``update(k, v)`` hands the layer's new keys and values to the cache and returns every
    key and value to attend to; ``mask`` is the step's mask (``CacheStep.mask``); ``kv`` is
    what the attention returns beside its output: the keys and values ``update`` returned.
    """

    def __init__(self, cache: Any, layer: int, mask: Bool[Tensor, "batch_or_1 1 new_pos key_pos"] | None = None):
        self.cache, self.layer, self.mask = cache, layer, mask
        self.kv: Any = None

    def update(
        self, k: Float[Tensor, "batch new_pos n_heads d_head"], v: Float[Tensor, "batch new_pos n_heads d_head"]
    ) -> tuple[Float[Tensor, "batch key_pos n_heads d_head"], Float[Tensor, "batch key_pos n_heads d_head"]]:
        keys, values = self.cache.update(self.layer, k, v)
        self.kv = (keys, values)
        return keys, values

    @classmethod
    def of(cls, past_kv: Any) -> "LayerCache | None":
        """``past_kv`` as a layer cache: None stays None; ARENA's classic ``past_kv``, one layer's
        keys and values as a tensor ``(2, batch, past_pos, n_heads, d_head)``, becomes the one layer
        of a ``GrowingCache``, whose ``kv`` is then that tensor extended with the new positions."""
        if past_kv is None or isinstance(past_kv, LayerCache):
            return past_kv
        if not isinstance(past_kv, Tensor) or past_kv.ndim != 5 or past_kv.shape[0] != 2:
            raise TypeError(
                "past_kv must be one layer's keys and values, a tensor (2, batch, past_pos, n_heads, d_head), "
                f"or a LayerCache; got {getattr(past_kv, 'shape', type(past_kv).__name__)}"
            )
        return _TensorLayer(GrowingCache(KeyValueCache(past_kv.as_subclass(Tensor)[None]), keep=False), 0)


class _TensorLayer(LayerCache):
    """ARENA's per-layer contract: ``kv`` is the one tensor of the keys and values so far."""

    @property
    def kv(self) -> Float[Tensor, "2 batch seq_len n_heads d_head"]:  # type: ignore[override]
        return self.cache.layers[0]

    @kv.setter
    def kv(self, value) -> None:
        pass


def step_after(
    past: int, tokens: Int[Tensor, "batch pos"], attention_mask: Int[Tensor, "batch pos"] | None = None
) -> CacheStep:
    """The step of a cache that holds the first ``past`` positions of ``tokens`` in order and puts the new
    ones after them (part 4's cache, and part 6's static cache): the tokens from ``past`` on, at their
    positions in the sequence; with an ``attention_mask`` (left padding, part 5) at their positions among
    their row's real tokens, and no query may see a pad key."""
    new_tokens = tokens[:, past:]
    if attention_mask is None:
        ### BEGIN SOLUTION
        # Hint: the new tokens sit at positions past, past + 1, ... of the sequence.
        # The offset matters: without it every new token would be embedded at position 0.
        positions = torch.arange(past, tokens.shape[1], device=tokens.device)[None]
        return CacheStep(new_tokens, positions)
        ### END SOLUTION
    from .transformer import position_ids_from_mask  # part 5's (transformer.py imports this module)

    ### BEGIN SOLUTION
    # Hint: each new token at its position among its row's real tokens; pad keys hidden from every query.
    # Count over the whole mask (the cached columns too), then keep the new columns.
    positions = position_ids_from_mask(attention_mask)[:, past:]
    return CacheStep(new_tokens, positions, mask=(attention_mask == 1)[:, None, None, :])
    ### END SOLUTION


class GrowingCache:
    """Part 4's ``KeyValueCache`` as a cache of the protocol, for one forward pass.

    ``tokens`` is the whole sequence so far: the new tokens are those past the cache's
    ``seq_len``. Each layer's keys and values grow by concatenation, so the new keys come
    last and the model's causal mask is all the masking needed, except for padding (part 5):
    with an ``attention_mask``, positions count real tokens only and no query sees a pad key.
    ``commit`` returns the extended cache; the cache it started from is left as it was.
    """

    def __init__(self, past: KeyValueCache, max_len: int | None = None, keep: bool = True):
        self.past = past
        self.max_len = max_len  # the most positions the cache will ever hold (the model's n_ctx), when known
        self.layers: list[Tensor | None] = [None] * past.shape[0]
        # keep: each layer's keys and values go into the committed cache's buffer as soon as the layer has them
        # (False: ARENA's classic one-layer call, which keeps the learner's tensor itself and commits nothing).
        self.keep = keep
        self.room: Room | None = None

    def prepare(
        self, tokens: Int[Tensor, "batch pos"], attention_mask: Int[Tensor, "batch pos"] | None = None
    ) -> CacheStep:
        """The tokens past the cache's ``seq_len``, their positions, and (padding) the keys they may see."""
        return step_after(self.past.seq_len, tokens, attention_mask)

    def update(
        self, layer: int, k: Float[Tensor, "batch new_pos n_heads d_head"], v: Float[Tensor, "batch new_pos n_heads d_head"]
    ) -> tuple[Float[Tensor, "batch key_pos n_heads d_head"], Float[Tensor, "batch key_pos n_heads d_head"]]:
        """Layer ``layer``'s cached keys and values followed by the new ones (kept for ``commit``)."""
        past_kv = self.past.as_subclass(Tensor)[layer]
        ### BEGIN SOLUTION
        # Hint: earlier positions come first, so the new keys go after the cached ones.
        # One cat for keys and values together: each copy of the cache costs a full pass.
        kv = torch.cat([past_kv, torch.stack([k, v])], dim=2)
        ### END SOLUTION
        if not self.keep:
            self.layers[layer] = kv
        else:
            # Into the buffer now, not at commit: then this layer's tensor is freed once its attention has read it,
            # and the next layer's cat reuses that memory, where keeping every layer's until commit would ask the
            # system for the whole cache afresh at every step (memory it maps and zeroes page by page).
            if self.room is None:
                self.room = Room.of(self.past, kv, self.max_len)
            self.layers[layer] = self.room.write(layer, kv)
        return kv[0], kv[1]

    def commit(self) -> KeyValueCache:
        """The extended cache: every layer's keys and values, old and new, a view of the buffer ``update`` wrote
        (``Room``)."""
        if self.room is None or any(kv is None for kv in self.layers):
            raise RuntimeError("commit comes after every layer's update, once per forward pass")
        return self.room.commit(self.layers[0].shape[2])


class Room:
    """The storage a ``KeyValueCache`` grows into: one buffer with room for more positions than it holds.

    A forward pass puts every layer's keys and values together in one tensor. Stacking them into a new
    tensor at every step would allocate the whole cache afresh (tens of megabytes for a batch of
    GPT-2 small), and a fresh allocation that large is memory the operating system maps and zeroes
    page by page: on a CPU that cost several times the copy itself, a sixth of a batched decode step.
    So the cache lives in a buffer with room to spare, as a Python list does: each layer's ``write`` puts only
    its new positions after the filled ones, and ``commit`` gives a view of the filled part.
    A full buffer is replaced by one twice as long (up to ``max_len``), a copy every doubling.

    Each committed cache's contents stay as they were: later steps write only past ``filled``, the
    furthest any cache of this buffer reaches, and a step from an older cache (speculative decoding's
    crop, a second continuation of the same prefix) finds ``filled`` past its own ``seq_len`` and copies
    into a new buffer. The caches of one buffer share its storage: an in-place change to one shows in
    the others' common positions.
    """

    def __init__(self, buffer: Float[Tensor, "n_layers 2 batch max_pos n_heads d_head"]):
        self.buffer = buffer
        self.filled = 0
        self.start = 0  # the first position the pass under way writes (``of``: past's length, or 0 in a new buffer)
        self.writing = False  # a pass has the buffer (``of``) and has not committed yet

    def holds(self, cache: KeyValueCache) -> bool:
        """``cache`` is this buffer's furthest view: the filled part, at the start of the same storage."""
        buffer = self.buffer
        return (cache.seq_len == self.filled and cache.data_ptr() == buffer.data_ptr()
                and cache.stride() == buffer.stride() and cache.shape[:3] == buffer.shape[:3]
                and cache.shape[4:] == buffer.shape[4:] and cache.dtype == buffer.dtype)

    @classmethod
    def of(cls, past: KeyValueCache, first: Float[Tensor, "2 batch seq_len n_heads d_head"],
           max_len: int | None = None) -> "Room":
        """Where ``past`` extended to ``first``'s length goes: ``past``'s own buffer when it has room after ``past``,
        else a new one (``first``: a layer's keys and values, old and new; every layer's have its shape)."""
        new = first.shape[2]
        room = getattr(past, "room", None)
        if isinstance(room, cls) and not room.writing and room.holds(past) and room.buffer.shape[3] >= new:
            room.start, room.writing = past.seq_len, True
            return room
        # A new buffer (every position copied in): no room after past, or another pass writes past's (it has not
        # committed: it may be under way, or have stopped with an error), whose positions this pass must not share.
        capacity = max(new, 2 * new if max_len is None else min(2 * new, max_len))
        room = cls(first.new_empty((past.shape[0], 2, first.shape[1], capacity) + tuple(first.shape[3:])))
        room.writing = True
        return room

    def write(self, layer: int, kv: Float[Tensor, "2 batch seq_len n_heads d_head"]) -> Tensor:
        """Layer ``layer``'s keys and values, old and new, into the buffer (the positions it lacks); their view."""
        new = kv.shape[2]
        self.buffer[layer, :, :, self.start : new] = kv[:, :, self.start :]
        return self.buffer[layer, :, :, :new]

    def commit(self, new: int) -> KeyValueCache:
        """The cache of the first ``new`` positions, filled now in every layer: a view of the buffer."""
        self.filled, self.writing = new, False
        cache = KeyValueCache(self.buffer[:, :, :, :new])
        cache.room = self
        return cache
