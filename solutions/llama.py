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
Parameter names follow TransformerLens; ``sampling_course.llama_weights`` converts Hugging
Face's LlamaForCausalLM and Qwen3ForCausalLM weights to them and back.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from sampling_course.llama_config import LlamaConfig


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * w over the last dimension (d_model, or d_head for q/k norms)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.w = nn.Parameter(torch.ones(size))

    def forward(self, x: Float[Tensor, "... size"]) -> Float[Tensor, "... size"]:
        ### BEGIN SOLUTION
        # The statistic in float32 whatever the model's dtype (as Hugging Face does): squares of
        # bfloat16 values lose most of their digits.
        x32 = x.float()
        normalized = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return normalized.to(x.dtype) * self.w
        ### END SOLUTION


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

    def cos_sin(self, positions: Int[Tensor, "pos"]) -> tuple[Float[Tensor, "pos d_head"], Float[Tensor, "pos d_head"]]:
        """cos and sin of every position's angles, each angle written twice (once per half)."""
        angles = positions.to(self.inv_freq.device, torch.float32)[:, None] * self.inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()

    def forward(
        self, x: Float[Tensor, "batch pos heads d_head"], offset: int = 0
    ) -> Float[Tensor, "batch pos heads d_head"]:
        """Rotate each head of x at positions offset, offset + 1, ... (offset: tokens already cached)."""
        ### BEGIN SOLUTION
        positions = torch.arange(offset, offset + x.shape[1], device=x.device)
        cos, sin = self.cos_sin(positions)
        cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over the heads
        x32 = x.float()
        first, second = x32.chunk(2, dim=-1)
        rotated_half = torch.cat((-second, first), dim=-1)  # (x1, x2) -> (-x2, x1): a quarter turn per pair
        return (x32 * cos + rotated_half * sin).to(x.dtype)
        ### END SOLUTION


class LlamaCache:
    """Each layer's keys (already rotated) and values, (batch, seq_len, n_key_value_heads, d_head).

    Only the key/value heads are stored: grouped-query attention's saving is in here.
    """

    def __init__(self, n_layers: int):
        self.keys: list[Tensor | None] = [None] * n_layers
        self.values: list[Tensor | None] = [None] * n_layers

    @property
    def seq_len(self) -> int:
        """How many positions are cached (what the next tokens' positions start from)."""
        return 0 if self.keys[0] is None else self.keys[0].shape[1]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append this step's keys and values to layer ``layer``'s; return all of them."""
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=1)
            v = torch.cat([self.values[layer], v], dim=1)
        self.keys[layer], self.values[layer] = k, v
        return k, v


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
        self, x: Float[Tensor, "batch pos d_model"], offset: int = 0, cache: LlamaCache | None = None
    ) -> Float[Tensor, "batch pos d_model"]:
        """Causal attention of x's positions (offset, offset + 1, ...) to themselves and to the cached ones."""
        ### BEGIN SOLUTION
        q = torch.einsum("bsd,ndh->bsnh", x, self.W_Q)
        k = torch.einsum("bsd,ndh->bsnh", x, self.W_K)
        v = torch.einsum("bsd,ndh->bsnh", x, self.W_V)
        if self.q_norm is not None:  # Qwen3: normalise each head, then rotate
            q, k = self.q_norm(q), self.k_norm(k)
        # Positions live in q and k only: values carry content, and rotating them would not cancel.
        q, k = self.rotary(q, offset), self.rotary(k, offset)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        # Query head i reads key/value head i // group: each KV head repeated group times in a row.
        group = self.cfg.n_heads // self.cfg.n_key_value_heads
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        scores = torch.einsum("bqnh,bknh->bnqk", q, k) / math.sqrt(self.cfg.d_head)
        query_pos, key_pos = scores.shape[-2:]
        future = torch.ones(query_pos, key_pos, dtype=torch.bool, device=x.device).triu(key_pos - query_pos + 1)
        pattern = scores.masked_fill(future, torch.finfo(scores.dtype).min).softmax(dim=-1)
        z = torch.einsum("bnqk,bknh->bqnh", pattern, v)
        return torch.einsum("bqnh,nhd->bqd", z, self.W_O)
        ### END SOLUTION


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
        ### BEGIN SOLUTION
        return (F.silu(x @ self.W_gate) * (x @ self.W_in)) @ self.W_out
        ### END SOLUTION


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int = 0):
        super().__init__()
        self.ln1 = RMSNorm(cfg.d_model, cfg.eps)
        self.attn = GroupedQueryAttention(cfg, layer)
        self.ln2 = RMSNorm(cfg.d_model, cfg.eps)
        self.mlp = SwiGLU(cfg)

    def forward(
        self, resid_pre: Float[Tensor, "batch pos d_model"], offset: int = 0, cache: LlamaCache | None = None
    ) -> Float[Tensor, "batch pos d_model"]:
        resid_mid = resid_pre + self.attn(self.ln1(resid_pre), offset, cache)
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
        self, tokens: Int[Tensor, "batch pos"], cache: LlamaCache | None = None
    ) -> Float[Tensor, "batch pos d_vocab"]:
        """Logits at every position of ``tokens``; with a cache, ``tokens`` follow the cached ones."""
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be (batch, pos), got shape {tuple(tokens.shape)}")
        ### BEGIN SOLUTION
        # The new tokens come after everything cached: that many positions were already used.
        # (Shifting every position by the same amount would change nothing, since scores depend on
        # distances only; what breaks a cached step is new positions that disagree with the cache's.)
        offset = 0 if cache is None else cache.seq_len
        residual = self.W_E[tokens]
        for block in self.blocks:
            residual = block(residual, offset, cache)
        return self.ln_final(residual) @ self.W_U
        ### END SOLUTION


@torch.inference_mode()
def greedy(model: LlamaTransformer, tokens: Int[Tensor, "batch pos"], max_new_tokens: int) -> Int[Tensor, "batch total"]:
    """The prompt followed by ``max_new_tokens`` argmax tokens, one cached step each."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    cache = model.new_cache()
    logits = model(tokens, cache)
    out = tokens
    for _ in range(max_new_tokens):
        next_token = logits[:, -1].argmax(dim=-1, keepdim=True)
        out = torch.cat([out, next_token], dim=1)
        logits = model(next_token, cache)
    return out
