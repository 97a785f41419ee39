"""Part 11: int8 per output channel and 4-bit per group, against torchao's primitives and brute force.

* torchao (``choose_qparams_affine`` / ``quantize_affine`` / ``dequantize_affine``, symmetric on
  [-127, 127] per row, asymmetric on [0, 2**bits - 1] per group of consecutive inputs) on the same
  weights: the trained ``story`` model's first-layer matrices. Scales agree to float32 rounding;
  codes agree except at ties (``part11_oracles.TIE``), where either neighbour is right.
* Brute force written here, one row or group at a time in float64, on matrices with outliers, an
  all-positive region and exact zeros.
* The round-trip bound. A code is the nearest integer to ``w / scale`` (+ zero point), so the weight
  it stands for is within half a step: ``|w - dequantised| <= scale / 2``, plus the tie allowance
  ``TIE * scale`` (a code chosen the other way at a tie). The range covers every weight (the
  max maps to the top code, the min to 0), so no weight is clipped beyond that.
* Dequantisation: exact products (float64) rounded once to float32; in another dtype at most two
  roundings of that dtype (``eps(dtype)`` relative), and the dtype asked for.
"""

from __future__ import annotations

import pytest
import torch

from part11_oracles import TIE, assert_codes_allowed, tensors, random_matrix, torchao_groups, torchao_int8, torchao_version, weight_matrices

DTYPES = [torch.bfloat16, torch.float16, torch.float64]


def relative_bound(dtype: torch.dtype) -> float:
    """Two roundings at most (a scale cast to ``dtype``, then the product): ``eps(dtype)`` relative; never tighter
    than float32's, which a float32 computation cast to float64 keeps."""
    return max(torch.finfo(dtype).eps, torch.finfo(torch.float32).eps)


@pytest.fixture(scope="module")
def story_matrices(story):
    return weight_matrices(story)


# ---------------------------------------------------------------------------------------
# int8 per output channel
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("quantise_int8")
def test_int8_matches_torchao_on_trained_weights(impl, story_matrices, oracle):
    for name, weight in story_matrices.items():
        q, scale = tensors(*impl.quantise.quantise_int8(weight.clone()))
        ref_q, ref_scale = oracle(torchao_int8, weight, torchao_version())
        assert q.dtype == torch.int8 and q.shape == weight.shape, (name, q.dtype, q.shape)
        assert scale.dtype == torch.float32 and scale.shape == (weight.shape[0],), (name, scale.dtype, scale.shape)
        torch.testing.assert_close(scale, ref_scale, rtol=1e-6, atol=0, msg=f"{name}: scales differ from torchao's")
        quotient = weight.double() / ref_scale.double()[:, None]
        assert_codes_allowed(q, quotient, -127, 127, f"{name} (torchao's scale)")
        assert_codes_allowed(ref_q, quotient, -127, 127, f"{name}, torchao's own codes")  # the reference obeys the rule


@pytest.mark.exercise("quantise_int8")
def test_int8_brute_force_and_round_trip_bound(impl):
    weight = random_matrix(11, 6, 48)
    weight[3, 5] = 0.0
    q, scale = tensors(*impl.quantise.quantise_int8(weight.clone()))
    for row in range(weight.shape[0]):
        values = [float(w) for w in weight[row].double()]
        expected_scale = max(abs(w) for w in values) / 127
        assert scale[row].item() == pytest.approx(expected_scale, rel=1e-6), f"row {row}: scale"
        quotient = torch.tensor(values, dtype=torch.float64) / expected_scale
        assert_codes_allowed(q[row], quotient, -127, 127, f"row {row}")
        # The largest magnitude is the top code, exactly.
        top = max(range(len(values)), key=lambda i: abs(values[i]))
        assert abs(int(q[row, top])) == 127, f"row {row}: its largest weight got code {int(q[row, top])}, not +-127"
    error = (weight.double() - q.double() * scale.double()[:, None]).abs()
    bound = scale.double()[:, None] * (0.5 + TIE)
    assert (error <= bound).all(), f"round trip off by {(error / scale.double()[:, None]).max().item():.4f} steps (at most 1/2)"
    assert q[3, 5] == 0


@pytest.mark.exercise("quantise_int8")
def test_int8_leaves_its_input_unchanged(impl):
    weight = random_matrix(12, 4, 32)
    before = weight.clone()
    impl.quantise.quantise_int8(weight)
    assert torch.equal(weight, before), "quantise_int8 modified the weight matrix it was given (the caller's own tensor)"


@pytest.mark.exercise("dequantise_int8")
def test_dequantise_int8_is_codes_times_row_scales(impl):
    g = torch.Generator().manual_seed(13)
    q = torch.randint(-127, 128, (5, 24), generator=g).to(torch.int8)
    scale = torch.rand(5, generator=g) / 30 + 1e-3
    exact = q.double() * scale.double()[:, None]
    result = tensors(impl.quantise.dequantise_int8(q.clone(), scale.clone()))
    assert result.dtype == torch.float32 and result.shape == q.shape
    torch.testing.assert_close(result.double(), exact, rtol=torch.finfo(torch.float32).eps, atol=0)
    for dtype in DTYPES:
        typed = tensors(impl.quantise.dequantise_int8(q, scale, dtype))
        assert typed.dtype == dtype, f"asked for {dtype}, got {typed.dtype}"
        torch.testing.assert_close(typed.double(), exact, rtol=relative_bound(dtype), atol=0)


# ---------------------------------------------------------------------------------------
# 4 bits (and 3) per group, with zero points
# ---------------------------------------------------------------------------------------


def check_groups(impl, weight: torch.Tensor, group_size: int, bits: int, what: str) -> tuple[torch.Tensor, ...]:
    """The learner's groups of ``weight``, brute-forced here group by group (in float64): scale, zero point, codes, bound."""
    top = 2**bits - 1
    q, scale, zero_point = tensors(*impl.quantise.quantise_groups(weight.clone(), group_size, bits))
    groups = weight.shape[1] // group_size
    assert q.dtype == torch.uint8 and q.shape == weight.shape, (what, q.dtype, q.shape)
    assert scale.shape == zero_point.shape == (weight.shape[0], groups), (what, scale.shape, zero_point.shape)
    grouped = weight.double().reshape(weight.shape[0], groups, group_size)
    low, high = grouped.amin(-1).clamp(max=0), grouped.amax(-1).clamp(min=0)
    # An all-zero group's scale is given code's floor (float32's smallest normal, as torchao's), not 0.
    expected = ((high - low) / top).clamp(min=torch.finfo(torch.float32).smallest_normal)
    torch.testing.assert_close(scale.double(), expected, rtol=1e-6, atol=0, msg=f"{what}: scales are not (max - min) / (2**bits - 1) of each group's range widened to include 0")
    assert_codes_allowed(zero_point, -low / scale.double(), 0, top, f"{what}: zero points")
    quotient = grouped / scale.double()[..., None] + zero_point.double()[..., None]
    assert_codes_allowed(q.reshape(grouped.shape), quotient, 0, top, f"{what}: codes")
    deq = (q.double().reshape(grouped.shape) - zero_point.double()[..., None]) * scale.double()[..., None]
    error = (grouped - deq).abs()
    assert (error <= scale.double()[..., None] * (0.5 + TIE)).all(), f"{what}: a weight is more than half a step off"
    return q, scale, zero_point


@pytest.mark.exercise("quantise_groups")
@pytest.mark.parametrize("matrix, group_size, bits", [("c_attn", 64, 4), ("c_fc", 32, 4), ("mlp_proj", 128, 4),
                                                      ("attn_proj", 64, 3)])
def test_groups_match_torchao_on_trained_weights(impl, story_matrices, oracle, matrix, group_size, bits):
    weight = story_matrices[matrix]
    q, scale, zero_point = check_groups(impl, weight, group_size, bits, matrix)
    ref_q, ref_scale, ref_zero_point, _ = oracle(torchao_groups, weight, group_size, bits, torchao_version())
    torch.testing.assert_close(scale, ref_scale, rtol=1e-6, atol=0, msg="scales differ from torchao's")
    tied = zero_point != ref_zero_point  # only where -min / scale sits at a half (checked above)
    assert tied.float().mean() < 0.01, f"{int(tied.sum())} zero points differ from torchao's"
    same_groups = ~tied
    codes, ref_codes = (c.reshape(*scale.shape, group_size)[same_groups] for c in (q, ref_q))
    assert (codes != ref_codes).float().mean() < 0.01, "codes differ from torchao's beyond ties"


@pytest.mark.exercise("quantise_groups")
def test_groups_brute_force_all_positive_and_zero_weights(impl):
    weight = random_matrix(14, 4, 64)
    weight[1, 16:32] = 0.0  # an all-zero group: its codes sit at the zero point, and it comes back exact
    weight[2, 40] = 0.0
    q, scale, zero_point = check_groups(impl, weight, 16, 4, "random")
    assert (zero_point[0, :2] == 0).all(), "an all-positive group's zero point is 0 (0 is its minimum)"
    assert (q[1, 16:32].long() == zero_point[1, 1].long()).all()
    assert q[2, 40].long() == zero_point[2, 2].long(), "0 must be quantised to the zero point exactly"


@pytest.mark.exercise("quantise_groups")
def test_groups_leave_their_input_unchanged(impl):
    weight = random_matrix(15, 4, 32)
    before = weight.clone()
    impl.quantise.quantise_groups(weight, 8)
    assert torch.equal(weight, before), "quantise_groups modified the weight matrix it was given (the caller's own tensor)"


@pytest.mark.exercise("dequantise_groups")
def test_dequantise_groups_against_brute_force_and_torchao(impl, story_matrices, oracle):
    g = torch.Generator().manual_seed(16)
    q = torch.randint(0, 16, (4, 32), generator=g).to(torch.uint8)
    zero_point = torch.randint(0, 16, (4, 4), generator=g).float()  # codes fall on both sides of it
    scale = torch.rand(4, 4, generator=g) / 20 + 1e-3
    exact = ((q.double().reshape(4, 4, 8) - zero_point.double()[..., None]) * scale.double()[..., None]).reshape(4, 32)
    result = tensors(impl.quantise.dequantise_groups(q.clone(), scale.clone(), zero_point.clone(), 8))
    assert result.dtype == torch.float32 and result.shape == q.shape
    torch.testing.assert_close(result.double(), exact, rtol=torch.finfo(torch.float32).eps, atol=0)
    for dtype in DTYPES:
        typed = tensors(impl.quantise.dequantise_groups(q, scale, zero_point, 8, dtype))
        assert typed.dtype == dtype, f"asked for {dtype}, got {typed.dtype}"
        torch.testing.assert_close(typed.double(), exact, rtol=relative_bound(dtype), atol=0)
    ref_q, ref_scale, ref_zero_point, ref_deq = oracle(torchao_groups, story_matrices["c_fc"], 32, 4, torchao_version())
    ours = tensors(impl.quantise.dequantise_groups(ref_q, ref_scale, ref_zero_point, 32))
    torch.testing.assert_close(ours, ref_deq, rtol=2 * torch.finfo(torch.float32).eps, atol=0)


# ---------------------------------------------------------------------------------------
# Given code (not graded as the learner's): argument checks, all-zero rows, packing
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_check_matrix_hands_the_quantiser_its_own_copy(impl, dtype):
    """So that a quantiser working in place on ``weight`` (the classic ``weight.div_(scale[:, None])``) is correct."""
    weight = random_matrix(25, 3, 8).to(dtype)
    checked = impl.quantise.check_matrix(weight)
    assert checked.dtype == torch.float32 and torch.equal(checked, weight.float())
    checked.add_(1)
    assert torch.equal(weight, random_matrix(25, 3, 8).to(dtype)), "check_matrix returned the caller's own tensor"


def test_all_zero_rows_quantise_to_zero_and_back(impl):
    q, scale = impl.quantise.quantise_int8(torch.zeros(2, 8))
    assert torch.isfinite(scale).all() and (scale > 0).all() and (q == 0).all()
    q4, scale4, zero_point = impl.quantise.quantise_groups(torch.zeros(2, 8), 4)
    assert torch.isfinite(scale4).all() and (q4.long() == zero_point.long().repeat_interleave(4, 1)).all()


@pytest.mark.parametrize("call, error, match", [
    (lambda m: m.quantise_int8(torch.zeros(3)), ValueError, "(out, in)"),
    (lambda m: m.quantise_int8(torch.zeros(2, 3, dtype=torch.long)), TypeError, "floating-point"),
    (lambda m: m.quantise_int8(torch.tensor([[1.0, float("nan")]])), ValueError, "NaN"),
    (lambda m: m.quantise_groups(torch.zeros(2, 12), 8), ValueError, "divide"),
    (lambda m: m.quantise_groups(torch.zeros(2, 12), 0), ValueError, "group_size"),
    (lambda m: m.quantise_groups(torch.zeros(2, 12), 4, bits=9), ValueError, "bits"),
    (lambda m: m.dequantise_int8(torch.zeros(2, 3, dtype=torch.int8), torch.ones(2), torch.int32), TypeError, "dtype"),
    (lambda m: m.dequantise_int8(torch.zeros(2, 3, dtype=torch.int8), torch.ones(3)), ValueError, "scale"),
    (lambda m: m.dequantise_groups(torch.zeros(2, 8, dtype=torch.uint8), torch.ones(2, 3), torch.ones(2, 3), 4),
     ValueError, "zero_point"),
    (lambda m: m.pack_int4(torch.full((1, 2), 16, dtype=torch.uint8)), ValueError, "15"),
    (lambda m: m.pack_int4(torch.zeros(1, 3, dtype=torch.uint8)), ValueError, "even"),
])
def test_bad_arguments_are_refused_with_what_is_allowed(impl, call, error, match):
    with pytest.raises(error, match=match):
        call(impl.quantise)


def test_pack_int4_holds_two_codes_a_byte(impl):
    codes = torch.randint(0, 16, (3, 10), generator=torch.Generator().manual_seed(17)).to(torch.uint8)
    packed = impl.quantise.pack_int4(codes)
    assert packed.shape == (3, 5) and packed.dtype == torch.uint8
    assert torch.equal(packed, codes[:, 0::2] + 16 * codes[:, 1::2])
    assert torch.equal(impl.quantise.unpack_int4(packed), codes)
