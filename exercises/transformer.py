# GENERATED from solutions/transformer.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: 303c184bc9a5d252103bf548c5e260d37e28c77b017f7d8c1e7fe0af6f380d88
"""Part 1: GPT-2 from scratch.

One small module per concept, in the order the residual stream meets them:

    tokens -> Embed + PosEmbed -> [TransformerBlock] * n_layers -> LayerNorm -> Unembed -> logits

Each block reads from the residual stream and adds its result back:

    resid_mid  = resid_pre + Attention(LayerNorm(resid_pre))
    resid_post = resid_mid + MLP(LayerNorm(resid_mid))

Parameter names follow TransformerLens (W_Q, b_Q, W_in, ...), so the weights of the
real GPT-2 load straight in through ``sampling_course.weights.demo_state_dict``.
"""

from __future__ import annotations

import math
from typing import Any

import einops
import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from sampling_course.config import Config
from sampling_course.devices import check_same_device

from .kv_cache import GrowingCache, KeyValueCache, LayerCache

# Written into masked attention scores. Large and negative rather than -inf: a softmax
# written out by hand, as in Attention.forward, turns a row of -inf into 0 / 0 = NaN.
# (PyTorch's scaled_dot_product_attention returns 0 for such a row since 2.5; other and
# older kernels may not, so a finite value is the portable choice, as Hugging Face's
# torch.finfo(dtype).min is.) It stays finite in float32 and bfloat16 (-99840), but not in
# float16, whose largest magnitude is 65504: a model cast to fp16 turns this buffer into
# -inf. That is harmless while every row keeps a visible key, as a causal mask's rows do;
# torch.finfo(dtype).min is finite in every dtype.
IGNORE = -1e5


def gelu_new(x: Float[Tensor, "..."]) -> Float[Tensor, "..."]:
    """GPT-2's GELU: the tanh approximation, not the exact erf form.

    0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3))), which PyTorch computes in one
    kernel as F.gelu(x, approximate="tanh"): written out, it is seven kernels over the MLP's
    widest activations at every layer, a cost a decode step notices (part 6).
    """
    return F.gelu(x, approximate="tanh")


class LayerNorm(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, residual: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """Centre each position's vector, scale it to unit variance, then apply w and b."""
        # Hint: use the biased variance (unbiased=False), and put eps inside the square root.
        raise NotImplementedError()


class Embed(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.W_E = nn.Parameter(torch.empty((cfg.d_vocab, cfg.d_model)))
        nn.init.normal_(self.W_E, std=cfg.init_range)

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        """Look up each token's row of W_E."""
        raise NotImplementedError()


class PosEmbed(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.W_pos = nn.Parameter(torch.empty((cfg.n_ctx, cfg.d_model)))
        nn.init.normal_(self.W_pos, std=cfg.init_range)

    def forward(self, tokens: Int[Tensor, "batch pos"], offset: int = 0) -> Float[Tensor, "batch pos d_model"]:
        """The learned embedding of positions offset..offset+pos-1, the same for every sequence.

        ``offset`` is the number of positions already held in a KV cache (part 4); without
        a cache it is 0 and the positions are simply 0..pos-1.
        """
        raise NotImplementedError()


class Attention(nn.Module):
    IGNORE: Float[Tensor, ""]

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.W_Q = nn.Parameter(torch.empty((cfg.n_heads, cfg.d_model, cfg.d_head)))
        self.W_K = nn.Parameter(torch.empty((cfg.n_heads, cfg.d_model, cfg.d_head)))
        self.W_V = nn.Parameter(torch.empty((cfg.n_heads, cfg.d_model, cfg.d_head)))
        self.W_O = nn.Parameter(torch.empty((cfg.n_heads, cfg.d_head, cfg.d_model)))
        self.b_Q = nn.Parameter(torch.zeros((cfg.n_heads, cfg.d_head)))
        self.b_K = nn.Parameter(torch.zeros((cfg.n_heads, cfg.d_head)))
        self.b_V = nn.Parameter(torch.zeros((cfg.n_heads, cfg.d_head)))
        self.b_O = nn.Parameter(torch.zeros((cfg.d_model)))
        for W in (self.W_Q, self.W_K, self.W_V, self.W_O):
            nn.init.normal_(W, std=cfg.init_range)
        # A buffer, so it follows the module to whatever device and dtype it is moved to.
        self.register_buffer("IGNORE", torch.tensor(IGNORE, dtype=torch.float32), persistent=False)
        # Part 6's fast path sets this (fast_path.fuse_at_load): q, k and v from one fused matmul.
        self.fused_qkv: Any = None

    def forward(
        self,
        normalized_resid_pre: Float[Tensor, "batch pos d_model"],
        past_kv: Float[Tensor, "2 batch past_pos n_heads d_head"] | LayerCache | None = None,
    ):
        """Causal multi-head self-attention.

        Without ``past_kv`` this returns the attention output. With ``past_kv`` the input holds
        only the new positions, and the keys and values of earlier ones come from a cache
        (part 4): ``past_kv`` is this layer's side of the cache (a ``LayerCache``), or ARENA's
        classic tensor of one layer's past keys and values. It returns ``(output, kv)``, where
        ``kv`` holds the keys and values attended to (the classic tensor: all positions so far).
        """
        cache = LayerCache.of(past_kv)
        if self.fused_qkv is not None:  # part 6's fast path: one matmul for q, k and v (solutions/fast_path.py)
            q, k, v = self.fused_qkv(self, normalized_resid_pre)
        else:
            raise NotImplementedError()
        if cache is not None:
            # Hint: the cache keeps the new keys and values and returns every key and value to attend to.
            raise NotImplementedError()
        if self.fused_qkv is not None:  # part 6's fast path: attention and W_O as fused kernels (fast_path.FusedQKV.attend)
            out = self.fused_qkv.attend(self, q, k, v, None if cache is None else cache.mask)
            return out if cache is None else (out, cache.kv)
        # Hint: scores are q . k / sqrt(d_head); mask them before the softmax.
        raise NotImplementedError()
        if cache is not None and cache.mask is not None:
            # Hint: a key the cache hides (padding, part 5) is masked like a future key.
            raise NotImplementedError()
        raise NotImplementedError()
        return out if cache is None else (out, cache.kv)

    def apply_causal_mask(
        self, attn_scores: Float[Tensor, "batch n_heads query_pos key_pos"]
    ) -> Float[Tensor, "batch n_heads query_pos key_pos"]:
        """Replace the score of every key that lies after its query with IGNORE.

        The last ``query_pos`` queries sit at the end of the ``key_pos`` keys, so the
        same code works when earlier keys come from a cache (query_pos < key_pos).
        """
        # Hint: query i may look at key j exactly when j <= i + (key_pos - query_pos).
        raise NotImplementedError()


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.W_in = nn.Parameter(torch.empty((cfg.d_model, cfg.d_mlp)))
        self.W_out = nn.Parameter(torch.empty((cfg.d_mlp, cfg.d_model)))
        self.b_in = nn.Parameter(torch.zeros((cfg.d_mlp)))
        self.b_out = nn.Parameter(torch.zeros((cfg.d_model)))
        nn.init.normal_(self.W_in, std=cfg.init_range)
        nn.init.normal_(self.W_out, std=cfg.init_range)
        # Part 6's fast path sets this (fast_path.fuse_at_load): the same matmuls on weights packed for the CPU's kernel.
        self.packed: Any = None

    def forward(
        self, normalized_resid_mid: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos d_model"]:
        """Expand to d_mlp, apply gelu_new, project back to d_model."""
        if self.packed is not None:  # part 6's fast path (fast_path.PackedMLP); None where it does not apply
            out = self.packed(self, normalized_resid_mid)
            if out is not None:
                return out
        raise NotImplementedError()


class TransformerBlock(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.ln1 = LayerNorm(cfg)
        self.attn = Attention(cfg)
        self.ln2 = LayerNorm(cfg)
        self.mlp = MLP(cfg)

    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        past_kv: Float[Tensor, "2 batch past_pos n_heads d_head"] | LayerCache | None = None,
    ):
        """Pre-LayerNorm block: attention then MLP, each added back to the residual stream.

        With ``past_kv`` it returns ``(resid_post, kv)``, passing the attention's keys and
        values through (see ``Attention.forward``).
        """
        if past_kv is not None:
            raise NotImplementedError()
        raise NotImplementedError()


class Unembed(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.W_U = nn.Parameter(torch.empty((cfg.d_model, cfg.d_vocab)))
        nn.init.normal_(self.W_U, std=cfg.init_range)
        # GPT-2 has no unembedding bias; we keep one (at zero) so other models fit too.
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab), requires_grad=False)
        # Part 6's fast path sets this (fast_path.fuse_at_load): the same matmul on W_U packed for the CPU's kernel.
        self.packed: Any = None

    def forward(
        self, normalized_resid_final: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos d_vocab"]:
        """Map the final residual stream to one logit per vocabulary entry."""
        if self.packed is not None:  # part 6's fast path (fast_path.PackedUnembed); None where it does not apply
            out = self.packed(self, normalized_resid_final)
            if out is not None:
                return out
        raise NotImplementedError()


def position_ids_from_mask(attention_mask: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
    """Each token's position among the real tokens of its row (part 5).

    ``attention_mask`` is 1 at real tokens and 0 at padding. The real tokens of a row get
    positions 0, 1, 2, ... whatever padding comes before them, so a left-padded prompt is
    embedded exactly as it would be alone. Padding gets position 0, as in Hugging Face;
    it is never attended, so its position changes no real token's logits.
    """
    # Hint: a running count of the real tokens so far, minus one, is each real token's position.
    raise NotImplementedError()


class DemoTransformer(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.pos_embed = PosEmbed(cfg)
        self.blocks = nn.ModuleList([TransformerBlock(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = LayerNorm(cfg)
        self.unembed = Unembed(cfg)

    def forward(
        self,
        tokens: Int[Tensor, "batch pos"],
        kv_cache: KeyValueCache | Any | None = None,
        *,
        attention_mask: Int[Tensor, "batch pos"] | None = None,
        logits_to_keep: int | Tensor = 0,
    ):
        """Logits for the next token at every position of ``tokens``.

        With a ``kv_cache`` (part 4's ``KeyValueCache`` or any cache of the protocol:
        part 6's static and sink caches, ...), ``tokens`` is still the whole sequence so far,
        but only the positions the cache does not hold yet are run; the result is
        ``(logits for those positions, the cache extended with them)``.

        ``attention_mask`` (part 5) has the shape of ``tokens``: 1 at real tokens, 0 at
        padding. Padding is never attended and positions count real tokens only, so each
        row's logits at its real tokens are those of that row run alone.

        ``logits_to_keep`` (Hugging Face's name and forms): the logits of the last ``logits_to_keep``
        positions only (0, the default, keeps all), or, as a 1-D tensor of position indices, of
        those positions. A prefill whose caller reads the last position's logits only (part 5's
        engine), or the last of each prompt packed in one row (part 10's), skips the unembedding
        of the others, the largest matmul of the model, on a cache's pass.
        """
        check_logits_to_keep(logits_to_keep, self.embed.W_E.device)
        cache = open_cache(self, tokens, kv_cache, attention_mask, logits_to_keep)
        if cache is None:
            raise NotImplementedError()
        # Hint: the cache says which tokens are new and at which positions; each block gets its layer of the cache.
        # Hint: leave the new positions' residual stream in `residual`: the given code after this unembeds it.
        raise NotImplementedError()
        residual = kept_positions(residual, logits_to_keep)  # only the positions whose logits the caller reads
        logits = self.unembed(self.ln_final(residual))
        return logits if kv_cache is None else (logits, cache.commit())


def open_cache(
    model: DemoTransformer,
    tokens: Int[Tensor, "batch pos"],
    kv_cache: KeyValueCache | Any | None,
    attention_mask: Int[Tensor, "batch pos"] | None,
    logits_to_keep: int | Tensor = 0,
) -> Any:
    """The cache ``DemoTransformer.forward`` runs ``tokens`` through, after checking the inputs.

    None without a cache, without padding and with every position's logits (part 1's pass).
    Part 4's ``KeyValueCache``, a tensor, becomes a ``GrowingCache`` (a padded batch, or a pass
    that keeps only the last logits, without a cache starts from an empty one); any other cache
    must speak the protocol itself (``prepare``, ``update``, ``commit``).
    """
    weight = model.embed.W_E
    # Inputs must be where the weights are: say so here, not in an error from deep inside.
    check_tokens(tokens, weight, n_ctx=None if kv_cache is not None else model.cfg.n_ctx)
    if attention_mask is not None:
        if isinstance(attention_mask, Tensor):
            check_same_device("the attention_mask", attention_mask.device, weight.device)
        check_attention_mask(attention_mask, tokens)
    if kv_cache is None:
        if attention_mask is None and isinstance(logits_to_keep, int) and logits_to_keep == 0:
            return None
        kv_cache = KeyValueCache.new_empty(model.cfg, tokens.shape[0], tokens.device, weight.dtype)
    if isinstance(kv_cache, KeyValueCache):
        kv_cache = kv_cache.on_device_of(weight)
        kv_cache.check_compatible(model.cfg, tokens)
        return GrowingCache(kv_cache, model.cfg.n_ctx)
    if not all(callable(getattr(kv_cache, name, None)) for name in ("prepare", "update", "commit")):
        raise TypeError(
            "kv_cache must be a KeyValueCache or a cache with prepare, update and commit (part 6's caches), "
            f"got {type(kv_cache).__name__}"
        )
    if callable(getattr(kv_cache, "check_compatible", None)):
        kv_cache.check_compatible(model.cfg, tokens)
    return kv_cache


def check_logits_to_keep(logits_to_keep: int | Tensor, device: torch.device) -> None:
    if isinstance(logits_to_keep, Tensor):
        if logits_to_keep.ndim != 1 or logits_to_keep.dtype not in (torch.int32, torch.int64):
            raise ValueError("logits_to_keep as a tensor must be 1-D int64 (or int32) indices of the positions to "
                             f"keep, got {logits_to_keep.dtype} of shape {tuple(logits_to_keep.shape)}")
        if logits_to_keep.device.type != "cpu":  # indices on the CPU index a tensor anywhere
            check_same_device("logits_to_keep", logits_to_keep.device, device)
        return
    if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 0:
        raise ValueError("logits_to_keep must be an integer >= 0 (0 keeps every position's logits) or a 1-D tensor of "
                         f"position indices, got {logits_to_keep!r}")


def kept_positions(
    residual: Float[Tensor, "batch pos d_model"], logits_to_keep: int | Tensor
) -> Float[Tensor, "batch kept d_model"]:
    """The positions of ``residual`` whose logits the caller reads (``DemoTransformer.forward``'s ``logits_to_keep``)."""
    if isinstance(logits_to_keep, Tensor):
        return residual[:, logits_to_keep]
    return residual[:, -logits_to_keep:] if logits_to_keep else residual


def check_attention_mask(attention_mask: Tensor, tokens: Tensor) -> None:
    """Fail loudly on a mask that cannot describe ``tokens``' padding."""
    if not isinstance(attention_mask, Tensor):
        raise TypeError(f"attention_mask must be a tensor of 0s and 1s, got {type(attention_mask).__name__}")
    if attention_mask.shape != tokens.shape:
        raise ValueError(
            f"attention_mask must have the shape of tokens {tuple(tokens.shape)} (1 = real token, 0 = padding), "
            f"got {tuple(attention_mask.shape)}"
        )
    if attention_mask.is_floating_point() or not ((attention_mask == 0) | (attention_mask == 1)).all():
        raise ValueError("attention_mask must hold integers (or booleans) 0 and 1 only: 1 = real token, 0 = padding")


def check_tokens(tokens: Tensor, weight: Tensor, n_ctx: int | None = None) -> None:
    """Fail loudly on tokens the model cannot run: not (batch, pos), not where ``weight`` (a
    weight of the model) lives, or, when ``n_ctx`` is given, longer than the model's context."""
    if tokens.ndim != 2:
        raise ValueError(f"tokens must have shape (batch, pos), got {tuple(tokens.shape)}")
    check_same_device("the tokens", tokens.device, weight.device)
    if n_ctx is not None and tokens.shape[1] > n_ctx:
        raise ValueError(
            f"tokens has {tokens.shape[1]} positions but the model has only n_ctx={n_ctx}; keep the last n_ctx tokens"
        )
