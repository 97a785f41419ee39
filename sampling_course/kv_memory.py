"""How much memory a KV cache takes, by formula and as measured, and what grouped-query attention saves.

Every layer caches one key and one value vector per key/value head per position:

    bytes = n_layers x 2 x batch x seq_len x n_kv_heads x d_head x bytes per number

GPT-2 has as many key/value heads as query heads; a grouped-query model shares each key/value
head among a group of query heads, which divides the cache by the group size. The measured
side sums the bytes of the storages a cache's tensors live in, so a cache that allocated more
than it uses (a preallocated buffer) shows it. On the meta device tensors have shapes and
storages but no memory, so an 8B model's cache can be "measured" without 8B of weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from sampling_course.config import Config
from sampling_course.llama_config import LlamaConfig

# Llama-3-8B's shapes (its rotary frequency scaling changes no shape, so it is left out here).
LLAMA3_8B = LlamaConfig(d_model=4096, d_vocab=128256, n_ctx=8192, d_head=128, d_mlp=14336, n_heads=32,
                        n_key_value_heads=8, n_layers=32, eps=1e-5, rotary_base=500000.0)


def kv_cache_bytes(*, n_layers: int, batch: int, seq_len: int, n_kv_heads: int, d_head: int,
                   dtype: torch.dtype = torch.float32) -> int:
    """The formula: n_layers x 2 (keys and values) x batch x seq_len x n_kv_heads x d_head x bytes per number."""
    for name, value in dict(n_layers=n_layers, batch=batch, seq_len=seq_len, n_kv_heads=n_kv_heads, d_head=d_head).items():
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return n_layers * 2 * batch * seq_len * n_kv_heads * d_head * torch.empty((), dtype=dtype).element_size()


def storage_bytes(tensors: Iterable[Tensor]) -> int:
    """The bytes of the distinct storages behind ``tensors`` (views of one buffer count once)."""
    seen: dict[tuple[str, int], int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        # On the meta device every storage reports address 0: count each tensor as its own storage.
        key = (str(tensor.device), storage.data_ptr() if tensor.device.type != "meta" else id(tensor))
        seen[key] = storage.nbytes()
    return sum(seen.values())


@dataclass(frozen=True)
class CacheShape:
    """What the formula needs of a model: its name, layers, query heads, key/value heads and head size."""

    name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int

    @classmethod
    def of(cls, name: str, cfg: Config | LlamaConfig) -> "CacheShape":
        kv = cfg.n_key_value_heads if isinstance(cfg, LlamaConfig) else cfg.n_heads
        return cls(name, cfg.n_layers, cfg.n_heads, kv, cfg.d_head)

    def bytes(self, batch: int, seq_len: int, dtype: torch.dtype, kv_heads: int | None = None) -> int:
        """The formula for this model (``kv_heads``: pretend it had that many key/value heads)."""
        return kv_cache_bytes(n_layers=self.n_layers, batch=batch, seq_len=seq_len,
                              n_kv_heads=self.n_kv_heads if kv_heads is None else kv_heads, d_head=self.d_head,
                              dtype=dtype)


def memory_rows(shapes: Iterable[CacheShape], batch: int, seq_len: int, dtype: torch.dtype) -> list[dict]:
    """One row per model: the cache per token and at ``seq_len``, and what it would be with one KV head per query head."""
    rows = []
    for shape in shapes:
        size = shape.bytes(batch, seq_len, dtype)
        full = shape.bytes(batch, seq_len, dtype, kv_heads=shape.n_heads)
        rows.append(dict(model=shape.name, layers=shape.n_layers, heads=f"{shape.n_heads} q / {shape.n_kv_heads} kv",
                         d_head=shape.d_head, per_token=shape.bytes(1, 1, dtype), total=size, without_gqa=full,
                         saving=full / size))
    return rows


def format_bytes(n: float) -> str:
    """``n`` bytes in B, KiB, MiB or GiB."""
    if n < 1024:
        return f"{n:,.0f} B"
    for unit in ("KiB", "MiB"):
        n /= 1024
        if n < 1024:
            return f"{n:,.1f} {unit}"
    return f"{n / 1024:,.1f} GiB"
