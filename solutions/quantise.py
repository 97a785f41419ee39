"""Part 11: uniform quantisation, the weights of a model in 8 and 4 bits.

A decode step reads every weight once and does little arithmetic with each (part 6), so the
bytes of the weights set its pace and the size of the model that fits. Storing each weight
as a small integer code and a few floating-point numbers per row or group cuts those bytes:

    int8, per output channel (absmax, symmetric):   w ~ q * scale,                 q in [-127, 127]
    4 bits, per group (asymmetric, zero point):      w ~ (q - zero_point) * scale,  q in [0, 15]

Every function takes a weight as the ``(out, in)`` matrix a linear layer multiplies by
(``y = x @ W.T``, PyTorch's ``nn.Linear`` layout): one row per output feature. Part 1's
weights are stored the other way round (``x @ W_in``) or per head; ``quantised_model.py``
converts them. A row is one output channel: the error a row's codes make lands in that
output only, which is why scales are chosen per row (LLM.int8(), Dettmers et al. 2022, calls
this vector-wise quantisation) or per group of consecutive inputs within a row, so one large
weight spoils the resolution of its own group only (GPTQ, Frantar et al. 2022, and QLoRA,
Dettmers et al. 2023, use groups of 64 to 128).

Rounding to the nearest code leaves an error of at most half a step, ``|w - dequantised| <=
scale / 2`` for every weight inside the range, and the range is chosen so that every weight is.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int8, UInt8
from torch import Tensor

# The smallest scale a quantiser returns (torchao's default: float32's smallest normal number). An
# all-zero row or group would get scale 0 and codes 0 / 0 = NaN; with this floor its codes are 0
# and it dequantises to exact zeros.
SMALLEST_SCALE = torch.finfo(torch.float32).smallest_normal
# Symmetric int8 uses [-127, 127]: -128 has no positive twin, and a symmetric range keeps 0 exact.
INT8_MAX = 127


def check_matrix(weight: Tensor, name: str = "weight") -> Tensor:
    """A float32 copy of ``weight``, after checking that it is an ``(out, in)`` matrix (the quantisers'
    scales and rounding are computed in float32 whatever the model's dtype).

    Always a copy, even of a float32 matrix (``.float()`` would hand back the caller's own tensor): what the
    quantiser does with it in place (``weight.div_(scale[:, None])``) must not reach the caller's weights."""
    if not isinstance(weight, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(weight).__name__}")
    if weight.ndim != 2:
        raise ValueError(f"{name} must be an (out, in) matrix, got shape {tuple(weight.shape)}")
    if not weight.is_floating_point():
        raise TypeError(f"{name} must hold floating-point weights, got {weight.dtype}")
    if not torch.isfinite(weight).all():
        raise ValueError(f"{name} holds NaN or infinite values: they cannot be quantised")
    return weight.to(torch.float32, copy=True)


def check_group_size(weight: Tensor, group_size: int) -> int:
    """The number of groups per row; ``group_size`` must be a positive int dividing the row length."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if weight.shape[-1] % group_size:
        raise ValueError(
            f"group_size={group_size} does not divide the rows of length {weight.shape[-1]}: "
            f"choose a divisor of {weight.shape[-1]} (32, 64 and 128 are usual)"
        )
    return weight.shape[-1] // group_size


def check_dtype(dtype: torch.dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype (torch.float32, torch.bfloat16, ...), got {dtype!r}")
    return dtype


# ---------------------------------------------------------------------------------------
# Exercise 1: int8, symmetric, one scale per output channel
# ---------------------------------------------------------------------------------------


def quantise_int8(weight: Float[Tensor, "out in"]) -> tuple[Int8[Tensor, "out in"], Float[Tensor, "out"]]:
    """Symmetric absmax quantisation per row: ``scale = max|w_row| / 127``, ``q = round(w / scale)``
    clamped to ``[-127, 127]``, as int8. Returns ``(q, scale)``, ``scale`` in float32."""
    weight = check_matrix(weight)
    ### BEGIN SOLUTION
    # Hint: the largest magnitude of each row maps to 127, so nothing is clipped.
    scale = weight.abs().amax(dim=1) / INT8_MAX
    ### END SOLUTION
    scale = scale.clamp(min=SMALLEST_SCALE)  # an all-zero row: codes 0, not 0 / 0
    ### BEGIN SOLUTION
    # Divide first, then round: the code is the nearest integer to w / scale.
    q = torch.round(weight / scale[:, None]).clamp(-INT8_MAX, INT8_MAX)
    return q.to(torch.int8), scale
    ### END SOLUTION


def dequantise_int8(
    q: Int8[Tensor, "out in"], scale: Float[Tensor, "out"], dtype: torch.dtype = torch.float32
) -> Float[Tensor, "out in"]:
    """``q * scale`` per row, computed in float32 and returned in ``dtype``."""
    check_dtype(dtype)
    if q.ndim != 2 or scale.shape != q.shape[:1]:
        raise ValueError(f"q must be (out, in) and scale (out,), got {tuple(q.shape)} and {tuple(scale.shape)}")
    ### BEGIN SOLUTION
    # Hint: int8 codes times a float32 scale; cast at the end, so bfloat16 rounds once.
    return (q.to(torch.float32) * scale.to(torch.float32)[:, None]).to(dtype)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# Exercise 2: 4 bits (or fewer), asymmetric, a scale and a zero point per group
# ---------------------------------------------------------------------------------------


def quantise_groups(
    weight: Float[Tensor, "out in"], group_size: int, bits: int = 4
) -> tuple[UInt8[Tensor, "out in"], Float[Tensor, "out groups"], Float[Tensor, "out groups"]]:
    """Asymmetric quantisation per group of ``group_size`` consecutive inputs of one row.

    The group's range, widened to include 0 (so that 0 is a code exactly, as torchao does), is cut into
    ``2**bits - 1`` steps: ``scale = (max - min) / (2**bits - 1)``, ``zero_point = round(-min / scale)``,
    ``q = clamp(round(w / scale) + zero_point, 0, 2**bits - 1)``. Returns ``(q, scale, zero_point)``:
    codes one per uint8, scales and zero points (whole numbers) in float32, one per group.
    """
    weight = check_matrix(weight)
    n_groups = check_group_size(weight, group_size)
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an int from 1 to 8, got {bits!r}")
    top = 2**bits - 1  # the largest code
    ### BEGIN SOLUTION
    # Hint: view the row as (groups, group_size): each group is group_size CONSECUTIVE inputs.
    grouped = weight.reshape(weight.shape[0], n_groups, group_size)
    low = grouped.amin(dim=-1).clamp(max=0)
    high = grouped.amax(dim=-1).clamp(min=0)
    scale = (high - low) / top
    ### END SOLUTION
    scale = scale.clamp(min=SMALLEST_SCALE)  # an all-zero group: codes at the zero point, not 0 / 0
    ### BEGIN SOLUTION
    # The code of 0 is the zero point: round(-low / scale), in [0, top] since low <= 0 <= high.
    zero_point = torch.round(-low / scale).clamp(0, top)
    q = (torch.round(grouped / scale[..., None]) + zero_point[..., None]).clamp(0, top)
    return q.reshape(weight.shape).to(torch.uint8), scale, zero_point
    ### END SOLUTION


def dequantise_groups(
    q: UInt8[Tensor, "out in"],
    scale: Float[Tensor, "out groups"],
    zero_point: Float[Tensor, "out groups"],
    group_size: int,
    dtype: torch.dtype = torch.float32,
) -> Float[Tensor, "out in"]:
    """``(q - zero_point) * scale`` per group, computed in float32 and returned in ``dtype``."""
    check_dtype(dtype)
    n_groups = check_group_size(q, group_size)
    if q.ndim != 2 or scale.shape != (q.shape[0], n_groups) or zero_point.shape != scale.shape:
        raise ValueError(f"for q of shape {tuple(q.shape)} and group_size={group_size}, scale and zero_point must "
                         f"be {(q.shape[0], n_groups)}, got {tuple(scale.shape)} and {tuple(zero_point.shape)}")
    ### BEGIN SOLUTION
    # Hint: subtract in float32: uint8 codes minus a zero point would wrap around below 0.
    grouped = q.reshape(q.shape[0], n_groups, group_size).to(torch.float32)
    weight = (grouped - zero_point.to(torch.float32)[..., None]) * scale.to(torch.float32)[..., None]
    return weight.reshape(q.shape).to(dtype)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# Given: two 4-bit codes per byte
# ---------------------------------------------------------------------------------------


def pack_int4(q: UInt8[Tensor, "out in"]) -> UInt8[Tensor, "out half_in"]:
    """Two codes in [0, 15] per byte: input 2j in the low four bits, input 2j + 1 in the high four.

    One code per uint8 (what the exercises return) spends half of every byte on zeros; stored packed,
    a 4-bit weight takes half a byte, which is the whole point of 4 bits.
    """
    if q.dtype != torch.uint8 or q.ndim != 2 or q.shape[1] % 2:
        raise ValueError(f"pack_int4 takes uint8 codes of shape (out, even in), got {q.dtype} {tuple(q.shape)}")
    if q.numel() and int(q.max()) > 15:
        raise ValueError("pack_int4 takes codes in [0, 15]")
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: UInt8[Tensor, "out half_in"]) -> UInt8[Tensor, "out in"]:
    """The codes ``pack_int4`` packed, one per uint8 again."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], 2 * packed.shape[1])
