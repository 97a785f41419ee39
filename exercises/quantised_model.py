# GENERATED from solutions/quantised_model.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: bdd0abe275a09596e93ccb8d489c0629aa71adeb15b7ddc427e47d116ac026ca
"""Part 11: the learner's own models run on quantised weights, through their one forward pass.

``quantise_model(model, "int4-g64")`` stores every weight matrix inside the blocks (attention's
W_Q, W_K, W_V and W_O, the MLP's W_in, W_out and, in the Llama-style model, W_gate) as codes
and scales, and the model dequantises each one when its forward pass reads it. Nothing in
``transformer.py`` or ``llama.py`` changes: PyTorch's parametrisations
(``torch.nn.utils.parametrize``) make ``attn.W_Q`` a property of the module that returns
``QuantisedWeight.forward(*stored)``, computed from the stored tensors at each access, while the
float weight itself is gone. The one forward pass, its caches (parts 4 to 10) and part 6's
fused QKV read ``attn.W_Q`` as before and get the dequantised weight.

This is weight-only quantisation: activations, the KV cache, embeddings, the unembedding,
norms and biases stay in the model's dtype. Dequantise-then-matmul saves memory (what a
model occupies, and what a GPU reads at each decode step when its kernel dequantises on the
fly, as torchao's do); it does not make the matmul itself cheaper on a CPU.

Layouts. The quantisers of ``quantise.py`` and ``nf4.py`` take ``(out, in)`` matrices (a row
per output feature, scales per row or per group of consecutive inputs of a row). The models
store their weights otherwise: part 1's MLP computes ``x @ W_in`` with W_in of shape
``(d_model, d_mlp)``, i.e. ``(in, out)``; attention keeps a matrix per head, W_Q of shape
``(n_heads, d_model, d_head)`` (inputs d_model, outputs n_heads * d_head) and W_O of shape
``(n_heads, d_head, d_model)`` (inputs n_heads * d_head, outputs d_model). ``LAYOUTS`` says,
for each name, how the weight becomes the ``(out, in)`` matrix and back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import einops
import torch
import torch.nn as nn
from torch import Tensor
from torch.nn.utils import parametrize

from .fast_path import fuse_at_load
from .nf4 import DoubleQuantised, dequantise_nf4, double_quantise, quantise_nf4
from .quantise import dequantise_groups, dequantise_int8, pack_int4, quantise_groups, quantise_int8, unpack_int4

# ---------------------------------------------------------------------------------------
# Given: schemes and layouts
# ---------------------------------------------------------------------------------------

_SCHEME = re.compile(r"^(int8|int4|nf4)(?:-g(\d+))?(-dq)?$")


@dataclass(frozen=True)
class Scheme:
    """A weight format: ``int8`` (per row), ``int4`` or ``nf4`` with a group size, NF4 optionally with
    double-quantised absmaxes. Written ``int8``, ``int4-g64``, ``nf4-g64``, ``nf4-g64-dq``."""

    kind: Literal["int8", "int4", "nf4"]
    group_size: int | None = None
    double_quant: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("int8", "int4", "nf4"):
            raise ValueError(f"kind must be 'int8', 'int4' or 'nf4', got {self.kind!r}")
        if self.kind == "int8" and self.group_size is not None:
            raise ValueError("int8 has one scale per row: its group_size must be None")
        if self.kind != "int8" and (isinstance(self.group_size, bool) or not isinstance(self.group_size, int)
                                    or self.group_size < 2 or self.group_size % 2):
            raise ValueError(f"{self.kind} needs an even group_size (32 to 128 are usual), got {self.group_size!r}")
        if self.double_quant and self.kind != "nf4":
            raise ValueError("double quantisation (-dq) is NF4's: int8 and int4 do not take it")

    @classmethod
    def parse(cls, text: "str | Scheme") -> "Scheme":
        """``"int8"``, ``"int4-g64"``, ``"nf4-g64"`` or ``"nf4-g64-dq"`` as a Scheme (a Scheme is returned as it is)."""
        if isinstance(text, Scheme):
            return text
        match = _SCHEME.match(text.strip().lower()) if isinstance(text, str) else None
        if match is None or (match[1] == "int8") != (match[2] is None):
            raise ValueError(f"a scheme is 'int8', 'int4-g<size>', 'nf4-g<size>' or 'nf4-g<size>-dq' "
                             f"(e.g. 'int4-g64'), got {text!r}")
        return cls(match[1], None if match[2] is None else int(match[2]), match[3] is not None)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return self.kind + (f"-g{self.group_size}" if self.group_size else "") + ("-dq" if self.double_quant else "")


@dataclass(frozen=True)
class Layout:
    """How a model's weight maps to the ``(out, in)`` matrix the quantisers take: an einops pattern and
    the sizes that undo it (the heads)."""

    to_matrix: str
    from_matrix: str


LAYOUTS: dict[str, Layout] = {
    # (n_heads, d_model, d_head): each head's d_head outputs read all d_model inputs.
    **{name: Layout("n d h -> (n h) d", "(n h) d -> n d h") for name in ("W_Q", "W_K", "W_V")},
    # (n_heads, d_head, d_model): the heads' outputs side by side are W_O's inputs.
    "W_O": Layout("n h d -> d (n h)", "d (n h) -> n h d"),
    # (in, out), used as x @ W: transpose.
    **{name: Layout("i o -> o i", "o i -> i o") for name in ("W_in", "W_out", "W_gate")},
}


def as_matrix(weight: Tensor, name: str) -> Tensor:
    """The model's weight ``name`` as an ``(out, in)`` matrix (contiguous: the quantisers reshape its rows)."""
    return einops.rearrange(weight, LAYOUTS[name].to_matrix).contiguous()


def from_matrix(matrix: Tensor, name: str, shape: torch.Size) -> Tensor:
    """The inverse of ``as_matrix``: back to the model's layout ``shape``.

    A view of ``matrix`` (a transpose or permutation of it), not a contiguous copy. A copy would match the
    strides of a float model's own weights, so a matmul would take exactly the same route; but it costs a
    strided pass over every weight at every access, which measured about twice the CPU time of a
    one-token forward of an int8 model (d_model 256, one thread). The matmuls read views at the same
    values, and on a CPU the quantised model's logits equal those of a float twin bit for bit (part 11's
    tests); a GPU library may pick another kernel for a transposed operand."""
    sizes = {"n": shape[0]} if len(shape) == 3 else {}
    return einops.rearrange(matrix, LAYOUTS[name].from_matrix, **sizes)


# ---------------------------------------------------------------------------------------
# Exercise 4: store a matrix in a scheme, read it back
# ---------------------------------------------------------------------------------------


def quantise_matrix(matrix: Tensor, scheme: Scheme) -> tuple[Tensor, ...]:
    """The tensors that store ``matrix`` (out, in) in ``scheme``; 4-bit codes packed two per byte.

    int8: ``(q, scale)``; int4: ``(packed, scale, zero_point)``, the zero points as uint8 (whole numbers
    in [0, 15], one byte each rather than float32's four); nf4: ``(packed, absmax)``; nf4 with double
    quantisation (``double_quantise``'s default blocks): ``(packed, absmax_codes, absmax_scales, absmax_offset)``.
    """
    # Hint: call your quantiser for the scheme's kind; pack_int4 the 4-bit codes.
    raise NotImplementedError()


def dequantise_matrix(stored: tuple[Tensor, ...], scheme: Scheme, shape: tuple[int, int], dtype: torch.dtype) -> Tensor:
    """The ``(out, in)`` matrix of shape ``shape`` that ``quantise_matrix`` stored, in ``dtype``.

    The block size of double quantisation is not stored: it is the number of absmax codes per scale."""
    # Hint: the inverse of quantise_matrix, step by step: unpack, then your dequantiser.
    raise NotImplementedError()


class QuantisedWeight(nn.Module):
    """The parametrisation of one weight: ``right_inverse`` stores it (once, when it is registered), and
    ``forward`` gives it back, dequantised, in the model's layout, at every access."""

    def __init__(self, scheme: Scheme, name: str, shape: torch.Size):
        super().__init__()
        self.scheme, self.name, self.shape = scheme, name, torch.Size(shape)
        self.matrix_shape = tuple(as_matrix(torch.empty(shape, device="meta"), name).shape)

    def right_inverse(self, weight: Tensor) -> tuple[Tensor, ...]:
        stored = quantise_matrix(as_matrix(weight.detach(), self.name).float(), self.scheme)
        # Scales in the model's dtype: a model cast later (model.to(torch.bfloat16)) casts them too, and its
        # weights then dequantise to its new dtype. Codes are integers: casts leave them as they are.
        return tuple(t if not t.is_floating_point() else t.to(weight.dtype) for t in stored)

    def forward(self, *stored: Tensor) -> Tensor:
        dtype = next(t.dtype for t in stored if t.is_floating_point())
        matrix = dequantise_matrix(stored, self.scheme, self.matrix_shape, dtype)
        return from_matrix(matrix, self.name, self.shape)


def quantise_model(model: nn.Module, scheme: "Scheme | str") -> nn.Module:
    """Store every weight matrix in ``model.blocks`` (the names of ``LAYOUTS``) in ``scheme``, in place; each is
    dequantised when the forward pass reads it. Embeddings, unembedding, norms and biases stay as they are.

    Works on part 1's DemoTransformer and part 9's LlamaTransformer (anything with ``blocks`` whose modules
    hold these names). Part 6's fused QKV, when the model has it, is made again from the quantised weights.
    Returns ``model``.
    """
    scheme = Scheme.parse(scheme)
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Module):
        raise TypeError(f"quantise_model takes a model with blocks (DemoTransformer, LlamaTransformer), got {type(model).__name__}")
    if any(parametrize.is_parametrized(module, name) for module in blocks.modules() for name in LAYOUTS):
        raise ValueError("this model is quantised already: quantise a fresh copy of the float model")
    targets = [(module, name) for module in blocks.modules() for name in LAYOUTS
               if isinstance(module._parameters.get(name), Tensor)]
    if not targets:
        raise ValueError(f"no weight named {', '.join(LAYOUTS)} in the model's blocks: nothing to quantise")
    if scheme.group_size:  # say so before any weight has changed
        for module, name in targets:
            in_features = as_matrix(module._parameters[name].detach(), name).shape[1]
            if in_features % scheme.group_size:
                raise ValueError(f"group_size {scheme.group_size} does not divide {name}'s {in_features} inputs")
    fused = any(getattr(module, "fused_qkv", None) is not None for module in blocks.modules())
    for module, name in targets:
        weight = module._parameters[name]
        weight.requires_grad_(False)  # integer codes cannot carry gradients: this model is for inference
        # Hint: torch.nn.utils.parametrize.register_parametrization(module, name, QuantisedWeight(...)).
        raise NotImplementedError()
    if fused:
        # The fused copy was made from the float weights: make it again from what the model now holds.
        for module in blocks.modules():
            if getattr(module, "fused_qkv", None) is not None:
                module.fused_qkv = None
        fuse_at_load(model)
    return model


def weight_bytes(model: nn.Module) -> int:
    """Bytes the model's parameters and buffers occupy as stored (codes, scales, zero points, embeddings,
    norms, ...), each storage counted once (tied weights). Part 6's fused QKV copy is not counted: it is a
    float copy of the quantised weights, made for speed, that a memory-bound deployment leaves out."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    return total
