# GENERATED from solutions/fast_path.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: c1e6d3c3aebc1cfcebcaf6b08bf21ff81e99e14efaec88ce3f50091b804e1985
"""Part 6: the fast path, the forward pass that part 6's caches run (and part 6b's captured step).

Part 6's caches run the model themselves: ``DemoTransformer.forward(tokens, kv_cache)``
hands any cache that is not a ``KeyValueCache`` the whole pass, ``kv_cache.forward(model,
tokens, attention_mask)``. They share one forward pass, ``fast_forward``, the fast path:

    tokens -> embed + positions -> per layer: LayerNorm -> one fused QKV matmul
           -> cache.update writes K, V in place, returns the keys to attend
           -> scaled_dot_product_attention -> W_O -> MLP -> ... -> logits

A one-token decode step reads every weight of the model once and does little arithmetic
with each, so it is bound by memory bandwidth; the fast path's job is to add as little as
possible on top of that: no concatenation, no copies of the cache, few small operations.

What the pass needs of a cache is two things: ``cache.fused``, the model's weights in the
layout the pass reads (``fused_weights``), and ``cache.update(layer, k, v)``, which stores
a layer's new keys and values where the cache decides and returns those to attend to.
The static cache (solutions/caches.py) and the sink cache (solutions/sink_cache.py) are
two such caches; part 6b's fixed-shape step (solutions/gpu_decoding.py) runs the same pass
with a third, a ``FusedCache`` whose ``update`` writes at a position held on the device.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

# gelu_new: GPT-2's GELU (the tanh approximation), for fast_forward's MLP.
from .transformer import DemoTransformer, gelu_new


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
    # Hint: rearrange each (n_heads, d_model, d_head) weight to (d_model, n_heads * d_head), then cat the three.
    raise NotImplementedError()
    # Contiguous: a matmul streams a contiguous weight fastest (these copies are made once per model).
    return FusedAttention(W_QKV.detach().contiguous(), b_QKV.detach().contiguous(), W_O.detach().contiguous(), attn.b_O.detach())


@dataclass
class FastLayer:
    """One block's weights as the fast path reads them: plain tensors, with no nn.Module lookups per step."""

    ln1_w: Float[Tensor, "d_model"]
    ln1_b: Float[Tensor, "d_model"]
    attn: FusedAttention
    ln2_w: Float[Tensor, "d_model"]
    ln2_b: Float[Tensor, "d_model"]
    W_in: Float[Tensor, "d_model d_mlp"]
    b_in: Float[Tensor, "d_mlp"]
    W_out: Float[Tensor, "d_mlp d_model"]
    b_out: Float[Tensor, "d_model"]


def fast_layer(block) -> FastLayer:
    return FastLayer(
        block.ln1.w.detach(), block.ln1.b.detach(), fuse_qkv(block.attn), block.ln2.w.detach(), block.ln2.b.detach(),
        block.mlp.W_in.detach(), block.mlp.b_in.detach(), block.mlp.W_out.detach(), block.mlp.b_out.detach(),
    )


# The fast layers of each model, with the version of every block weight they were made from.
_FUSED: "weakref.WeakKeyDictionary[DemoTransformer, tuple[tuple, list[FastLayer]]]" = weakref.WeakKeyDictionary()


def fused_weights(model: DemoTransformer) -> list[FastLayer]:
    """``fast_layer`` of every block of ``model``, made once and reused while its weights stay the same.

    A weight changed in place (loading a state dict, training) bumps its ``_version``; one
    moved to another device is a new tensor. Either makes a fresh copy. The copies are
    detached: the fast path is for generation, and no gradient flows back through it.
    """
    key = tuple((p.data_ptr(), p._version) for p in model.blocks.parameters())
    cached = _FUSED.get(model)
    if cached is None or cached[0] != key:
        cached = (key, [fast_layer(block) for block in model.blocks])
        _FUSED[model] = cached
    return cached[1]


def fast_forward(
    model: DemoTransformer,
    new_tokens: Int[Tensor, "batch new_pos"],
    positions: Int[Tensor, "batch_or_1 new_pos"],
    cache,
    attn_mask: Tensor | None,
) -> Float[Tensor, "batch new_pos d_vocab"]:
    """The logits of ``new_tokens``, writing their keys and values into ``cache`` as it goes.

    ``positions`` are the position ids the new tokens are embedded at (the cache decides
    them). ``cache.update(layer, k, v)`` stores a layer's new keys and values and returns
    ``(keys, values)``, each ``(batch, key_pos, n_heads, d_head)``: every position the new
    queries may look at. ``attn_mask`` (broadcast to ``(batch, n_heads, new_pos, key_pos)``;
    True or 0.0 = may attend) narrows that further; None lets every query see every key.
    ``cache.fused`` holds a ``FastLayer`` per block: its LayerNorm and MLP weights and
    ``fuse_qkv`` of its attention.

    GPT-2's GELU is the tanh approximation, not the exact erf form: ``gelu_new`` (part 1's,
    imported above) or ``F.gelu(x, approximate="tanh")``; plain ``F.gelu(x)`` is the other
    function and moves the logits.
    """
    cfg = model.cfg
    batch, new_pos = new_tokens.shape
    rows, d_model, eps = batch * new_pos, (cfg.d_model,), cfg.layer_norm_eps
    # Hint: rows of (batch * new_pos, d_model); per layer: layer_norm, addmm to Q, K, V, cache.update, SDPA, W_O, MLP.
    raise NotImplementedError()


def causal_mask(new_pos: int, key_pos: int, device) -> Int[Tensor, "new_pos key_pos"]:
    """True where a query may attend: the last ``new_pos`` of ``key_pos`` positions, each up to itself."""
    query = torch.arange(key_pos - new_pos, key_pos, device=device)
    return torch.arange(key_pos, device=device)[None, :] <= query[:, None]


@dataclass
class FusedCache:
    """The least a cache must offer ``fast_forward``: the fused weights of every block and an
    ``update(layer, k, v)`` that stores one layer's new keys and values and returns the keys
    and values the new queries attend to, each ``(batch, key_pos, n_heads, d_head)``."""

    fused: list[FastLayer]
    update: Callable[[int, Tensor, Tensor], tuple[Tensor, Tensor]]
