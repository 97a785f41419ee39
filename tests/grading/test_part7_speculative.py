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

import itertools
import math
from collections import Counter
from functools import cache

import pytest
import torch
from torch import nn

from sampling_course.config import Config
from sampling_course.beside import made_beside
from sampling_course.implementation import load_demo
from sampling_course.reference import ReferenceUnavailable, load_reference
from sampling_course.repeat import repeat

from doubles import CountedModel, IdTokenizer, IdTokenizerWithVocab, RecordingTokenizer, TrigramModel
from quantiles import chi2_isf, ncx2_sf

ALPHA = 1e-6  # the false-failure probability of every statistical test below
# At these sample sizes Pearson's statistic has a heavier far tail than the chi-square
# distribution: simulated under the exact distributions of the five tests below (4e7
# multinomial samples each, pooled as the tests pool), it passes chi2.isf(1e-6, df) 1.3e-6
# to 2.4e-6 of the time, and chi2.isf(1e-7, df) 1e-7 to 4e-7 of the time. So the threshold
# is taken at ALPHA / TAIL_SAFETY.
TAIL_SAFETY = 10
POWER = 0.999  # the chance of catching a distribution DETECT_DISTANCE away from the exact one
DETECT_DISTANCE = 0.1  # chi-square distance sum((e - p)^2 / p) that the sample sizes are chosen to detect
MIN_EXPECTED = 20.0  # each chi-square cell expects at least this many draws (rarer outcomes are pooled)
# Two fp32 logits within this of each other count as a tie for greedy decoding: cached
# and uncached forwards of a correct model agree to ~1e-5.
TIE_TOLERANCE = 1e-4

V = 4  # the toy models' vocabulary


# ---------------------------------------------------------------------------------------
# Toy models: trigram tables over V tokens (TrigramModel, in sampling_course.trigram_model)
# ---------------------------------------------------------------------------------------


def random_table(seed: int, scale: float, bigram: bool = False) -> torch.Tensor:
    """Random logits ``(V + 1, V, V)`` for a TrigramModel (row V: no previous token); with
    ``bigram`` they ignore the previous token."""
    generator = torch.Generator().manual_seed(seed)
    if bigram:
        return (scale * torch.randn(1, V, V, generator=generator)).expand(V + 1, V, V).clone()
    return scale * torch.randn(V + 1, V, V, generator=generator)


# The toy pair of the exactness tests: a target that looks two tokens back and a draft that
# looks one token back, different enough that about half of the proposals are rejected.
TOY_TARGET_TABLE = random_table(101, scale=1.2)
TOY_DRAFT_TABLE = random_table(202, scale=1.2, bigram=True)
TOY_PROMPT = "2 0"


def toy_pair(where, n_ctx: int = 64) -> tuple[TrigramModel, TrigramModel]:
    """The toy target and draft, made beside the code under test (``where``: one of its modules)."""
    return (made_beside(where, TrigramModel, TOY_TARGET_TABLE, "target", n_ctx),
            made_beside(where, TrigramModel, TOY_DRAFT_TABLE, "draft", n_ctx))


# Their twins in the test's own process: the oracles compute with these, never with the models handed out.
ORACLE_TARGET = TrigramModel(TOY_TARGET_TABLE, "target", 256)
ORACLE_DRAFT = TrigramModel(TOY_DRAFT_TABLE, "draft", 256)


def assert_cache_holds(cache, tokens: torch.Tensor, what: str) -> None:
    """A toy model's keys and values are the token ids: the cache must hold exactly ``tokens``. Checked here,
    on the cache's data (the models check it too where they run, but a record there is the code's to change)."""
    held = torch.clone(cache).as_subclass(torch.Tensor)[:, :, 0, :, 0, 0].round().long()  # a torch function: on its data
    assert held.shape[-1] == len(tokens) and bool((held == tokens.to(held.device)).all()), (
        f"{what} holds the tokens {held[0, 0].tolist()}, but the sequence kept begins with {tokens.tolist()}: "
        "a cache must be cropped back to the tokens that were kept"
    )


def id_tokenizer(where, *args):
    """An IdTokenizer (``args``: its eos_token_id), made beside the code under test."""
    return made_beside(where, IdTokenizer, *args)


def random_demo(transformer, seed: int, **dims) -> nn.Module:
    """A small DemoTransformer with seeded random weights, large enough for peaked distributions."""
    settings = dict(d_model=32, d_vocab=16, n_ctx=64, d_head=8, d_mlp=64, n_heads=4, n_layers=2)
    model = transformer.DemoTransformer(Config(**{**settings, **dims}))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.2 * noise if name.endswith(".w") else 0.5 * noise)
    return model.eval()


def first_layers(transformer, model: nn.Module, n_layers: int) -> nn.Module:
    """A draft made of the model's first ``n_layers`` blocks, with its embeddings and unembedding."""
    cfg = Config(**{**vars(model.cfg), "n_layers": n_layers})
    draft = transformer.DemoTransformer(cfg)
    keep = {k: v for k, v in model.state_dict().items() if not k.startswith("blocks.") or int(k.split(".")[1]) < n_layers}
    draft.load_state_dict(keep, strict=True)
    return draft.eval()


# ---------------------------------------------------------------------------------------
# Oracles
# ---------------------------------------------------------------------------------------


def oracle_filtered(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Temperature, top-k, top-p (inclusive), softmax: one row, float64, in plain Python."""
    logits = logits.double()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(), logits.shape[-1]).double()
    probs = (logits / temperature).softmax(-1)
    ranked = sorted(range(len(probs)), key=lambda t: -probs[t].item())
    kept = ranked[:top_k] if top_k else ranked
    mass = sum(probs[t].item() for t in kept)
    if top_p < 1.0:
        nucleus, above = [], 0.0
        for t in kept:
            if above < top_p:
                nucleus.append(t)
            above += probs[t].item() / mass
        kept = nucleus
    out = torch.zeros_like(probs)
    out[kept] = probs[kept] / probs[kept].sum()
    return out


def exact_joint(model: TrigramModel, prompt_ids: list[int], length: int, settings: dict) -> dict[tuple[int, ...], float]:
    """The target's exact probability of every continuation of ``length`` tokens, by enumeration.

    Each factor comes from a plain uncached forward pass over the prefix, filtered by the oracle.
    """
    joint: dict[tuple[int, ...], float] = {}
    for continuation in itertools.product(range(model.cfg.d_vocab), repeat=length):
        prob = 1.0
        for i, token in enumerate(continuation):
            prefix = torch.tensor([prompt_ids + list(continuation[:i])])
            prob *= oracle_filtered(model(prefix)[0, -1], **settings)[token].item()
            if prob == 0.0:
                break
        joint[continuation] = prob
    return joint


def chi2_threshold(df: int) -> float:
    return chi2_isf(ALPHA / TAIL_SAFETY, df)


def sample_size(df: int) -> int:
    """The smallest n that catches a distribution DETECT_DISTANCE away with probability POWER."""
    threshold = chi2_threshold(df)
    n = 1
    while ncx2_sf(threshold, df, n * DETECT_DISTANCE) < POWER:
        n = math.ceil(n * 1.05) + 1
    return n


def pooled(expected: dict, n: int) -> list[list]:
    """The outcomes of positive probability in groups whose expected count is at least MIN_EXPECTED.

    Each outcome is a group of its own, except those expected fewer than MIN_EXPECTED
    times, which are pooled into one group (with the next rarest outcomes while that group
    is still short of MIN_EXPECTED).
    """
    cells = sorted((outcome for outcome, prob in expected.items() if prob > 0), key=lambda c: expected[c])
    rare: list = []
    while cells and (n * expected[cells[0]] < MIN_EXPECTED or (rare and n * sum(expected[c] for c in rare) < MIN_EXPECTED)):
        rare.append(cells.pop(0))
    groups = [[c] for c in cells] + ([rare] if rare else [])
    assert len(groups) >= 2 and n * sum(expected[c] for c in groups[-1]) >= MIN_EXPECTED, "test design: too few samples"
    return groups


def assert_frequencies_match(observed: Counter, expected: dict, n: int, what: str) -> None:
    """Support first, then Pearson's chi-square (rare outcomes pooled) against the exact threshold for ALPHA."""
    impossible = {outcome: count for outcome, count in observed.items() if expected.get(outcome, 0.0) == 0.0}
    assert not impossible, f"{what}: outcomes of probability 0 appeared (outcome: count): {impossible}"
    groups = pooled(expected, n)
    seen = [sum(observed[c] for c in group) for group in groups]
    wanted = [n * sum(expected[c] for c in group) for group in groups]
    statistic = sum((o - e) ** 2 / e for o, e in zip(seen, wanted))
    df = len(groups) - 1
    threshold = chi2_threshold(df)
    if statistic > threshold:
        order = sorted(range(len(groups)), key=lambda i: -abs(seen[i] - wanted[i]) / math.sqrt(wanted[i]))[:4]
        detail = ", ".join(
            f"{groups[i][0] if len(groups[i]) == 1 else 'rare outcomes'}: {seen[i] / n:.3f} (exact {wanted[i] / n:.3f})"
            for i in order
        )
        pytest.fail(
            f"{what}: the frequencies do not follow the exact distribution (chi-square {statistic:.1f} > "
            f"{threshold:.1f}, df={df}, n={n}). Largest deviations: {detail}",
            pytrace=False,
        )


def assert_greedy(target: nn.Module, prompt_ids: list[int], generated: list[int], max_new_tokens: int, eos: int | None, what: str) -> None:
    """Every generated token is the target's argmax after the text before it (uncached), and the length is right."""
    assert generated[: len(prompt_ids)] == prompt_ids, f"{what}: the output does not start with the prompt"
    new = generated[len(prompt_ids) :]
    with torch.inference_mode():
        logits = target(torch.tensor([generated]))[0]
    for i, token in enumerate(new):
        row = logits[len(prompt_ids) + i - 1]
        best = int(row.argmax())
        if token != best:
            gap = (row[best] - row[token]).item()
            assert gap <= TIE_TOLERANCE, (
                f"{what}: generated token {i} is {token}, but the target's greedy choice after the text before it is "
                f"{best} (its logit is larger by {gap:.4f})"
            )
        if token == eos:
            assert i == len(new) - 1, f"{what}: generation went on after the end-of-text token (generated token {i})"
    if not new or new[-1] != eos:
        assert len(new) == max_new_tokens, f"{what}: generated {len(new)} tokens, expected {max_new_tokens}"


# ---------------------------------------------------------------------------------------
# filtered_probs
# ---------------------------------------------------------------------------------------

# Unsorted logits over 8 tokens without ties; softmax ~ [.069 .028 .380 .126 .034 .230 .008 .124].
LOGITS = torch.tensor([0.3, -0.6, 2.0, 0.9, -0.4, 1.5, -1.9, 0.88])


@pytest.fixture(scope="module")
def spec(impl):
    return impl.speculative


@pytest.fixture(scope="module")
def spec_loop(impl):
    return impl.speculative_loop


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
    counted = CountedModel(draft)  # its calls are recorded here, where draft_tokens cannot change the record
    proposals, q, cache = spec.draft_tokens(counted, tokens, cache, gamma, generator=generator, **settings)
    assert proposals.shape == (gamma,) and q.shape == (gamma, V), f"shapes {tuple(proposals.shape)}, {tuple(q.shape)}"
    calls = counted.calls
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


# ---------------------------------------------------------------------------------------
# speculative_round and the loop around it
# ---------------------------------------------------------------------------------------


def generate(spec_loop, target, draft, prompt: str, n: int, tokenizer=None, **settings):
    tokenizer = id_tokenizer(spec_loop) if tokenizer is None else tokenizer
    text, stats = spec_loop.speculative_generate(target, draft, tokenizer, prompt, n, return_stats=True, **settings)
    return IdTokenizer().encode(text), stats


@pytest.mark.exercise("speculative_round")
def test_speculative_round_keeps_only_accepted_positions(spec, impl, seed, device):
    """One round: 1 to gamma + 1 new tokens; one target forward over the last token and every proposal;
    afterwards each cache holds only the tokens kept (checked here, on the caches' data).
    40 rounds from the same start, which include rejections except with probability < 1e-11."""
    KVC = impl.kv_cache.KeyValueCache
    target, draft = toy_pair(spec)
    generator = torch.Generator(device=device).manual_seed(seed)
    tokens = torch.tensor([2, 0, 1])
    target_cache, draft_cache = KVC.new_empty(target.cfg), KVC.new_empty(draft.cfg)
    _, target_cache = target(tokens[None, :2], target_cache)
    lengths = Counter()
    for _ in range(40):
        counted = CountedModel(target)  # its calls are recorded here, where speculative_round cannot change them
        new, t_cache, d_cache = spec.speculative_round(
            counted, draft, tokens, target_cache, draft_cache, 3, 1.0, 0, 1.0, generator
        )
        lengths[len(new)] += 1
        assert 1 <= len(new) <= 4, f"a round with gamma=3 added {len(new)} tokens"
        calls = counted.calls
        assert calls == [(len(tokens) + 3, 2)], f"expected one target forward over 4 new positions, got {calls}"
        kept = torch.cat([tokens, new])
        assert t_cache.shape[3] == len(kept) - 1, f"the target's cache holds {t_cache.shape[3]} positions, expected {len(kept) - 1}"
        assert d_cache.shape[3] <= len(kept) - 1
        assert_cache_holds(t_cache, kept[: len(kept) - 1], "the target's cache")
        assert_cache_holds(d_cache, kept[: d_cache.shape[3]], "the draft's cache")
    # From this context a round adds 1 token with probability .12 and all 4 with at most .51, so 40 rounds
    # without a rejection, or without an accepted proposal, happen with probability below 1e-11.
    assert min(lengths) < 4 and max(lengths) >= 2, f"40 rounds should see rejections and acceptances, got lengths {dict(lengths)}"


TOY_SETTINGS = [
    pytest.param(dict(gamma=1, temperature=1.0), 2, id="gamma1-T1"),
    pytest.param(dict(gamma=2, temperature=0.6, top_k=2), 3, id="gamma2-T0.6-topk2"),
    pytest.param(dict(gamma=4, temperature=1.4, top_p=0.7), 3, id="gamma4-T1.4-topp0.7"),
]


@pytest.mark.exercise("speculative_round")
@pytest.mark.parametrize("settings, length", TOY_SETTINGS)
def test_output_follows_the_target_distribution_exactly(spec_loop, settings, length, seed):
    """The joint distribution of the first ``length`` generated tokens equals the target's, computed by
    enumerating every continuation with uncached forwards. Chi-square: false-failure probability <= 1e-6."""
    target, draft = toy_pair(spec_loop)
    tokenizer = id_tokenizer(spec_loop)
    filters = {k: v for k, v in settings.items() if k != "gamma"}
    expected = exact_joint(ORACLE_TARGET, IdTokenizer().encode(TOY_PROMPT), length, filters)
    n = sample_size(sum(prob > 0 for prob in expected.values()) - 1)
    torch.manual_seed(seed)  # the runs draw from torch's global generator (seed=None)
    n_prompt = len(TOY_PROMPT.split())
    observed: Counter = Counter()
    for _ in range(n):
        ids, _ = generate(spec_loop, target, draft, TOY_PROMPT, length, tokenizer, **settings)
        observed[tuple(ids[n_prompt:])] += 1
    assert_frequencies_match(observed, expected, n, f"speculative_generate({settings})")


@pytest.mark.exercise("speculative_round")
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_temperature_zero_is_the_targets_greedy_text_on_toy_models(spec_loop, gamma):
    """Temperature 0: token for token the target's greedy choice, whatever the draft proposes."""
    target, draft = toy_pair(spec_loop)
    for prompt in ("2 0", "1", "3 3 1"):
        ids, stats = generate(spec_loop, target, draft, prompt, 30, gamma=gamma, temperature=0)
        assert_greedy(ORACLE_TARGET, IdTokenizer().encode(prompt), ids, 30, None, f"gamma={gamma}, prompt {prompt!r}")


@pytest.mark.exercise("speculative_round")
@pytest.mark.parametrize("gamma", [1, 4])
def test_temperature_zero_is_the_targets_greedy_text_on_random_transformers(spec_loop, impl, gamma, seed):
    """Random small DemoTransformers: an unrelated draft, the target's first layer, and the target itself."""
    target = random_demo(impl.transformer, seed)
    drafts = {
        "unrelated draft": random_demo(impl.transformer, seed + 1, n_layers=1, d_model=16, d_head=4),
        "the target's first layer": first_layers(impl.transformer, target, 1),
        "the target itself": target,
    }
    prompt_ids = torch.randint(0, 16, (5,), generator=torch.Generator().manual_seed(seed)).tolist()
    prompt = IdTokenizer().decode(prompt_ids)
    for name, draft in drafts.items():
        ids, stats = generate(spec_loop, target, draft, prompt, 24, gamma=gamma, temperature=0)
        assert_greedy(target, prompt_ids, ids, 24, None, f"{name}, gamma={gamma}")


def _available(name: str):
    """The reference ``name``, or a skip saying why it cannot be loaded here."""
    try:
        return load_reference(name)
    except (ReferenceUnavailable, ValueError) as exc:  # not built or downloaded here, or a name this version lacks
        pytest.skip(f"reference {name!r} is not available here: {exc}")


def _story_pair(transformer):
    target, draft = _available("story"), _available("story-draft")
    return load_demo(target, transformer), load_demo(draft, transformer), target.tokenizer


def _stand_in_pair(transformer):
    tiny = _available("tiny")
    target = load_demo(tiny, transformer)
    return target, first_layers(transformer, target, 1), tiny.tokenizer


# Reference pairs for the greedy test: name -> builder(transformer module) -> (target, draft, tokenizer).
# A pair whose checkpoints cannot be loaded here is skipped with the reason.
REFERENCE_PAIRS = {
    "stand-in, draft = its first layer": _stand_in_pair,
    "story, story-draft": _story_pair,
}
# The shipped tokenizer of each pair, by name: a RecordingTokenizer of it is made where the loop runs.
PAIR_TOKENIZER = {"stand-in, draft = its first layer": "tiny", "story, story-draft": "story"}


@cache
def _reference_pair(name: str, transformer):
    return REFERENCE_PAIRS[name](transformer)


@pytest.mark.exercise("speculative_round")
@pytest.mark.downstream  # the learner's own model: greedy within TIE_TOLERANCE of its own argmax
@pytest.mark.parametrize("pair", REFERENCE_PAIRS)
def test_temperature_zero_is_the_targets_greedy_text_on_reference_pairs(spec_loop, impl, pair):
    """The reference models with their tokenizer: greedy speculative text equals the target's greedy text."""
    target, draft, tokenizer = _reference_pair(pair, impl.transformer)
    recording = made_beside(spec_loop, RecordingTokenizer, PAIR_TOKENIZER[pair])
    for prompt, gamma in (("Once upon a time", 3), ("The cat sat on the", 5)):
        text = spec_loop.speculative_generate(target, draft, recording, prompt, 40, gamma=gamma, temperature=0)
        assert text == tokenizer.decode(recording.decoded)
        prompt_ids = tokenizer.encode(prompt)
        assert_greedy(target, prompt_ids, recording.decoded, 40, tokenizer.eos_token_id, f"{pair}, {prompt!r}")


@pytest.mark.exercise("speculative_round")
@pytest.mark.parametrize("pair", REFERENCE_PAIRS)
def test_speculative_generate_runs_on_part_6_static_caches(spec_loop, impl, pair):
    """cache_class=StaticKeyValueCache: both models keep their keys in part 6's preallocated buffers, which crop
    themselves (crop_cache calls their crop); greedy speculative text is still the target's greedy text."""
    target, draft, tokenizer = _reference_pair(pair, impl.transformer)
    recording = made_beside(spec_loop, RecordingTokenizer, PAIR_TOKENIZER[pair])
    for prompt, gamma in (("Once upon a time", 3), ("The cat sat on the", 5)):
        text = spec_loop.speculative_generate(
            target, draft, recording, prompt, 40, gamma=gamma, temperature=0, cache_class=impl.caches.StaticKeyValueCache
        )
        assert text == tokenizer.decode(recording.decoded)
        assert_greedy(target, tokenizer.encode(prompt), recording.decoded, 40, tokenizer.eos_token_id,
                      f"{pair}, {prompt!r}, static caches")


@pytest.mark.exercise("speculative_round")
@pytest.mark.parametrize("gamma, n", [(1, 10), (3, 17), (4, 20)])
def test_an_identical_draft_has_every_proposal_accepted(spec_loop, gamma, n):
    """Draft == target: every proposal is accepted and each round adds gamma + 1 tokens (the bonus
    included), so the target runs ceil(n / (gamma + 1)) times. At temperatures other than 1 this also
    catches a temperature applied twice to one side."""
    table = random_table(7, scale=1.5)
    for settings in (dict(temperature=1.0), dict(temperature=0.5, top_k=3), dict(temperature=2.0, top_p=0.8)):
        target, draft = made_beside(spec_loop, TrigramModel, table, "target"), made_beside(spec_loop, TrigramModel, table, "draft")
        target = CountedModel(target)  # its calls are recorded here, where the loop cannot change them
        ids, stats = generate(spec_loop, target, draft, "1 2", n, gamma=gamma, seed=gamma, **settings)
        rounds = math.ceil(n / (gamma + 1))
        assert len(ids) == 2 + n
        assert stats.acceptance_rate == 1.0, f"{settings}: acceptance rate {stats.acceptance_rate} with the target as its own draft"
        calls = target.calls
        assert stats.target_forwards == rounds == len(calls), (
            f"{settings}: {n} tokens with gamma={gamma} and nothing rejected take {rounds} target forwards; "
            f"stats say {stats.target_forwards}, the target was called {len(calls)} times"
        )
        assert stats.tokens_per_target_forward == pytest.approx(n / rounds)


@pytest.mark.exercise("speculative_round")
def test_stats_count_the_real_forward_passes(spec_loop, seed):
    """Stats agree with spies: target and draft forwards, proposals, and a rate alpha = accepted / judged;
    after the first, every target forward runs at most gamma + 1 new positions. Alpha is strictly between
    0 and 1 except with probability < 1e-10 (no context of the toy pair accepts 3 proposals in a row with
    probability above .3, or rejects the first with probability above .72)."""
    target, draft = (CountedModel(model) for model in toy_pair(spec_loop, n_ctx=128))  # records kept here
    gamma, n = 3, 80
    ids, stats = generate(spec_loop, target, draft, TOY_PROMPT, n, gamma=gamma, seed=seed)
    target_calls, draft_calls = target.calls, draft.calls
    assert len(ids) == 2 + n and stats.new_tokens == n
    assert stats.target_forwards == len(target_calls) and stats.draft_forwards == len(draft_calls)
    assert all(c is not None for _, c in target_calls + draft_calls), "every forward pass must use a cache"
    assert all(positions - cached <= gamma + 1 for positions, cached in target_calls[1:]), target_calls
    assert sum(stats.accepted_per_round) == stats.accepted <= stats.judged <= stats.proposed
    assert 0 < stats.acceptance_rate < 1 and stats.acceptance_rate == stats.accepted / stats.judged
    assert stats.tokens_per_target_forward == n / stats.target_forwards


@pytest.mark.exercise("speculative_round")
def test_same_seed_same_text_and_eos_ends_it(spec_loop):
    """A seed makes the run reproducible; generation stops right after the end-of-text token."""
    target, draft = toy_pair(spec_loop)
    first = generate(spec_loop, target, draft, TOY_PROMPT, 30, gamma=3, seed=11)[0]
    assert generate(spec_loop, target, draft, TOY_PROMPT, 30, gamma=3, seed=11)[0] == first
    eos = 3
    ending = id_tokenizer(spec_loop, eos)
    for s in range(10):
        ids, stats = generate(spec_loop, target, draft, TOY_PROMPT, 30, gamma=3, seed=s, tokenizer=ending)
        new = ids[2:]
        assert eos not in new[:-1], f"tokens were generated after the end-of-text token: {new}"
        assert new[-1] == eos or len(new) == 30
        assert stats.new_tokens == len(new)


@pytest.mark.exercise("speculative_round")
def test_bad_input_raises_clear_errors(spec, impl, spec_loop):
    """Different vocabularies or tokenizers, gamma < 1, the n_ctx limit, bad settings: ValueError saying what is allowed
    (a cache class without new_empty: TypeError)."""
    target, draft = toy_pair(spec_loop)
    other_vocab = random_demo(impl.transformer, 0, d_vocab=5)
    tok = id_tokenizer(spec_loop)

    def run(*args, **kwargs):
        return spec_loop.speculative_generate(*args, **kwargs)

    with pytest.raises(ValueError, match="vocabular"):
        run(target, other_vocab, tok, "1 2", 5)

    with pytest.raises(ValueError, match="tokenizer"):
        run(target, draft, (made_beside(spec_loop, IdTokenizerWithVocab, {"a": 0}),
                            made_beside(spec_loop, IdTokenizerWithVocab, {"b": 0})), "1 2", 5)
    for gamma in (0, -2, 1.5):
        with pytest.raises(ValueError, match="gamma"):
            run(target, draft, tok, "1 2", 5, gamma=gamma)
    with pytest.raises(ValueError, match="n_ctx"):
        run(target, draft, tok, "1 2", 63)
    with pytest.raises(ValueError, match="max_new_tokens"):
        run(target, draft, tok, "1 2", -1)
    with pytest.raises(ValueError, match="temperature"):
        run(target, draft, tok, "1 2", 5, temperature=-0.5)
    with pytest.raises(ValueError, match="top_p"):
        run(target, draft, tok, "1 2", 5, top_p=0.0)
    with pytest.raises(ValueError, match="prompt"):
        run(target, draft, tok, "", 5)
    with pytest.raises(ValueError, match="seed"):
        run(target, draft, tok, "1 2", 5, seed="7")
    with pytest.raises(TypeError, match="draft"):
        run(target, "not a model", tok, "1 2", 5)
    with pytest.raises(TypeError, match="cache_class"):
        run(target, draft, tok, "1 2", 5, cache_class=dict)
    # The limit is the prompt plus max_new_tokens: 2 + 62 positions fit in n_ctx=64.
    shared = made_beside(spec_loop, IdTokenizerWithVocab, {"a": 0})
    ids, stats = generate(spec_loop, target, draft, "1 2", 62, gamma=8, tokenizer=(shared, shared), seed=0)
    assert len(ids) == 64


# ---------------------------------------------------------------------------------------
# Prompt-lookup drafting
# ---------------------------------------------------------------------------------------


def oracle_prompt_lookup(tokens: list[int], num_tokens: int, max_ngram_size: int) -> list[int]:
    """The definition, transcribed: for n from max_ngram_size down to 1, the most recent earlier occurrence of the
    last n tokens (not the ending itself) with at least one token after it; the up to num_tokens tokens after it."""
    length = len(tokens)
    for n in range(min(max_ngram_size, length - 1), 0, -1):
        ending = tokens[length - n :]
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == ending:
                return tokens[start + n : start + n + num_tokens]
    return []


LOOKUP_CASES = [
    ("a repeated phrase", [1, 2, 3, 4, 9, 1, 2], 3, 2, [3, 4, 9]),
    ("the longest n-gram wins", [5, 2, 7, 6, 2, 8, 5, 2], 2, 2, [7, 6]),
    ("the most recent occurrence", [1, 2, 3, 1, 2, 4, 1, 2], 1, 2, [4]),
    ("an occurrence overlapping the ending", [4, 4, 4, 4], 3, 2, [4]),
    ("falls back to a shorter n-gram", [1, 2, 3, 9, 3], 2, 3, [9, 3]),
    ("cut where the text ends", [1, 2, 3, 1], 5, 2, [2, 3, 1]),
    ("no match", [1, 2, 3, 4], 3, 2, []),
    ("one token", [7], 3, 2, []),
]


@pytest.mark.exercise("prompt_lookup")
@pytest.mark.parametrize("name, tokens, num_tokens, max_ngram_size, expected", LOOKUP_CASES, ids=[c[0] for c in LOOKUP_CASES])
def test_prompt_lookup_on_hand_made_texts(spec, name, tokens, num_tokens, max_ngram_size, expected):
    """Each case's answer (written out, and checked against the transcription of the definition)."""
    assert oracle_prompt_lookup(tokens, num_tokens, max_ngram_size) == expected, "the documented answer disagrees with the definition"
    got = spec.prompt_lookup(torch.tensor(tokens), num_tokens, max_ngram_size)
    assert isinstance(got, torch.Tensor) and got.ndim == 1, f"prompt_lookup must return a 1-D tensor, got {got!r}"
    assert got.tolist() == expected, f"{name}: proposed {got.tolist()}, expected {expected}"


@pytest.mark.exercise("prompt_lookup")
def test_prompt_lookup_on_random_texts(spec, seed):
    """On random texts over 3 and 5 tokens (matches everywhere) of every length up to 25, for several sizes."""
    generator = torch.Generator().manual_seed(seed + 700)
    for vocab in (3, 5):
        for length in range(1, 26):
            tokens = torch.randint(0, vocab, (length,), generator=generator)
            for num_tokens, max_ngram_size in ((1, 1), (4, 2), (3, 3), (6, 4)):
                expected = oracle_prompt_lookup(tokens.tolist(), num_tokens, max_ngram_size)
                got = spec.prompt_lookup(tokens, num_tokens, max_ngram_size).tolist()
                assert got == expected, f"{tokens.tolist()} (num_tokens={num_tokens}, n={max_ngram_size}): {got}, expected {expected}"


def lookup_generate(spec_loop, target, prompt: str, n: int, tokenizer=None, **settings):
    tokenizer = id_tokenizer(spec_loop) if tokenizer is None else tokenizer
    text, stats = spec_loop.speculative_generate(target, None, tokenizer, prompt, n, return_stats=True, **settings)
    return IdTokenizer().encode(text), stats


LOOKUP_PROMPT = "1 2 0 1 2 3 1 2"  # the ending "1 2" occurs twice before: proposals from the first round on
LOOKUP_SETTINGS = [
    pytest.param(dict(prompt_lookup_num_tokens=3, temperature=1.0), 2, id="k3-T1"),
    pytest.param(dict(prompt_lookup_num_tokens=2, max_matching_ngram_size=1, temperature=0.7, top_k=3), 3, id="k2-n1-T0.7-topk3"),
]


@pytest.mark.exercise("prompt_lookup")
@pytest.mark.parametrize("settings, length", LOOKUP_SETTINGS)
def test_prompt_lookup_output_follows_the_target_distribution_exactly(spec_loop, settings, length, seed):
    """With prompt-lookup drafting, the joint distribution of the first ``length`` tokens equals the target's,
    computed by enumeration (chi-square; false-failure probability <= 1e-6), and proposals were judged."""
    target, _ = toy_pair(spec_loop)
    tokenizer = id_tokenizer(spec_loop)
    filters = {k: v for k, v in settings.items() if k in ("temperature", "top_k", "top_p")}
    expected = exact_joint(ORACLE_TARGET, IdTokenizer().encode(LOOKUP_PROMPT), length, filters)
    n = sample_size(sum(prob > 0 for prob in expected.values()) - 1)
    torch.manual_seed(seed)
    n_prompt = len(LOOKUP_PROMPT.split())
    observed: Counter = Counter()
    judged = 0
    for _ in range(n):
        ids, stats = lookup_generate(spec_loop, target, LOOKUP_PROMPT, length, tokenizer, **settings)
        observed[tuple(ids[n_prompt:])] += 1
        judged += stats.judged
    assert judged > 0, "no proposal was judged: the prompt lookup never proposed"
    assert_frequencies_match(observed, expected, n, f"prompt-lookup speculative_generate({settings})")


@pytest.mark.exercise("prompt_lookup")
def test_prompt_lookup_is_the_targets_greedy_text_and_counts_no_draft_forwards(spec, impl, spec_loop):
    """Temperature 0: the target's greedy text, token for token, on toy models and the reference pairs' targets;
    the stats count target forwards only."""
    model, _ = toy_pair(spec_loop)
    for prompt in ("2 0", "1 2 0 1 2", "3 3 1"):
        target = CountedModel(model)  # its calls are recorded here, where the loop cannot change them
        ids, stats = lookup_generate(spec_loop, target, prompt, 30, prompt_lookup_num_tokens=4, temperature=0)
        assert stats.draft_forwards == 0 and stats.target_forwards == len(target.calls) > 0
        assert_greedy(ORACLE_TARGET, IdTokenizer().encode(prompt), ids, 30, None, f"prompt lookup, prompt {prompt!r}")
    for pair in REFERENCE_PAIRS:
        model, _, tokenizer = _reference_pair(pair, impl.transformer)
        recording = made_beside(spec_loop, RecordingTokenizer, PAIR_TOKENIZER[pair])
        text, stats = spec_loop.speculative_generate(model, None, recording, "Once upon a time", 60, temperature=0,
                                                prompt_lookup_num_tokens=5, return_stats=True)
        assert text == tokenizer.decode(recording.decoded)
        assert_greedy(model, tokenizer.encode("Once upon a time"), recording.decoded, 60, tokenizer.eos_token_id, pair)
        assert stats.draft_forwards == 0 and stats.proposed > 0


@pytest.mark.exercise("prompt_lookup")
def test_prompt_lookup_settings_are_checked(spec, spec_loop):
    target, draft = toy_pair(spec_loop)
    tok = id_tokenizer(spec_loop)
    with pytest.raises(ValueError, match="draft=None"):
        spec_loop.speculative_generate(target, draft, tok, "1 2", 4, prompt_lookup_num_tokens=3)
    with pytest.raises(ValueError, match="max_matching_ngram_size"):
        spec_loop.speculative_generate(target, None, tok, "1 2", 4, prompt_lookup_num_tokens=3, max_matching_ngram_size=0)
    with pytest.raises(ValueError, match="num_tokens"):
        spec.prompt_lookup(torch.tensor([1, 2]), 0)
