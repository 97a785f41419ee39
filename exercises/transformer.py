# GENERATED from solutions/transformer.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: 9250a47d0ee6c7aca5f32fcc8fe3379b361bda501dbdfea1ff547d46569e89e9
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

import einops
import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from sampling_course.config import Config
from sampling_course.devices import check_same_device

from .kv_cache import KeyValueCache

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
    """GPT-2's GELU: the tanh approximation, not the exact erf form."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3.0))))


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

    def forward(
        self,
        normalized_resid_pre: Float[Tensor, "batch pos d_model"],
        past_kv: Float[Tensor, "2 batch past_pos n_heads d_head"] | None = None,
    ):
        """Causal multi-head self-attention.

        Without ``past_kv`` this returns the attention output. With ``past_kv`` (the keys
        and values of earlier positions, from a KV cache) the input holds only the new
        positions; it returns ``(output, kv)`` where ``kv`` holds the keys and values of
        all positions so far, ready to be cached.
        """
        raise NotImplementedError()
        if past_kv is not None:
            # Hint: earlier positions come first, so the new keys go after the cached ones.
            raise NotImplementedError()
        # Hint: scores are q . k / sqrt(d_head); mask them before the softmax.
        raise NotImplementedError()
        return out if past_kv is None else (out, kv)

    def apply_causal_mask(
        self, attn_scores: Float[Tensor, "batch n_heads query_pos key_pos"]
    ) -> Float[Tensor, "batch n_heads query_pos key_pos"]:
        """Replace the score of every key that lies after its query with IGNORE.

        The last ``query_pos`` queries sit at the end of the ``key_pos`` keys, so the
        same code works when earlier keys come from a cache (query_pos < key_pos).
        """
        # Hint: query i may look at key j exactly when j <= i + (key_pos - query_pos).
        raise NotImplementedError()

    def masked_forward(
        self,
        normalized_resid_pre: Float[Tensor, "batch new_pos d_model"],
        kv: Float[Tensor, "2 batch key_pos n_heads d_head"],
        attention_mask: Int[Tensor, "batch key_pos"],
    ) -> Float[Tensor, "batch new_pos d_model"]:
        """Attention for padded batches: the generation engine's (part 5).

        ``kv`` holds the keys and values of every position so far, its last ``new_pos``
        slots still empty: this fills them, in place, with the new positions' keys and
        values, then lets each new query attend to the keys up to its own position that are
        real tokens (``attention_mask`` 1), never to padding (0).
        """
        # Hint: q, k, v as in forward; k and v go into kv's last slots; pad keys are masked like future keys.
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

    def forward(
        self, normalized_resid_mid: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos d_model"]:
        """Expand to d_mlp, apply gelu_new, project back to d_model."""
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
        past_kv: Float[Tensor, "2 batch past_pos n_heads d_head"] | None = None,
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

    def forward(
        self, normalized_resid_final: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos d_vocab"]:
        """Map the final residual stream to one logit per vocabulary entry."""
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
        kv_cache: KeyValueCache | None = None,
        *,
        attention_mask: Int[Tensor, "batch pos"] | None = None,
    ):
        """Logits for the next token at every position of ``tokens``.

        With a ``kv_cache``, ``tokens`` is still the whole sequence so far, but only the
        positions the cache does not hold yet are run; the result is
        ``(logits for those positions, the cache extended with them)``.

        ``attention_mask`` (part 5) has the shape of ``tokens``: 1 at real tokens, 0 at
        padding. Padding is never attended and positions count real tokens only, so each
        row's logits at its real tokens are those of that row run alone.
        """
        if kv_cache is not None or attention_mask is not None:
            return self.route(tokens, kv_cache, attention_mask)  # a cache (parts 4 and 6) or padding (part 5)
        check_tokens(tokens, self.embed.W_E, self.cfg.n_ctx)
        raise NotImplementedError()

    def route(
        self,
        tokens: Int[Tensor, "batch pos"],
        kv_cache: KeyValueCache | None,
        attention_mask: Int[Tensor, "batch pos"] | None,
    ):
        """``forward`` with a cache or a padding mask: checks the inputs, then picks the pass.

        A padded batch runs ``padded_forward`` (part 5), with or without part 4's cache; part
        4's cache alone runs ``cached_forward``; any other cache (part 6's, solutions/caches.py
        and solutions/sink_cache.py) runs the whole pass itself, on the fast path.
        """
        # Inputs must be where the weights are: say so here, not in an error from deep inside.
        weight = self.embed.W_E
        check_tokens(tokens, weight, n_ctx=None if kv_cache is not None else self.cfg.n_ctx)
        if attention_mask is not None and isinstance(attention_mask, Tensor):
            check_same_device("the attention_mask", attention_mask.device, weight.device)
        if kv_cache is not None and not isinstance(kv_cache, KeyValueCache):
            if not callable(getattr(kv_cache, "forward", None)):
                raise TypeError(f"kv_cache must be a KeyValueCache (or a cache of part 6), got {type(kv_cache).__name__}")
            if attention_mask is not None:
                check_attention_mask(attention_mask, tokens)
            return kv_cache.forward(self, tokens, attention_mask)
        if kv_cache is not None:
            kv_cache = kv_cache.on_device_of(weight)
            kv_cache.check_compatible(self.cfg, tokens)
        if attention_mask is not None:
            check_attention_mask(attention_mask, tokens)
            return self.padded_forward(tokens, attention_mask, kv_cache)
        return self.cached_forward(tokens, kv_cache)

    def cached_forward(
        self, tokens: Int[Tensor, "batch pos"], kv_cache: KeyValueCache
    ) -> tuple[Float[Tensor, "batch new_pos d_vocab"], KeyValueCache]:
        """Run only the positions of ``tokens`` that ``kv_cache`` does not hold yet."""
        # Hint: the new tokens sit at positions seq_len, seq_len + 1, ... of the sequence.
        raise NotImplementedError()

    def padded_forward(
        self,
        tokens: Int[Tensor, "batch pos"],
        attention_mask: Int[Tensor, "batch pos"],
        kv_cache: KeyValueCache | None = None,
    ):
        """The forward pass of a padded batch (part 5), with or without a cache.

        ``attention_mask`` covers every position of ``tokens`` (cached ones too). Returns
        what ``forward`` returns: the logits, or with ``kv_cache`` the logits of the new
        positions and the extended cache.

        Each new token is embedded at its own position among its row's real tokens
        (``position_ids_from_mask``), so rows need different positions. ``PosEmbed`` gives
        every row the same positions ``offset .. offset + pos - 1``, so it cannot do that:
        index its weights with the positions instead, ``self.pos_embed.W_pos[positions]``.
        The blocks' own ``forward`` has no mask argument: call each block's ``ln1``,
        ``attn.masked_forward``, ``ln2`` and ``mlp`` yourself.
        """
        return_cache = kv_cache is not None
        if kv_cache is None:  # start from an empty cache: one code path with and without one
            kv_cache = KeyValueCache.new_empty(self.cfg, tokens.shape[0], tokens.device, self.embed.W_E.dtype)
        past = kv_cache.seq_len
        # Room for the new positions: the cache is copied once, then each layer fills its new slots in place.
        cache = kv_cache.grown(tokens.shape[1])
        # Hint: embed each new token at its position among real tokens (position_ids_from_mask), not at its column.
        raise NotImplementedError()
        return (logits, cache) if return_cache else logits


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
