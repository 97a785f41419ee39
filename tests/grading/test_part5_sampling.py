"""Part 5: ``warp_logits`` (the chain in Hugging Face's order or another) and the batched ``sample``."""

from __future__ import annotations

import pytest
import torch

from part5_shared import (
    assert_same_filter, chi_square_p_value, FALSE_FAILURE, hf_warped, llama_top_n_sigma, llama_xtc_cut, Part5, random_logits, xtc_rows,
    with_05b_solved,
)


@pytest.fixture(autouse=True)
def later_helpers(request, impl, monkeypatch):
    """Notebook 05's exercises run with notebook 05b's functions as the solutions write them (see with_05b_solved)."""
    with_05b_solved(request, impl, monkeypatch)


@pytest.fixture(scope="module")
def gen(impl):
    """Part 5's names under test, from whichever module holds them."""
    return Part5(impl)


# ---------------------------------------------------------------------------------------
# The warper chain and the draw
# ---------------------------------------------------------------------------------------

WARP_SETTINGS = [
    dict(temperature=0.6),
    dict(temperature=1.7),
    dict(temperature=0.5, top_k=40),
    dict(temperature=2.0, top_p=0.8),
    dict(temperature=0.7, top_p=0.5),
    dict(temperature=1.5, min_p=0.2),
    dict(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05),
    dict(temperature=1.6, top_k=100, top_p=0.6, min_p=0.1),
]


@pytest.mark.exercise("warp_logits")
@pytest.mark.parametrize("settings", WARP_SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_warp_logits_matches_hf_chain(gen, oracle, seed, settings):
    """warp_logits equals Hugging Face's warpers applied in its order: temperature, top-k, top-p, min-p."""
    logits = random_logits(seed, 8, 400, scale=3.0)
    expected = oracle(hf_warped, settings, logits)
    assert_same_filter(gen.warp_logits(logits.clone(), **settings), expected, f"warp_logits({settings})")


@pytest.mark.exercise("warp_logits")
def test_warp_logits_with_everything_off_is_the_identity(gen, seed):
    """Temperature 1 and every filter off leave the logits as they are; temperature 0 is refused (sample handles it)."""
    logits = random_logits(seed, 3, 50)
    assert_same_filter(gen.warp_logits(logits.clone()), logits, "warp_logits with everything off")
    with pytest.raises(ValueError, match="temperature"):
        gen.warp_logits(logits, temperature=0.0)


# The chain's steps in Hugging Face's order (its _get_logits_processor: temperature, top-k, top-p, min-p, typical,
# epsilon, eta), then the two it lacks, as the engine documents; and llama.cpp's default order (common/common.h).
ORACLE_HF_ORDER = ["temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_n_sigma", "xtc"]
ORACLE_LLAMA_ORDER = ["top_n_sigma", "top_k", "typical_p", "top_p", "min_p", "xtc", "temperature"]
STEP_OFF = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0,
                top_n_sigma=0.0, xtc=0.0)


def oracle_step(name: str, logits: torch.Tensor, settings: dict) -> torch.Tensor:
    """One step of the chain: Hugging Face's processor where it has one, the transcription of llama.cpp's otherwise
    (XTC only as it cuts when its draw says yes)."""
    from transformers import (EpsilonLogitsWarper, EtaLogitsWarper, MinPLogitsWarper, TemperatureLogitsWarper,
                              TopKLogitsWarper, TopPLogitsWarper, TypicalLogitsWarper)

    value = settings.get("xtc_probability" if name == "xtc" else name, STEP_OFF[name])
    if name == "temperature":
        return TemperatureLogitsWarper(value)(None, logits)
    hf = {"top_k": TopKLogitsWarper, "top_p": TopPLogitsWarper, "min_p": MinPLogitsWarper,
          "typical_p": TypicalLogitsWarper, "epsilon_cutoff": EpsilonLogitsWarper, "eta_cutoff": EtaLogitsWarper}
    if name in hf:
        return hf[name](value)(None, logits)
    if name == "top_n_sigma":
        keep = torch.tensor([llama_top_n_sigma(row, value) for row in logits.tolist()])
    else:
        keep = torch.tensor([llama_xtc_cut(row, settings.get("xtc_threshold", 0.1)) for row in logits.tolist()])
    return logits.masked_fill(~keep, float("-inf"))


def oracle_chain(logits: torch.Tensor, settings: dict, order: list[str] | None = None) -> torch.Tensor:
    """Oracle (through the ``oracle`` fixture): the steps of ``order`` (Hugging Face's by default) that the settings switch on, one after the other."""
    for name in order or ORACLE_HF_ORDER:
        if settings.get("xtc_probability" if name == "xtc" else name, STEP_OFF[name]) != STEP_OFF[name]:
            logits = oracle_step(name, logits.clone(), settings)
    return logits


CHAIN_SETTINGS = [
    dict(temperature=0.9, typical_p=0.8),
    dict(temperature=1.3, epsilon_cutoff=0.004),
    dict(temperature=1.2, eta_cutoff=0.003),
    dict(temperature=0.8, top_k=60, top_p=0.95, min_p=0.02, typical_p=0.9, epsilon_cutoff=3e-4, eta_cutoff=1e-3),
    dict(temperature=1.4, top_n_sigma=1.0),
    dict(temperature=0.7, top_k=80, top_n_sigma=1.5, xtc_probability=1.0, xtc_threshold=0.05),
]


@pytest.mark.exercise("warp_logits")
@pytest.mark.parametrize("settings", CHAIN_SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_warp_logits_runs_the_whole_chain_in_hf_order(gen, seed, settings, oracle, device):
    """With the newer filters switched on too, warp_logits equals the steps applied one after the other in Hugging
    Face's order (its processors; top-n-sigma and XTC last, from the llama.cpp transcriptions)."""
    logits = random_logits(seed, 8, 400, scale=3.0)
    actual = gen.warp_logits(logits.clone(), generator=torch.Generator(device=device).manual_seed(seed), **settings)
    reference = "Hugging Face's processors and llama.cpp's rules" if {"top_n_sigma", "xtc_probability"} & settings.keys() \
        else "Hugging Face"
    assert_same_filter(actual, oracle(oracle_chain, logits, settings), f"warp_logits({settings})", reference)


@pytest.mark.exercise("warp_logits")
@pytest.mark.parametrize("order", [ORACLE_LLAMA_ORDER, ["top_p", "temperature", "min_p", "top_k"]],
                         ids=["llama.cpp", "custom"])
def test_warp_logits_follows_the_samplers_order(gen, seed, order, oracle):
    """samplers=[...] (or llama.cpp's ';'-separated string) runs the steps in that order: with the temperature
    last, top-p and min-p judge the untempered distribution, and the result differs from Hugging Face's order."""
    settings = dict(temperature=0.5, top_k=100, top_p=0.8, min_p=0.05)
    logits = random_logits(seed, 8, 400, scale=2.0)
    expected = oracle(oracle_chain, logits, settings, order)
    for samplers in (order, ";".join(order)):
        actual = gen.warp_logits(logits.clone(), samplers=samplers, **settings)
        assert_same_filter(actual, expected, f"warp_logits(samplers={samplers!r})")
    hf = oracle(oracle_chain, logits, settings)
    assert not torch.equal(torch.isfinite(hf), torch.isfinite(expected)), "precondition: the order should matter here"


@pytest.mark.exercise("warp_logits")
def test_samplers_order_is_checked(gen):
    """An unknown step, a step named twice, or a setting switched on whose step is not in the order raise a
    ValueError saying which."""
    logits = random_logits(0, 2, 20)
    with pytest.raises(ValueError, match="bogus"):
        gen.warp_logits(logits, top_k=3, samplers="top_k;bogus")
    with pytest.raises(ValueError, match="twice"):
        gen.warp_logits(logits, top_k=3, samplers=["top_k", "top_k"])
    with pytest.raises(ValueError, match="top_p"):
        gen.warp_logits(logits, top_k=3, top_p=0.5, samplers=["top_k", "temperature"])


def draw_counts(gen, logits: torch.Tensor, n: int, settings: dict, seed: int) -> torch.Tensor:
    """(rows, d_vocab) counts of ``n`` draws per row of ``logits``, made in one sample() call (with a generator
    where the logits are: a generator draws on its own device only)."""
    rows, d_vocab = logits.shape
    batch = logits.repeat_interleave(n, dim=0)
    generator = torch.Generator(device=logits.device).manual_seed(seed)
    tokens = gen.sample(batch, generator=generator, **settings)
    assert tokens.shape == (rows * n,), f"sample returned shape {tuple(tokens.shape)}, expected ({rows * n},)"
    assert not tokens.is_floating_point(), f"sample must return token ids (integers), got {tokens.dtype}"
    counts = torch.zeros(rows, d_vocab, dtype=torch.long)
    counts.scatter_add_(1, tokens.reshape(rows, n), torch.ones(rows, n, dtype=torch.long))
    return counts


SAMPLE_SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=10),
    dict(temperature=1.5, top_p=0.8),
    dict(temperature=1.2, top_k=25, top_p=0.9, min_p=0.1),
]


@pytest.mark.exercise("batched_sample")
@pytest.mark.parametrize("settings", SAMPLE_SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_sample_draws_each_row_from_its_warped_distribution(gen, oracle, seed, settings):
    """Two different rows, 20,000 draws each, in one call. Only tokens Hugging Face's warpers keep may
    appear (exact), and the frequencies fit softmax of the warped logits (chi-square per row; the two
    tests share a false-failure probability of 1e-6)."""
    logits = random_logits(seed, 2, 40, scale=1.5)
    n = 20_000
    counts = draw_counts(gen, logits, n, settings, seed)
    probs = oracle(hf_warped, settings, logits).softmax(dim=-1)
    for row in range(2):
        outside = ((probs[row] == 0) & (counts[row] > 0)).nonzero().flatten().tolist()
        assert not outside, f"row {row}: drew tokens {outside} that the filters remove ({settings})"
        p_value = chi_square_p_value(counts[row], probs[row])
        assert p_value > FALSE_FAILURE / 2, (
            f"row {row}: the frequencies of {n} draws do not fit softmax of the warped logits "
            f"(chi-square p = {p_value:.2e}) with {settings}"
        )


@pytest.mark.exercise("batched_sample")
def test_sample_at_temperature_zero_is_argmax(gen, seed):
    """Temperature 0 returns each row's argmax (the first one on ties), whatever the filters say."""
    logits = random_logits(seed, 5, 100)
    logits[4, 7] = logits[4, 9] = logits[4].max() + 1.0
    expected = logits.argmax(dim=-1)
    assert expected[4] == 7
    for filters in (dict(), dict(top_k=3, top_p=0.5, min_p=0.3)):
        actual = gen.sample(logits.clone(), temperature=0.0, **filters)
        assert torch.equal(actual.long(), expected), f"sample(temperature=0, {filters}) = {actual.tolist()}, argmax is {expected.tolist()}"


@pytest.mark.exercise("batched_sample")
def test_sample_draws_from_the_generator_it_is_given(gen, seed, device):
    """The same seeded generator gives the same draws, whatever torch's global generator is doing."""
    logits = random_logits(seed, 64, 30, scale=0.5)
    torch.manual_seed(1)
    first = gen.sample(logits, generator=torch.Generator(device=device).manual_seed(seed + 10))
    torch.manual_seed(2)
    second = gen.sample(logits, generator=torch.Generator(device=device).manual_seed(seed + 10))
    assert torch.equal(first, second), "the same seeded generator gave different tokens: is sample using the global generator?"


@pytest.mark.exercise("batched_sample")
def test_sample_rejects_bad_settings(gen):
    """A negative temperature, negative top_k or top_p/min_p outside [0, 1] raise a ValueError naming the setting."""
    logits = random_logits(0, 2, 10)
    for settings, name in [
        (dict(temperature=-1.0), "temperature"), (dict(top_k=-1), "top_k"),
        (dict(top_p=1.2), "top_p"), (dict(min_p=2.0), "min_p"),
    ]:
        with pytest.raises(ValueError, match=name):
            gen.sample(logits, **settings)


@pytest.mark.exercise("batched_sample")
@pytest.mark.parametrize("settings", [dict(temperature=0.9, typical_p=0.7),
                                      dict(temperature=1.2, eta_cutoff=0.02, top_n_sigma=1.0,
                                           samplers=["eta_cutoff", "top_n_sigma", "temperature"])],
                         ids=["typical", "eta+top_n_sigma, temperature last"])
def test_sample_draws_from_the_whole_chain(gen, seed, settings, oracle):
    """sample passes the chain's other settings on to warp_logits: two rows, 20,000 draws each; only tokens the
    chain keeps appear, at the frequencies of its softmax (chi-square per row; false-failure probability 1e-6)."""
    logits = random_logits(seed, 2, 40, scale=1.5)
    n = 20_000
    counts = draw_counts(gen, logits, n, settings, seed)
    order = settings.get("samplers")
    probs = oracle(oracle_chain, logits, {k: v for k, v in settings.items() if k != "samplers"}, order).softmax(dim=-1)
    for row in range(2):
        outside = ((probs[row] == 0) & (counts[row] > 0)).nonzero().flatten().tolist()
        assert not outside, f"row {row}: drew tokens {outside} that the chain removes ({settings})"
        p_value = chi_square_p_value(counts[row], probs[row])
        assert p_value > FALSE_FAILURE / 2, f"row {row}: frequencies do not fit the chain (chi-square p = {p_value:.2e})"


@pytest.mark.exercise("batched_sample")
def test_sample_with_xtc_draws_from_the_mixture(gen, seed):
    """With xtc_probability=0.4 a row is cut 40% of the time, so its tokens come from 0.6 x softmax(row) +
    0.4 x softmax(cut row): 20,000 draws fit that mixture (chi-square, false-failure probability 1e-6)."""
    row = xtc_rows(seed)[3:4].float()
    n = 20_000
    counts = draw_counts(gen, row, n, dict(xtc_probability=0.4, xtc_threshold=0.1), seed)
    cut = row.masked_fill(~torch.tensor([llama_xtc_cut(row[0].tolist(), 0.1)]), float("-inf"))
    mixture = 0.6 * row.softmax(dim=-1) + 0.4 * cut.softmax(dim=-1)
    p_value = chi_square_p_value(counts[0], mixture[0])
    assert p_value > FALSE_FAILURE, f"the frequencies do not fit the XTC mixture (chi-square p = {p_value:.2e})"
