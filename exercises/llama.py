# GENERATED from solutions/llama.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: 916d4a53f61cdb6c8ad152c0471a58c5d6d576e00b3956db4a29e3fee44cf2f7
"""Part 9: a Llama-style decoder from scratch.

The same residual stream as part 1's GPT-2, with the four changes every decoder since
Llama has made:

    tokens -> Embed -> [LlamaBlock] * n_layers -> RMSNorm -> Unembed -> logits

    resid_mid  = resid_pre + GroupedQueryAttention(RMSNorm(resid_pre))   (RoPE on q and k)
    resid_post = resid_mid + SwiGLU(RMSNorm(resid_mid))

* RMSNorm: scale by the root mean square; no mean subtracted, no bias.
* Rotary position embeddings (RoPE): no position vector is added to the stream; instead
  each query and key is rotated by an angle proportional to its position, so a score
  q_m . k_n depends on the distance m - n only.
* Grouped-query attention: n_key_value_heads key/value heads, each shared by a group of
  n_heads / n_key_value_heads query heads; the KV cache shrinks by that factor.
* SwiGLU: a gated MLP, W_out(silu(x W_gate) * (x W_in)).

Qwen3 adds one RMSNorm per query and key head before the rotation (``cfg.qk_norm``).

``LlamaTransformer.forward(tokens, cache=None, *, attention_mask=None)`` is the one forward pass,
and it meets a cache as GPT-2's does (the cache protocol, solutions/kv_cache.py and
docs/design.md): ``cache.prepare`` once says which tokens are new, at which positions, and which
keys each may see; every attention hands its new (rotated) keys and values to ``cache.update`` and
reads what it returns; ``cache.commit`` ends the step. So part 9's ``LlamaCache`` and rotating
sink cache, part 4's ``KeyValueCache`` (padding included) and part 6's static cache all run it.
Parameter names follow TransformerLens; ``sampling_course.llama_weights`` converts Hugging
Face's LlamaForCausalLM and Qwen3ForCausalLM weights to them and back.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sampling_course.llama_config import LlamaConfig

from .kv_cache import CacheStep, GrowingCache, KeyValueCache, step_after


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * w over the last dimension (d_model, or d_head for q/k norms)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.w = nn.Parameter(torch.ones(size))

    def forward(self, x: Float[Tensor, "... size"]) -> Float[Tensor, "... size"]:
        raise NotImplementedError()


class Rotary(nn.Module):
    """Rotary position embeddings, in Hugging Face's "rotate half" layout.

    Dimension i of a head is paired with dimension i + d_head/2 (not with its neighbour), and
    the pair is rotated by the angle position * inv_freq[i]. Llama's and Qwen3's checkpoints
    are stored for this pairing.
    """

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        # One frequency per pair, from 1 (fast, local) down to about 1/rotary_base (slow, global).
        exponents = torch.arange(0, cfg.d_head, 2, dtype=torch.float32) / cfg.d_head
        self.register_buffer("inv_freq", 1.0 / cfg.rotary_base**exponents, persistent=False)

    def cos_sin(
        self, positions: Int[Tensor, "*rows pos"]
    ) -> tuple[Float[Tensor, "*rows pos d_head"], Float[Tensor, "*rows pos d_head"]]:
        """cos and sin of every position's angles, each angle written twice (once per half)."""
        angles = positions.to(self.inv_freq.device, torch.float32)[..., None] * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()

    def forward(
        self, x: Float[Tensor, "batch pos heads d_head"], offset: int | Int[Tensor, "batch_or_1 pos"] = 0
    ) -> Float[Tensor, "batch pos heads d_head"]:
        """Rotate each head of x at positions offset, offset + 1, ... (an int: the tokens already cached), or at
        each token's own position (a tensor, as a cache's step gives them: rows may differ, as with padding)."""
        # Hint: offset is an int (positions offset, offset + 1, ...) or already the positions, (batch_or_1, pos).
        raise NotImplementedError()


class LlamaCache:
    """Each layer's keys (already rotated) and values, (batch, seq_len, n_key_value_heads, d_head).

    Only the key/value heads are stored: grouped-query attention's saving is in here. A cache of the
    protocol, like part 4's: ``model(tokens, cache)`` takes the whole sequence so far, runs the
    tokens past ``seq_len`` at the positions after it, and returns ``(logits, the cache)``, filled in
    place. With an ``attention_mask`` (left padding), positions count each row's real tokens.
    """

    def __init__(self, n_layers: int):
        self.keys: list[Tensor | None] = [None] * n_layers
        self.values: list[Tensor | None] = [None] * n_layers

    @property
    def seq_len(self) -> int:
        """How many positions are cached."""
        return 0 if self.keys[0] is None else self.keys[0].shape[1]

    def prepare(self, tokens: Int[Tensor, "batch pos"], attention_mask: Int[Tensor, "batch pos"] | None = None) -> CacheStep:
        """The tokens past ``seq_len``, at the positions after the cached ones (part 4's step)."""
        if tokens.shape[1] <= self.seq_len:
            raise ValueError(f"tokens has {tokens.shape[1]} positions but the cache already holds {self.seq_len}: pass "
                             "the whole sequence so far, with at least one position not cached yet")
        return step_after(self.seq_len, tokens, attention_mask)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append this step's keys and values to layer ``layer``'s; return all of them."""
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=1)
            v = torch.cat([self.values[layer], v], dim=1)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def commit(self) -> "LlamaCache":
        return self


class GroupedQueryAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int = 0):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        n, kv, d, h = cfg.n_heads, cfg.n_key_value_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.empty(n, d, h))
        self.W_K = nn.Parameter(torch.empty(kv, d, h))
        self.W_V = nn.Parameter(torch.empty(kv, d, h))
        self.W_O = nn.Parameter(torch.empty(n, h, d))
        for weight in (self.W_Q, self.W_K, self.W_V, self.W_O):
            nn.init.normal_(weight, std=cfg.init_range)
        self.q_norm = RMSNorm(h, cfg.eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(h, cfg.eps) if cfg.qk_norm else None
        self.rotary = Rotary(cfg)

    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"],
        offset: int | Int[Tensor, "batch_or_1 pos"] = 0,
        cache: LlamaCache | None = None,
        mask: Bool[Tensor, "batch_or_1 1 pos key_pos"] | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        """Causal attention of x's positions (offset, offset + 1, ..., or the positions given) to themselves and to
        the cached ones; ``cache.update(self.layer, k, v)`` stores the new keys and values and returns every key
        and value to attend to, ``mask`` (from the cache's step) hides the keys it says False to."""
        raise NotImplementedError()

    def apply_causal_mask(
        self, scores: Float[Tensor, "batch n_heads query_pos key_pos"], mask: Bool[Tensor, "batch_or_1 1 query_pos key_pos"] | None = None
    ) -> Float[Tensor, "batch n_heads query_pos key_pos"]:
        """The family's one mask: hide every key after its query (the queries are the last ``query_pos`` of the
        ``key_pos`` keys), and every key ``mask`` says False to (a pad, a key a cache's step hides)."""
        # Hint: query i may see key j when j <= i + (key_pos - query_pos), and where mask (if any) is True.
        raise NotImplementedError()


class SwiGLU(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.W_gate = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        for weight in (self.W_gate, self.W_in, self.W_out):
            nn.init.normal_(weight, std=cfg.init_range)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """W_out(silu(x W_gate) * (x W_in)): the gate decides, per hidden unit, how much of x W_in passes."""
        raise NotImplementedError()


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int = 0):
        super().__init__()
        self.ln1 = RMSNorm(cfg.d_model, cfg.eps)
        self.attn = GroupedQueryAttention(cfg, layer)
        self.ln2 = RMSNorm(cfg.d_model, cfg.eps)
        self.mlp = SwiGLU(cfg)

    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        offset: int | Int[Tensor, "batch_or_1 pos"] = 0,
        cache: LlamaCache | None = None,
        mask: Bool[Tensor, "batch_or_1 1 pos key_pos"] | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        resid_mid = resid_pre + self.attn(self.ln1(resid_pre), offset, cache, mask)
        return resid_mid + self.mlp(self.ln2(resid_mid))


class LlamaTransformer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        if not isinstance(cfg, LlamaConfig):
            raise TypeError(f"LlamaTransformer takes a LlamaConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))
        self.blocks = nn.ModuleList([LlamaBlock(cfg, layer) for layer in range(cfg.n_layers)])
        self.ln_final = RMSNorm(cfg.d_model, cfg.eps)
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab))
        nn.init.normal_(self.W_E, std=cfg.init_range)
        nn.init.normal_(self.W_U, std=cfg.init_range)

    def new_cache(self) -> LlamaCache:
        return LlamaCache(self.cfg.n_layers)

    def forward(
        self,
        tokens: Int[Tensor, "batch pos"],
        cache: LlamaCache | KeyValueCache | Any | None = None,
        *,
        attention_mask: Int[Tensor, "batch pos"] | None = None,
    ):
        """Logits at every position of ``tokens``.

        With a cache (any cache of the protocol: part 9's ``LlamaCache`` and rotating sink cache, part 4's
        ``KeyValueCache``, part 6's static cache), ``tokens`` is the whole sequence so far; the cache says which
        of its tokens are new, and the result is ``(their logits, the cache's commit)``. ``attention_mask`` (1 at
        real tokens, 0 at left padding) makes each row's positions count its real tokens and hides its pads.
        """
        step_cache = open_cache(self, tokens, cache, attention_mask)  # None, or a cache of the protocol
        # Hint: without a cache every token is new, at positions 0, 1, ...; with one, step_cache.prepare(tokens,
        raise NotImplementedError()
        return logits if cache is None else (logits, step_cache.commit())


def open_cache(
    model: LlamaTransformer, tokens: Int[Tensor, "batch pos"], cache: Any, attention_mask: Int[Tensor, "batch pos"] | None
) -> Any:
    """The cache ``LlamaTransformer.forward`` runs ``tokens`` through, after checking the inputs: None without a
    cache and without padding; part 4's ``KeyValueCache`` (a tensor) through a ``GrowingCache`` (a padded batch
    without a cache starts from an empty one); any other cache must speak the protocol itself."""
    if not isinstance(tokens, Tensor) or tokens.ndim != 2:
        raise ValueError(f"tokens must be (batch, pos), got shape {tuple(getattr(tokens, 'shape', ()))}")
    if attention_mask is not None and (not isinstance(attention_mask, Tensor) or attention_mask.shape != tokens.shape):
        raise ValueError(f"attention_mask must be a tensor shaped like tokens {tuple(tokens.shape)} (1 = real token, "
                         f"0 = padding), got {getattr(attention_mask, 'shape', type(attention_mask).__name__)}")
    shape = model.cfg.cache_config()  # part 4's and 6's caches: the key/value heads' shape
    if cache is None:
        if attention_mask is None:
            return None
        cache = KeyValueCache.new_empty(shape, tokens.shape[0], tokens.device, model.W_E.dtype)
    if isinstance(cache, Tensor):  # part 4's KeyValueCache, through the GrowingCache of the module that made it
        grow = GrowingCache if isinstance(cache, KeyValueCache) else getattr(sys.modules[type(cache).__module__], "GrowingCache", None)
        if grow is None or not callable(getattr(cache, "check_compatible", None)):
            raise TypeError(f"a tensor cache must be part 4's KeyValueCache, got {type(cache).__name__}")
        cache = cache.on_device_of(model.W_E)
        cache.check_compatible(shape, tokens)
        return grow(cache)
    if not all(callable(getattr(cache, name, None)) for name in ("prepare", "update", "commit")):
        raise TypeError("cache must be a KeyValueCache or a cache with prepare, update and commit (LlamaCache, part 6's "
                        f"caches), got {type(cache).__name__}")
    if callable(getattr(cache, "check_compatible", None)):
        cache.check_compatible(shape, tokens)
    return cache


@torch.inference_mode()
def greedy(model: LlamaTransformer, tokens: Int[Tensor, "batch pos"], max_new_tokens: int) -> Int[Tensor, "batch total"]:
    """The prompt followed by ``max_new_tokens`` argmax tokens, one cached step each."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    cache = model.new_cache()
    logits, cache = model(tokens, cache)
    out = tokens
    for _ in range(max_new_tokens):
        next_token = logits[:, -1].argmax(dim=-1, keepdim=True)
        out = torch.cat([out, next_token], dim=1)
        logits, cache = model(out, cache)  # the whole sequence so far: the cache runs the new token only
    return out
