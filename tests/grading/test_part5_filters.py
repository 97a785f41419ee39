"""Part 5: the classic filters (top-k, top-p, min-p) against Hugging Face's warpers and the peers' own test cases."""

from __future__ import annotations

import pytest
import torch

from part5_shared import Part5, assert_same_filter, hf_processor, random_logits


@pytest.fixture(scope="module")
def gen(impl):
    """Part 5's names under test, from whichever module holds them."""
    return Part5(impl)


# ---------------------------------------------------------------------------------------
# Filters
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("top_k_filter")
def test_top_k_filter_matches_hf(gen, oracle, seed):
    """top_k_filter keeps the same tokens, with the same values, as TopKLogitsWarper; k > d_vocab keeps all."""
    logits = random_logits(seed, 6, 300)
    for k in (1, 2, 17, 299, 300, 1000):
        actual = gen.top_k_filter(logits.clone(), k)
        expected = oracle(hf_processor, "TopKLogitsWarper", dict(top_k=k), None, logits)
        assert_same_filter(actual, expected, f"top_k_filter(k={k})")


@pytest.mark.exercise("top_k_filter")
def test_top_k_filter_ties_at_the_kth_value(gen, oracle):
    """With several tokens tied at the k-th value, keeping all of them (Hugging Face) and keeping exactly k
    (torch.topk and a scatter) are both accepted: every token above the k-th value stays, every token below
    it goes, and kept values are unchanged."""
    logits = torch.tensor([[3.0, 1.0, 2.0, 1.0, 0.0, 1.0, -1.0], [0.5, 0.5, 0.5, 0.5, 0.2, 0.9, 0.1]])
    for k in (2, 3, 4):
        actual = gen.top_k_filter(logits.clone(), k)
        hf_kept = torch.isfinite(oracle(hf_processor, "TopKLogitsWarper", dict(top_k=k), None, logits))
        for row in range(logits.shape[0]):
            kept = torch.isfinite(actual[row])
            kth = logits[row].topk(k).values[-1]
            assert torch.all(actual[row][~kept] == float("-inf")), f"k={k}, row {row}: removed logits must be -inf"
            assert torch.equal(actual[row][kept], logits[row][kept]), f"k={k}, row {row}: kept values changed"
            assert kept[logits[row] > kth].all(), f"k={k}, row {row}: a token above the k-th value was removed"
            assert not kept[logits[row] < kth].any(), f"k={k}, row {row}: a token below the k-th value was kept"
            assert torch.equal(kept, hf_kept[row]) or int(kept.sum()) == k, (
                f"k={k}, row {row}: kept {int(kept.sum())} tokens; keep every tie ({int(hf_kept[row].sum())}) or exactly {k}"
            )


@pytest.mark.exercise("top_p_filter")
def test_top_p_filter_matches_hf(gen, oracle, seed):
    """top_p_filter keeps the same tokens as TopPLogitsWarper (the smallest top set with mass >= p;
    the top token always), on flat and peaked rows."""
    for scale in (0.5, 2.0, 6.0):
        logits = random_logits(seed, 6, 300, scale)
        for p in (0.01, 0.1, 0.5, 0.9, 0.99):
            actual = gen.top_p_filter(logits.clone(), p)
            expected = oracle(hf_processor, "TopPLogitsWarper", dict(top_p=p), None, logits)
            assert_same_filter(actual, expected, f"top_p_filter(p={p}, scale={scale})")


@pytest.mark.exercise("min_p_filter")
def test_min_p_filter_matches_hf(gen, oracle, seed):
    """min_p_filter keeps the same tokens as MinPLogitsWarper (probability >= min_p x the row's top probability)."""
    for scale in (0.5, 2.0, 6.0):
        logits = random_logits(seed, 6, 300, scale)
        for min_p in (0.001, 0.05, 0.3, 0.9):
            actual = gen.min_p_filter(logits.clone(), min_p)
            expected = oracle(hf_processor, "MinPLogitsWarper", dict(min_p=min_p), None, logits)
            assert_same_filter(actual, expected, f"min_p_filter(min_p={min_p}, scale={scale})")


@pytest.mark.exercise("top_k_filter")
@pytest.mark.exercise("top_p_filter")
@pytest.mark.exercise("min_p_filter")
def test_filters_reject_bad_arguments(gen):
    """Out-of-range settings and logits that are not (batch, d_vocab) floats raise a ValueError saying what is allowed."""
    logits = random_logits(0, 2, 10)
    cases = [
        (lambda: gen.top_p_filter(logits, 0.0), "top_p"),  # the settings' rule: 1.0 is off, 0 is refused
        (lambda: gen.top_k_filter(logits, -3), "top_k"),
        (lambda: gen.top_p_filter(logits, 1.5), "top_p"),
        (lambda: gen.min_p_filter(logits, -0.1), "min_p"),
        (lambda: gen.top_k_filter(logits[0], 3), "batch, d_vocab"),
        (lambda: gen.top_p_filter(logits.long(), 0.5), "float"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError, match=words):
            call()
