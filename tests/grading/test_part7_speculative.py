"""Part 7: speculative decoding, exact in distribution and equal to greedy at temperature 0.

How the tests judge:

* ``filtered_probs`` and ``residual_probs`` are compared with oracles computed here in
  float64: softmax of the tempered logits, then an explicit top-k and nucleus in plain
  Python, and max(0, p - q) normalised by hand.
* The acceptance rule, ``accept_or_resample``, is tested against its closed form: for
  fixed p, q and proposals, the probability of every possible outcome (how many proposals
  survive, and which token comes after them) is written down exactly and compared with
  the empirical frequencies (chi-square). A second test checks the theorem itself: a
  proposal drawn from q and then judged comes out distributed as p.
* ``speculative_generate`` (the loop around your ``speculative_round``) runs on toy models
  with a four-token vocabulary: ``TrigramModel``s (``sampling_course.trigram_model``), whose next-token
  logits depend on the last two tokens; they are made beside the code under test
  (``sampling_course.beside``, in its process when it runs in another), and every oracle runs on
  a twin made here from the same table. The target's exact distribution over the first two or three generated tokens
  is computed by enumerating every continuation, and the empirical joint distribution of
  the generated tokens must match it (chi-square), for several gammas, temperatures and
  filters. The trigram models keep the token ids themselves in their KeyValueCache and fail
  (AssertionError) when a cache holds anything but the sequence's own tokens: a rejected
  proposal that was not cropped away is caught on the spot.
* At temperature 0 the output must be the target's greedy text: every generated token is
  the argmax of the target's logits, computed with a plain uncached forward pass over the
  text before it (two tokens whose logits tie within float noise are both accepted). On
  random small DemoTransformers and on the reference pairs in ``REFERENCE_PAIRS`` (the
  stand-in and, once available, the story models).
* Prompt-lookup drafting: ``prompt_lookup`` against a transcription of its definition on
  hand-made and random texts; with it as the draft, the output's joint distribution equals
  the target's exactly (chi-square, as above) and temperature 0 gives the greedy text.
* The statistics (acceptance rate, forward passes) are checked against spies that count
  the real calls, and against cases whose answer is known: a draft identical to the target
  has every proposal accepted and adds gamma + 1 tokens per target forward.

Statistical tests: support first (an outcome of probability 0 must never appear), then
Pearson's chi-square statistic over the outcomes of positive probability (the rarest
pooled, so that every cell expects at least ``MIN_EXPECTED`` draws) against
``scipy.stats.chi2.isf(ALPHA / TAIL_SAFETY, df)``, so that a correct implementation fails
with probability at most ``ALPHA`` = 1e-6 (the safety factor covers the chi-square
approximation's error in the far tail, measured by simulation: see ``TAIL_SAFETY``). Each
sample size is the smallest for which a distribution at chi-square distance
``DETECT_DISTANCE`` from the exact one is caught with probability at least ``POWER``
(noncentral chi-square). The planted mistakes of this part that change the output
distribution move it much farther, in at least one setting: accepting when r >= p/q by 0.9
to 2.1 (or onto outcomes of probability 0), reading p from the first rows of the target's
logits by 0.6 to 7.5, resampling from p instead of the residual by 0.23 (measured with
4,000 runs each). The seed comes from ``SAMPLING_COURSE_TEST_SEED`` (any seed must pass). The draws
your code makes take a ``torch.Generator`` on the grading device (``pytest --device``), where the
models are: a generator draws on its own device only. The toy models' tables are their weights, so
they live there too.
"""


from __future__ import annotations

from collections import Counter

import pytest
import torch

from sampling_course.repeat import repeat

from doubles import counted
from part7_oracles import ORACLE_DRAFT, V, assert_frequencies_match, oracle_filtered, sample_size, toy_pair


@pytest.fixture(scope="module")
def spec(impl):
    return impl.speculative


@pytest.fixture(scope="module")
def spec_loop(impl):
    return impl.speculative_loop


# ---------------------------------------------------------------------------------------
# filtered_probs
# ---------------------------------------------------------------------------------------

# Unsorted logits over 8 tokens without ties; softmax ~ [.069 .028 .380 .126 .034 .230 .008 .124].
LOGITS = torch.tensor([0.3, -0.6, 2.0, 0.9, -0.4, 1.5, -1.9, 0.88])


@pytest.mark.exercise("filtered_probs")
@pytest.mark.parametrize(
    "settings",
    [
        dict(),
        dict(temperature=0.5),
        dict(temperature=2.0),
        dict(top_k=1),
        dict(top_k=3),
        dict(top_k=9),  # more than the vocabulary: keeps every token, as in Hugging Face
        dict(top_p=0.5),
        dict(top_p=0.6),
        dict(temperature=0.7, top_k=5, top_p=0.8),
        dict(temperature=1.6, top_p=0.9),
    ],
    ids=str,
)
def test_filtered_probs_matches_the_oracle(spec, settings):
    """Temperature, then top-k, then top-p (inclusive), then softmax: equal to the float64 oracle."""
    got = spec.filtered_probs(LOGITS.clone(), **settings)
    expected = oracle_filtered(LOGITS, **settings)
    assert got.shape == LOGITS.shape, f"shape {tuple(got.shape)}, expected {tuple(LOGITS.shape)}"
    assert (got[expected == 0] == 0).all(), f"{settings}: filtered-out tokens got probability {got.tolist()}"
    torch.testing.assert_close(got.double(), expected, atol=1e-6, rtol=1e-5, msg=lambda m: f"{settings}: {m}")


@pytest.mark.exercise("filtered_probs")
def test_filtered_probs_top_p_is_inclusive_and_after_top_k(spec):
    """The token that takes the running total to top_p is kept; top-p measures mass after top-k."""
    probs = torch.tensor([0.1, 0.4, 0.2, 0.3])
    logits = probs.log()
    # Sorted .4 .3 .2 .1: top_p=0.69 needs .4 + .3 (the second token reaches it).
    assert (spec.filtered_probs(logits, top_p=0.69) > 0).tolist() == [False, True, False, True]
    assert (spec.filtered_probs(logits, top_p=0.71) > 0).tolist() == [False, True, True, True]
    assert (spec.filtered_probs(logits, top_p=0.39) > 0).tolist() == [False, True, False, False]
    # After top_k=2 the two survivors have 4/7 and 3/7, so top_p=0.5 keeps one of them; top-p first would keep two.
    assert (spec.filtered_probs(logits, top_k=2, top_p=0.5) > 0).tolist() == [False, True, False, False]


@pytest.mark.exercise("filtered_probs")
def test_filtered_probs_temperature_zero_is_the_argmax(spec):
    """Temperature 0: all the mass on the argmax, the first of tied tokens, whatever top-k and top-p say."""
    assert spec.filtered_probs(LOGITS, temperature=0).tolist() == oracle_filtered(LOGITS, 0).tolist()
    tied = torch.tensor([1.0, 3.0, 0.5, 3.0])
    assert spec.filtered_probs(tied, temperature=0, top_k=3, top_p=0.5).tolist() == [0.0, 1.0, 0.0, 0.0]


@pytest.mark.exercise("filtered_probs")
def test_filtered_probs_treats_every_row_on_its_own(spec):
    """Leading dimensions are kept, and each row is filtered with its own ranking."""
    rows = torch.stack([LOGITS, LOGITS.flip(0), LOGITS * 0.5]).reshape(3, 1, -1)
    got = spec.filtered_probs(rows, temperature=0.8, top_k=4, top_p=0.9)
    assert got.shape == rows.shape
    for i in range(3):
        torch.testing.assert_close(got[i, 0].double(), oracle_filtered(rows[i, 0], 0.8, 4, 0.9), atol=1e-6, rtol=1e-5)


@pytest.mark.exercise("filtered_probs")
@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
    ],
    ids=str,
)
def test_filtered_probs_rejects_bad_settings(spec, settings, message):
    with pytest.raises(ValueError, match=message):
        spec.filtered_probs(LOGITS, **settings)


# ---------------------------------------------------------------------------------------
# draft_tokens
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("draft_tokens")
@pytest.mark.parametrize("settings", [dict(temperature=1.0), dict(temperature=0.6, top_k=2), dict(temperature=1.5, top_p=0.7)], ids=str)
@pytest.mark.parametrize("cached", [0, 2], ids=lambda n: f"{n}-cached")
def test_draft_tokens_draws_from_the_filtered_draft(spec, impl, settings, cached, seed, device):
    """gamma cached forwards, each on its new positions only; q rows are the filtered draft distributions
    after each prefix (uncached oracle); every proposal lies in its q's support; the cache holds all but the last."""
    KVC = impl.kv_cache.KeyValueCache
    _, draft = toy_pair(spec)
    tokens = torch.tensor([2, 0, 3])
    cache = KVC.new_empty(draft.cfg)
    if cached:
        _, cache = draft(tokens[None, :cached], cache)
    gamma = 5
    generator = torch.Generator(device=device).manual_seed(seed)
    spy = counted(draft)  # its calls are recorded apart, where draft_tokens cannot change the record
    proposals, q, cache = spec.draft_tokens(spy, tokens, cache, gamma, generator=generator, **settings)
    assert proposals.shape == (gamma,) and q.shape == (gamma, V), f"shapes {tuple(proposals.shape)}, {tuple(q.shape)}"
    calls = spy.calls
    assert len(calls) == gamma, f"expected {gamma} forward passes of the draft, got {len(calls)}"
    assert all(c is not None for _, c in calls), "every forward pass of the draft must use its cache"
    assert calls[0][1] == cached and all(n - c == 1 for n, c in calls[1:]), (
        f"after the first, each draft forward must run exactly one new position; calls (positions, cached): {calls}"
    )
    sequence = torch.cat([tokens, proposals])
    for i in range(gamma):
        expected = oracle_filtered(ORACLE_DRAFT(sequence[None, : len(tokens) + i])[0, -1], **settings)
        torch.testing.assert_close(q[i].double(), expected, atol=1e-6, rtol=1e-5, msg=lambda m: f"q[{i}]: {m}")
        assert expected[proposals[i]] > 0, f"proposal {i} is token {int(proposals[i])}, which q[{i}] gives probability 0"
    assert cache.shape[3] == len(tokens) + gamma - 1, f"the draft's cache holds {cache.shape[3]} positions, expected {len(tokens) + gamma - 1}"
    draft(sequence[None], cache)  # the toy model checks that the cache holds the sequence's tokens


@pytest.mark.exercise("draft_tokens")
def test_draft_tokens_is_greedy_at_temperature_zero_and_follows_the_generator(spec, impl, device):
    """Temperature 0 proposes the draft's greedy chain; the same generator seed gives the same proposals."""
    KVC = impl.kv_cache.KeyValueCache
    _, draft = toy_pair(spec)
    tokens = torch.tensor([1, 3])
    proposals, q, _ = spec.draft_tokens(draft, tokens, KVC.new_empty(draft.cfg), 4, temperature=0)
    sequence = tokens.tolist()
    for _ in range(4):
        sequence.append(int(ORACLE_DRAFT(torch.tensor([sequence]))[0, -1].argmax()))
    assert proposals.tolist() == sequence[2:], f"proposals {proposals.tolist()}, the draft's greedy chain {sequence[2:]}"
    assert q.sum(-1).tolist() == [1.0] * 4 and (q.max(-1).values == 1).all()
    runs = [
        spec.draft_tokens(draft, tokens, KVC.new_empty(draft.cfg), 6, generator=torch.Generator(device=device).manual_seed(5))[0]
        for _ in range(2)
    ]
    assert torch.equal(*runs), "the same generator seed must give the same proposals: draw with generator="


# ---------------------------------------------------------------------------------------
# residual_probs
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("residual_probs")
def test_residual_probs_is_the_normalised_positive_part(spec):
    """normalize(max(0, p - q)), row by row; p itself where p <= q everywhere."""
    p = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.1, 0.1, 0.7, 0.1], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.2, 0.4, 0.1, 0.3], [0.1, 0.1, 0.7, 0.1], [0.7, 0.1, 0.1, 0.1]])
    got = spec.residual_probs(p, q)
    expected = torch.tensor([[0.75, 0.0, 0.25, 0.0], [0.1, 0.1, 0.7, 0.1], [0.0, 1 / 3, 1 / 3, 1 / 3]])
    assert got.shape == p.shape
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(spec.residual_probs(p[0], q[0]), expected[0], atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="shape"):
        spec.residual_probs(p, q[:2])


# ---------------------------------------------------------------------------------------
# accept_or_resample
# ---------------------------------------------------------------------------------------

# p (3 rows) and q (2 rows) over 4 tokens, and the two proposals judged: the first is
# accepted with probability .2 / .8 = 1/4, the second with .3 / .5 = 3/5.
RULE_P = torch.tensor([[0.2, 0.1, 0.4, 0.3], [0.1, 0.3, 0.3, 0.3], [0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
RULE_Q = torch.tensor([[0.8, 0.1, 0.05, 0.05], [0.2, 0.5, 0.2, 0.1]], dtype=torch.float64)
RULE_PROPOSALS = [0, 1]


def rule_closed_form() -> dict[tuple[int, ...], float]:
    """Probability of every output of accept_or_resample(RULE_P, RULE_Q, RULE_PROPOSALS), written out."""
    out: dict[tuple[int, ...], float] = {}
    prefix, reach = [], 1.0
    for i, x in enumerate(RULE_PROPOSALS):
        accept = min(1.0, (RULE_P[i, x] / RULE_Q[i, x]).item())
        residual = (RULE_P[i] - RULE_Q[i]).clamp(min=0)
        residual = residual / residual.sum()
        for y in range(V):
            out[(*prefix, y)] = reach * (1 - accept) * residual[y].item()
        prefix, reach = prefix + [x], reach * accept
    for y in range(V):
        out[(*prefix, y)] = reach * RULE_P[-1, y].item()
    return out


@pytest.mark.exercise("accept_or_resample")
def test_accept_or_resample_follows_its_closed_form(spec, seed, device):
    """Every outcome (accepted proposals, then one token) has its exact probability: reject the first
    (3/4) and draw from normalize(max(0, p0 - q0)); accept it, reject the second (1/4 * 2/5) and draw from
    normalize(max(0, p1 - q1)); accept both (3/20) and draw the bonus from p2. Chi-square:
    false-failure probability <= 1e-6."""
    expected = rule_closed_form()
    n = sample_size(sum(prob > 0 for prob in expected.values()) - 1)
    generator = torch.Generator(device=device).manual_seed(seed)
    p, q, proposals = RULE_P.float(), RULE_Q.float(), torch.tensor(RULE_PROPOSALS)
    # One repeat: a submission graded in another process makes the n calls there, in one request.
    observed = Counter(tuple(drawn.tolist()) for drawn in repeat(spec.accept_or_resample, n, p, q, proposals, generator))
    assert_frequencies_match(observed, expected, n, "accept_or_resample(p, q, proposals)")


@pytest.mark.exercise("accept_or_resample")
def test_draft_then_judge_gives_the_target_distribution(spec, seed, device):
    """The theorem: a proposal drawn from q and then judged yields a first token distributed exactly as p.
    Chi-square: false-failure probability <= 1e-6."""
    p = torch.tensor([[0.05, 0.45, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.4, 0.1, 0.3, 0.2]])
    n = sample_size(V - 1)
    generator = torch.Generator(device=device).manual_seed(seed)
    proposals = torch.multinomial(q[0], n, replacement=True, generator=generator)
    observed = Counter(int(spec.accept_or_resample(p, q, x[None], generator)[0]) for x in proposals)
    assert_frequencies_match(observed, dict(enumerate(p[0].double().tolist())), n, "first token after drafting from q and judging")


@pytest.mark.exercise("accept_or_resample")
def test_accept_or_resample_certain_cases(spec, device):
    """p >= q at every proposal: all accepted, plus a bonus from p[-1]. p(x) = 0: rejected at once, replaced by
    a token where p > q. One-hot p and q (temperature 0): the target's argmax wins."""
    generator = torch.Generator(device=device).manual_seed(0)
    p = torch.tensor([[0.1, 0.6, 0.2, 0.1], [0.2, 0.2, 0.5, 0.1], [0.0, 0.0, 0.0, 1.0]])
    q = torch.tensor([[0.3, 0.3, 0.3, 0.1], [0.3, 0.3, 0.3, 0.1]])
    for _ in range(20):
        assert spec.accept_or_resample(p, q, torch.tensor([1, 2]), generator).tolist() == [1, 2, 3]
        assert spec.accept_or_resample(p[1:], q[:1], torch.tensor([2]), generator).tolist() == [2, 3]
    p0 = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q0 = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    for _ in range(20):
        out = spec.accept_or_resample(p0, q0, torch.tensor([0]), generator).tolist()
        assert len(out) == 1 and out[0] in (1, 2), f"proposal 0 has p = 0 and must be replaced by 1 or 2, got {out}"
    one_hot = torch.eye(V)
    assert spec.accept_or_resample(one_hot[[3, 1]], one_hot[[0]], torch.tensor([0]), generator).tolist() == [3]
    assert spec.accept_or_resample(one_hot[[0, 1]], one_hot[[0]], torch.tensor([0]), generator).tolist() == [0, 1]


@pytest.mark.exercise("accept_or_resample")
def test_accept_or_resample_rejects_mismatched_shapes(spec):
    p, q = torch.full((3, V), 0.25), torch.full((2, V), 0.25)
    with pytest.raises(ValueError, match="rows"):
        spec.accept_or_resample(p, q, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="rows"):
        spec.accept_or_resample(p[:, :3], q, torch.tensor([0, 1]))


# ---------------------------------------------------------------------------------------
# crop_cache
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("crop_cache")
def test_crop_cache_keeps_the_first_positions(spec, impl):
    """A KeyValueCache cropped to n holds positions 0..n-1 of every layer, keys and values, and is a KeyValueCache."""
    KVC = impl.kv_cache.KeyValueCache
    data = torch.randn(3, 2, 1, 7, 2, 5, generator=torch.Generator().manual_seed(0))
    for n in (0, 1, 4, 7):
        cropped = spec.crop_cache(KVC(data.clone()), n)
        assert isinstance(cropped, KVC), f"crop_cache gave a {type(cropped).__name__}, expected a KeyValueCache"
        assert tuple(cropped.shape) == (3, 2, 1, n, 2, 5), f"n={n}: shape {tuple(cropped.shape)}"
        assert torch.equal(cropped.as_subclass(torch.Tensor), data[:, :, :, :n]), f"n={n}: the wrong positions were kept"
    with pytest.raises(ValueError, match="seq_len"):
        spec.crop_cache(KVC(data), 8)
    with pytest.raises(ValueError, match="seq_len"):
        spec.crop_cache(KVC(data), -1)


@pytest.mark.exercise("crop_cache")
def test_crop_cache_lets_a_cache_crop_itself(spec, impl):
    """A cache with its own crop(n) is cropped by it: its result, or the cache itself when crop returns None."""
    KVC = impl.kv_cache.KeyValueCache
    seen = []

    class CroppingCache(KVC):
        def crop(self, n):
            seen.append(n)
            return "cropped by the cache"

    class InPlaceCache(KVC):
        def crop(self, n):
            seen.append(-n)

    data = torch.zeros(1, 2, 1, 5, 1, 1)
    assert spec.crop_cache(CroppingCache(data), 3) == "cropped by the cache"
    in_place = InPlaceCache(data)
    assert spec.crop_cache(in_place, 2) is in_place
    assert seen == [3, -2]
