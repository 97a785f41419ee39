"""Part 6: the fast path, the model's one forward pass made faster where it counts.

A one-token decode step reads every weight of the model once and does little arithmetic
with each, so it is bound by memory bandwidth; the fast path's job is to add as little as
possible on top of that. Part 6's caches already remove the copies of the cache (a static
buffer written in place); what is left is the model's own work, and the first place to look
is attention's three projections. Part 1 computes queries, keys and values as three matmuls
over weights shaped ``(n_heads, d_model, d_head)``; one ``(d_model, 3 * n_heads * d_head)``
matrix gives all three in one matmul, one sweep over the weights and one kernel launch.

The fused matrix is made once, when the weights are loaded (``fuse_at_load``, as gpt-fast
fuses its QKV weights in a load hook), never at each step, and ``Attention.forward`` uses it
when it is there: the same forward pass, one matmul instead of three.
"""

from __future__ import annotations

from dataclasses import dataclass

import einops
import torch
import torch.nn as nn
from jaxtyping import Float
from torch import Tensor


@dataclass
class FusedAttention:
    """One layer's attention weights in the layout the fast path reads."""

    W_QKV: Float[Tensor, "d_model qkv"]  # qkv = 3 * n_heads * d_head: queries, keys, values side by side
    b_QKV: Float[Tensor, "qkv"]
    W_O: Float[Tensor, "heads_d_head d_model"]  # heads_d_head = n_heads * d_head
    b_O: Float[Tensor, "d_model"]


def fuse_qkv(attn) -> FusedAttention:
    """W_Q, W_K and W_V as one ``(d_model, 3 * n_heads * d_head)`` matrix, and W_O flattened.

    Columns are ordered (Q, K, V), then head, then d_head, so that the fused output
    ``x @ W_QKV + b_QKV`` of shape ``(..., 3 * n_heads * d_head)`` views as
    ``(..., 3, n_heads, d_head)``. One matmul reads the three weights in one sweep instead
    of three, and W_O as ``(n_heads * d_head, d_model)`` sums the heads inside its matmul.
    """
    ### BEGIN SOLUTION
    # Hint: rearrange each (n_heads, d_model, d_head) weight to (d_model, n_heads * d_head), then cat the three.
    W_QKV = torch.cat([einops.rearrange(W, "n d h -> d (n h)") for W in (attn.W_Q, attn.W_K, attn.W_V)], dim=1)
    b_QKV = torch.cat([b.flatten() for b in (attn.b_Q, attn.b_K, attn.b_V)])
    W_O = einops.rearrange(attn.W_O, "n h d -> (n h) d")
    ### END SOLUTION
    # Contiguous: a matmul streams a contiguous weight fastest (these copies are made once per model).
    return FusedAttention(W_QKV.detach().contiguous(), b_QKV.detach().contiguous(), W_O.detach().contiguous(), attn.b_O.detach())


def fuse_at_load(model: nn.Module) -> nn.Module:
    """Give every ``Attention`` of ``model`` its fused QKV weights now, and again whenever its weights change.

    gpt-fast's load hook fuses the weights once, as they are loaded. Here the fused copy is made
    at once, and remade at the next forward pass when a weight has been changed in place
    (loading a state dict, training: either bumps its ``_version``) or moved or cast.
    The copies are detached: the fast path is for generation, and no gradient flows through it.
    Returns ``model``.
    """
    for module in model.modules():
        if all(hasattr(module, name) for name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "fused_qkv")):
            fused = FusedQKV()
            fused.refresh(module)  # fused now, at load (before the attribute is set, so a failure leaves the model as it was)
            module.fused_qkv = fused
    return model


class FusedQKV:
    """An ``Attention``'s queries, keys and values in one matmul, with ``fuse_qkv``'s weights (remade when stale)."""

    def __init__(self):
        self.key: tuple = ()
        self.fused: FusedAttention | None = None

    def refresh(self, attn: nn.Module) -> FusedAttention:
        """``attn``'s fused weights, made again only when one of its weights changed since the last call."""
        weights = (attn.W_Q, attn.W_K, attn.W_V, attn.b_Q, attn.b_K, attn.b_V, attn.W_O, attn.b_O)
        key = tuple((w.data_ptr(), w._version, w.dtype) for w in weights)
        if key != self.key or self.fused is None:
            self.fused, self.key = fuse_qkv(attn), key
        return self.fused

    def __call__(
        self, attn: nn.Module, x: Float[Tensor, "batch pos d_model"]
    ) -> tuple[Float[Tensor, "batch pos n_heads d_head"], Float[Tensor, "batch pos n_heads d_head"], Float[Tensor, "batch pos n_heads d_head"]]:
        """``attn``'s queries, keys and values of ``x``, each ``(batch, pos, n_heads, d_head)``."""
        fused = self.refresh(attn)
        n_heads, d_head = attn.W_Q.shape[0], attn.W_Q.shape[2]
        batch, pos, d_model = x.shape
        ### BEGIN SOLUTION
        # Hint: one torch.addmm(bias, rows, W_QKV) over (batch * pos) rows, then view as (batch, pos, 3, n_heads, d_head).
        # addmm: the bias and the matmul in one call, on the positions as rows.
        qkv = torch.addmm(fused.b_QKV, x.reshape(batch * pos, d_model), fused.W_QKV)
        q, k, v = qkv.view(batch, pos, 3, n_heads, d_head).unbind(2)
        ### END SOLUTION
        return q, k, v
