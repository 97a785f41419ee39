"""Part 11's probes: small fixed matrices for each quantiser and dequantiser.

The matrices have rows of different sizes and one outlier (so the mean and the max differ), weights
well below 1 (so rounding before dividing shows), groups that are all positive (zero point 0), and,
for the dequantisers, codes on both sides of their zero point and a dtype other than float32 (the
output's dtype is part of the probe's answer: a tensor comparison alone would not see it).
"""

from __future__ import annotations

from typing import Any

import torch

from sampling_course.grading.matching import plain
from sampling_course.grading.probing import Impl, generator, probe, randn


def _matrix(seed: int, rows: int = 4, cols: int = 16) -> torch.Tensor:
    g = generator(seed)
    weight = randn(g, rows, cols, std=0.3) * torch.linspace(0.5, 2.0, rows)[:, None]
    weight[1, 3] = 2.5  # an outlier: its row's max is far above its mean
    weight[2, :8] = weight[2, :8].abs() + 0.05  # two groups of 4 (or one of 8) with no negative weight
    return weight


def _typed(x: torch.Tensor) -> list[Any]:
    """A dequantised tensor as the probe sees it: its values (in float64) and its dtype."""
    return [plain(x.double()), str(x.dtype)]


@probe("quantise_int8")
def _probe_quantise_int8(impl: Impl) -> Any:
    q, scale = impl.quantise.quantise_int8(_matrix(1))
    return [plain(q), plain(scale)]


@probe("dequantise_int8")
def _probe_dequantise_int8(impl: Impl) -> Any:
    g = generator(2)
    q = torch.randint(-127, 128, (3, 8), generator=g).to(torch.int8)
    scale = torch.rand(3, generator=g) / 50
    deq = impl.quantise.dequantise_int8
    return [_typed(deq(q, scale)), _typed(deq(q, scale, torch.bfloat16)), _typed(deq(q, scale, torch.float64))]


@probe("quantise_groups")
def _probe_quantise_groups(impl: Impl) -> Any:
    weight = _matrix(3)
    q, scale, zero_point = impl.quantise.quantise_groups(weight, 4)
    q3, scale3, zero_point3 = impl.quantise.quantise_groups(weight, 8, bits=3)
    return [plain(q), plain(scale), plain(zero_point), plain(q3), plain(scale3), plain(zero_point3)]


@probe("dequantise_groups")
def _probe_dequantise_groups(impl: Impl) -> Any:
    g = generator(4)
    q = torch.randint(0, 16, (3, 8), generator=g).to(torch.uint8)
    zero_point = torch.tensor([[7.0, 3.0], [0.0, 15.0], [8.0, 12.0]])  # codes fall on both sides
    scale = torch.rand(3, 2, generator=g) / 10 + 0.01
    deq = impl.quantise.dequantise_groups
    return [_typed(deq(q, scale, zero_point, 4)), _typed(deq(q, scale, zero_point, 4, torch.bfloat16))]


@probe("nf4_levels")
def _probe_nf4_levels(impl: Impl) -> Any:
    return plain(impl.nf4.nf4_levels())


@probe("quantise_nf4")
def _probe_quantise_nf4(impl: Impl) -> Any:
    codes, absmax = impl.nf4.quantise_nf4(_matrix(5), 8)
    return [plain(codes), plain(absmax)]


@probe("dequantise_nf4")
def _probe_dequantise_nf4(impl: Impl) -> Any:
    g = generator(6)
    codes = torch.randint(0, 16, (3, 8), generator=g).to(torch.uint8)
    absmax = torch.rand(3, 2, generator=g) + 0.1
    deq = impl.nf4.dequantise_nf4
    return [_typed(deq(codes, absmax, 4)), _typed(deq(codes, absmax, 4, torch.bfloat16))]


@probe("double_quantise")
def _probe_double_quantise(impl: Impl) -> Any:
    absmax = torch.rand(5, 6, generator=generator(7)) + 0.5  # 30 absmaxes: blocks of 8, the last one short
    dq = impl.nf4.double_quantise(absmax, 8)
    return [plain(dq.codes), plain(dq.scales), plain(dq.offset), plain(dq.dequantise())]


@probe("quantise_matrix")
def _probe_quantise_matrix(impl: Impl) -> Any:
    model, weight = impl.quantised_model, _matrix(10, 4, 16)
    return [[plain(t) for t in model.quantise_matrix(weight, model.Scheme.parse(s))] for s in ("int8", "int4-g8", "nf4-g8")]


@probe("gptq_quantise")
def _probe_gptq(impl: Impl) -> Any:
    g = generator(8)
    inputs = randn(g, 24, 3) @ randn(g, 3, 8) + randn(g, 24, 8, std=0.2)  # correlated inputs: the updates matter
    codes, scale, zero_point = impl.gptq.gptq_quantise(_matrix(9, 4, 8), inputs, 4)
    return [plain(codes), plain(scale), plain(zero_point)]
