"""Part 6's static cache as a Hugging Face ``Cache``, for any causal LM whose layers call ``update``.

``StaticKeyValueCache(model.config, batch, max_len)`` holds one course ``StaticKeyValueCache``
(part 6, from the implementation you choose) and hands every layer's keys and values to it:
each step writes into the next free slots of the one buffer allocated at the first step, and
attention reads the filled prefix only, through the course's ``update``. Beam search's
reordering is the course's ``reorder``, rolling back is its ``crop``.

    model.generate(**inputs, max_new_tokens=20, past_key_values=StaticKeyValueCache(model.config, 2, 64))

The buffer is ``(n_layers, 2, batch, max_len, kv_heads, d_head)``: with grouped-query attention
the heads are the key/value heads (what the layers store). It is allocated at the first step, on
the model's device and in its dtype, with the head count and head size of the keys it receives.
Hugging Face's layers store keys as ``(batch, kv_heads, seq, d_head)``; the course's cache takes
``(batch, seq, heads, d_head)``, hence the transposes.

A generation of a ``prompt``-token batch with ``max_new_tokens`` new tokens runs the model on
``prompt + max_new_tokens - 1`` positions (the last token is never run), so ``max_len`` must be
at least that. A step that would go past ``max_len``, more rows than ``batch``, or rows that
change in the middle of a generation are refused with a ValueError, before anything is written.
"""

from __future__ import annotations

from types import ModuleType

import torch
from jaxtyping import Float
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from sampling_course.implementation import impl_module


class StaticKeyValueLayer(CacheLayerMixin):
    """Layer ``layer`` of a ``StaticKeyValueCache``: its reads and writes go to the one course cache."""

    is_sliding = False
    is_croppable = True
    supports_early_init = False

    def __init__(self, owner: "StaticKeyValueCache", layer: int):
        super().__init__()
        self.owner, self.layer = owner, layer

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = self.owner.write(self.layer, key_states, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """Attention reads the filled slots and the new ones, from slot 0 (like a dynamic cache, not the whole buffer)."""
        return self.owner.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.get_seq_length()

    def get_max_length(self) -> int:
        return self.owner.max_len


class StaticKeyValueCache(Cache):
    """Part 6's ``StaticKeyValueCache`` behind Hugging Face's ``Cache``: ``batch`` rows of ``max_len`` positions.

    ``config`` is the model's (``model.config``; only its layer count is read); ``impl`` picks
    whose part 6 stores the keys (``"solutions"`` by default where they exist, ``"exercises"`` for yours).
    ``course`` is the course's cache once the first step has allocated it (None before).
    """

    def __init__(self, config, batch: int, max_len: int, impl: str | None = None):
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch (rows the cache holds) must be an integer >= 1, got {batch!r}")
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"max_len (positions the cache holds) must be an integer >= 1, got {max_len!r}")
        text_config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        n_layers = getattr(text_config, "num_hidden_layers", None)
        if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
            raise ValueError(f"StaticKeyValueCache takes the model's config (model.config), with num_hidden_layers; got {config!r:.80}")
        self.caches: ModuleType = impl_module("caches", impl, default="solutions")
        self.batch, self.max_len, self.n_layers = batch, max_len, n_layers
        self.course = None  # the course's StaticKeyValueCache, allocated at the first step
        super().__init__(layers=[StaticKeyValueLayer(self, layer) for layer in range(n_layers)])

    def __repr__(self) -> str:
        return f"StaticKeyValueCache(batch={self.batch}, max_len={self.max_len}, seq_len={self.get_seq_length()})"

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.course is None else self.course.seq_len

    def check_room(self, rows: int, positions: int) -> None:
        """Refuse, before a generation starts, ``rows`` sequences that will run ``positions`` positions each."""
        if rows > self.batch:
            raise ValueError(f"the StaticKeyValueCache was made for batch={self.batch} rows but this generation runs "
                             f"{rows} (prompts x num_return_sequences x num_beams); make it with batch={rows}")
        if positions > self.max_len:
            raise ValueError(f"the StaticKeyValueCache holds max_len={self.max_len} positions but this generation runs the "
                             f"model on {positions} (the prompt plus max_new_tokens - 1); make it with max_len >= {positions}")

    def write(
        self,
        layer: int,
        key_states: Float[Tensor, "batch kv_heads new_pos d_head"],
        value_states: Float[Tensor, "batch kv_heads new_pos d_head"],
    ) -> tuple[Float[Tensor, "batch kv_heads key_pos d_head"], Float[Tensor, "batch kv_heads key_pos d_head"]]:
        """Store ``layer``'s new keys and values through the course's ``update``; every filled slot, in Hugging Face's layout."""
        new = key_states.shape[2]
        if layer == 0:
            self.check_step(key_states)
        k, v = self.course.update(layer, key_states.transpose(1, 2), value_states.transpose(1, 2))
        if layer == self.n_layers - 1:
            self.course.seq_len += new  # every layer has written its slots (what the course cache's commit does)
        return k.transpose(1, 2), v.transpose(1, 2)

    def check_step(self, key_states: Float[Tensor, "batch kv_heads new_pos d_head"]) -> None:
        """At a step's first layer: allocate the buffer (first step), then refuse a step that does not fit."""
        rows, heads, new, d_head = key_states.shape
        if self.course is None:
            buffer = torch.empty(self.n_layers, 2, self.batch, self.max_len, heads, d_head,
                                 device=key_states.device, dtype=key_states.dtype)
            self.course = self.caches.StaticKeyValueCache(buffer)
        buffer = self.course.buffer
        if (buffer.shape[4], buffer.shape[5]) != (heads, d_head) or buffer.dtype != key_states.dtype:
            raise ValueError(f"the StaticKeyValueCache holds {buffer.shape[4]} heads of size {buffer.shape[5]} in "
                             f"{buffer.dtype}, this model's layers give {heads} of size {d_head} in {key_states.dtype}: "
                             "one cache serves one model")
        if buffer.device != key_states.device:
            raise ValueError(f"the StaticKeyValueCache is on {buffer.device} and the model on {key_states.device}")
        seq_len = self.course.seq_len
        if seq_len == 0:
            if rows > buffer.shape[2]:
                self.check_room(rows, 0)
            self.course.batch = rows  # an empty cache takes any batch that fits, as part 6's does
        elif rows != self.course.batch:
            raise ValueError(f"the StaticKeyValueCache holds {self.course.batch} rows but this step brings {rows}; "
                             "a generation keeps its rows (reorder_cache moves them), a new one starts from reset()")
        if seq_len + new > self.max_len:
            raise ValueError(f"the StaticKeyValueCache holds max_len={self.max_len} positions and has filled {seq_len}; "
                             f"this step brings {new} more. Make it with max_len at least the prompt's length plus "
                             "max_new_tokens - 1")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: row i takes what row ``beam_idx[i]`` held (part 6's ``reorder``, once for every layer)."""
        if self.course is not None and self.course.seq_len > 0:
            self.course.reorder(beam_idx.to(self.course.buffer.device))

    def batch_select_indices(self, indices: Tensor) -> None:
        self.reorder_cache(torch.as_tensor(indices))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.course is not None and self.course.seq_len > 0:
            rows = torch.arange(self.course.batch, device=self.course.buffer.device).repeat_interleave(repeats)
            self.reorder_cache(rows)

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` positions (Hugging Face passes a negative count; 0 keeps all)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes minus the number of positions to forget (as Hugging Face's caches do), got {tokens_to_remove}")
        if self.course is not None:
            self.course.crop(self.course.seq_len + tokens_to_remove)

    def reset(self) -> None:
        """Empty the cache for a new generation; the buffer stays allocated."""
        if self.course is not None:
            self.course.crop(0)
