"""Part 11 (optional): GPTQ's error-compensating rounding (Frantar et al., 2022), against brute force.

* The reference, written here: Optimal Brain Quantisation's update in its elimination form, in float64,
  with the inverse Hessian itself (no Cholesky factor): round column j, move the later columns by
  ``-e * Hinv[j, j+1:] / Hinv[j, j]``, then eliminate column j from ``Hinv``. GPTQ's Cholesky form is
  the same computation; a float32 implementation may round a code the other way where the reference's
  quotient sits at a half, and the error then travels on, so codes may differ in at most ``MISMATCH``
  of the places, and the output error must be within ``SLACK`` of the reference's.
* Inputs whose Hessian is a multiple of the identity leave nothing to compensate: the codes, scales and
  zero points are then exactly ``quantise_groups``'.
* On correlated inputs the layer's output error, ``||X W^T - X Wq^T||^2``, is far below plain rounding's.
"""

from __future__ import annotations

import pytest
import torch

from part11_oracles import random_matrix

MISMATCH = 0.02
SLACK = 1.05


def obq_reference(weight: torch.Tensor, inputs: torch.Tensor, group_size: int, bits: int) -> tuple[torch.Tensor, ...]:
    """Column-by-column rounding with OBQ's compensation, in float64 (GPTQ's damping: 1% of the mean diagonal)."""
    top = 2**bits - 1
    w = weight.double().clone()
    hessian = 2 * inputs.double().T @ inputs.double()
    hessian += 0.01 * hessian.diagonal().mean() * torch.eye(w.shape[1], dtype=torch.float64)
    hinv = torch.linalg.inv(hessian)
    codes = torch.zeros_like(w)
    scales, zeros = [], []
    for j in range(w.shape[1]):
        if j % group_size == 0:
            block = w[:, j : j + group_size]
            low, high = block.amin(1).clamp(max=0), block.amax(1).clamp(min=0)
            scale = (high - low) / top
            zero = (-low / scale).round()
            scales.append(scale)
            zeros.append(zero)
        q = ((w[:, j] / scale).round() + zero).clamp(0, top)
        error = w[:, j] - (q - zero) * scale
        w[:, j + 1 :] -= error[:, None] * hinv[j, j + 1 :][None, :] / hinv[j, j]
        hinv = hinv - hinv[:, j : j + 1] @ hinv[j : j + 1, :] / hinv[j, j]
        codes[:, j] = q
    return codes, torch.stack(scales, 1), torch.stack(zeros, 1)


def output_error(weight, inputs, codes, scale, zero_point, group_size) -> float:
    deq = ((codes.double().reshape(*scale.shape, group_size) - zero_point.double()[..., None])
           * scale.double()[..., None]).reshape(weight.shape)
    return float(((inputs.double() @ (weight.double() - deq).T) ** 2).sum())


def correlated_inputs(seed: int, n: int, features: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g) @ torch.randn(6, features, generator=g) + 0.3 * torch.randn(n, features, generator=g)


@pytest.mark.exercise("gptq_quantise")
@pytest.mark.parametrize("group_size, bits", [(32, 4), (16, 3)])
def test_gptq_matches_obq_compensation_and_beats_plain_rounding(impl, group_size, bits):
    weight, inputs = random_matrix(41, 12, 64), correlated_inputs(42, 96, 64)
    codes, scale, zero_point = impl.gptq.gptq_quantise(weight.clone(), inputs.clone(), group_size, bits)
    assert codes.dtype == torch.uint8 and codes.shape == weight.shape and scale.shape == zero_point.shape == (12, 64 // group_size)
    ref_codes, ref_scale, ref_zero = obq_reference(weight, inputs, group_size, bits)
    assert (codes.double() != ref_codes).double().mean() <= MISMATCH, "codes differ from the compensated rounding's"
    ours = output_error(weight, inputs, codes, scale, zero_point, group_size)
    reference = output_error(weight, inputs, ref_codes, ref_scale, ref_zero, group_size)
    plain = output_error(weight, inputs, *impl.quantise.quantise_groups(weight, group_size, bits), group_size)
    assert ours <= SLACK * reference, f"output error {ours:.4g}, compensated rounding's {reference:.4g}"
    assert reference < 0.5 * plain  # the premise: compensation pays on correlated inputs


@pytest.mark.exercise("gptq_quantise")
def test_gptq_on_uncorrelated_inputs_is_plain_rounding(impl):
    weight = random_matrix(43, 8, 64)
    orthonormal, _ = torch.linalg.qr(torch.randn(80, 64, generator=torch.Generator().manual_seed(44)))
    got = impl.gptq.gptq_quantise(weight.clone(), orthonormal, 32)
    expected = impl.quantise.quantise_groups(weight, 32)
    for a, b, what in zip(got, expected, ("codes", "scales", "zero points")):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=0, msg=what)


# Given code (not graded as the learner's).
def test_gptq_refuses_inputs_of_another_width(impl):
    with pytest.raises(ValueError, match="input features"):
        impl.gptq.gptq_quantise(torch.zeros(2, 8), torch.zeros(4, 6), 4)
