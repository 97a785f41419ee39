"""Part 7's toy models, oracles and statistical bounds, shared by its test files.

``test_part7_speculative.py`` says how the tests judge. The statistical tests compare Pearson's
chi-square statistic with ``chi2.isf(ALPHA / TAIL_SAFETY, df)`` (``quantiles.chi2_isf``), each
sample the smallest that catches a distribution ``DETECT_DISTANCE`` away with probability ``POWER``.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from functools import cache

import pytest
import torch
from torch import nn

from sampling_course.beside import made_beside
from sampling_course.config import Config
from sampling_course.implementation import load_demo
from sampling_course.reference import ReferenceUnavailable, load_reference

from doubles import IdTokenizer, TrigramModel
from quantiles import chi2_isf, chi2_sample_size

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
    return chi2_sample_size(chi2_threshold(df), df, DETECT_DISTANCE, POWER)


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
# Reference pairs (target, draft and tokenizer) for the greedy tests
# ---------------------------------------------------------------------------------------


def available_reference(name: str):
    """The reference ``name``, or a skip saying why it cannot be loaded here."""
    try:
        return load_reference(name)
    except (ReferenceUnavailable, ValueError) as exc:  # not built or downloaded here, or a name this version lacks
        pytest.skip(f"reference {name!r} is not available here: {exc}")


def story_pair(transformer):
    target, draft = available_reference("story"), available_reference("story-draft")
    return load_demo(target, transformer), load_demo(draft, transformer), target.tokenizer


def stand_in_pair(transformer):
    tiny = available_reference("tiny")
    target = load_demo(tiny, transformer)
    return target, first_layers(transformer, target, 1), tiny.tokenizer


# Reference pairs for the greedy test: name -> builder(transformer module) -> (target, draft, tokenizer).
# A pair whose checkpoints cannot be loaded here is skipped with the reason.
REFERENCE_PAIRS = {
    "stand-in, draft = its first layer": stand_in_pair,
    "story, story-draft": story_pair,
}
# The shipped tokenizer of each pair, by name: a RecordingTokenizer of it is made where the loop runs.
PAIR_TOKENIZER = {"stand-in, draft = its first layer": "tiny", "story, story-draft": "story"}


@cache
def reference_pair(name: str, transformer):
    return REFERENCE_PAIRS[name](transformer)
