"""Part 5: the generation engine, against Hugging Face's processors, forwards and ``generate``.

How the tests judge:

* Each filter and penalty runs on random ``(batch, d_vocab)`` batches next to the matching
  Hugging Face processor (``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
  ``TopPLogitsWarper``, ``MinPLogitsWarper``, ``RepetitionPenaltyLogitsProcessor``, and
  the whole chain in Hugging Face's order): the same kept set, the same values. The
  presence and frequency penalties have no Hugging Face processor; their oracle is a
  plain loop over the tokens written here, and in ``generate`` a transcription of OpenAI's
  definition (they count the generated tokens only, as vLLM's do).
* Ties at the k-th value: Hugging Face keeps every tied token; a filter that keeps
  exactly k of them (torch.topk and a scatter) is also accepted.
* ``sample`` is random, so it is tested statistically: which tokens can appear (exact),
  and how often (chi-square, false-failure probability at most 1e-6 per test).
* The padded model: each row of a left-padded batch, with and without a KV cache, gives
  Hugging Face's logits of that row run alone, at every real position.
* ``generate``: batched greedy equals every prompt alone and Hugging Face ``generate``
  with left padding, token for token. Seeded sampling equals a replay of your own
  ``sample`` on Hugging Face's logits under the same seed (and, for the solutions,
  Hugging Face's own seeded ``generate``). Scores and log-probs equal a recomputation from
  full forwards. Per-row stopping runs on a toy model whose rows end at known steps.
* Stop strings are compared with Hugging Face's ``StopStringCriteria`` on the same
  sequences; the streamer's printed text with the final decode, on multi-byte text.

Seeded tests take their seed from ``SAMPLING_COURSE_TEST_SEED`` (default 0); any seed must pass. The
draws your code makes take a ``torch.Generator`` on the grading device (``pytest --device``): a generator
draws on its own device only. The tests' random inputs come from seeded CPU generators, drawn on the CPU
and moved, so every device grades on the same inputs.
"""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch

from sampling_course.grading.tolerances import parity

from doubles import IdTokenizer, RecordingFile, SuccessorModel
from sampling_course.implementation import load_demo

# fp32 logits of two correct implementations agree to ~1e-5; every planted mistake moves them by far more.
# The bounds for the device graded on, float32 (grading/tolerances.py says why).
TOL = parity()
# Filters only mask: kept values are the input's, up to one rounding of the temperature division.
VALUE_TOL = dict(atol=1e-6, rtol=1e-5)
# Summed over every statistical check of one test: the chance that correct code fails it.
FALSE_FAILURE = 1e-6

PROMPTS = [
    "The cat sat on the mat, and then",
    "Once",
    "When I was a kid, John and Mary went to the",
    "A short one",
]


# ---------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gen(impl):
    """The generate module under test."""
    return impl.generate


def random_logits(seed: int, batch: int, d_vocab: int, scale: float = 2.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return scale * torch.randn(batch, d_vocab, generator=generator)


def assert_same_filter(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """The same tokens removed (set to -inf) and the same values kept."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    kept, kept_expected = torch.isfinite(actual), torch.isfinite(expected)
    removed = ~kept
    assert torch.all(actual[removed] == float("-inf")), f"{what}: removed logits must be -inf"
    differ = (kept != kept_expected).nonzero().tolist()
    assert not differ, (
        f"{what}: kept {int(kept.sum())} tokens, Hugging Face keeps {int(kept_expected.sum())}; "
        f"first disagreement at (row, token) {differ[0]}"
    )
    torch.testing.assert_close(
        actual[kept], expected[kept], **VALUE_TOL, msg=lambda m: f"{what}: kept values differ from Hugging Face.\n{m}"
    )


# The oracle's functions: each runs live once through the ``oracle`` fixture, then is read back.


def hf_warpers(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0):
    """Hugging Face's warpers in the order its generate applies them, those switched on."""
    from transformers import (LogitsProcessorList, MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper,
                              TopPLogitsWarper)

    warpers = LogitsProcessorList()
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k > 0:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    if min_p > 0.0:
        warpers.append(MinPLogitsWarper(min_p))
    return warpers


def hf_warped(settings: dict, logits: torch.Tensor) -> torch.Tensor:
    """Oracle: ``logits`` after Hugging Face's warpers for ``settings`` (see ``hf_warpers``)."""
    return hf_warpers(**settings)(None, logits.clone())


def hf_processor(name: str, settings: dict | list, input_ids: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
    """Oracle: Hugging Face's logits processor ``name`` (e.g. "TopKLogitsWarper"), built with ``settings`` (keyword
    arguments, or a list of positional ones)."""
    import transformers

    cls = getattr(transformers, name)
    processor = cls(*settings) if isinstance(settings, list) else cls(**settings)
    return processor(input_ids, scores.clone())


def hf_logits_alone(reference, ids: list[int]) -> torch.Tensor:
    """Oracle: Hugging Face's logits for one unpadded sequence, (len(ids), d_vocab)."""
    return reference.hf_model(torch.tensor([ids])).logits[0]


def left_padded(token_lists: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle's own left padding (not the code under test)."""
    width = max(map(len, token_lists))
    ids = torch.tensor([[pad] * (width - len(t)) + t for t in token_lists])
    mask = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in token_lists])
    return ids, mask


def new_tokens_of(sequences: torch.Tensor, width: int) -> list[list[int]]:
    return sequences[:, width:].tolist()


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of ``counts`` to ``probs`` (over tokens with probs > 0); bins expecting
    fewer than 5 draws are pooled, so the chi-square approximation holds."""
    n = int(counts.sum())
    probs = probs.double() / probs.double().sum()
    expected = probs * n
    big = expected >= 5
    observed = counts[big].double().tolist()
    wanted = expected[big].double().tolist()
    rest_obs, rest_exp = float(counts[~big].sum()), float(expected[~big].sum())
    if rest_exp > 0:
        if rest_exp >= 5:
            observed.append(rest_obs)
            wanted.append(rest_exp)
        else:  # too small to stand alone: merge with the smallest bin
            i = min(range(len(wanted)), key=wanted.__getitem__)
            observed[i] += rest_obs
            wanted[i] += rest_exp
    if len(wanted) < 2:
        return 1.0
    total = sum(wanted)  # scipy wants the sums to agree to ~1e-8
    wanted = [w * n / total for w in wanted]
    from scipy import stats  # loaded only by the statistical tests

    return float(stats.chisquare(observed, wanted).pvalue)


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
        for p in (0.0, 0.1, 0.5, 0.9, 0.99):
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
        (lambda: gen.top_k_filter(logits, 0), "top_k"),
        (lambda: gen.top_k_filter(logits, -3), "top_k"),
        (lambda: gen.top_p_filter(logits, 1.5), "top_p"),
        (lambda: gen.min_p_filter(logits, -0.1), "min_p"),
        (lambda: gen.top_k_filter(logits[0], 3), "batch, d_vocab"),
        (lambda: gen.top_p_filter(logits.long(), 0.5), "float"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError, match=words):
            call()


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


def llama_top_n_sigma(row: list[float], n: float) -> list[bool]:
    """llama.cpp's top-n-sigma, transcribed: over the finite logits, the max, the mean and the population standard
    deviation; a token stays unless its logit is below max - n * std."""
    finite = [x for x in row if x != float("-inf")]
    top, mean = max(finite), sum(finite) / len(finite)
    std = math.sqrt(sum((x - mean) ** 2 for x in finite) / len(finite))
    return [not (x < top - n * std) for x in row]


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
            assert_same_filter(actual, expected, f"top_n_sigma_filter(n={n}, scale={scale})")
            tempered = gen.top_n_sigma_filter(logits.clone() / 0.6, n)
            assert torch.equal(torch.isfinite(tempered), torch.isfinite(actual)), "the kept set changed with the temperature"


def llama_xtc_cut(row: list[float], threshold: float) -> list[bool]:
    """llama.cpp's XTC when its draw says yes, transcribed: softmax, sort from most to least likely, find the last
    token of the leading run with p >= threshold; if it is not the first, every token before it goes."""
    top = max(row)
    weights = [math.exp(x - top) for x in row]
    total = sum(weights)
    order = sorted(range(len(row)), key=lambda t: -weights[t])
    last = 0
    for i, t in enumerate(order):
        if weights[t] / total >= threshold:
            last = i
        else:
            break
    keep = [True] * len(row)
    for t in order[:last]:
        keep[t] = False
    return keep


def xtc_rows(seed: int) -> torch.Tensor:
    """Rows with 0, 1, 2 and 3+ tokens above a threshold of 0.1 (and a random one)."""
    rows = random_logits(seed, 5, 50, scale=0.5)
    rows[1, 7] = 6.0                                   # one token above the bar
    rows[2, 3], rows[2, 9] = 4.0, 3.5                  # two
    rows[3, 1], rows[3, 2], rows[3, 4] = 3.0, 2.8, 2.5  # three
    rows[4] *= 8.0
    return rows.double()


@pytest.mark.exercise("xtc_filter")
def test_xtc_filter_when_it_applies_follows_llama_cpp(gen, seed, device):
    """With xtc_probability=1 every row is cut as the transcription says: at least two tokens above the threshold
    leave all but the least likely of them; fewer leave the row alone. Kept values are unchanged."""
    rows = xtc_rows(seed)
    for threshold in (0.05, 0.1, 0.2, 0.6):
        actual = gen.xtc_filter(rows.clone(), threshold, 1.0, generator=torch.Generator(device=device).manual_seed(seed))
        keep = torch.tensor([llama_xtc_cut(row, threshold) for row in rows.tolist()])
        assert_same_filter(actual, rows.masked_fill(~keep, float("-inf")), f"xtc_filter(threshold={threshold})")
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
        (lambda: gen.top_n_sigma_filter(logits, 0.0), "top_n_sigma"),
        (lambda: gen.xtc_filter(logits, 0.0, 0.5), "xtc_threshold"),
        (lambda: gen.xtc_filter(logits, 0.1, 1.5), "xtc_probability"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError, match=words):
            call()


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
    assert_same_filter(actual, oracle(oracle_chain, logits, settings), f"warp_logits({settings})")


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


# ---------------------------------------------------------------------------------------
# Penalties
# ---------------------------------------------------------------------------------------


def random_history(seed: int, batch: int, length: int, d_vocab: int) -> torch.Tensor:
    """Token histories with plenty of repeats."""
    generator = torch.Generator().manual_seed(seed + 100)
    return torch.randint(0, d_vocab // 4, (batch, length), generator=generator)


@pytest.mark.exercise("apply_repetition_penalty")
def test_repetition_penalty_matches_hf(gen, oracle, seed):
    """apply_repetition_penalty equals RepetitionPenaltyLogitsProcessor (positive logits divided, negative
    multiplied, once per distinct token), for penalties above and below 1."""
    logits = random_logits(seed, 4, 120)
    history = random_history(seed, 4, 30, 120)
    for penalty in (1.3, 2.0, 0.7):
        actual = gen.apply_repetition_penalty(logits.clone(), history, penalty)
        expected = oracle(hf_processor, "RepetitionPenaltyLogitsProcessor", dict(penalty=penalty), history, logits)
        torch.testing.assert_close(actual, expected, **VALUE_TOL, msg=lambda m: f"repetition penalty {penalty}.\n{m}")


@pytest.mark.exercise("apply_repetition_penalty")
def test_repetition_penalty_ignores_padding(gen, oracle, seed):
    """Positions where attention_mask is 0 do not count as seen: each row equals Hugging Face's processor on its real tokens."""
    logits = random_logits(seed, 3, 80)
    history = random_history(seed, 3, 20, 80)
    mask = torch.ones_like(history)
    mask[0, :7] = 0
    mask[2, :12] = 0
    actual = gen.apply_repetition_penalty(logits.clone(), history, 1.5, attention_mask=mask)
    for row in range(3):
        real = history[row][mask[row].bool()][None]
        expected = oracle(hf_processor, "RepetitionPenaltyLogitsProcessor", dict(penalty=1.5), real, logits[row : row + 1])[0]
        torch.testing.assert_close(actual[row], expected, **VALUE_TOL, msg=lambda m: f"row {row}.\n{m}")


def presence_frequency_oracle(logits, history, mask, presence, frequency):
    """OpenAI's rules, one token at a time."""
    out = logits.clone()
    for row in range(history.shape[0]):
        counts: dict[int, int] = {}
        for token, keep in zip(history[row].tolist(), mask[row].tolist()):
            if keep:
                counts[token] = counts.get(token, 0) + 1
        for token, count in counts.items():
            out[row, token] -= presence + frequency * count
    return out


@pytest.mark.exercise("apply_presence_and_frequency_penalty")
def test_presence_and_frequency_penalty_follow_openai(gen, seed):
    """presence_penalty is subtracted once per distinct token seen, frequency_penalty once per occurrence;
    padding (mask 0) does not count."""
    logits = random_logits(seed, 3, 80)
    history = random_history(seed, 3, 25, 80)
    mask = torch.ones_like(history)
    mask[1, :9] = 0
    for presence, frequency in ((0.8, 0.0), (0.0, 0.6), (0.5, 0.3), (-0.4, 0.2)):
        actual = gen.apply_presence_and_frequency_penalty(logits.clone(), history, presence, frequency, attention_mask=mask)
        expected = presence_frequency_oracle(logits, history, mask, presence, frequency)
        torch.testing.assert_close(
            actual, expected, **VALUE_TOL, msg=lambda m: f"presence={presence}, frequency={frequency}.\n{m}"
        )


@pytest.mark.exercise("apply_repetition_penalty")
@pytest.mark.exercise("apply_presence_and_frequency_penalty")
def test_penalties_reject_bad_arguments(gen):
    """A repetition penalty <= 0 and a mask of the wrong shape raise a ValueError saying what is allowed."""
    logits, history = random_logits(0, 2, 10), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="repetition_penalty"):
        gen.apply_repetition_penalty(logits, history, 0.0)
    with pytest.raises(ValueError, match="attention_mask"):
        gen.apply_presence_and_frequency_penalty(logits, history, 0.1, 0.1, attention_mask=torch.ones(2, 4))


def llama_dry(tokens: list[int], row: list[float], multiplier: float, base: float, allowed: int,
              breakers: set[int], last_n: int) -> list[float]:
    """llama.cpp's DRY penalty, transcribed from its definition (the plain quadratic search, not its Z-algorithm)."""
    context = tokens[-last_n:] if last_n > 0 else list(tokens)
    n = len(context)
    out = list(row)
    if n <= allowed:
        return out
    limit = n  # tokens after the most recent breaker
    for i in range(n):
        if context[n - 1 - i] in breakers:
            limit = i
            break
    if limit < allowed:
        return out
    longest: dict[int, int] = {}
    for j in range(n - 1):
        # how many tokens ending at j equal the tokens ending at the last position
        length = 0
        while length <= j and context[j - length] == context[n - 1 - length]:
            length += 1
        length = min(length, limit)
        if length >= allowed:
            token = context[j + 1]
            longest[token] = max(longest.get(token, 0), length)
    max_exponent = int(88.7228391 / math.log(base)) if base > 1.000001 else 0
    for token, length in longest.items():
        if token in breakers:
            continue
        exponent = length - allowed
        if max_exponent > 0:
            exponent = min(exponent, max_exponent)
        out[token] -= multiplier * base**exponent
    return out


DRY_CASES = [
    # (multiplier, base, allowed_length, breakers, penalty_last_n)
    (0.8, 1.75, 2, set(), -1),
    (1.0, 2.0, 1, {5}, -1),
    (0.5, 1.5, 3, {0}, -1),
    (0.8, 1.75, 2, {4}, 9),
    (2.0, 1.0, 2, set(), -1),
]


@pytest.mark.exercise("apply_dry_penalty")
@pytest.mark.parametrize("case", DRY_CASES, ids=lambda c: f"mult={c[0]},base={c[1]},allowed={c[2]},breakers={sorted(c[3])},last_n={c[4]}")
def test_dry_penalty_follows_llama_cpp(gen, seed, case):
    """On random histories over a small vocabulary (repeats everywhere) of every length from 1 to 30, with and
    without left padding, apply_dry_penalty equals the transcription of llama.cpp's definition."""
    multiplier, base, allowed, breakers, last_n = case
    generator = torch.Generator().manual_seed(seed + 300)
    d_vocab, rows = 8, 4
    breaker_mask = torch.zeros(d_vocab, dtype=torch.bool)
    breaker_mask[list(breakers)] = True
    penalised_any = False
    for length in range(1, 31):
        history = torch.randint(0, 6, (rows, length), generator=generator)
        mask = torch.ones_like(history)
        mask[1, : length // 2] = 0
        logits = random_logits(seed + length, rows, d_vocab)
        actual = gen.apply_dry_penalty(logits.clone(), history, multiplier, base, allowed, breaker_mask, last_n, mask)
        for r in range(rows):
            real = history[r][mask[r].bool()].tolist()
            expected = torch.tensor(llama_dry(real, logits[r].tolist(), multiplier, base, allowed, breakers, last_n))
            torch.testing.assert_close(actual[r], expected, **VALUE_TOL,
                                       msg=lambda m: f"history {real} (row {r}): DRY penalties differ.\n{m}")
            penalised_any |= not torch.equal(expected, logits[r])
    assert penalised_any, "precondition: some history should be penalised"


@pytest.mark.exercise("apply_dry_penalty")
def test_dry_penalty_worked_example(gen):
    """llama.cpp's own example, 'a b c c b c y a b c', allowed_length 2, multiplier 1, base 2: 'a b c' occurs
    before, followed by c, so c would extend a repeat of 3: penalty 2^(3 - 2); 'b c' occurs followed by y: 2^0;
    'c' alone is followed by b and c, but a repeat of 1 is below the allowed length. A breaker three tokens back
    changes nothing here; a breaker one token back stops every penalty."""
    a, b, c, y = 0, 1, 2, 3
    history = torch.tensor([[a, b, c, c, b, c, y, a, b, c]])
    out = gen.apply_dry_penalty(torch.zeros(1, 5), history, 1.0, 2.0, 2, torch.zeros(5, dtype=torch.bool))
    assert out[0].tolist() == [0.0, 0.0, -2.0, -1.0, 0.0], f"penalties {out[0].tolist()}"
    breakers = torch.tensor([False, False, False, False, True])
    history = torch.tensor([[a, b, c, c, b, c, y, 4, a, b, c]])  # a breaker before 'a b c': repeats reach back 3 tokens
    out = gen.apply_dry_penalty(torch.zeros(1, 5), history, 1.0, 2.0, 2, breakers)
    assert out[0].tolist() == [0.0, 0.0, -2.0, -1.0, 0.0], f"penalties {out[0].tolist()}"
    history = torch.tensor([[a, b, c, c, b, c, y, a, 4, c]])  # only one token after the breaker: nothing
    out = gen.apply_dry_penalty(torch.zeros(1, 5), history, 1.0, 2.0, 2, breakers)
    assert out[0].tolist() == [0.0] * 5


@pytest.mark.exercise("apply_dry_penalty")
def test_dry_penalty_rejects_bad_arguments(gen):
    logits, history = random_logits(0, 1, 6), torch.zeros(1, 4, dtype=torch.long)
    for kwargs, name in [(dict(multiplier=-1.0), "dry_multiplier"), (dict(multiplier=1.0, base=0.5), "dry_base"),
                         (dict(multiplier=1.0, allowed_length=0), "dry_allowed_length"),
                         (dict(multiplier=1.0, penalty_last_n=-2), "dry_penalty_last_n")]:
        with pytest.raises(ValueError, match=name):
            gen.apply_dry_penalty(logits, history, **kwargs)


# ---------------------------------------------------------------------------------------
# Biases and bans
# ---------------------------------------------------------------------------------------


def hf_sequence_bias(bias: list[tuple[int, float]], input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Oracle: Hugging Face's SequenceBiasLogitsProcessor with one-token sequences, ``bias`` as (token, bias) pairs."""
    from transformers import SequenceBiasLogitsProcessor

    return SequenceBiasLogitsProcessor({(t,): b for t, b in bias})(input_ids, scores.clone())


def test_logit_bias_matches_hf_sequence_bias(gen, seed, oracle):
    """apply_logit_bias equals SequenceBiasLogitsProcessor with one-token sequences; a key outside the vocabulary
    is refused."""
    logits = random_logits(seed, 3, 50)
    bias = {3: 2.5, 10: -4.0, 49: 0.75, 0: float("-inf")}
    expected = oracle(hf_sequence_bias, list(bias.items()), torch.zeros(3, 1, dtype=torch.long), logits)
    torch.testing.assert_close(gen.apply_logit_bias(logits.clone(), bias), expected, **VALUE_TOL)
    with pytest.raises(ValueError, match="logit_bias"):
        gen.apply_logit_bias(logits, {50: 1.0})


@pytest.mark.exercise("ban_bad_words")
def test_ban_bad_words_matches_hf(gen, seed, oracle):
    """On random histories over a small vocabulary, ban_bad_words bans exactly what NoBadWordsLogitsProcessor
    bans: one-token sequences everywhere, longer ones where the history ends with all but their last token."""
    generator = torch.Generator().manual_seed(seed + 400)
    bad = [[3], [1, 2], [2, 2, 4], [0, 5, 1, 6]]
    banned_multi = False
    for length in range(1, 12):
        history = torch.randint(0, 7, (6, length), generator=generator)
        logits = random_logits(seed + length, 6, 9)
        actual = gen.ban_bad_words(logits.clone(), history, bad)
        expected = oracle(hf_processor, "NoBadWordsLogitsProcessor", dict(bad_words_ids=bad, eos_token_id=8), history, logits)
        assert_same_filter(actual, expected, f"ban_bad_words on {history.tolist()}")
        banned_multi |= bool((torch.isinf(expected[:, [2, 4, 6]])).any())
    assert banned_multi, "precondition: some history should end with the start of a longer banned sequence"


@pytest.mark.exercise("ban_bad_words")
def test_ban_bad_words_ignores_padding(gen):
    """A padded row is banned as it would be alone: pads (mask 0) never complete the start of a banned sequence."""
    history = torch.tensor([[7, 7, 1], [1, 2, 2], [9, 1, 2]])
    mask = torch.tensor([[0, 0, 1], [1, 1, 1], [0, 1, 1]])
    out = gen.ban_bad_words(torch.zeros(3, 10), history, [[7, 1, 5], [2, 2, 4], [1, 2, 8]], attention_mask=mask)
    banned = [set(torch.isinf(row).nonzero().flatten().tolist()) for row in out]
    assert banned == [set(), {4}, {8}], f"banned tokens per row: {banned}"


# ---------------------------------------------------------------------------------------
# The padding-aware model
# ---------------------------------------------------------------------------------------


def random_rows(seed: int, lengths: list[int], d_vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed + 200)
    return [torch.randint(0, d_vocab, (n,), generator=generator).tolist() for n in lengths]


def hf_left_padded(reference, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Oracle: Hugging Face's tokenizer on ``prompts`` with padding_side="left" and pad = EOS: (input_ids, attention_mask)."""
    tok = copy.deepcopy(reference.hf_tokenizer)
    tok.pad_token, tok.padding_side = tok.eos_token, "left"
    expected = tok(prompts, padding=True, return_tensors="pt")
    return expected.input_ids, expected.attention_mask


@pytest.mark.exercise("left_pad")
def test_left_pad_matches_the_tokenizers_left_padding(gen, reference, oracle):
    """left_pad gives what Hugging Face's tokenizer gives with padding_side="left" (pad = EOS): every row's last
    real token in the last column, pads before it, the mask 1 at real tokens and 0 at pads."""
    tok = reference.tokenizer
    for prompts in (PROMPTS, PROMPTS[1:2], ["same length", "same length"]):
        expected_ids, expected_mask = oracle(hf_left_padded, reference, prompts)
        ids, mask = gen.left_pad([tok.encode(p) for p in prompts], tok.eos_token_id)
        assert not ids.is_floating_point() and not mask.is_floating_point(), "input_ids and attention_mask hold integers"
        assert_same_tokens(ids, expected_ids, f"left_pad({len(prompts)} prompts): input_ids")
        assert_same_tokens(mask, expected_mask, f"left_pad({len(prompts)} prompts): attention_mask")


@pytest.mark.exercise("position_ids_from_mask")
def test_position_ids_count_real_tokens_only(impl):
    """position_ids_from_mask numbers each row's real tokens 0, 1, 2, ... (what pads get is not checked)."""
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1], [0, 1, 1, 0, 0]])
    positions = impl.transformer.position_ids_from_mask(mask)
    assert positions.shape == mask.shape
    for row in range(mask.shape[0]):
        real = positions[row][mask[row].bool()].tolist()
        assert real == list(range(len(real))), f"row {row} (mask {mask[row].tolist()}): real tokens at positions {real}"


def hf_attention_io(reference, ids: torch.Tensor, mask: torch.Tensor, layer: int = 0):
    """Oracle: Hugging Face's input to a block's attention (its ln_1 output) and that attention's output, on a padded
    batch with the positions Hugging Face's generate gives it (real tokens counted from 0, pads at 0)."""
    seen = {}
    block = reference.hf_model.transformer.h[layer]
    hooks = [block.ln_1.register_forward_hook(lambda module, args, out: seen.__setitem__("x", out)),
             block.attn.register_forward_hook(lambda module, args, out: seen.__setitem__("out", out[0]))]
    try:
        with torch.no_grad():
            reference.hf_model(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    finally:
        for hook in hooks:
            hook.remove()
    return seen["x"], seen["out"]


@pytest.mark.exercise("masked_forward")
@pytest.mark.parametrize("layer", [0, -1], ids=["first layer", "last layer"])
def test_masked_forward_matches_hf_attention_on_a_padded_batch(demo, reference, oracle, seed, layer):
    """Attention.masked_forward, fed Hugging Face's own attention input for a left-padded batch, gives Hugging
    Face's attention output at every real token: all positions new (kv all empty slots), and with a cache (the
    first positions, then the last two on top, their keys and values written into kv's last slots). kv starts
    as NaN, so a slot read before it is written shows."""
    cfg = reference.cfg
    layer = layer % cfg.n_layers
    rows = random_rows(seed + 3, [7, 2, 5], cfg.d_vocab)
    ids, mask = left_padded(rows, reference.tokenizer.eos_token_id)
    x, expected = oracle(hf_attention_io, reference, ids, mask, layer)
    attn, real, n = demo.blocks[layer].attn, mask.bool(), ids.shape[1]

    def empty_kv() -> torch.Tensor:
        return torch.full((2, len(rows), n, cfg.n_heads, cfg.d_head), float("nan"))

    with torch.no_grad():
        out = attn.masked_forward(x, empty_kv(), mask)
        kv = empty_kv()
        first = attn.masked_forward(x[:, : n - 2], kv[:, :, : n - 2], mask[:, : n - 2])
        last = attn.masked_forward(x[:, n - 2 :], kv, mask)
    for what, got, want, keep in (("all positions new", out, expected, real),
                                  ("cached: the first positions", first, expected[:, : n - 2], real[:, : n - 2]),
                                  ("cached: the last two on top", last, expected[:, n - 2 :], real[:, n - 2 :])):
        assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        torch.testing.assert_close(got[keep], want[keep], **TOL,
                                   msg=lambda m: f"layer {layer}, {what}: attention output at real tokens.\n{m}")


@pytest.mark.exercise("padded_forward")
def test_padded_rows_equal_each_row_alone(demo, reference, oracle, seed):
    """Without a cache: at every real position, each row of a left-padded batch gives Hugging Face's
    logits of that row run alone; an all-ones mask gives the plain forward's logits."""
    cfg = reference.cfg
    rows = random_rows(seed, [9, 3, 14, 1], cfg.d_vocab)
    pad = reference.tokenizer.eos_token_id
    ids, mask = left_padded(rows, pad)
    with torch.no_grad():
        logits = demo(ids, attention_mask=mask)
        plain = demo(ids[2:3])
        ones = demo(ids[2:3], attention_mask=mask[2:3])
    assert logits.shape == (*ids.shape, cfg.d_vocab)
    torch.testing.assert_close(ones, plain, **TOL, msg=lambda m: f"an all-ones mask changed the logits.\n{m}")
    for r, row in enumerate(rows):
        expected = oracle(hf_logits_alone, reference, row)
        torch.testing.assert_close(
            logits[r, ids.shape[1] - len(row) :], expected, **TOL,
            msg=lambda m: f"row {r} ({len(row)} tokens after {ids.shape[1] - len(row)} pads) differs from the row alone.\n{m}",
        )


@pytest.mark.exercise("padded_forward")
def test_padded_rows_with_a_cache(demo, reference, oracle, impl, seed):
    """With a KV cache: a padded prefill, then new tokens one or two at a time; row 1 'finishes' after the
    second step and receives masked pads. At every step the other rows' logits equal each row run alone."""
    cfg = reference.cfg
    KVC = impl.transformer.KeyValueCache
    rows = random_rows(seed, [6, 2, 9], cfg.d_vocab)
    pad = reference.tokenizer.eos_token_id
    ids, mask = left_padded(rows, pad)
    extra = random_rows(seed + 1, [5, 5, 5], cfg.d_vocab)
    cache = KVC.new_empty(cfg, batch=3)
    with torch.no_grad():
        logits, cache = demo(ids, cache, attention_mask=mask)
        for r, row in enumerate(rows):
            torch.testing.assert_close(logits[r, -len(row):], oracle(hf_logits_alone, reference, row), **TOL,
                                       msg=lambda m: f"prefill, row {r}.\n{m}")
        done = 0
        for step, n_new in enumerate((1, 1, 2, 1)):
            new = torch.tensor([e[done : done + n_new] for e in extra])
            new_mask = torch.ones_like(new)
            if step >= 2:  # row 1 is finished: it gets pads, masked out
                new[1], new_mask[1] = pad, 0
            ids, mask = torch.cat([ids, new], 1), torch.cat([mask, new_mask], 1)
            logits, cache = demo(ids, cache, attention_mask=mask)
            done += n_new
            assert isinstance(cache, KVC) and cache.seq_len == ids.shape[1]
            for r in range(3):
                if r == 1 and step >= 2:
                    continue
                real = ids[r][mask[r].bool()].tolist()
                expected = oracle(hf_logits_alone, reference, real)[-n_new:]
                torch.testing.assert_close(logits[r], expected, **TOL,
                                           msg=lambda m: f"step {step}, row {r}: cached padded logits differ from the row alone.\n{m}")


@pytest.mark.exercise("padded_forward")
def test_attention_mask_is_checked(demo, reference):
    """A mask of another shape, or with values other than 0 and 1, raises a ValueError saying what a mask holds."""
    ids = torch.zeros(2, 4, dtype=torch.long)
    for mask in (torch.ones(2, 3, dtype=torch.long), torch.full((2, 4), 2), torch.ones(2, 4) * 0.5):
        with pytest.raises(ValueError, match="attention_mask"):
            demo(ids, attention_mask=mask)


# ---------------------------------------------------------------------------------------
# generate: batched greedy, seeded sampling, scores
# ---------------------------------------------------------------------------------------


def hf_generate(reference, prompts: list[str], new: int, seed: int | None = None, **settings) -> torch.Tensor:
    """Oracle: Hugging Face's generate on the left-padded prompts (after torch.manual_seed(seed), when given)."""
    tok = reference.tokenizer
    ids, mask = left_padded([tok.encode(p) for p in prompts], tok.eos_token_id)
    if seed is not None:
        torch.manual_seed(seed)
    return reference.hf_model.generate(
        ids, attention_mask=mask, max_new_tokens=new, pad_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id, **settings,
    )


def assert_same_tokens(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if not torch.equal(actual, expected):
        row, col = (actual != expected).nonzero()[0].tolist()
        raise AssertionError(f"{what}: row {row} differs first at column {col}: {actual[row].tolist()} vs {expected[row].tolist()}")


@pytest.mark.exercise("generate")
def test_batched_greedy_matches_each_prompt_alone_and_hf(gen, demo, reference, oracle):
    """Greedy generate on prompts of different lengths equals Hugging Face generate with left padding
    (pad = EOS) token for token, and each row's new tokens equal that prompt generated alone."""
    new = 12
    out = gen.generate(demo, reference.tokenizer, PROMPTS, new, temperature=0.0)
    expected = oracle(hf_generate, reference, PROMPTS, new, do_sample=False)
    assert_same_tokens(out, expected, "batched greedy vs Hugging Face generate")
    width = out.shape[1] - new
    eos = reference.tokenizer.eos_token_id
    for r, prompt in enumerate(PROMPTS):
        alone = gen.generate(demo, reference.tokenizer, [prompt], new, temperature=0.0)
        mine = alone[0, -(alone.shape[1] - len(reference.tokenizer.encode(prompt))) :].tolist()
        batched = out[r, width : width + len(mine)].tolist()
        assert batched == mine, f"prompt {r} in the batch generated {batched}, alone {mine}"
        assert all(t == eos for t in out[r, width + len(mine) :].tolist())


@pytest.mark.exercise("generate")
def test_seeded_sampling_matches_hf_generate(gen, demo, reference, oracle, impl, seed):
    """Seeded sampling equals Hugging Face generate(do_sample=True, top_k=0, ...) token for token, with typical_p,
    eta_cutoff, epsilon_cutoff and num_return_sequences too.

    Conditions: Hugging Face draws one torch.multinomial(softmax(warped logits), 1) per step on the whole
    (batch, d_vocab), finished rows included, from the global generator after torch.manual_seed(seed);
    the solutions draw the same way from a generator seeded alike. (A correct sample() that draws in
    another way, e.g. by inverse CDF, gives other tokens: yours is checked by the replay test below.)"""
    if impl.package != "solutions":
        pytest.skip("exact Hugging Face parity is a property of the solutions' draw; your sample() is replayed instead")
    new = 15
    for settings in (dict(temperature=1.0), dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02),
                     dict(temperature=0.9, typical_p=0.8, eta_cutoff=0.001, epsilon_cutoff=3e-4),
                     dict(temperature=1.1, top_p=0.95, num_return_sequences=2)):
        out = gen.generate(demo, reference.tokenizer, PROMPTS, new, seed=seed, **settings)
        expected = oracle(hf_generate, reference, PROMPTS, new, seed=seed, do_sample=True, **{"top_k": 0, **settings})
        assert_same_tokens(out, expected, f"seeded sampling with {settings} vs Hugging Face")


@pytest.mark.exercise("generate")
def test_seeded_sampling_replays_your_sample(gen, demo, reference, oracle, seed, device):
    """generate(seed=s) draws exactly what your own sample() draws on the true logits: one call per step on the
    whole batch with a torch.Generator on the model's device seeded with s, and rows that emitted EOS get pads from
    then on. The logits come from Hugging Face, each row run alone."""
    tok = reference.tokenizer
    new, settings = 12, dict(temperature=0.9, top_p=0.95)
    out = gen.generate(demo, tok, PROMPTS, new, seed=seed, **settings)

    rows = [tok.encode(p) for p in PROMPTS]
    generator = torch.Generator(device=device).manual_seed(seed)
    finished = [False] * len(rows)
    for _ in range(new):
        logits = torch.stack([oracle(hf_logits_alone, reference, row)[-1] for row in rows])
        drawn = gen.sample(logits, generator=generator, **settings).tolist()
        for r in range(len(rows)):
            rows[r].append(tok.eos_token_id if finished[r] else int(drawn[r]))
            finished[r] = finished[r] or drawn[r] == tok.eos_token_id
        if all(finished):
            break
    width = max(len(tok.encode(p)) for p in PROMPTS)
    n_new = len(rows[0]) - len(tok.encode(PROMPTS[0]))
    expected = [row[len(tok.encode(p)) :] for row, p in zip(rows, PROMPTS)]
    assert out.shape[1] == width + n_new, f"generate returned {out.shape[1] - width} new tokens, the replay {n_new}"
    assert new_tokens_of(out, width) == expected, "generate's tokens differ from a replay of sample() on the true logits"


def oracle_scores(reference, prompts, sequences, width, settings, penalty):
    """Oracle: per row and step, the chosen token's log-prob after HF's repetition penalty and warpers, and under
    the raw logits."""
    from transformers import RepetitionPenaltyLogitsProcessor

    tok = reference.tokenizer
    warpers = hf_warpers(**{k: v for k, v in settings.items() if k != "temperature" or v != 0.0})
    scores, logprobs = torch.full(sequences[:, width:].shape, float("nan")), torch.full(sequences[:, width:].shape, float("nan"))
    for r, prompt in enumerate(prompts):
        real = tok.encode(prompt) + sequences[r, width:].tolist()
        n_prompt = len(tok.encode(prompt))
        raw_all = hf_logits_alone(reference, real)
        for step in range(sequences.shape[1] - width):
            history = torch.tensor([real[: n_prompt + step]])
            raw = raw_all[n_prompt + step - 1][None]
            processed = RepetitionPenaltyLogitsProcessor(penalty)(history, raw.clone())
            if settings.get("temperature", 1.0) != 0.0:
                processed = warpers(history, processed)
            chosen = real[n_prompt + step]
            scores[r, step] = processed.log_softmax(-1)[0, chosen]
            logprobs[r, step] = raw.log_softmax(-1)[0, chosen]
            if chosen == tok.eos_token_id:
                break
    return scores, logprobs


@pytest.mark.exercise("generate")
@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(temperature=0.8, top_k=30, top_p=0.9)],
                         ids=["greedy", "sampling"])
def test_scores_and_logprobs_match_a_recomputation(gen, demo, reference, oracle, seed, settings):
    """return_dict_in_generate=True: scores are the chosen tokens' log-probs after the repetition penalty and the
    warpers (at temperature 0, after the penalty only), logprobs under the raw model; both recomputed here from
    Hugging Face full forwards of each row alone. Greedy tokens also equal Hugging Face's with the same penalty."""
    tok, new, penalty = reference.tokenizer, 10, 1.3
    out = gen.generate(demo, tok, PROMPTS, new, seed=seed, repetition_penalty=penalty,
                       return_dict_in_generate=True, **settings)
    sequences = out.sequences
    width = max(len(tok.encode(p)) for p in PROMPTS)
    n_new = sequences.shape[1] - width
    assert out.scores.shape == out.logprobs.shape == (len(PROMPTS), n_new)
    scores, logprobs = oracle(oracle_scores, reference, PROMPTS, sequences, width, settings, penalty)
    torch.testing.assert_close(out.scores, scores, **TOL, equal_nan=True, msg=lambda m: f"scores.\n{m}")
    torch.testing.assert_close(out.logprobs, logprobs, **TOL, equal_nan=True, msg=lambda m: f"logprobs.\n{m}")
    if settings["temperature"] == 0.0:
        for r, prompt in enumerate(PROMPTS):  # HF counts left pads as seen tokens, so compare rows alone
            expected = oracle(hf_generate, reference, [prompt], new, do_sample=False, repetition_penalty=penalty)[0]
            mine = sequences[r, width - len(tok.encode(prompt)) :][: expected.shape[0]]
            assert mine.tolist() == expected.tolist(), f"greedy with repetition_penalty={penalty}, prompt {r}"


def openai_penalised_greedy(reference, prompt: str, new: int, presence: float, frequency: float):
    """Oracle: greedy decoding of one prompt under OpenAI's definition of the two penalties, transcribed:

        mu[j] <- mu[j] - c[j] * frequency_penalty - float(c[j] > 0) * presence_penalty

    where c[j] is how often token j was sampled before the current position (the prompt's tokens
    are not counted). Returns the new tokens and each one's log-prob under the penalised logits;
    the logits come from Hugging Face, the row alone."""
    tok = reference.tokenizer
    ids = tok.encode(prompt)
    sampled: list[int] = []
    scores: list[float] = []
    for _ in range(new):
        mu = hf_logits_alone(reference, ids + sampled)[-1].clone()
        for j in set(sampled):
            c = sampled.count(j)
            mu[j] = mu[j] - c * frequency - float(c > 0) * presence
        token = int(mu.argmax())
        scores.append(float(mu.log_softmax(-1)[token]))
        sampled.append(token)
        if token == tok.eos_token_id:
            break
    return sampled, scores


@pytest.mark.exercise("generate")
def test_presence_and_frequency_penalties_count_generated_tokens_only(gen, demo, reference, oracle):
    """generate's presence and frequency penalties follow OpenAI's definition (also vLLM's): they count the tokens
    sampled so far, never the prompt's. Greedy tokens and their scores equal a transcription of that definition
    on Hugging Face's logits, each prompt alone. (The repetition penalty, Hugging Face's, counts the prompt too:
    see the scores test above.)"""
    tok, new = reference.tokenizer, 10
    for presence, frequency in ((0.0, 1.5), (2.0, 0.0), (0.7, 0.9)):
        out = gen.generate(demo, tok, PROMPTS, new, temperature=0.0, presence_penalty=presence,
                           frequency_penalty=frequency, return_dict_in_generate=True)
        width = out.sequences.shape[1] - out.scores.shape[1]
        for r, prompt in enumerate(PROMPTS):
            tokens, scores = oracle(openai_penalised_greedy, reference, prompt, new, presence, frequency)
            what = f"presence_penalty={presence}, frequency_penalty={frequency}, prompt {r}"
            mine = out.sequences[r, width : width + len(tokens)].tolist()
            assert mine == tokens, f"{what}: generated {mine}, OpenAI's definition gives {tokens}"
            torch.testing.assert_close(
                out.scores[r, : len(scores)], torch.tensor(scores), **TOL,
                msg=lambda m: f"{what}: scores differ from OpenAI's definition (do the penalties count the prompt?)\n{m}",
            )


# ---------------------------------------------------------------------------------------
# generate: per-row stopping, on a toy model
# ---------------------------------------------------------------------------------------


@pytest.fixture()
def successor_batch(impl):
    model = SuccessorModel(impl.transformer.KeyValueCache)
    eos = model.cfg.d_vocab - 1
    # Rows reach EOS after 3, 5 and 8 steps; row 2's prompt is the shortest.
    prompts = [f"1 2 {eos - 3}", f"4 5 6 7 {eos - 5}", f"{eos - 8}"]
    return model, IdTokenizer(eos), prompts, eos


@pytest.mark.exercise("generate")
def test_rows_finish_at_their_own_step(gen, successor_batch):
    """Each row stops at its own EOS, then receives pads (the EOS id) and never changes; the loop ends when the last
    row finishes, not at max_new_tokens. One prefill over the prompts, then one new position per step. Scores are
    finite up to and including the EOS step and NaN after it."""
    model, tokenizer, prompts, eos = successor_batch
    out = gen.generate(model, tokenizer, prompts, 20, temperature=0.0, return_dict_in_generate=True)
    width = 5
    expected = [
        [eos - 2, eos - 1, eos, eos, eos, eos, eos, eos],
        [eos - 4, eos - 3, eos - 2, eos - 1, eos, eos, eos, eos],
        [eos - 7, eos - 6, eos - 5, eos - 4, eos - 3, eos - 2, eos - 1, eos],
    ]
    assert new_tokens_of(out.sequences, width) == expected, (
        f"new tokens {new_tokens_of(out.sequences, width)}: each row must stop at its own EOS, get pads afterwards, "
        "and the batch must run until its last row is done"
    )
    assert model.calls[0] == (width, 0), f"the first call should be the prefill of {width} positions, got {model.calls[0]}"
    assert model.calls[1:] == [(width + i, width + i - 1) for i in range(1, 8)], (
        f"after the prefill each step should run one new position on top of the cache, got calls {model.calls}"
    )
    for row, steps in enumerate((3, 5, 8)):
        assert torch.isfinite(out.scores[row, :steps]).all() and torch.isfinite(out.logprobs[row, :steps]).all()
        assert torch.isnan(out.scores[row, steps:]).all() and torch.isnan(out.logprobs[row, steps:]).all(), (
            f"row {row} finished at step {steps}: its later scores and logprobs must be NaN"
        )


@pytest.mark.exercise("generate")
def test_a_criterion_stops_only_its_rows(gen, successor_batch):
    """A stopping criterion that stops row 1 only (at 7 tokens) pads row 1; the others run on to their EOS.
    MaxLengthCriteria(7) stops every row at 7 tokens."""
    model, tokenizer, prompts, eos = successor_batch

    def stop_row_1(input_ids, scores):
        stop = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        stop[1] = input_ids.shape[1] >= 7
        return stop

    out = gen.generate(model, tokenizer, prompts, 20, temperature=0.0, stopping_criteria=[stop_row_1])
    rows = new_tokens_of(out, 5)
    assert rows[1] == [eos - 4, eos - 3] + [eos] * 6, f"row 1 should stop after 2 new tokens, got {rows[1]}"
    assert rows[0][:3] == [eos - 2, eos - 1, eos] and rows[2][-1] == eos and len(rows[2]) == 8
    out = gen.generate(model, tokenizer, prompts, 20, temperature=0.0, stopping_criteria=[gen.MaxLengthCriteria(7)])
    assert out.shape == (3, 7), f"MaxLengthCriteria(7) should end the batch at 7 tokens, got shape {tuple(out.shape)}"


@pytest.mark.exercise("generate")
def test_generate_rejects_bad_arguments(gen, demo, reference):
    """Past n_ctx, a streamer with several prompts, an empty prompt, a string instead of a list, or a bad
    setting raise an error saying what is allowed."""
    tok, n_ctx = reference.tokenizer, reference.cfg.n_ctx
    with pytest.raises(ValueError, match=f"n_ctx={n_ctx}"):
        gen.generate(demo, tok, PROMPTS, n_ctx)
    with pytest.raises(ValueError, match="one prompt"):
        gen.generate(demo, tok, PROMPTS, 3, streamer=gen.TextStreamer(tok, file=io.StringIO()))
    with pytest.raises(ValueError, match="prompt"):
        gen.generate(demo, tok, ["fine", ""], 3)
    with pytest.raises(TypeError, match="list"):
        gen.generate(demo, tok, "a single string", 3)
    with pytest.raises(ValueError, match="top_p"):
        gen.generate(demo, tok, PROMPTS, 3, top_p=2.0)


# ---------------------------------------------------------------------------------------
# generate: the newer settings
# ---------------------------------------------------------------------------------------


def hf_greedy_alone(reference, prompt_ids: list[int], new: int, eos: int, settings: dict) -> torch.Tensor:
    """Oracle: Hugging Face's greedy generate on one prompt with ``settings`` (a ``logit_bias`` becomes its one-token
    sequence_bias), pad and end-of-text ``eos``."""
    settings = dict(settings)
    if "logit_bias" in settings:
        settings["sequence_bias"] = {(t,): b for t, b in settings.pop("logit_bias")}
    ids = torch.tensor([prompt_ids])
    return reference.hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                                       pad_token_id=eos, **{**settings, "eos_token_id": eos})


@pytest.mark.exercise("generate")
@pytest.mark.parametrize("settings", [
    dict(min_new_tokens=6, eos_token_id=None),
    dict(bad_words_ids=[[17], [2, 3], [371, 289]]),
    dict(logit_bias={5: 3.0, 17: -2.0, 100: 4.0, 259: -1.5}),
    dict(repetition_penalty=1.4, bad_words_ids=[[267, 417]], min_new_tokens=3, logit_bias={20: 1.0}),
], ids=["min_new_tokens", "bad_words_ids", "logit_bias", "together"])
def test_greedy_with_processors_matches_hf(gen, demo, reference, oracle, settings):
    """Greedy generate with min_new_tokens, bad_words_ids and logit_bias equals Hugging Face generate (logit_bias as
    its one-token sequence_bias), each prompt alone (Hugging Face counts left pads as seen tokens). min_new_tokens
    uses an end-of-text token that the greedy text would otherwise emit early."""
    tok, new = reference.tokenizer, 10
    settings = dict(settings)
    hf_settings = {k: v for k, v in settings.items() if k not in ("logit_bias", "eos_token_id")}
    if "logit_bias" in settings:  # as pairs: an oracle's argument keys are strings
        hf_settings["logit_bias"] = sorted(settings["logit_bias"].items())
    for prompt in PROMPTS:
        eos = tok.eos_token_id
        if "eos_token_id" in settings:  # the second greedy token of the prompt becomes the end-of-text token
            eos = int(gen.generate(demo, tok, [prompt], 2, temperature=0.0, eos_token_id=-1)[0, -1])
        ours = gen.generate(demo, tok, [prompt], new, temperature=0.0, **{**settings, "eos_token_id": eos})
        expected = oracle(hf_greedy_alone, reference, tok.encode(prompt), new, eos, hf_settings)
        assert_same_tokens(ours, expected, f"greedy with {settings}, prompt {prompt!r}")


@pytest.mark.exercise("generate")
def test_num_return_sequences_groups_copies_by_prompt(gen, demo, reference, seed, oracle, device):
    """num_return_sequences=3: 3 rows per prompt, grouped by prompt (rows 0-2 continue prompt 0, ...); at temperature 0
    the copies are the same greedy text; seeded sampling replays your sample() on the copies, one draw per step."""
    tok = reference.tokenizer
    greedy = gen.generate(demo, tok, PROMPTS, 6, temperature=0.0, num_return_sequences=3)
    alone = gen.generate(demo, tok, PROMPTS, 6, temperature=0.0)
    assert greedy.shape[0] == 3 * len(PROMPTS)
    assert torch.equal(greedy, alone.repeat_interleave(3, dim=0)), "each prompt's copies must follow it, in prompt order"
    out = gen.generate(demo, tok, PROMPTS[:2], 5, seed=seed, temperature=1.5, num_return_sequences=3)
    rows = [tok.encode(p) for p in PROMPTS[:2] for _ in range(3)]
    generator = torch.Generator(device=device).manual_seed(seed)
    finished = [False] * len(rows)
    for _ in range(5):
        logits = torch.stack([oracle(hf_logits_alone, reference, row)[-1] for row in rows])
        drawn = gen.sample(logits, generator=generator, temperature=1.5).tolist()
        for r in range(len(rows)):
            rows[r].append(tok.eos_token_id if finished[r] else int(drawn[r]))
            finished[r] = finished[r] or drawn[r] == tok.eos_token_id
    width = out.shape[1] - 5
    expected = [row[-5:] for row in rows]
    assert new_tokens_of(out, width) == expected, "the copies' tokens differ from a replay of sample() on the true logits"
    assert len({tuple(r) for r in expected}) > 1, "precondition: the copies should differ at temperature 1.5"


@pytest.mark.exercise("generate")
def test_generate_with_mirostat_keeps_a_state_per_row(gen, demo, reference, seed, oracle, device):
    """generate(mirostat=2) replays your mirostat_step on the true logits after the temperature: one call per step
    on the whole batch, each row's mu starting at 2 tau and carried from step to step."""
    tok, new, tau, eta, temperature = reference.tokenizer, 8, 3.0, 0.5, 0.9
    out = gen.generate(demo, tok, PROMPTS, new, seed=seed, temperature=temperature, mirostat=2, mirostat_tau=tau,
                       mirostat_eta=eta)
    rows = [tok.encode(p) for p in PROMPTS]
    generator = torch.Generator(device=device).manual_seed(seed)
    mu = torch.full((len(rows),), 2 * tau)
    finished = [False] * len(rows)
    mus = []
    for _ in range(new):
        logits = torch.stack([oracle(hf_logits_alone, reference, row)[-1] for row in rows])
        tempered = oracle(hf_processor, "TemperatureLogitsWarper", [temperature], None, logits)
        drawn, mu, _ = gen.mirostat_step(tempered, mu, tau, eta, generator)
        mus.append(mu.clone())
        for r in range(len(rows)):
            rows[r].append(tok.eos_token_id if finished[r] else int(drawn[r]))
            finished[r] = finished[r] or int(drawn[r]) == tok.eos_token_id
        if all(finished):
            break
    width = out.shape[1] - (len(rows[0]) - len(tok.encode(PROMPTS[0])))
    expected = [row[len(tok.encode(p)) :] for row, p in zip(rows, PROMPTS)]
    assert new_tokens_of(out, width) == expected, "generate's tokens differ from a replay of mirostat_step with a mu per row"
    assert len({round(float(m), 4) for m in mus[-1]}) > 1, "precondition: the rows' states should differ"


@pytest.mark.exercise("generate")
def test_logprobs_returns_the_top_k_of_the_raw_model(gen, demo, reference, oracle):
    """logprobs=5: at every step each row's 5 most likely tokens under the raw model and their log-probabilities,
    best first, recomputed here from Hugging Face's full forwards of each row alone; -1 and NaN once a row finished."""
    tok, new, k = reference.tokenizer, 6, 5
    out = gen.generate(demo, tok, PROMPTS, new, temperature=0.0, repetition_penalty=1.3, logprobs=k)
    width = out.sequences.shape[1] - new
    assert out.top_tokens.shape == out.top_logprobs.shape == (len(PROMPTS), new, k)
    for r, prompt in enumerate(PROMPTS):
        real = tok.encode(prompt) + out.sequences[r, width:].tolist()
        raw = oracle(hf_logits_alone, reference, real).log_softmax(-1)
        for step in range(new):
            values, ids = raw[len(tok.encode(prompt)) + step - 1].topk(k)
            assert out.top_tokens[r, step].tolist() == ids.tolist(), f"row {r}, step {step}: top tokens"
            torch.testing.assert_close(out.top_logprobs[r, step], values, **TOL)


# ---------------------------------------------------------------------------------------
# generate(num_beams=...): Hugging Face's beam search in the engine
# ---------------------------------------------------------------------------------------

# Story prompts of different lengths; the end-of-text token is "." for these tests, so that beams finish at
# sentence ends, after different numbers of tokens, and length_penalty and early_stopping change the answer.
BEAM_PROMPTS = ["One day, Max and Sunny went to the", "Later, it was raining. Max and Sunny stayed inside and"]
BEAM_SETTINGS = [(lp, es) for lp in (0.0, 1.0, 2.0, -1.0) for es in (True, False, "never")]


@pytest.fixture(scope="module")
def story_demo(story, impl):
    return load_demo(story, impl.transformer)


def hf_beam_generate(reference, ids: torch.Tensor, mask: torch.Tensor, new: int, length_penalty: float,
                     early_stopping: bool | str, eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Oracle: Hugging Face's beam search (3 beams, 2 returned) on a left-padded batch: (sequences, sequences_scores)."""
    out = reference.hf_model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, num_beams=3,
                                      num_return_sequences=2, length_penalty=length_penalty,
                                      early_stopping=early_stopping, eos_token_id=eos, pad_token_id=eos,
                                      output_scores=True, return_dict_in_generate=True)
    return out.sequences, out.sequences_scores


@pytest.mark.exercise("BeamHypotheses")
def test_engine_beam_search_matches_hf_for_every_setting(gen, story_demo, story, oracle):
    """generate(num_beams=3, num_return_sequences=2, length_penalty=lp, early_stopping=es) on two left-padded
    story prompts equals Hugging Face generate with the same settings: the same sequences (padded at the end), the
    same sequences_scores, for lp in 0, 1, 2, -1 and early_stopping True, False, "never". Which beams win changes
    with the settings (checked), so each setting is really compared."""
    tok, new = story.tokenizer, 10
    dot = tok.encode(".")[0]
    ids, mask = left_padded([tok.encode(p) for p in BEAM_PROMPTS], dot)
    answers = set()
    for lp, es in BEAM_SETTINGS:
        out = gen.generate(story_demo, tok, BEAM_PROMPTS, new, temperature=0.0, num_beams=3, num_return_sequences=2,
                           length_penalty=lp, early_stopping=es, eos_token_id=dot, return_dict_in_generate=True)
        sequences, sequences_scores = oracle(hf_beam_generate, story, ids, mask, new, lp, es, dot)
        assert_same_tokens(out.sequences, sequences, f"beams with length_penalty={lp}, early_stopping={es!r}")
        torch.testing.assert_close(out.sequences_scores, sequences_scores, **TOL,
                                   msg=lambda m: f"sequences_scores, length_penalty={lp}, early_stopping={es!r}.\n{m}")
        answers.add(tuple(map(tuple, sequences.tolist())))
    assert len(answers) >= 4, f"precondition: the settings should give different answers, got {len(answers)}"


@pytest.mark.exercise("BeamHypotheses")
def test_engine_beam_search_scores_are_its_tokens(gen, story_demo, story, oracle):
    """With return_dict_in_generate, a beam's per-token logprobs are its tokens' log-probabilities under the model
    (NaN past its end) and sum to its score times length ** length_penalty (no processor here)."""
    tok, lp = story.tokenizer, 1.0
    dot = tok.encode(".")[0]
    out = gen.generate(story_demo, tok, BEAM_PROMPTS[:2], 12, temperature=0.0, num_beams=3, num_return_sequences=3,
                       length_penalty=lp, eos_token_id=dot, return_dict_in_generate=True)
    width = out.sequences.shape[1] - out.logprobs.shape[1]
    for r in range(out.sequences.shape[0]):
        prompt = tok.encode(BEAM_PROMPTS[r // 3])
        new = out.sequences[r, width:].tolist()
        length = new.index(dot) + 1 if dot in new else len(new)
        raw = oracle(hf_logits_alone, story, prompt + new[:length]).log_softmax(-1)
        expected = raw[len(prompt) - 1 : -1].gather(-1, torch.tensor(new[:length])[:, None])[:, 0]
        torch.testing.assert_close(out.logprobs[r, :length], expected, **TOL)
        assert torch.isnan(out.logprobs[r, length:]).all()
        assert float(out.sequences_scores[r]) == pytest.approx(float(expected.sum()) / length**lp, abs=1e-3)


def test_engine_beam_search_rejects_sampling_settings(gen, story_demo, story):
    """num_beams > 1 takes no temperature, filter or mirostat, and at most num_beams return sequences."""
    tok = story.tokenizer
    with pytest.raises(ValueError, match="beam search"):
        gen.generate(story_demo, tok, ["Once"], 3, num_beams=2, temperature=0.7)
    with pytest.raises(ValueError, match="num_return_sequences"):
        gen.generate(story_demo, tok, ["Once"], 3, num_beams=2, num_return_sequences=3, temperature=0.0)
    with pytest.raises(ValueError, match="early_stopping"):
        gen.generate(story_demo, tok, ["Once"], 3, num_beams=2, early_stopping="sometimes", temperature=0.0)


# ---------------------------------------------------------------------------------------
# Stop strings
# ---------------------------------------------------------------------------------------

STOP_TEXT = " The cat sat on the mat, and the dog stopped there; then they went home."


def hf_stop_verdicts(reference, ids: list[int], stop_strings: list[str]) -> list[bool]:
    """Oracle: Hugging Face's StopStringCriteria on every prefix ids[:1], ids[:2], ...: stop or not."""
    from transformers import StopStringCriteria

    criterion = StopStringCriteria(reference.hf_tokenizer, stop_strings)
    return [bool(criterion(torch.tensor([ids[:end]]), None)[0]) for end in range(1, len(ids) + 1)]


@pytest.mark.exercise("StopStringCriteria")
def test_stop_strings_match_hf_criterion(gen, tiny, oracle):
    """On every prefix of a tokenized text, StopStringCriteria agrees with Hugging Face's: a row stops exactly
    when a stop string ends inside the newest token's text, also when it spans several tokens."""
    tok = tiny.tokenizer
    ids = tok.encode(STOP_TEXT)
    stop_strings = ["at,", "e dog", "stop", "ere;", " the", "ome.", "xyz", "t o", "n the mat"]
    ours = gen.StopStringCriteria(tok, stop_strings)
    theirs = oracle(hf_stop_verdicts, tiny, ids, stop_strings)
    multi_token_hits = 0
    for end in range(1, len(ids) + 1):
        prefix = torch.tensor([ids[:end]])
        expected = theirs[end - 1]
        actual = ours(prefix, torch.zeros(1, tiny.cfg.d_vocab))
        assert actual.shape == (1,), f"a criterion returns one bool per row, got shape {tuple(actual.shape)}"
        assert bool(actual[0]) == expected, (
            f"after {tok.decode(ids[:end])!r}: yours says {bool(actual[0])}, Hugging Face's {expected}"
        )
        if expected and not any(s in tok.decode(ids[end - 1 : end]) for s in stop_strings):
            multi_token_hits += 1
    assert multi_token_hits >= 3, "the text should contain stop strings spread over several tokens"


@pytest.mark.exercise("StopStringCriteria")
def test_stop_string_with_a_character_split_across_tokens(gen, tiny):
    """A stop string ending in a character whose bytes span two tokens matches once its last byte arrives, not
    before (decode the tail together: one token's bytes alone are not a character)."""
    tok = tiny.tokenizer
    ids = tok.encode(" café au lait")
    crit = gen.StopStringCriteria(tok, ["café"])
    verdicts = [bool(crit(torch.tensor([ids[:end]]), None)[0]) for end in range(1, len(ids) + 1)]
    first = next(end for end in range(1, len(ids) + 1) if "café" in tok.decode(ids[:end]))
    assert tok.decode(ids[first - 1 : first]) != "é", "the test needs 'é' split over tokens"
    assert verdicts == [end == first for end in range(1, len(ids) + 1)], f"verdicts per prefix: {verdicts}"


def hf_generate_with_stop_strings(reference, prompts: list[str], new: int, stops: list[str]) -> torch.Tensor:
    """Oracle: Hugging Face's greedy generate on the left-padded prompts, with stop strings."""
    tok = reference.tokenizer
    ids, mask = left_padded([tok.encode(p) for p in prompts], tok.eos_token_id)
    return reference.hf_model.generate(
        ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id, stop_strings=stops, tokenizer=reference.hf_tokenizer,
    )


@pytest.mark.exercise("StopStringCriteria")
def test_generate_with_stop_strings_matches_hf(gen, demo, reference, oracle):
    """generate(stop_strings=...) stops each row where Hugging Face's generate does and keeps the tokens that
    completed the stop string. The stop strings are cut from the rows' own greedy text, across token boundaries."""
    tok, new = reference.tokenizer, 14
    free = gen.generate(demo, tok, PROMPTS, new, temperature=0.0)
    width = free.shape[1] - new
    stops = []
    for row in (0, 2):  # a piece spanning the first boundary between two whole-character tokens, from new token 3
        pieces = [tok.decode(free[row, i : i + 1]) for i in range(width + 3, free.shape[1])]
        i = next(i for i in range(len(pieces) - 1) if "\ufffd" not in pieces[i] + pieces[i + 1])
        stops.append(pieces[i][-2:] + pieces[i + 1][:2])
    out = gen.generate(demo, tok, PROMPTS, new, temperature=0.0, stop_strings=stops)
    expected = oracle(hf_generate_with_stop_strings, reference, PROMPTS, new, stops)
    assert_same_tokens(out, expected, f"greedy with stop_strings={stops} vs Hugging Face")
    assert out.shape != free.shape or not torch.equal(out, free), "the stop strings should have stopped a row early"


# ---------------------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------------------

STREAM_TEXT = "Grüße aus Köln ☃ — naïve café, 東京 and emoji 🙂 end.\nNew line: über.   spaced"


@pytest.mark.exercise("TextStreamer")
def test_streamer_prints_the_decode_a_word_at_a_time(gen, tiny):
    """Fed one token at a time on text with multi-byte characters, TextStreamer's writes put together are the
    decode of every token; no write holds a broken character, and every write but the last ends in a space or
    newline (a word is printed once it is complete). With skip_prompt, the first put is left out."""
    tok = tiny.tokenizer
    ids = tok.encode(STREAM_TEXT)
    assert any(tok.decode(ids[i : i + 1]) == "\ufffd" for i in range(len(ids))), "the text must split a character"
    out = RecordingFile()
    streamer = gen.TextStreamer(tok, file=out)
    streamer.put(torch.tensor([ids[:3]]))
    for token in ids[3:]:
        streamer.put(torch.tensor([token]))
    streamer.end()
    assert "".join(out.chunks) == STREAM_TEXT
    assert not any("\ufffd" in chunk for chunk in out.chunks), f"a write held a broken character: {out.chunks}"
    assert all(chunk[-1] in " \n" for chunk in out.chunks[:-1]), f"writes that end mid-word: {out.chunks}"
    assert len(out.chunks) >= 8, f"expected the text a word at a time, got {len(out.chunks)} writes"

    out = RecordingFile()
    streamer = gen.TextStreamer(tok, skip_prompt=True, file=out)
    streamer.put(torch.tensor([ids[:4]]))
    for token in ids[4:]:
        streamer.put(torch.tensor([token]))
    streamer.end()
    assert "".join(out.chunks) == tok.decode(ids[4:])


@pytest.mark.exercise("TextStreamer")
def test_generate_streams_what_it_returns(gen, demo, reference, seed):
    """generate(..., streamer=TextStreamer(...)) prints the prompt and then exactly the text it returns."""
    tok = reference.tokenizer
    out = RecordingFile()
    sequences = gen.generate(demo, tok, ["Grüße aus Köln, said the"], 25, seed=seed, temperature=1.5,
                             streamer=gen.TextStreamer(tok, file=out))
    assert "".join(out.chunks) == tok.decode(sequences[0], clean_up_tokenization_spaces=False)
    assert len(out.chunks) >= 2
