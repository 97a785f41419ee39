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

On the fast path, attention itself runs as one kernel too (``FusedQKV.attend``):
``F.scaled_dot_product_attention``, as gpt-fast and Hugging Face call it, computes the same
softmax(q k^T / sqrt(d_head)) v with the same masks, but reads the keys and values where the
cache keeps them and never writes the scores out; the heads are then summed by one matmul
with the flattened W_O.

A step of several rows (a batch, beams, a prefill) is another case: each weight multiplies a
few rows, a thin product that the CPU's default matmul runs well below the processor's speed.
The fast path packs the MLP's, the unembedding's and W_O's weights once into the layout of
oneDNN's matmul kernel, which runs it faster (about twice as fast at GPT-2 small's sizes:
``PackedLinear``); one row, and weights too small to gain, keep the plain weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import einops
import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor

from .transformer import gelu_new


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


def fuse_at_load(model: nn.Module, pack: bool = True) -> nn.Module:
    """Give every ``Attention`` of ``model`` its fused QKV weights now, and again whenever its weights change;
    and, with ``pack`` (the default), every ``MLP`` and ``Unembed`` their matmuls on packed weights
    (``PackedMLP``, ``PackedUnembed``; W_O too). ``pack=False`` keeps their plain matmuls, and no second
    copy of those weights in memory (about 410 MB for GPT-2 small once packed).

    gpt-fast's load hook fuses the weights once, as they are loaded. Here the fused copy is made
    at once, and remade at the next forward pass when a weight has been changed in place
    (loading a state dict, training: either bumps its ``_version``) or moved or cast.
    The copies are detached: the fast path is for generation, and no gradient flows through it.
    Returns ``model``.
    """
    masks = StepMask()  # one for the model: its layers share each step's mask
    for module in model.modules():
        if all(hasattr(module, name) for name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "fused_qkv")):
            fused = FusedQKV(pack)
            fused.refresh(module)  # fused now, at load (before the attribute is set, so a failure leaves the model as it was)
            fused.masks = masks
            module.fused_qkv = fused
        elif all(hasattr(module, name) for name in ("W_in", "b_in", "W_out", "b_out", "packed")):
            module.packed = PackedMLP() if pack else None
        elif all(hasattr(module, name) for name in ("W_U", "b_U", "packed")):
            module.packed = PackedUnembed() if pack else None
    return model


class FusedQKV:
    """An ``Attention``'s queries, keys and values in one matmul, with ``fuse_qkv``'s weights (remade when stale)."""

    def __init__(self, pack: bool = True):
        self.key: tuple = ()
        self.fused: FusedAttention | None = None
        self.masks = StepMask()
        self.n_heads = self.d_head = 0  # the head sizes of the weights fused last
        self.W_O = PackedLinear() if pack else None  # the flattened W_O, packed for several rows (fuse_at_load's pack)
        # Plain parameters, not part 11's quantised ones (whose fused copy is a float copy already: not packed again).
        self.plain = True

    def refresh(self, attn: nn.Module) -> FusedAttention:
        """``attn``'s fused weights, made again only when one of its weights changed since the last call.

        The test reads what the module stores (``stored_tensors``), never ``attn.W_Q`` itself: on a
        quantised model (part 11) each such read dequantises the whole matrix into a new tensor,
        which would cost a dequantisation per weight, and a new fusing, at every step.
        """
        key = tuple((t.data_ptr(), version_of(t), t.dtype, t.shape) for name in FUSED_NAMES for t in stored_tensors(attn, name))
        if key != self.key or self.fused is None:
            self.fused, self.key = fuse_qkv(attn), key
            shape = attn.W_Q.shape  # (n_heads, d_model, d_head); read here, once per fusing, not at every step
            self.n_heads, self.d_head = shape[0], shape[2]
            self.plain = all(name in attn._parameters for name in FUSED_NAMES)
        return self.fused

    def __call__(
        self, attn: nn.Module, x: Float[Tensor, "batch pos d_model"]
    ) -> tuple[Float[Tensor, "batch pos n_heads d_head"], Float[Tensor, "batch pos n_heads d_head"], Float[Tensor, "batch pos n_heads d_head"]]:
        """``attn``'s queries, keys and values of ``x``, each ``(batch, pos, n_heads, d_head)``."""
        fused = self.refresh(attn)
        n_heads, d_head = self.n_heads, self.d_head
        batch, pos, d_model = x.shape
        ### BEGIN SOLUTION
        # Hint: one torch.addmm(bias, rows, W_QKV) over (batch * pos) rows, then view as (batch, pos, 3, n_heads, d_head).
        # addmm: the bias and the matmul in one call, on the positions as rows.
        qkv = torch.addmm(fused.b_QKV, x.reshape(batch * pos, d_model), fused.W_QKV)
        q, k, v = qkv.view(batch, pos, 3, n_heads, d_head).unbind(2)
        ### END SOLUTION
        return q, k, v

    def attend(
        self,
        attn: nn.Module,
        q: Float[Tensor, "batch new_pos n_heads d_head"],
        k: Float[Tensor, "batch key_pos n_heads d_head"],
        v: Float[Tensor, "batch key_pos n_heads d_head"],
        mask: Bool[Tensor, "batch_or_1 1 new_pos key_pos"] | None = None,
    ) -> Float[Tensor, "batch new_pos d_model"]:
        """``attn``'s output for queries ``q`` over keys ``k`` and values ``v``: what ``Attention.forward`` computes
        (the causal rule, then the cache's ``mask``), in one attention kernel and one matmul for W_O."""
        batch, new_pos, n_heads, d_head = q.shape
        key_pos = k.shape[1]
        # The weights __call__ refreshed a moment ago, for this same layer's q, k and v: no second look at them.
        fused = self.fused if self.fused is not None else self.refresh(attn)
        # Heads second, as transposed views: the kernel reads each head's keys where the cache keeps them.
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if mask is None and new_pos in (1, key_pos):
            # No mask to build: one query sees every key; as many queries as keys is the plain causal triangle.
            # (With as many queries as keys, SDPA's top-left triangle is the model's bottom-right one.)
            z = F.scaled_dot_product_attention(q, k, v, is_causal=new_pos > 1)
        else:
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=self.masks(attn, new_pos, key_pos, mask, q))
        # The heads side by side, then W_O as one (n_heads * d_head, d_model) matrix sums them in its matmul.
        z = z.transpose(1, 2).reshape(batch * new_pos, n_heads * d_head)
        out = self.W_O(z, fused.W_O, fused.b_O) if self.plain and self.W_O is not None else None
        return (torch.addmm(fused.b_O, z, fused.W_O) if out is None else out).view(batch, new_pos, -1)


# The weights fuse_qkv reads: a change to any of them makes the fused copy stale.
FUSED_NAMES = ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "W_O", "b_O")


def stored_tensors(module: nn.Module, name: str) -> tuple[Tensor, ...]:
    """What ``module`` stores for its weight ``name``: the parameter itself, or, when a parametrisation
    computes it (part 11's quantised weights, ``torch.nn.utils.parametrize``), the tensors the
    parametrisation keeps (``original``, or ``original0``, ``original1``, ... : codes, scales), which
    change only when the weight does. Reading ``module.<name>`` there would run the parametrisation."""
    param = module._parameters.get(name)
    if param is not None:  # a plain parameter (looked up directly: this runs at every step of every layer)
        return (param,)
    parametrizations = module._modules.get("parametrizations")
    if parametrizations is not None and name in parametrizations:
        kept = parametrizations[name]
        return tuple(kept.parameters(recurse=False)) + tuple(kept.buffers(recurse=False))
    return (getattr(module, name),)


class StepMask:
    """The additive mask of the step under way, made once and read by every layer.

    Every layer of a forward pass gets the same ``CacheStep.mask``; building the additive mask
    is several passes over (rows, new_pos, key_pos) numbers, as much as a decode step's attention
    itself. The mask made last is kept with the tensor it was made from and that tensor's
    version, so a mask changed in place gets a fresh one. (Tensors made under
    ``torch.inference_mode`` keep no version: there the tensor itself is the key, which every
    cache of the course meets, since its ``prepare`` makes a new mask at every step.) Shared by
    every layer's ``FusedQKV`` (``fuse_at_load``).
    """

    def __init__(self):
        self.made: tuple = ()

    def __call__(
        self, attn: nn.Module, new_pos: int, key_pos: int, mask: Tensor | None, q: Tensor
    ) -> Float[Tensor, "..."]:
        """The additive mask for ``new_pos`` queries over ``key_pos`` keys, in ``q``'s dtype and on its device."""
        dtype = q.dtype
        version = None if mask is None else version_of(mask)
        key = (new_pos, key_pos, (dtype, q.device), mask, version)
        if len(self.made) != 2 or not same_key(self.made[0], key):
            self.made = (key, additive_mask(visible_keys(attn, new_pos, key_pos, mask, q.device), dtype))
        return self.made[1]


def same_key(a: tuple, b: tuple) -> bool:
    """Equal sizes, dtype and version, and the very same mask tensor (``is``: tensors compare element by element)."""
    return a[:3] == b[:3] and a[3] is b[3] and a[4] == b[4]


def visible_keys(
    attn: nn.Module, new_pos: int, key_pos: int, mask: Bool[Tensor, "batch_or_1 1 new_pos key_pos"] | None,
    device: torch.device,
) -> Bool[Tensor, "batch_or_1 1 new_pos key_pos"]:
    """Where a query may see a key: the model's own causal rule, ``attn.apply_causal_mask`` (part 1; the one
    causal mask of the family), read off a table of zero scores (a key it hides no longer scores 0), and then
    the cache's ``mask`` where it has one."""
    if new_pos == 1 and mask is not None:
        return mask  # one query, the newest position: the causal rule hides nothing
    zeros = torch.zeros(1, 1, new_pos, key_pos, device=device)
    causal = attn.apply_causal_mask(zeros) == 0
    return causal if mask is None else causal & mask


def additive_mask(visible: Bool[Tensor, "..."], dtype: torch.dtype) -> Float[Tensor, "..."]:
    """0 where visible, the dtype's most negative finite number elsewhere, to add to the scores.

    Finite, not -inf, for the reason ``transformer.IGNORE`` is: a query that sees no key at all
    (a pad) then averages every value instead of making NaN, which older PyTorch versions do
    with a boolean mask, and which would reach every later layer through that position's keys.
    """
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, torch.finfo(dtype).min)


# ---------------------------------------------------------------------------------------
# Weights packed for the CPU's matmul kernel
# ---------------------------------------------------------------------------------------


def packing_available() -> bool:
    """Whether this build of PyTorch has oneDNN's packed-weight matmul (``torch.ops.mkldnn``): x86 and Arm builds do."""
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


def version_of(t: Tensor) -> int:
    """``t._version``, which counts its in-place changes (-1 for an inference tensor, which keeps no count)."""
    return -1 if t.is_inference() else t._version


# The smallest weight worth packing, in elements. Timed on a 2-core AVX-512 machine, one thread, 8 rows, median of
# 100 calls: the packed kernel ran a 512 x 512 or 256 x 1024 weight faster than addmm (81 against 89, 60 against 94
# microseconds), the story model's 192 x 768 no faster (63 against 55) and its 192 x 192 slower (21 against 11): at
# those sizes the call costs more than the arithmetic. GPT-2 small's matrices are 590k to 39M elements.
PACK_FROM = 1 << 18


class PackedLinear:
    """``x @ W + b``, with ``W`` packed into the layout of oneDNN's matmul kernel, for inputs of several rows.

    A decode step of a batch or of beams multiplies a few rows by each weight. The matmul that ``@`` and
    ``addmm`` call on a CPU (MKL's) runs such a thin product well below the processor's speed; oneDNN's,
    given the weight reordered once into its own blocked layout, runs it faster, about twice as fast at
    GPT-2 small's sizes and 8 rows (``sampling-course bench``: the batched and beam rows). One row is a
    matrix-vector product, which MKL streams at the speed of memory and the packed kernel does not beat,
    so one row keeps the plain weight. PyTorch's compiler packs a frozen model's linear weights with the
    same two operators (``mkldnn._reorder_linear_weight``, ``mkldnn._linear_pointwise``) when the batch
    size may vary (for a fixed one it may take MKL's own packed format instead).

    The weight is packed at the first call that applies (``applies``): several rows, a plain float32 weight
    of at least ``PACK_FROM`` elements on the CPU (not on a GPU, not part 11's quantised weights), a step
    autograd does not record (the kernel has no backward), a build with the kernel. Elsewhere ``__call__``
    returns None and the caller multiplies as usual. The packed copy costs the weight's memory once more.
    It is made again when the weight's memory changes (another tensor, or ``.data`` replaced, moved or cast)
    or the weight is changed in place (``_version``; an inference tensor keeps no version, so a change in
    place to one is not seen); it is dropped once its weight no longer applies, and left out of copies and
    pickles.
    """

    available: bool | None = None  # packing_available(), asked once

    def __init__(self):
        self.source: Tensor | None = None  # a view of the weight packed last: it holds the weight's memory
        self.version = -1
        self.packed: Tensor | None = None

    @staticmethod
    def applies(x: Tensor, W: Tensor | None, b: Tensor) -> bool:
        """Whether ``x @ W + b`` goes through the packed kernel (see the class)."""
        if W is None or x.numel() <= x.shape[-1] or x.device.type != "cpu" or x.dtype != torch.float32:
            return False
        if W.dtype != torch.float32 or W.device.type != "cpu" or W.numel() < PACK_FROM:
            return False
        if torch.is_grad_enabled() and (W.requires_grad or b.requires_grad or x.requires_grad):
            return False
        if PackedLinear.available is None:
            PackedLinear.available = packing_available()
        return PackedLinear.available

    def stale(self, W: Tensor | None) -> bool:
        """Whether the packed copy is not of ``W`` as it is now: other memory (another tensor, or this one's
        ``.data`` replaced, moved or cast: the held view keeps the old memory from being reused), another shape, or
        a change in place (``_version``)."""
        source = self.source
        return (source is None or W is None or W.data_ptr() != source.data_ptr() or W.shape != source.shape
                or version_of(W) != self.version)

    def forget_if_stale(self, W: Tensor | None) -> None:
        """Drop a packed copy that will not be used again (its weight replaced, moved or cast)."""
        if self.packed is not None and self.stale(W):
            self.source = self.packed = None

    def __call__(
        self, x: Float[Tensor, "*rows d_in"], W: Float[Tensor, "d_in d_out"] | None, b: Float[Tensor, "d_out"]
    ) -> Float[Tensor, "*rows d_out"] | None:
        if not self.applies(x, W, b):
            self.forget_if_stale(W)
            return None
        return self.multiply(x, W, b)

    def multiply(
        self, x: Float[Tensor, "*rows d_in"], W: Float[Tensor, "d_in d_out"], b: Float[Tensor, "d_out"]
    ) -> Float[Tensor, "*rows d_out"] | None:
        """``__call__`` where ``applies`` said yes already: packed now if stale (None if the operator fails)."""
        if self.packed is None or self.stale(W):
            try:  # oneDNN takes the weight as (d_out, d_in), nn.Linear's layout
                self.packed = torch.ops.mkldnn._reorder_linear_weight(W.detach().t().contiguous(), None)
            except (RuntimeError, TypeError):  # a private operator of PyTorch: if it changed, multiply as usual
                PackedLinear.available = False
                return None
            self.source, self.version = W.detach(), version_of(W)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, b.detach(), "none", [], "")

    def __getstate__(self) -> dict:
        return {"source": None, "version": -1, "packed": None}  # an opaque oneDNN tensor neither copies nor pickles

    def __deepcopy__(self, memo: dict) -> "PackedLinear":
        return type(self)()


class PackedMLP:
    """Part 1's ``MLP`` on packed weights (``PackedLinear``): the same two matmuls around the model's ``gelu_new``."""

    def __init__(self):
        self.W_in, self.W_out = PackedLinear(), PackedLinear()

    def __call__(self, mlp: nn.Module, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"] | None:
        # The stored parameters: a parametrised weight (part 11's quantised ones) is not packed. Both or neither.
        W_in, W_out = mlp._parameters.get("W_in"), mlp._parameters.get("W_out")
        if not (PackedLinear.applies(x, W_in, mlp.b_in) and PackedLinear.applies(x, W_out, mlp.b_out)):
            self.W_in.forget_if_stale(W_in)
            self.W_out.forget_if_stale(W_out)
            return None
        pre = self.W_in.multiply(x, W_in, mlp.b_in)
        return None if pre is None else self.W_out.multiply(gelu_new(pre), W_out, mlp.b_out)


class PackedUnembed:
    """Part 1's ``Unembed`` on a packed ``W_U`` (``PackedLinear``): one matmul, the largest of the model."""

    def __init__(self):
        self.W_U = PackedLinear()

    def __call__(self, unembed: nn.Module, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"] | None:
        return self.W_U(x, unembed._parameters.get("W_U"), unembed.b_U)
