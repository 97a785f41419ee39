"""Part 5b: typical, epsilon, eta (Hugging Face), top-n-sigma, XTC and mirostat (llama.cpp), against the peers' rules and cases."""

from __future__ import annotations

import math

import pytest
import torch

from part5_shared import (
    assert_same_filter, chi_square_p_value, FALSE_FAILURE, hf_processor, llama_top_n_sigma, llama_xtc_cut, Part5, random_logits, xtc_rows,
)


@pytest.fixture(scope="module")
def gen(impl):
    """Part 5's names under test, from whichever module holds them."""
    return Part5(impl)


# ---------------------------------------------------------------------------------------
# More filters: typical, epsilon, eta (Hugging Face), top-n-sigma and XTC (llama.cpp)
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("typical_filter")
def test_typical_filter_matches_hf(gen, seed, oracle):
    """typical_filter keeps the same tokens as TypicalLogitsWarper (rank by |surprise - entropy|, keep the smallest
    prefix with mass >= typical_p), on flat and peaked rows, and on rows that earlier filters cut (-inf)."""
    for scale in (0.5, 2.0, 6.0):
        logits = random_logits(seed, 6, 300, scale)
        logits[:3] = oracle(hf_processor, "TopKLogitsWarper", [40], None, logits[:3])
        for p in (0.05, 0.2, 0.5, 0.9, 0.99):
            actual = gen.typical_filter(logits.clone(), p)
            expected = oracle(hf_processor, "TypicalLogitsWarper", [p], None, logits)
            assert_same_filter(actual, expected, f"typical_filter(p={p}, scale={scale})")


@pytest.mark.exercise("typical_filter")
def test_typical_filter_can_remove_the_most_likely_token(gen, oracle):
    """On a row with one likely token and a long flat tail, the likely token is far from typical: typical_p=0.5
    removes it (top-p never would). Hugging Face's warper agrees."""
    tail = 0.01 * torch.randn(1, 200, generator=torch.Generator().manual_seed(0))  # flat, without exact ties
    logits = torch.cat([torch.tensor([[4.0]]), tail], dim=1)
    actual = gen.typical_filter(logits.clone(), 0.5)
    assert_same_filter(actual, oracle(hf_processor, "TypicalLogitsWarper", [0.5], None, logits), "typical_filter on a flat tail")
    assert actual[0, 0] == float("-inf"), "the most likely token is the least typical here and must go"


@pytest.mark.exercise("epsilon_filter")
def test_epsilon_filter_matches_hf(gen, seed, oracle):
    """epsilon_filter keeps the same tokens as EpsilonLogitsWarper (probability >= epsilon; the top token always)."""
    for scale in (0.5, 2.0, 6.0):
        logits = random_logits(seed, 6, 300, scale)
        for epsilon in (1e-4, 3e-3, 0.02, 0.3, 0.9):
            actual = gen.epsilon_filter(logits.clone(), epsilon)
            assert_same_filter(actual, oracle(hf_processor, "EpsilonLogitsWarper", [epsilon], None, logits),
                               f"epsilon_filter(epsilon={epsilon}, scale={scale})")


@pytest.mark.exercise("eta_filter")
def test_eta_filter_matches_hf(gen, seed, oracle):
    """eta_filter keeps the same tokens as EtaLogitsWarper (bar min(eta, sqrt(eta) exp(-entropy)); the top token always)."""
    for scale in (0.5, 2.0, 6.0):
        logits = random_logits(seed, 6, 300, scale)
        logits[:2] = oracle(hf_processor, "TopKLogitsWarper", [60], None, logits[:2])
        for eta in (1e-4, 2e-3, 0.02, 0.3, 0.9):
            actual = gen.eta_filter(logits.clone(), eta)
            expected = oracle(hf_processor, "EtaLogitsWarper", [eta], None, logits)
            assert_same_filter(actual, expected, f"eta_filter(eta={eta}, scale={scale})")


@pytest.mark.exercise("top_n_sigma_filter")
def test_top_n_sigma_filter_follows_llama_cpp(gen, seed):
    """top_n_sigma_filter keeps the tokens of the transcription above (ignoring tokens already at -inf), with their
    values, for several n; the kept set does not change when the logits are divided by a temperature."""
    for scale in (0.5, 2.0):
        logits = random_logits(seed, 5, 200, scale).double()
        logits[1, ::3] = float("-inf")  # cut by an earlier filter
        for n in (0.5, 1.0, 2.0, 3.0):
            actual = gen.top_n_sigma_filter(logits.clone(), n)
            expected = torch.tensor([llama_top_n_sigma(row, n) for row in logits.tolist()])
            expected = logits.masked_fill(~expected, float("-inf"))
            assert_same_filter(actual, expected, f"top_n_sigma_filter(n={n}, scale={scale})", "llama.cpp's rule")
            tempered = gen.top_n_sigma_filter(logits.clone() / 0.6, n)
            assert torch.equal(torch.isfinite(tempered), torch.isfinite(actual)), "the kept set changed with the temperature"


@pytest.mark.exercise("xtc_filter")
def test_xtc_filter_when_it_applies_follows_llama_cpp(gen, seed, device):
    """With xtc_probability=1 every row is cut as the transcription says: at least two tokens above the threshold
    leave all but the least likely of them; fewer leave the row alone. Kept values are unchanged."""
    rows = xtc_rows(seed)
    for threshold in (0.05, 0.1, 0.2, 0.6):
        actual = gen.xtc_filter(rows.clone(), threshold, 1.0, generator=torch.Generator(device=device).manual_seed(seed))
        keep = torch.tensor([llama_xtc_cut(row, threshold) for row in rows.tolist()])
        assert_same_filter(actual, rows.masked_fill(~keep, float("-inf")), f"xtc_filter(threshold={threshold})",
                           "llama.cpp's rule")
    assert torch.equal(gen.xtc_filter(rows.clone(), 0.1, 0.0), rows), "xtc_probability=0 must change nothing"


@pytest.mark.exercise("xtc_filter")
def test_xtc_filter_applies_with_its_probability(gen, seed, device):
    """20,000 copies of a row with three tokens above the threshold, xtc_probability=0.3: each copy is either
    untouched or cut exactly as above, the number cut is Binomial(20,000, 0.3) (two-sided binomial test,
    false-failure probability 1e-6), and the same seeded generator cuts the same rows."""
    row = xtc_rows(seed)[3:4]
    n = 20_000
    batch = row.expand(n, -1).clone()
    cut = row.masked_fill(~torch.tensor([llama_xtc_cut(row[0].tolist(), 0.1)]), float("-inf"))
    out = gen.xtc_filter(batch.clone(), 0.1, 0.3, generator=torch.Generator(device=device).manual_seed(seed))
    untouched = (out == row).all(dim=-1)
    was_cut = (out == cut).all(dim=-1)
    assert (untouched | was_cut).all(), "every row must be either left alone or cut as llama.cpp cuts it"
    k = int(was_cut.sum())
    from scipy import stats  # loaded only by the statistical tests

    p_value = stats.binomtest(k, n, 0.3).pvalue
    assert p_value > FALSE_FAILURE, f"{k} of {n} rows were cut with xtc_probability=0.3 (binomial p = {p_value:.2e})"
    again = gen.xtc_filter(batch.clone(), 0.1, 0.3, generator=torch.Generator(device=device).manual_seed(seed))
    assert torch.equal(again, out), "the same seeded generator must cut the same rows: draw with generator="


@pytest.mark.exercise("typical_filter")
@pytest.mark.exercise("epsilon_filter")
@pytest.mark.exercise("eta_filter")
@pytest.mark.exercise("top_n_sigma_filter")
@pytest.mark.exercise("xtc_filter")
def test_new_filters_reject_bad_arguments(gen):
    """Settings out of range raise a ValueError naming the setting."""
    logits = random_logits(0, 2, 10)
    cases = [
        (lambda: gen.typical_filter(logits, 1.5), "typical_p"),
        (lambda: gen.epsilon_filter(logits, -0.1), "epsilon"),
        (lambda: gen.eta_filter(logits, 1.0), "eta"),
        (lambda: gen.top_n_sigma_filter(logits, -1.0), "top_n_sigma"),  # 0 is off, as in llama.cpp
        (lambda: gen.xtc_filter(logits, 0.0, 0.5), "xtc_threshold"),
        (lambda: gen.xtc_filter(logits, 0.1, 1.5), "xtc_probability"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError, match=words):
            call()


# ---------------------------------------------------------------------------------------
# Mirostat
# ---------------------------------------------------------------------------------------


def oracle_mirostat(row: list[float], mu: float) -> list[float]:
    """llama.cpp's mirostat v2 truncation, transcribed: softmax, sort, keep the leading tokens whose surprise
    -log2 p is at most mu (at least the first), renormalise. The distribution the token is drawn from."""
    top = max(row)
    weights = [math.exp(x - top) for x in row]
    total = sum(weights)
    order = sorted(range(len(row)), key=lambda t: -weights[t])
    kept = [t for t in order if -math.log2(weights[t] / total) <= mu] or order[:1]
    mass = sum(weights[t] for t in kept)
    return [weights[t] / mass if t in kept else 0.0 for t in range(len(row))]


@pytest.mark.exercise("mirostat_step")
def test_mirostat_step_draws_from_the_truncated_distribution_and_moves_mu(gen, seed, device):
    """Three states mu (bits) on the same logits, 20,000 rows each, in one call: each row draws from its own
    truncation (support exact; chi-square per state, false-failure probability 1e-6 in all), the returned logits
    are -inf exactly where it cut, and each row's new mu is mu - eta (-log2 p(token) - tau), with p the
    renormalised probability of the token it drew."""
    logits = random_logits(seed, 1, 40, scale=1.5)
    mus, tau, eta, n = [0.3, 2.5, 5.0], 3.0, 0.1, 20_000
    batch = logits.expand(3 * n, -1).clone()
    mu = torch.tensor(mus).repeat_interleave(n)
    tokens, new_mu, kept = gen.mirostat_step(batch, mu.clone(), tau, eta, torch.Generator(device=device).manual_seed(seed))
    assert tokens.shape == (3 * n,) and new_mu.shape == (3 * n,) and kept.shape == batch.shape
    for i, m in enumerate(mus):
        probs = torch.tensor(oracle_mirostat(logits[0].tolist(), m))
        rows = slice(i * n, (i + 1) * n)
        counts = torch.bincount(tokens[rows], minlength=40)
        outside = ((probs == 0) & (counts > 0)).nonzero().flatten().tolist()
        assert not outside, f"mu={m}: drew tokens {outside} whose surprise is above mu"
        assert torch.equal(torch.isfinite(kept[rows]), (probs > 0).expand(n, -1)), f"mu={m}: the returned logits cut the wrong tokens"
        p_value = chi_square_p_value(counts, probs)
        assert p_value > FALSE_FAILURE / 3, f"mu={m}: frequencies do not fit the truncated distribution (p = {p_value:.2e})"
        surprise = -torch.log2(probs[tokens[rows]])
        torch.testing.assert_close(new_mu[rows], (m - eta * (surprise - tau)).float(), atol=1e-4, rtol=1e-5,
                                   msg=lambda msg: f"mu={m}: the new mu is wrong.\n{msg}")


# Not graded as the learner's (no exercise marker): the failure messages themselves.
def test_llama_cpp_filters_name_their_reference_when_they_fail(seed, device):
    """A wrong top-n-sigma or XTC filter is told how many tokens llama.cpp's rule keeps (Hugging Face has
    neither filter)."""

    class KeepsEverything:
        @staticmethod
        def top_n_sigma_filter(logits, n):
            return logits.clone()

        @staticmethod
        def xtc_filter(logits, threshold, probability, generator=None):
            return logits.clone()

    for check in (test_top_n_sigma_filter_follows_llama_cpp, test_xtc_filter_when_it_applies_follows_llama_cpp):
        args = (KeepsEverything, seed) if check is test_top_n_sigma_filter_follows_llama_cpp else (KeepsEverything, seed, device)
        with pytest.raises(AssertionError) as failed:
            check(*args)
        assert "llama.cpp's rule keeps" in str(failed.value) and "Hugging Face" not in str(failed.value), str(failed.value)
