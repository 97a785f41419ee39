"""Part 11: the NF4 codebook (QLoRA, Dettmers et al. 2023), against its published levels and brute force.

* The levels: against the 16 values bitsandbytes publishes (``part11_oracles.PUBLISHED_NF4``) and
  against QLoRA's construction written here with scipy's ``ndtri`` (``scipy.stats.norm.ppf``), both to float32 precision:
  within ``LEVEL_ATOL = 2**-20`` (8 float32 ulps at 1.0; the published values were computed from the
  offset rounded to 0.9677083 in float32 arithmetic, which moves them by up to 1.5 ulps).
* Codes: each weight's level is a nearest one, by brute force over the 16 levels (a weight within
  ``NEAREST_SLACK`` of a midpoint may take either side), on the trained ``story`` model's weights.
  Absmaxes are the groups' largest magnitudes exactly.
* The round-trip bound: a nearest level is at most half the widest gap between neighbouring levels
  away (``(1 - 0.7229568) / 2`` of the absmax, between the two largest levels).
* Double quantisation: the absmaxes within half an int8 step of their block (the bound of exercise 1)
  plus one float32 rounding of the offset added back, in fewer bytes.
"""

from __future__ import annotations

import pytest
import torch

from part11_oracles import PUBLISHED_NF4, TIE, random_matrix, tensors, weight_matrices

LEVEL_ATOL = 2**-20
# Two correct ways of computing w / absmax (a division, a multiplication by 1 / absmax) differ by a float32
# ulp or two (about 2.4e-7 at 1): a weight that near a midpoint may take either level.
NEAREST_SLACK = 1e-6
PUBLISHED = torch.tensor(PUBLISHED_NF4, dtype=torch.float64)
HALF_WIDEST_GAP = float((PUBLISHED[1:] - PUBLISHED[:-1]).max() / 2)


def scipy_levels() -> torch.Tensor:
    """QLoRA's construction with scipy's normal quantile function (scipy.special.ndtri, norm.ppf's core), in float64."""
    from scipy.special import ndtri

    p = 0.5 * ((1 - 1 / 30) + (1 - 1 / 32))
    positive = ndtri(torch.linspace(p, 0.5, 9, dtype=torch.float64)[:-1].numpy())
    negative = -ndtri(torch.linspace(p, 0.5, 8, dtype=torch.float64)[:-1].numpy())
    levels = torch.tensor(sorted([*negative, 0.0, *positive]), dtype=torch.float64)
    return levels / levels.max()


@pytest.mark.exercise("nf4_levels")
def test_levels_are_qloras_published_values(impl):
    levels = tensors(impl.nf4.nf4_levels())
    assert levels.dtype == torch.float32 and levels.shape == (16,), (levels.dtype, levels.shape)
    worst = int((levels.double() - PUBLISHED).abs().argmax())
    torch.testing.assert_close(
        levels.double(), PUBLISHED, rtol=0, atol=LEVEL_ATOL,
        msg=f"not QLoRA's published NF4 levels: level {worst} is {levels[worst].item():.6f}, published "
            f"{PUBLISHED[worst].item():.6f}; yours: {' '.join(f'{v:+.3f}' for v in levels.tolist())}",
    )
    torch.testing.assert_close(levels.double(), scipy_levels(), rtol=0, atol=LEVEL_ATOL)
    assert levels[0] == -1 and levels[7] == 0 and levels[15] == 1, "-1, 0 and 1 must be levels exactly"
    assert (levels[1:] > levels[:-1]).all(), "the levels must be sorted, smallest first"


def check_nearest(impl, weight: torch.Tensor, group_size: int, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    codes, absmax = tensors(*impl.nf4.quantise_nf4(weight.clone(), group_size))
    groups = weight.shape[1] // group_size
    assert codes.dtype == torch.uint8 and codes.shape == weight.shape, (what, codes.dtype, codes.shape)
    assert absmax.shape == (weight.shape[0], groups), (what, absmax.shape)
    grouped = weight.double().reshape(weight.shape[0], groups, group_size)
    expected = grouped.abs().amax(-1).clamp(min=torch.finfo(torch.float32).smallest_normal)
    torch.testing.assert_close(absmax.double(), expected, rtol=0, atol=0, msg=f"{what}: absmax per group")
    normalised = grouped / absmax.double()[..., None]
    distances = (normalised[..., None] - PUBLISHED).abs()  # brute force: every level
    chosen = distances.gather(-1, codes.long().reshape(grouped.shape)[..., None])[..., 0]
    worse = chosen > distances.amin(-1) + NEAREST_SLACK
    if worse.any():
        i = tuple(int(x) for x in worse.nonzero()[0])
        raise AssertionError(f"{what}: {int(worse.sum())} weights do not get their nearest level; first at {i}: "
                             f"w / absmax = {normalised[i].item():.6f} got level {PUBLISHED[int(codes.reshape(grouped.shape)[i])].item():.4f}")
    error = (normalised - PUBLISHED[codes.long().reshape(grouped.shape)]).abs()
    assert (error <= HALF_WIDEST_GAP + NEAREST_SLACK).all(), f"{what}: a weight is further than half a gap from its level"
    return codes, absmax


@pytest.mark.exercise("quantise_nf4")
@pytest.mark.parametrize("matrix, group_size", [("c_fc", 64), ("mlp_proj", 128)])
def test_nf4_codes_are_nearest_levels_on_trained_weights(impl, story, matrix, group_size):
    check_nearest(impl, weight_matrices(story)[matrix], group_size, matrix)


@pytest.mark.exercise("quantise_nf4")
def test_nf4_extremes_and_zeros_are_exact(impl):
    weight = random_matrix(21, 4, 64)
    weight[1, 3] = 0.0
    codes, absmax = check_nearest(impl, weight, 32, "random")
    assert codes[1, 3] == 7, "a zero weight must get the level 0.0 (code 7)"
    for row in range(4):
        for group in range(2):
            block = weight[row, 32 * group : 32 * (group + 1)]
            i = int(block.abs().argmax())
            assert codes[row, 32 * group + i] == (15 if block[i] > 0 else 0), "a group's absmax must map to +-1"
    before = weight.clone()
    impl.nf4.quantise_nf4(weight, 32)
    assert torch.equal(weight, before), "quantise_nf4 modified the weight matrix it was given (the caller's own tensor)"


@pytest.mark.exercise("dequantise_nf4")
def test_dequantise_nf4_is_level_times_absmax(impl):
    g = torch.Generator().manual_seed(22)
    codes = torch.randint(0, 16, (3, 24), generator=g).to(torch.uint8)
    absmax = torch.rand(3, 3, generator=g) + 0.05
    exact = (PUBLISHED[codes.long()].reshape(3, 3, 8) * absmax.double()[..., None]).reshape(3, 24)
    # The learner's levels may differ from the published ones by LEVEL_ATOL: that much of each absmax.
    slack = LEVEL_ATOL * absmax.double().repeat_interleave(8, 1)
    for dtype in [torch.float32, torch.bfloat16, torch.float16, torch.float64]:
        result = impl.nf4.dequantise_nf4(codes.clone(), absmax.clone(), 8, dtype) if dtype != torch.float32 \
            else impl.nf4.dequantise_nf4(codes.clone(), absmax.clone(), 8)
        assert tensors(result).dtype == dtype and result.shape == codes.shape, f"asked for {dtype}, got {result.dtype}"
        rel = max(torch.finfo(dtype).eps, torch.finfo(torch.float32).eps)  # two roundings in dtype at most
        assert ((result.double() - exact).abs() <= rel * exact.abs() + slack).all(), dtype


@pytest.mark.exercise("double_quantise")
@pytest.mark.parametrize("block_size", [256, 64])
def test_double_quantised_absmaxes_come_back_within_half_a_step(impl, story, block_size):
    if block_size == 256:  # the trained model's absmaxes per group of 64 (768 x 3 of them: 9 whole blocks)
        absmax = weight_matrices(story)["c_fc"].reshape(768, 3, 64).abs().amax(-1)
    else:  # 301 absmaxes: a short last block
        absmax = torch.rand(7, 43, generator=torch.Generator().manual_seed(23)) + 0.2
    dq = impl.nf4.double_quantise(absmax.clone(), block_size)
    tensors(dq.codes, dq.scales, dq.offset)
    n, blocks = absmax.numel(), -(-absmax.numel() // block_size)
    assert dq.codes.dtype == torch.int8 and dq.codes.numel() == blocks * block_size, (
        f"codes: int8, one per absmax and the last block's padding ({blocks} blocks of {block_size}, "
        f"{blocks * block_size} codes for {n} absmaxes), got {dq.codes.dtype} of shape {tuple(dq.codes.shape)}")
    assert dq.scales.shape == (blocks,) and dq.block_size == block_size and tuple(dq.shape) == tuple(absmax.shape)
    assert float(dq.offset) == pytest.approx(float(absmax.double().mean()), rel=1e-6), "the offset is the absmaxes' mean"
    # What the stored codes, scales and offset stand for, computed here: DoubleQuantised.dequantise and nbytes are
    # given code in the submission's file, which a class grader cannot trust (one returning the absmaxes kept aside
    # would pass any codes).
    codes, scales, offset = (t.detach().cpu() for t in (dq.codes, dq.scales, dq.offset))
    # Each block's scale is its largest centred magnitude over 127 (exercise 1's): a larger one would pass the bound.
    centred = torch.cat([absmax.double().flatten() - offset.double(), torch.zeros(blocks * block_size - n, dtype=torch.float64)])
    expected = (centred.reshape(blocks, block_size).abs().amax(-1) / 127).clamp(min=torch.finfo(torch.float32).smallest_normal)
    torch.testing.assert_close(scales.double(), expected, rtol=1e-5, atol=0, msg="each block's scale is max|absmax - offset| / 127")
    back = (codes.double().reshape(blocks, block_size) * scales.double()[:, None]).flatten()[:n] + offset.double()
    back = back.reshape(absmax.shape)
    step = scales.double().repeat_interleave(block_size)[:n].reshape(absmax.shape)
    error = (back - absmax.double()).abs()
    bound = step * (0.5 + TIE) + torch.finfo(torch.float32).eps * absmax.double()
    assert (error <= bound).all(), f"absmax off by {(error / step).max().item():.3f} steps (at most 1/2)"
    nbytes = sum(t.numel() * t.element_size() for t in (codes, scales, offset))
    assert nbytes < 0.3 * 4 * n, f"{nbytes} bytes for {n} float32 absmaxes ({4 * n} bytes)"
    torch.testing.assert_close(dq.dequantise().double(), back, rtol=0, atol=float(step.max()) * 1e-3)


@pytest.mark.exercise("double_quantise")
def test_double_quantise_leaves_its_input_unchanged(impl):
    absmax = torch.rand(3, 100, generator=torch.Generator().manual_seed(24)) + 0.2  # 300: exactly 3 blocks of 100
    before = absmax.clone()
    impl.nf4.double_quantise(absmax, 100)
    assert torch.equal(absmax, before), "double_quantise modified the absmaxes it was given (the caller's own tensor)"


# ---------------------------------------------------------------------------------------
# Given code (not graded as the learner's)
# ---------------------------------------------------------------------------------------


def test_an_all_zero_group_quantises_to_level_zero(impl):
    codes, absmax = impl.nf4.quantise_nf4(torch.zeros(2, 8), 4)
    assert torch.isfinite(absmax).all() and (codes == 7).all()
    assert (impl.nf4.dequantise_nf4(codes, absmax, 4) == 0).all()


@pytest.mark.parametrize("call, error, match", [
    (lambda m: m.quantise_nf4(torch.zeros(2, 12), 8), ValueError, "divide"),
    (lambda m: m.quantise_nf4(torch.zeros(12)), ValueError, "(out, in)"),
    (lambda m: m.dequantise_nf4(torch.zeros(2, 8, dtype=torch.uint8), torch.ones(2, 3), 4), ValueError, "absmax"),
    (lambda m: m.dequantise_nf4(torch.zeros(2, 8, dtype=torch.uint8), torch.ones(2, 2), 4, torch.int8), TypeError, "dtype"),
    (lambda m: m.double_quantise(torch.ones(4), 0), ValueError, "block_size"),
    (lambda m: m.double_quantise(torch.ones(0)), ValueError, "non-empty"),
    (lambda m: m.double_quantise(torch.tensor([1.0, float("nan")])), ValueError, "absmax holds NaN"),
    (lambda m: m.dequantise_nf4(torch.full((2, 8), 16, dtype=torch.uint8), torch.ones(2, 2), 4), ValueError,
     r"must lie in \[0, 15\]; got codes from 16 to 16"),
])
def test_bad_arguments_are_refused_with_what_is_allowed(impl, call, error, match):
    with pytest.raises(error, match=match):
        call(impl.nf4)
