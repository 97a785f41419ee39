"""Part 9: an attention-sink cache for a rotary model, which re-rotates the keys it keeps.

StreamingLLM (Xiao et al., 2023, *Efficient Streaming Language Models with Attention Sinks*)
keeps the first few positions (the sinks) and a sliding window of the most recent ones, and
gives the cached tokens positions *within the cache*, 0 .. capacity - 1, instead of their
index in the text. Part 6 could not do that with GPT-2: a learned position is added to the
residual stream once, at the bottom, and is baked into every later layer's keys. A rotary
model's keys carry their position as a rotation and nothing else, and rotations compose: a
key rotated to position p and then by -s is exactly the key rotated to p - s. So when the
window slides by s positions, the cache turns every kept (non-sink) key back by s, and the
cache stays what it would be had those tokens been at their new positions all along.
(Hugging Face's former ``SinkCache`` did the same.)

The cache is one of the protocol (solutions/kv_cache.py): ``model(tokens, cache)`` takes the whole
text so far, however long; the cache's ``prepare`` calls ``make_room`` for the tokens it has not
seen yet and numbers them by the slots after the kept ones, before any layer adds its keys.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sampling_course.llama_config import LlamaConfig

from .kv_cache import CacheStep
from .llama import LlamaCache, LlamaTransformer, Rotary


def rerotate(
    rotary: Rotary, keys: Float[Tensor, "batch pos heads d_head"], shift: int
) -> Float[Tensor, "batch pos heads d_head"]:
    """Keys rotated at positions p, turned to positions p - shift: every key by the same angle."""
    ### BEGIN SOLUTION
    # One angle for every key: position -shift's. (rotary(keys, -shift) would turn key i by i - shift.)
    cos, sin = rotary.cos_sin(torch.tensor([-shift], device=keys.device))
    k32 = keys.float()
    first, second = k32.chunk(2, dim=-1)
    return (k32 * cos[:, None, :] + torch.cat((-second, first), dim=-1) * sin[:, None, :]).to(keys.dtype)
    ### END SOLUTION


class RotatingSinkCache(LlamaCache):
    """The first ``n_sink`` positions for ever, and the most recent ``window`` after them.

    Positions are slots of the cache: sinks at 0 .. n_sink - 1, the window after them. With
    ``n_sink=0`` it is a plain sliding window (re-rotated too).
    """

    def __init__(self, cfg: LlamaConfig, n_sink: int, window: int):
        if not isinstance(n_sink, int) or n_sink < 0 or not isinstance(window, int) or window < 1:
            raise ValueError(f"n_sink must be an integer >= 0 and window one >= 1, got {n_sink!r} and {window!r}")
        super().__init__(cfg.n_layers)
        self.n_sink, self.window = n_sink, window
        self.rotary = Rotary(cfg)
        self.seen = 0  # tokens of the text run so far (the cache holds at most capacity of them)
        self.new_pos = 0  # tokens of the step under way (prepare sets it, commit counts them as seen)

    @property
    def capacity(self) -> int:
        return self.n_sink + self.window

    def make_room(self, n_new: int) -> int:
        """Evict the oldest non-sink positions so that ``n_new`` more fit, re-rotating the window's keys
        that stay; return how many positions were evicted."""
        if not isinstance(n_new, int) or not 0 <= n_new <= self.window:
            raise ValueError(f"n_new must be between 0 and the window ({self.window}), got {n_new!r}")
        ### BEGIN SOLUTION
        evict = max(self.seq_len + n_new - self.capacity, 0)
        if evict == 0:
            return 0
        for layer, (k, v) in enumerate(zip(self.keys, self.values)):
            # The sinks keep their slots; everything after the evicted block moves down by `evict`.
            kept = rerotate(self.rotary, k[:, self.n_sink + evict :], evict)
            self.keys[layer] = torch.cat([k[:, : self.n_sink], kept], dim=1)
            self.values[layer] = torch.cat([v[:, : self.n_sink], v[:, self.n_sink + evict :]], dim=1)
        return evict
        ### END SOLUTION


    def prepare(self, tokens: Int[Tensor, "batch pos"], attention_mask: Int[Tensor, "batch pos"] | None = None) -> CacheStep:
        """The tokens not seen yet, at the slots after the kept ones, room made for them first."""
        if attention_mask is not None and not bool((attention_mask == 1).all()):
            raise ValueError("the rotating sink cache keeps the first columns as every row's sinks, so it takes no "
                             "padding: give rows of one length")
        if tokens.shape[1] <= self.seen:
            raise ValueError(f"tokens has {tokens.shape[1]} positions but the cache has seen {self.seen}: pass the whole "
                             "text so far, with at least one token not seen yet")
        new_tokens = tokens[:, self.seen :]
        self.make_room(new_tokens.shape[1])
        self.new_pos = new_tokens.shape[1]
        positions = torch.arange(self.seq_len, self.seq_len + self.new_pos, device=tokens.device)[None]
        return CacheStep(new_tokens, positions)

    def commit(self) -> "RotatingSinkCache":
        self.seen += self.new_pos
        self.new_pos = 0
        return self


@torch.inference_mode()
def stream_logits(
    model: LlamaTransformer, tokens: Int[Tensor, "batch pos"], cache: RotatingSinkCache, prefill: int = 1
) -> Float[Tensor, "batch pos d_vocab"]:
    """The logits of every position of ``tokens``, read through ``cache``: the first ``prefill`` tokens
    in one step, then one token per step (the cache makes room before each)."""
    if not 1 <= prefill <= min(tokens.shape[1], cache.window):
        raise ValueError(f"prefill must be between 1 and min(len(tokens), window), got {prefill}")
    steps = [model(tokens[:, :prefill], cache)[0]]
    for position in range(prefill, tokens.shape[1]):
        steps.append(model(tokens[:, : position + 1], cache)[0])  # the text so far: the cache runs the newest token
    return torch.cat(steps, dim=1)
