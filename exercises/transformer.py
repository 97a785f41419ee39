# GENERATED from solutions/transformer.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: 02fe05629d255faf4c0c43bc2e47f81c1ed04dd0b6726121af09930c2b8ddb0c
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
from jaxtyping import Float, Int
from torch import Tensor

from sampling_course.config import Config

# Written into masked attention scores. Large and negative rather than -inf, so that
# softmax never sees a row of -inf (which would give NaN) and the value survives fp16.
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

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        """The learned embedding of each position 0..pos-1, the same for every sequence."""
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
        self, normalized_resid_pre: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos d_model"]:
        """Causal multi-head self-attention."""
        # Hint: scores are q . k / sqrt(d_head); mask them before the softmax.
        raise NotImplementedError()

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

    def forward(self, resid_pre: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """Pre-LayerNorm block: attention then MLP, each added back to the residual stream."""
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


class DemoTransformer(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.pos_embed = PosEmbed(cfg)
        self.blocks = nn.ModuleList([TransformerBlock(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = LayerNorm(cfg)
        self.unembed = Unembed(cfg)

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_vocab"]:
        """Logits for the next token at every position of ``tokens``."""
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape (batch, pos), got {tuple(tokens.shape)}")
        if tokens.shape[1] > self.cfg.n_ctx:
            raise ValueError(
                f"tokens has {tokens.shape[1]} positions but the model has only n_ctx={self.cfg.n_ctx}; "
                "keep the last n_ctx tokens"
            )
        raise NotImplementedError()
