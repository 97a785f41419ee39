"""Part 9's attention-sink cache as a Hugging Face ``Cache``, for Llama and Qwen3 models.

It keeps what part 9's ``RotatingSinkCache`` keeps: the first ``n_sink`` positions for ever and
the ``window`` most recent after them, and when the window slides by s positions it turns every
kept window key back by s (``rerotate``, from the implementation you choose), so the cache holds
the keys its tokens would have had at their slots 0 .. capacity - 1.

A step reaches it in one of two ways:

* ``cache.make_room(n_new)`` first, as part 9's loop does (the course's ``custom_generate`` does
  this). The eviction happens before the model reads ``get_seq_length()``, so a model called
  without ``position_ids`` gives the new tokens the slots that follow the kept ones: exactly
  part 9's cache.
* Hugging Face's own ``generate(past_key_values=cache)``, which never calls ``make_room`` and
  gives each token its index in the text as its position. Then ``update`` makes room itself,
  turns the new keys from their text positions to their slots, and hands attention the kept keys
  turned forward by the same angle, so that the query (rotated at its text position) sees every
  key at the same distance as in the first case. Hugging Face's positions are text indices only
  for prompts without padding, so this way takes unpadded prompts.

The layers store keys in Hugging Face's layout, ``(batch, kv_heads, seq, d_head)``; the course's
rotation takes ``(batch, seq, heads, d_head)``, hence the transposes.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from sampling_course.implementation import impl_module
from sampling_course.llama_config import LlamaConfig

# keys (batch, seq, heads, d_head) rotated at p -> the same keys rotated at p - shift
Rerotate = Callable[[Tensor, int], Tensor]


def check_sizes(n_sink: int, window: int) -> None:
    if isinstance(n_sink, bool) or not isinstance(n_sink, int) or n_sink < 0:
        raise ValueError(f"n_sink (positions kept for ever) must be an integer >= 0, got {n_sink!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window (recent positions kept) must be an integer >= 1, got {window!r}")


class SinkLayer(CacheLayerMixin):
    """One layer's sinks and window; ``rerotate`` turns keys ``(batch, seq, heads, d_head)`` back by a shift."""

    is_sliding = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, n_sink: int, window: int, rerotate: Rerotate):
        super().__init__()
        check_sizes(n_sink, window)
        self.n_sink, self.window, self.rerotate = n_sink, window, rerotate
        self.seen = 0  # tokens that went through this layer: the text index of the next one
        self.room_made = False  # make_room ran for the coming tokens: they come at their slots

    @property
    def capacity(self) -> int:
        return self.n_sink + self.window

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = key_states[:, :, :0]
        self.values = value_states[:, :, :0]
        self.is_initialized = True

    def turn(self, keys: Tensor, shift: int) -> Tensor:
        """``keys`` (Hugging Face's layout) turned back by ``shift`` positions."""
        return self.rerotate(keys.transpose(1, 2), shift).transpose(1, 2) if shift else keys

    def make_room(self, n_new: int) -> int:
        """Evict the oldest window positions so that ``n_new`` more fit, turning the kept ones down; how many went."""
        if isinstance(n_new, bool) or not isinstance(n_new, int) or not 0 <= n_new <= self.window:
            raise ValueError(f"a step of the sink cache takes between 0 and window={self.window} new tokens, got {n_new!r}")
        self.room_made = True
        evict = max(self.get_seq_length() + n_new - self.capacity, 0)
        if evict:
            kept = self.turn(self.keys[:, :, self.n_sink + evict :], evict)
            self.keys = torch.cat([self.keys[:, :, : self.n_sink], kept], dim=2)
            self.values = torch.cat([self.values[:, :, : self.n_sink], self.values[:, :, self.n_sink + evict :]], dim=2)
        return evict

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """Store this step's keys and values; return what attention reads, in the frame of the query's positions."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n_new = key_states.shape[2]
        # Without make_room, the new tokens came at their text positions (Hugging Face's generate).
        frame = 0
        if not self.room_made:
            self.make_room(n_new)
            frame = self.seen - self.get_seq_length()  # text position minus slot of the first new token
        self.room_made = False
        self.keys = torch.cat([self.keys, self.turn(key_states, frame)], dim=2)
        self.values = torch.cat([self.values, value_states], dim=2)
        self.seen += n_new
        return self.turn(self.keys, -frame), self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """Keys attention will read after this step's update (the cache's slots, from 0)."""
        evict = 0 if self.room_made else max(self.get_seq_length() + query_length - self.capacity, 0)
        return self.get_seq_length() - evict + query_length, 0

    def get_seq_length(self) -> int:
        return 0 if not self.is_initialized else self.keys.shape[2]

    def get_max_length(self) -> int:
        return self.capacity

    def reset(self) -> None:
        self.keys = self.values = None
        self.is_initialized, self.seen, self.room_made = False, 0, False

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length() > 0:
            self.keys = self.keys.repeat_interleave(repeats, dim=0)
            self.values = self.values.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: Tensor) -> None:
        if self.get_seq_length() > 0:
            self.keys, self.values = self.keys[indices], self.values[indices]


class SinkCache(Cache):
    """Attention sinks and a sliding window for a Llama or Qwen3 model, kept keys re-rotated.

    ``config`` is the model's (``model.config``); ``impl`` chooses whose ``rerotate`` and
    ``Rotary`` turn the keys (``"solutions"`` by default where they exist, ``"exercises"`` for your own part 9).
    Pass it as ``model.generate(..., past_key_values=SinkCache(model.config, 4, 60))``.
    """

    def __init__(self, config, n_sink: int, window: int, impl: str | None = None):
        check_sizes(n_sink, window)
        text_config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        try:
            cfg = LlamaConfig.from_hf(text_config)
        except ValueError as exc:
            raise ValueError(f"SinkCache re-rotates rotary keys, so it takes a Llama or Qwen3 model's config: {exc}") from None
        rerotate = rotation(cfg, impl_module("rope_sink", impl, default="solutions"),
                            impl_module("llama", impl, default="solutions"))
        self.n_sink, self.window = n_sink, window
        super().__init__(layers=[SinkLayer(n_sink, window, rerotate) for _ in range(cfg.n_layers)])

    @property
    def capacity(self) -> int:
        return self.n_sink + self.window

    def make_room(self, n_new: int) -> int:
        """Make room for ``n_new`` tokens in every layer before the model runs them; how many positions went."""
        evicted = [layer.make_room(n_new) for layer in self.layers]
        return evicted[0]


def rotation(cfg: LlamaConfig, rope_sink: ModuleType, llama: ModuleType) -> Rerotate:
    """The implementation's ``rerotate`` with a ``Rotary`` for ``cfg``, moved to the keys' device when needed."""
    rotaries: dict[torch.device, torch.nn.Module] = {}

    def rerotate(keys: Tensor, shift: int) -> Tensor:
        if keys.device not in rotaries:
            rotaries[keys.device] = llama.Rotary(cfg).to(keys.device)
        return rope_sink.rerotate(rotaries[keys.device], keys, shift)

    return rerotate
