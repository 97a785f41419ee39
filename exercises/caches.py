# GENERATED from solutions/caches.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: c8f14211874dbd045e8669a85dc39bf5892b2991ad522b039ae259342efe8d21
"""Part 6: caches for long and fast generation; first, the static cache.

Part 4's ``KeyValueCache`` grows by concatenation: every step copies everything cached so
far into a new tensor, and it stops at n_ctx because each cached key was computed at its
own position. Production generators use two other designs, built in part 6:

* ``StaticKeyValueCache`` (here): one buffer sized for the whole generation, allocated
  once. A step writes its keys and values into the next free slots, in place, and
  attention reads the filled prefix only. ``crop(n)`` (speculative decoding) moves a
  counter back; ``reorder(rows)`` (beam search) gathers rows into the same buffer.
* ``SinkCache`` (solutions/sink_cache.py): a fixed budget of ``window_length`` slots. The
  first ``num_sink_tokens`` tokens (the "attention sinks") stay forever; the other slots
  hold the most recent tokens, so generation goes on past n_ctx with bounded memory.

Both are caches of the protocol (solutions/kv_cache.py, docs/design.md): the model's one
forward pass, ``DemoTransformer.forward``, asks ``prepare`` which tokens are new and where they
sit, hands every layer's new keys and values to ``update`` and reads what it returns, then
calls ``commit``. The cache stores; it never runs the model.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sampling_course.config import Config
from sampling_course.devices import check_same_device, pick_device

from .kv_cache import CacheStep, check_cache_fits, step_after


class StaticKeyValueCache:
    """Keys and values in one preallocated buffer ``(n_layers, 2, batch, max_len, n_heads, d_head)``
    (stored head-major: ``empty_buffer``).

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
        self.new_pos = 0  # positions the step under way adds (prepare sets it, commit adds it to seq_len)
        self.pending: tuple | None = None  # a reorder left for the next forward pass (reorder_later)
        self.checked: Tensor | None = None  # rows checked already (settle's one-layer views: checked by reorder_later)
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
        buffer = empty_buffer((cfg.n_layers, 2, batch, max_len, cfg.n_heads, cfg.d_head),
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
        self.settle()
        return self.buffer[:, 0, : self.batch, : self.seq_len]

    @property
    def v(self) -> Float[Tensor, "n_layers batch seq_len n_heads d_head"]:
        self.settle()
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
        and ``commit`` advances it once, after the last layer.
        """
        if layer == 0 and self.seq_len == 0:
            self.buffer = placed_buffer(self, k)  # a new generation: where the model computes
        if self.pending is not None:
            self.settle(layer)  # beam search's reorder of this layer, just before the layer reads its keys
        # Hint: rows :self.batch, slots seq_len .. seq_len + new_pos - 1; return only the filled slots of those rows.
        raise NotImplementedError()

    def crop(self, n: int) -> None:
        """Forget every position from ``n`` on (speculative decoding's rejected proposals).

        Nothing moves: the counter goes back, and the next step overwrites the slots.
        """
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.seq_len:
            raise ValueError(f"n must be an integer between 0 and the cache's seq_len={self.seq_len}, got {n!r}")
        self.settle()
        self.seq_len = n

    def reorder(self, rows: Int[Tensor, "new_batch"]) -> None:
        """Make row i of the cache hold what row ``rows[i]`` held (beam search), in the same buffer.

        ``rows`` may repeat rows and may be longer than the current batch (beam search
        turns one prompt into ``num_beams`` beams); the buffer grows the first time that
        happens and is reused from then on.
        """
        self.settle()  # a reorder asked for earlier (reorder_later) comes first
        rows = self.checked_rows(rows)
        # Hint: move only the rows that change (rows[i] != i); a row that a move reads but another move overwrites is saved first.
        raise NotImplementedError()

    def reorder_later(self, rows: Int[Tensor, "new_batch"]) -> None:
        """``reorder(rows)``, done one layer at a time as the next forward pass reaches each layer (beam search).

        A reorder reads and writes the whole cache; done at once, before the step, it brings every
        layer's keys in from memory only for attention to read them from memory again, twelve layers
        of weights later. Done as each layer is about to attend (``update``), the keys it moved are still
        in the processor's cache when attention reads them. Each layer is reordered by ``reorder`` itself,
        on a one-layer cache that views this buffer. Reading the keys or values (``k``, ``v``), cropping
        or reordering again first finishes what is left.
        """
        self.settle()
        rows = self.checked_rows(rows)
        self.pending = (rows, self.batch, set(range(self.buffer.shape[0])))
        self.batch = len(rows)

    def settle(self, layer: int | None = None) -> None:
        """Do the reorder ``reorder_later`` left for ``layer`` (every layer it left when None)."""
        if self.pending is None:
            return
        rows, batch, left = self.pending
        for todo in sorted(left) if layer is None else [layer] if layer in left else []:
            one_layer = type(self)(self.buffer[todo : todo + 1])  # a view: its reorder moves this buffer's rows
            one_layer.batch, one_layer.seq_len, one_layer.checked = batch, self.seq_len, rows
            one_layer.reorder(rows)
            left.discard(todo)
        if not left:
            self.pending = None

    def checked_rows(self, rows: Int[Tensor, "new_batch"]) -> Int[Tensor, "new_batch"]:
        """``rows`` as a tensor on the buffer's device, after checking them; the buffer grown to hold them all."""
        if rows is self.checked:
            return rows
        rows = torch.as_tensor(rows, device=self.buffer.device)
        if rows.ndim != 1 or rows.is_floating_point() or len(rows) == 0:
            raise ValueError(f"rows must be a non-empty 1-D tensor of row indices, got {rows!r:.80}")
        if not ((rows >= 0) & (rows < self.batch)).all():
            raise ValueError(f"rows must index the cache's {self.batch} rows (0 to {self.batch - 1}), got {rows.tolist()}")
        if len(rows) > self.buffer.shape[2]:  # more rows than ever before: grow once
            grown = empty_buffer(self.buffer.shape[:2] + (len(rows),) + self.buffer.shape[3:], self.buffer.device, self.buffer.dtype)
            grown[:, :, : self.buffer.shape[2]] = self.buffer
            self.buffer = grown
        return rows

    def check_compatible(self, cfg: Config, tokens: Int[Tensor, "batch pos"]) -> None:
        """Fail loudly, saying what is wrong, rather than silently return wrong logits."""
        if self.seq_len == 0 and tokens.shape[0] <= self.buffer.shape[2]:
            self.batch = tokens.shape[0]  # an empty cache takes any batch that fits its buffer
        elif self.seq_len:  # the tokens are where the model computes (its forward checked): so must the keys be
            check_same_device("the StaticKeyValueCache", self.buffer.device, tokens.device)
        check_cache_and_tokens(self, cfg, tokens, run=self.seq_len)
        if tokens.shape[1] > self.max_len:
            raise ValueError(
                f"the sequence has {tokens.shape[1]} positions but this StaticKeyValueCache was allocated for "
                f"max_len={self.max_len}; allocate it with a larger max_len (at most n_ctx={cfg.n_ctx})"
            )

    def prepare(
        self, tokens: Int[Tensor, "batch pos"], attention_mask: Int[Tensor, "batch pos"] | None = None
    ) -> CacheStep:
        """The positions of ``tokens`` not cached yet go in the next free slots: part 4's step (``step_after``).

        With ``attention_mask`` (part 5's left-padded batches), positions count real tokens
        only and pad keys are never attended, as with part 4's cache.
        """
        self.new_pos = tokens.shape[1] - self.seq_len
        return step_after(self.seq_len, tokens, attention_mask)

    def commit(self) -> "StaticKeyValueCache":
        """Every layer has written its slots: they are filled now. ``model(tokens, cache)`` returns the cache itself."""
        self.settle()  # every layer has reordered itself by now, unless a model skipped one
        self.seq_len += self.new_pos
        self.new_pos = 0
        return self


def check_cache_and_tokens(cache, cfg: Config, tokens: Int[Tensor, "batch pos"], run: int) -> None:
    """The cache was made for this model and this batch, and ``tokens`` holds positions it has not run yet."""
    name = type(cache).__name__
    check_cache_fits(name, cache.buffer.shape, cache.batch, cfg, tokens)
    if tokens.shape[1] <= run:
        raise ValueError(
            f"tokens has {tokens.shape[1]} positions but the {name} has already run {run}: pass the whole "
            "sequence so far, including at least one position not yet run"
        )


def empty_buffer(shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype) -> Tensor:
    """An uninitialised cache buffer of ``shape`` ``(n_layers, 2, batch, slots, n_heads, d_head)``, stored head-major.

    Indexed as every cache of the course indexes it, but each head's slots lie one after the
    other in memory (it is a transposed view of a ``(n_layers, 2, batch, n_heads, slots,
    d_head)`` tensor). Attention's matmuls run one head at a time: with this layout they read
    the filled slots where they are, while with the slots outermost every layer would first
    copy all of its keys and values into a head-major tensor (at batch 8 on a CPU, about a
    tenth of a decode step).
    """
    n_layers, two, batch, slots, n_heads, d_head = shape
    return torch.empty(n_layers, two, batch, n_heads, slots, d_head, device=device, dtype=dtype).transpose(3, 4)


def placed_buffer(cache, k: Tensor) -> Tensor:
    """The buffer of an empty ``cache``, where the first keys ``k`` were computed and in their dtype when
    ``new_empty`` was left to choose (reallocated then, before anything is stored); checked against them otherwise."""
    buffer = cache.buffer
    device = k.device if cache.follows_device else buffer.device
    dtype = k.dtype if cache.follows_dtype else buffer.dtype
    if buffer.device != device or buffer.dtype != dtype:
        buffer = empty_buffer(buffer.shape, device=device, dtype=dtype)
    check_same_device(f"the {type(cache).__name__}", buffer.device, k.device,
                      f"make it with {type(cache).__name__}.new_empty(cfg, ...) without a device (it follows the model) "
                      "or with the model's device")
    if buffer.dtype != k.dtype:
        raise ValueError(f"the {type(cache).__name__} holds {buffer.dtype} but the model computes in {k.dtype}: "
                         "make it without a dtype (it follows the model) or with the model's")
    return buffer
