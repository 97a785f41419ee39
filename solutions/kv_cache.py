"""Part 4: the KV cache.

Generation runs the model once per new token, and without a cache each run recomputes the
keys and values of every earlier position, which never change: a causal model's position i
depends on positions 0..i only. The cache keeps them. ``KeyValueCache`` holds every layer's
keys and values for the positions run so far; ``DemoTransformer.cached_forward``
(solutions/transformer.py) runs only the new positions, at their place in the sequence, and
returns the cache extended with them.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
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

    def grown(self, seq_len: int) -> "KeyValueCache":
        """A copy of this cache with room for ``seq_len`` positions, the new slots left empty (part 5)."""
        n_layers, _, batch, past, n_heads, d_head = self.shape
        room = torch.empty(n_layers, 2, batch, seq_len - past, n_heads, d_head, device=self.device, dtype=self.dtype)
        return KeyValueCache(torch.cat([self.as_subclass(torch.Tensor), room], dim=3))

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
