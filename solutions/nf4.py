"""Part 11: the 4-bit normal-float codebook (NF4, from QLoRA: Dettmers et al., 2023).

Uniform 4-bit codes (quantise.py) spend their 16 levels evenly over a group's range. Trained
weights are not spread evenly: they look normally distributed, most of them near 0, few in
the tails. NF4 puts its 16 levels where a normal distribution puts equal shares of its mass,
so each level stands for about as many weights: a group is divided by its largest magnitude
(absmax, so it lies in [-1, 1]) and each weight becomes the index of the nearest level.

The levels (QLoRA, section 3 and appendix E): quantiles of N(0, 1) at probabilities evenly
spaced from 1/2 to an outer probability ``p = ((1 - 1/30) + (1 - 1/32)) / 2 = 0.9677083``,
QLoRA's choice, short of 1 because the quantile at probability 1 is infinite. Each half has its
own spacing: the positive half takes 9 evenly spaced probabilities from 1/2 to p and drops 1/2
(its quantile is 0), leaving 8 levels; the negative half does the same with 8 probabilities,
leaving 7, negated. With an exact 0 added and every level divided by the largest, that is 16
values from -1 to 1 (both halves end at p, so the smallest is exactly -1).
Exact 0 keeps zero weights (and padding) exact; +-1 map the group's absmax back exactly.

Double quantisation (QLoRA's second idea): one float32 absmax per 64 weights is 0.5 bit per
weight; storing the absmaxes themselves in 8 bits, 256 to a block with one float32 scale,
brings that to about 0.127 bit. QLoRA stores them as 8-bit floats; here they are the int8
of exercise 1, after subtracting their mean (they are all positive, so centring them doubles
the resolution the int8 range gives them), as torchao's NF4 tensor does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int8, UInt8
from torch import Tensor

from .quantise import SMALLEST_SCALE, check_dtype, check_group_size, check_matrix, dequantise_int8, quantise_int8

# The outer probability (QLoRA): halfway between 1 - 1/30 and 1 - 1/32.
NF4_OUTER_PROBABILITY = 0.5 * ((1 - 1 / 30) + (1 - 1 / 32))


def nf4_levels() -> Float[Tensor, "16"]:
    """QLoRA's 16 NF4 levels in float32, sorted: normal quantiles (8 positive, 7 negative) and 0, scaled to [-1, 1]."""
    ### BEGIN SOLUTION
    # Hint: torch.special.ndtri is the normal quantile function; work in float64, cast at the end.
    p = NF4_OUTER_PROBABILITY
    positive = torch.special.ndtri(torch.linspace(p, 0.5, 9, dtype=torch.float64)[:-1])  # 8 values, without 0.5
    negative = -torch.special.ndtri(torch.linspace(p, 0.5, 8, dtype=torch.float64)[:-1])  # 7 values
    levels = torch.cat([negative, torch.zeros(1, dtype=torch.float64), positive]).sort().values
    return (levels / levels.max()).to(torch.float32)
    ### END SOLUTION


def quantise_nf4(
    weight: Float[Tensor, "out in"], group_size: int = 64
) -> tuple[UInt8[Tensor, "out in"], Float[Tensor, "out groups"]]:
    """Per group of ``group_size`` consecutive inputs of a row: ``absmax = max|w|``, and each weight's code is
    the index of the NF4 level nearest to ``w / absmax``. Returns ``(codes, absmax)``: codes one per uint8
    in [0, 15], absmax in float32."""
    weight = check_matrix(weight)
    n_groups = check_group_size(weight, group_size)
    levels = nf4_levels().to(weight.device)
    ### BEGIN SOLUTION
    grouped = weight.reshape(weight.shape[0], n_groups, group_size)
    absmax = grouped.abs().amax(dim=-1)
    ### END SOLUTION
    absmax = absmax.clamp(min=SMALLEST_SCALE)  # an all-zero group: every code at level 0.0
    ### BEGIN SOLUTION
    # Hint: the nearest level is the one at the smallest distance |w / absmax - level|.
    normalised = grouped / absmax[..., None]
    codes = (normalised[..., None] - levels).abs().argmin(dim=-1)
    return codes.reshape(weight.shape).to(torch.uint8), absmax
    ### END SOLUTION


def dequantise_nf4(
    codes: UInt8[Tensor, "out in"],
    absmax: Float[Tensor, "out groups"],
    group_size: int = 64,
    dtype: torch.dtype = torch.float32,
) -> Float[Tensor, "out in"]:
    """``level[code] * absmax`` per group, computed in float32 and returned in ``dtype``."""
    check_dtype(dtype)
    n_groups = check_group_size(codes, group_size)
    if codes.ndim != 2 or absmax.shape != (codes.shape[0], n_groups):
        raise ValueError(f"for codes of shape {tuple(codes.shape)} and group_size={group_size}, absmax must be "
                         f"{(codes.shape[0], n_groups)}, got {tuple(absmax.shape)}")
    if codes.numel() and not 0 <= int(codes.min()) <= int(codes.max()) <= 15:
        raise ValueError(f"NF4 codes index the 16 levels, so they must lie in [0, 15]; got codes from "
                         f"{int(codes.min())} to {int(codes.max())}")
    levels = nf4_levels().to(codes.device)
    ### BEGIN SOLUTION
    # Hint: index the levels with the codes (as long), then scale each group by its absmax.
    values = levels[codes.long()].reshape(codes.shape[0], n_groups, group_size)
    return (values * absmax.to(torch.float32)[..., None]).reshape(codes.shape).to(dtype)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# Optional: double quantisation of the absmaxes
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DoubleQuantised:
    """Absmaxes stored in 8 bits: ``absmax ~ codes * scales[block] + offset``."""

    codes: Int8[Tensor, "n"]  # one per absmax, then the last block's padding: n = blocks * block_size
    scales: Float[Tensor, "blocks"]  # one float32 per block of block_size absmaxes
    offset: Float[Tensor, ""]  # the absmaxes' mean, subtracted before quantising
    shape: tuple[int, ...]  # the absmaxes' shape, (out, groups)
    block_size: int

    def dequantise(self) -> Float[Tensor, "out groups"]:
        """The absmaxes back, in float32, in their own shape (the padding of the last block dropped)."""
        centred = dequantise_int8(self.codes.reshape(-1, self.block_size), self.scales)
        return (centred + self.offset.float()).flatten()[: _numel(self.shape)].reshape(self.shape)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.offset))


def _numel(shape: tuple[int, ...]) -> int:
    return int(torch.Size(shape).numel())


def double_quantise(absmax: Float[Tensor, "out groups"], block_size: int = 256) -> DoubleQuantised:
    """Quantise the absmaxes themselves: subtract their mean, then symmetric int8 per block of ``block_size``
    (``quantise_int8`` on the absmaxes flattened into rows of ``block_size``; a short last block is padded
    with the mean, which costs nothing since it quantises to 0)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if not isinstance(absmax, Tensor) or not absmax.is_floating_point() or absmax.numel() == 0:
        raise ValueError("absmax must be a non-empty floating-point tensor")
    if not torch.isfinite(absmax).all():
        raise ValueError("absmax holds NaN or infinite values: double quantisation takes the finite absmaxes "
                         "quantise_nf4 returns")
    flat = absmax.detach().to(torch.float32, copy=True).flatten()  # a copy: in-place work must not reach the caller's
    n_blocks = -(-flat.numel() // block_size)
    ### BEGIN SOLUTION
    # Hint: centre the absmaxes on their mean, pad to whole blocks, and reuse quantise_int8 row by row.
    offset = flat.mean()
    padded = torch.cat([flat - offset, flat.new_zeros(n_blocks * block_size - flat.numel())])
    codes, scales = quantise_int8(padded.reshape(n_blocks, block_size))
    return DoubleQuantised(codes.flatten(), scales, offset, tuple(absmax.shape), block_size)
    ### END SOLUTION
