"""Part 8, constrained generation: ``TokenConstraint`` and ``generate(..., constraint=...)``, against a hand-written
index, Python's ``re`` and Hugging Face's model and warpers.

How the tests judge:

* ``TokenConstraint`` is checked on a hand-written index (independent of ``build_index``).
* ``generate(..., constraint=...)``: every completed text of fuzzed expressions and seeds
  matches (``re.fullmatch``), under several temperatures and filters; greedy decoding takes
  the argmax of the allowed tokens; the constraint ends rows by itself. The law of the
  sampled token sequences is compared with the exact law of mask-and-renormalise computed
  here by enumeration on the reference model's logits (Hugging Face's model, penalty and
  warpers, applied after the mask): support first, then Pearson's chi-square against
  ``scipy.stats.chi2.isf(ALPHA / TAIL_SAFETY, df)``, so that a correct implementation fails
  with probability at most ``ALPHA`` = 1e-6 per test (the safety factor covers the
  approximation's error in the far tail, as in part 7). The sample size is the smallest
  that catches a law at chi-square distance ``DETECT_DISTANCE`` with probability ``POWER``
  (noncentral chi-square).

Seeded tests take their seed from ``SAMPLING_COURSE_TEST_SEED`` (default 0); any seed must pass.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import pytest
import torch

from quantiles import chi2_isf, chi2_sample_size
from part8_oracles import allowed_by_oracle, byte_prefixes, completed_texts, oracle_vocabulary
from sampling_course.implementation import load_demo

ALPHA = 1e-6  # the false-failure probability of each statistical test below
TAIL_SAFETY = 10  # Pearson's statistic has a heavier far tail than chi-square at these sizes (see part 7)
POWER = 0.999
DETECT_DISTANCE = 0.1
MIN_EXPECTED = 20.0


@pytest.fixture(scope="module")
def st(impl):
    """The constraint's module."""
    return impl.token_constraint


@pytest.fixture(scope="module")
def gen(impl):
    return impl.generate


@pytest.fixture(scope="module")
def tiny_model(tiny, impl):
    return load_demo(tiny, impl.transformer)


# ---------------------------------------------------------------------------------------
# TokenConstraint, on a hand-written index
# ---------------------------------------------------------------------------------------

# Tokens a, b, c, EOS. State 0: a -> 1, c -> 1. State 1: b -> 0, EOS -> DONE. So the language is ((a|c)b)*(a|c).
HAND_VOCAB = [b"a", b"b", b"c", None]


def hand_constraint(st, impl):
    index = impl.token_index.TokenIndex([{0: 1, 2: 1}, {1: 0, 3: -1}], eos_token_id=3)
    return st.TokenConstraint(index, HAND_VOCAB, d_vocab=5)


@pytest.mark.exercise("TokenConstraint")
def test_mask_sets_exactly_the_forbidden_tokens_to_minus_infinity(st, impl, seed):
    """Each row: -inf (or -1e10 and below) where its state forbids a token, its own logit elsewhere; DONE allows only EOS."""
    constraint = hand_constraint(st, impl)
    logits = torch.randn(5, 5, generator=torch.Generator().manual_seed(seed))
    states = torch.tensor([0, 1, -1, 1, 0])
    got = constraint.mask_logits(logits.clone(), states)
    allowed = {0: [0, 2], 1: [1, 3], -1: [3]}
    for row, state in enumerate(states.tolist()):
        for token in range(5):
            if token in allowed[state]:
                assert got[row, token] == logits[row, token], f"row {row} (state {state}): allowed token {token} changed"
            else:  # -inf, or a number so negative that softmax gives it exactly 0 (a -1e10 mask)
                assert got[row, token] <= -1e9, f"row {row} (state {state}): token {token} must be -inf, got {got[row, token]}"
    with pytest.raises(ValueError, match="d_vocab"):
        constraint.mask_logits(torch.zeros(2, 4), torch.tensor([0, 1]))


@pytest.mark.exercise("TokenConstraint")
def test_advance_follows_the_index_and_finished_rows_stay_done(st, impl):
    """Each row moves along its token; EOS leads to DONE (the row is finished); a DONE row stays DONE
    whatever it reads; a token the state forbids is a ValueError."""
    constraint = hand_constraint(st, impl)
    states = constraint.start(4)
    assert states.tolist() == [0, 0, 0, 0]
    states = constraint.advance(states, torch.tensor([0, 2, 0, 2]))
    assert states.tolist() == [1, 1, 1, 1]
    states = constraint.advance(states, torch.tensor([1, 3, 3, 1]))
    assert states.tolist() == [0, -1, -1, 0], f"after b, EOS, EOS, b: expected states [0, -1, -1, 0], got {states.tolist()}"
    assert constraint.finished(states).tolist() == [False, True, True, False]
    states = constraint.advance(states, torch.tensor([0, 3, 4, 2]))  # finished rows read pads (3 or 4)
    assert states.tolist() == [1, -1, -1, 1], f"finished rows must stay DONE, got {states.tolist()}"
    with pytest.raises(ValueError, match="token"):
        constraint.advance(torch.tensor([0]), torch.tensor([1]))



# ---------------------------------------------------------------------------------------
# generate(..., constraint=...)
# ---------------------------------------------------------------------------------------

PROMPTS = ["Once upon a time", "The", "She looked at the door and"]
FUZZ_PATTERNS = [
    r" (cat|dog|the big door)\.",
    r"[a-z]{1,6}( [a-z]{1,4})?",
    r" [0-9]{1,3}(\.[0-9])?",
    r"( |é|caf)+é{0,2}!",
    r'\{"name": "[a-zé]{0,5}", "n": -?[1-9]\}',
]
FUZZ_SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=1.5, top_k=5),
    dict(temperature=0.8, top_p=0.7, repetition_penalty=1.3),
    dict(temperature=2.0, min_p=0.05, presence_penalty=0.5),
]



@pytest.mark.exercise("constrained_generate")
@pytest.mark.parametrize("pattern", FUZZ_PATTERNS)
def test_every_generated_text_matches(st, gen, tiny, tiny_model, pattern, seed):
    """Fuzzed: several temperatures, filters and penalties, two seeds each; every row ends with EOS and
    its text matches the pattern as a whole; after EOS a row holds only pads."""
    tokenizer = tiny.tokenizer
    constraint = st.regex_constraint(pattern, tokenizer)
    eos = tokenizer.eos_token_id
    for i, settings in enumerate(FUZZ_SETTINGS):
        out = gen.generate(tiny_model, tokenizer, PROMPTS, 40, constraint=constraint, seed=seed * 100 + i, **settings)
        width = max(len(tokenizer.encode(p)) for p in PROMPTS)
        for r, (tokens, text) in enumerate(completed_texts(constraint, out, width, eos)):
            assert re.fullmatch(pattern, text), f"{settings}, row {r}: generated {text!r}, which does not match {pattern!r}"
            after = out[r, width + len(tokens) :].tolist()
            assert all(t == eos for t in after), f"{settings}, row {r}: tokens after EOS must be pads, got {after}"


def hf_last_logits(reference, ids: list[int]) -> torch.Tensor:
    """Oracle: Hugging Face's logits for the token after ``ids``."""
    return reference.hf_model(torch.tensor([ids])).logits[0, -1]


@pytest.mark.exercise("constrained_generate")
@pytest.mark.downstream  # the learner's own model against Hugging Face's logits, ties within 1e-4
def test_greedy_takes_the_best_allowed_token(st, gen, tiny, tiny_model, oracle):
    """Temperature 0: every token is the argmax of the model's logits over the allowed tokens (oracle:
    Hugging Face's logits and the allowed sets of a brute-force walk over the members)."""
    tokenizer, eos = tiny.tokenizer, tiny.tokenizer.eos_token_id
    members = [f" {a} {b}." for a in ("cat", "dog", "door", "the") for b in ("is", "was", "sat")]
    pattern = r" (cat|dog|door|the) (is|was|sat)\."
    prefixes, full = byte_prefixes(members)
    vocabulary = oracle_vocabulary(tokenizer)
    constraint = st.regex_constraint(pattern, tokenizer)
    for prompt in PROMPTS:
        out = gen.generate(tiny_model, tokenizer, [prompt], 20, constraint=constraint, temperature=0.0)
        ids = tokenizer.encode(prompt)
        new = out[0, len(ids) :].tolist()
        text = b""
        for i, token in enumerate(new):
            allowed = sorted(allowed_by_oracle(vocabulary, eos, text, prefixes, full))
            logits = oracle(hf_last_logits, tiny, ids + new[:i])
            best = allowed[int(logits[allowed].argmax())]
            assert token == best or abs(logits[token] - logits[best]) < 1e-4, (
                f"prompt {prompt!r}, step {i}: generated {vocabulary[token]!r}, the best allowed token is {vocabulary[best]!r}"
            )
            if token == eos:
                break
            text += vocabulary[token]
        assert text.decode() in members


@pytest.mark.exercise("constrained_generate")
def test_the_constraint_ends_rows_without_the_eos_criterion(st, gen, tiny, tiny_model, seed):
    """With generate's own end-of-text stopping switched off (eos_token_id=-1), a row still ends when its
    constraint reads EOS: its later tokens are pads (id 0 here), and the batch stops when all rows are done."""
    tokenizer, eos = tiny.tokenizer, tiny.tokenizer.eos_token_id
    pattern = r"[a-c]{1,3}"
    constraint = st.regex_constraint(pattern, tokenizer)
    out = gen.generate(tiny_model, tokenizer, PROMPTS, 30, constraint=constraint, eos_token_id=-1, seed=seed)
    width = max(len(tokenizer.encode(p)) for p in PROMPTS)
    assert out.shape[1] - width <= 4, f"every row is done after at most 4 tokens, yet the batch ran {out.shape[1] - width} steps"
    for r, row in enumerate(out[:, width:].tolist()):
        assert eos in row, f"row {r} never read EOS: {row}"
        end = row.index(eos)
        text = b"".join(constraint.vocabulary[t] for t in row[:end]).decode()
        assert re.fullmatch(pattern, text), f"row {r}: {text!r}"
        assert all(t == 0 for t in row[end + 1 :]), f"row {r}: after EOS, expected pads (0), got {row[end + 1:]}"


def chi2_threshold(df: int) -> float:
    return chi2_isf(ALPHA / TAIL_SAFETY, df)


def sample_size(df: int) -> int:
    """The smallest n that catches a distribution DETECT_DISTANCE away with probability POWER."""
    return chi2_sample_size(chi2_threshold(df), df, DETECT_DISTANCE, POWER)


def assert_frequencies_match(observed: Counter, expected: dict, n: int, what: str) -> None:
    """Support first, then Pearson's chi-square (outcomes expected fewer than MIN_EXPECTED times pooled)."""
    impossible = {o: c for o, c in observed.items() if expected.get(o, 0.0) == 0.0}
    assert not impossible, f"{what}: token sequences of probability 0 were generated: {list(impossible)[:3]}"
    cells = sorted((o for o, p in expected.items() if p > 0), key=lambda o: expected[o])
    rare: list = []
    while cells and (n * expected[cells[0]] < MIN_EXPECTED or (rare and n * sum(expected[c] for c in rare) < MIN_EXPECTED)):
        rare.append(cells.pop(0))
    groups = [[c] for c in cells] + ([rare] if rare else [])
    assert len(groups) >= 2, "test design: too few cells"
    seen = [sum(observed[c] for c in g) for g in groups]
    wanted = [n * sum(expected[c] for c in g) for g in groups]
    statistic = sum((o - e) ** 2 / e for o, e in zip(seen, wanted))
    threshold = chi2_threshold(len(groups) - 1)
    if statistic > threshold:
        worst = max(range(len(groups)), key=lambda i: abs(seen[i] - wanted[i]) / math.sqrt(wanted[i]))
        pytest.fail(
            f"{what}: the generated sequences do not follow the exact law of mask-and-renormalise (chi-square "
            f"{statistic:.1f} > {threshold:.1f}, df={len(groups) - 1}, n={n}); e.g. {groups[worst][0] if len(groups[worst]) == 1 else 'rare ones'}: "
            f"{seen[worst] / n:.4f}, exact {wanted[worst] / n:.4f}",
            pytrace=False,
        )


def exact_masked_law(reference, prompt_ids, vocabulary, eos, members, settings) -> dict[tuple[int, ...], float]:
    """Oracle: the probability of every token sequence (EOS included) that masked sampling can produce, by
    enumeration: Hugging Face's logits, its repetition penalty, the mask of allowed tokens, then its warpers."""
    from transformers import (LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                              TopKLogitsWarper, TopPLogitsWarper)

    hf_model = reference.hf_model
    prefixes, full = byte_prefixes(members)
    processors = LogitsProcessorList()
    if settings.get("repetition_penalty", 1.0) != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(settings["repetition_penalty"]))
    warpers = LogitsProcessorList([TemperatureLogitsWarper(settings.get("temperature", 1.0))])
    if settings.get("top_k"):
        warpers.append(TopKLogitsWarper(settings["top_k"]))
    if settings.get("top_p", 1.0) < 1.0:
        warpers.append(TopPLogitsWarper(settings["top_p"]))
    law: dict[tuple[int, ...], float] = {}
    frontier = [((), b"", 1.0)]
    while frontier:
        ids = torch.tensor([prompt_ids + list(tokens) for tokens, _, _ in frontier])
        with torch.no_grad():
            all_logits = hf_model(ids).logits[:, -1].double()
        next_frontier = []
        for (tokens, text, prob), logits, row_ids in zip(frontier, all_logits, ids):
            logits = processors(row_ids[None], logits[None].float()).double()[0]
            allowed = sorted(allowed_by_oracle(vocabulary, eos, text, prefixes, full))
            masked = torch.full_like(logits, float("-inf"))
            masked[allowed] = logits[allowed]
            probs = warpers(row_ids[None], masked[None])[0].softmax(-1)
            for token in allowed:
                if probs[token] == 0:
                    continue
                if token == eos:
                    law[tokens + (eos,)] = prob * probs[token].item()
                else:
                    next_frontier.append((tokens + (token,), text + vocabulary[token], prob * probs[token].item()))
        frontier = next_frontier
    return law


LAW_SETTINGS = [
    pytest.param(dict(temperature=1.0), id="T1"),
    pytest.param(dict(temperature=0.7, top_k=2), id="T0.7-topk2"),
    pytest.param(dict(temperature=1.3, top_p=0.8, repetition_penalty=1.5), id="T1.3-topp0.8-rep1.5"),
]


@pytest.mark.exercise("constrained_generate")
@pytest.mark.parametrize("settings", LAW_SETTINGS)
def test_sampled_sequences_follow_the_exact_masked_law(st, gen, tiny, tiny_model, oracle, settings, seed):
    """The law of the generated token sequences equals mask-and-renormalise's, computed exactly by enumeration
    (mask before temperature and filters). Chi-square: false-failure probability <= 1e-6."""
    tokenizer, eos = tiny.tokenizer, tiny.tokenizer.eos_token_id
    members = [f" {a} {b}" for a in ("cat", "dog", "the") for b in ("sat", "ran")] + [" cat"]
    pattern = r" (cat|dog|the) (sat|ran)| cat"
    prompt = "Once upon a time"
    prompt_ids = tokenizer.encode(prompt)
    expected = oracle(exact_masked_law, tiny, prompt_ids, oracle_vocabulary(tokenizer), eos, members, settings)
    n = sample_size(sum(p > 0 for p in expected.values()) - 1)
    constraint = st.regex_constraint(pattern, tokenizer)
    out = gen.generate(tiny_model, tokenizer, [prompt] * n, 12, constraint=constraint, seed=seed, **settings)
    observed = Counter()
    for row in out[:, len(prompt_ids) :].tolist():
        assert eos in row, f"a row did not finish: {row}"
        observed[tuple(row[: row.index(eos) + 1])] += 1
    assert_frequencies_match(observed, expected, n, f"generate(constraint, {settings})")


@pytest.mark.exercise("constrained_generate")
def test_generate_rejects_something_that_is_not_a_constraint(gen, tiny, tiny_model):
    with pytest.raises(TypeError, match="constraint"):
        gen.generate(tiny_model, tiny.tokenizer, ["The"], 3, constraint="[a-z]+")

