"""Part 8, the distortion of mask-and-renormalise: ``exact_laws`` and ``kl_divergence``, against hand-computed
toys, and ``enumerate_language`` + ``exact_laws`` on the stand-in model against a brute-force computation of both
laws on Hugging Face's logits."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from part8_oracles import byte_prefixes, oracle_vocabulary
from sampling_course.implementation import load_demo


@pytest.fixture(scope="module")
def st(impl):
    """The distortion's module."""
    return impl.distortion


@pytest.fixture(scope="module")
def tiny_model(tiny, impl):
    return load_demo(tiny, impl.transformer)


@pytest.mark.exercise("kl_divergence")
def test_kl_divergence_of_a_hand_computed_toy(st):
    """p = (1/2, 1/4, 1/4), q = (1/4, 1/4, 1/2): KL(p || q) = 1/2 ln 2 + 0 + 1/4 ln(1/2) = ln(2) / 4;
    KL(q || p) = 1/4 ln(1/2) + 1/2 ln 2 = ln(2) / 4 as well; a term with p = 0 adds nothing;
    q = 0 where p > 0 gives infinity."""
    p = {"a": 0.5, "b": 0.25, "c": 0.25}
    q = {"a": 0.25, "b": 0.25, "c": 0.5}
    assert st.kl_divergence(p, q) == pytest.approx(math.log(2) / 4, rel=1e-12)
    assert st.kl_divergence(q, p) == pytest.approx(math.log(2) / 4, rel=1e-12)
    skewed = {"a": 0.9, "b": 0.1, "c": 0.0}
    # 0.9 ln(0.9 / 0.25) + 0.1 ln(0.1 / 0.25), the c term is 0
    assert st.kl_divergence(skewed, q) == pytest.approx(0.9 * math.log(3.6) + 0.1 * math.log(0.4), rel=1e-12)
    assert st.kl_divergence(q, skewed) == math.inf
    assert st.kl_divergence(p, p) == pytest.approx(0.0, abs=1e-12)


def toy_path(st, tokens, text, logprobs, masses):
    return st.LanguagePath(tuple(tokens), text, tuple(math.log(x) for x in logprobs), tuple(math.log(x) for x in masses))


@pytest.mark.exercise("exact_laws")
def test_exact_laws_of_a_hand_computed_toy(st):
    """Three paths, two of them spelling "ab" (tokens a+b, and ab):

    * a, b:  model 0.2 * 0.5 = 0.1,  masked (0.2 / 0.4) * (0.5 / 0.5) = 0.5
    * ab:    model 0.1,              masked 0.1 / 0.4 = 0.25
    * c:     model 0.1,              masked 0.1 / 0.4 = 0.25

    So p("ab" | L) = 0.2 / 0.3 = 2/3, p("c" | L) = 1/3; q("ab") = 0.75, q("c") = 0.25."""
    paths = [
        toy_path(st, [0, 1], "ab", [0.2, 0.5], [0.4, 0.5]),
        toy_path(st, [2], "ab", [0.1], [0.4]),
        toy_path(st, [3], "c", [0.1], [0.4]),
    ]
    p, q = st.exact_laws(paths)
    assert set(p) == set(q) == {"ab", "c"}
    assert p["ab"] == pytest.approx(2 / 3, rel=1e-9) and p["c"] == pytest.approx(1 / 3, rel=1e-9)
    assert q["ab"] == pytest.approx(0.75, rel=1e-9) and q["c"] == pytest.approx(0.25, rel=1e-9)


@pytest.mark.exercise("exact_laws")
def test_exact_laws_keep_tiny_probabilities(st):
    """Paths of probability 1e-300 and below (long texts under a model that dislikes them) still give the right
    conditional: work in log space."""
    paths = [
        st.LanguagePath((0,), "x", (-800.0,), (-1.0,)),
        st.LanguagePath((1,), "y", (-800.0 + math.log(3),), (-1.0,)),
    ]
    p, q = st.exact_laws(paths)
    assert p["x"] == pytest.approx(0.25, rel=1e-9) and p["y"] == pytest.approx(0.75, rel=1e-9)


def brute_force_laws(reference, prompt_ids, vocabulary, members) -> tuple[dict[str, float], dict[str, float]]:
    """Oracle: both laws by enumerating every token sequence that spells a member (prefix-free language), on
    Hugging Face's logits."""
    hf_model = reference.hf_model
    prefixes, full = byte_prefixes(members)
    p: dict[str, float] = Counter()
    q: dict[str, float] = Counter()
    frontier = [((), b"", 1.0, 1.0)]
    while frontier:
        ids = torch.tensor([prompt_ids + list(t) for t, *_ in frontier])
        with torch.no_grad():
            probs = hf_model(ids).logits[:, -1].double().softmax(-1)
        next_frontier = []
        for (tokens, text, pp, qq), row in zip(frontier, probs):
            allowed = [i for i, t in enumerate(vocabulary) if t is not None and text + t in prefixes]
            mass = row[allowed].sum().item()
            for token in allowed:
                child = (tokens + (token,), text + vocabulary[token], pp * row[token].item(), qq * row[token].item() / mass)
                if child[1] in full:
                    p[child[1].decode()] += child[2]
                    q[child[1].decode()] += child[3]
                else:
                    next_frontier.append(child)
        frontier = next_frontier
    total = sum(p.values())
    return {x: v / total for x, v in p.items()}, dict(q)


@pytest.mark.exercise("exact_laws")
def test_enumerated_laws_equal_a_brute_force_computation(st, impl, tiny, tiny_model, oracle):
    """enumerate_language + exact_laws on the stand-in model equal both laws computed here by brute force over
    every tokenization of every member (Hugging Face's logits), to 1e-4 relative; so does
    the KL between them."""
    members = [f" {a} {b}." for a in ("cat", "dog", "the door") for b in ("sat", "ran", "is é")]
    pattern = r" (cat|dog|the door) (sat|ran|is é)\."
    prompt = "Once upon a time"
    tokenizer = tiny.tokenizer
    constraint = impl.token_constraint.regex_constraint(pattern, tokenizer)
    language = st.enumerate_language(tiny_model, tokenizer, prompt, constraint, skip_below=1e-30)
    assert language.skipped_q_mass == 0.0
    p, q = st.exact_laws(language.paths)
    p_true, q_true = oracle(brute_force_laws, tiny, tokenizer.encode(prompt), oracle_vocabulary(tokenizer), members)
    assert set(p) == set(p_true) == set(members)
    for x in members:
        assert p[x] == pytest.approx(p_true[x], rel=1e-4), f"p({x!r} | L)"
        assert q[x] == pytest.approx(q_true[x], rel=1e-4), f"q({x!r})"
    # The KL of the two laws, computed here (kl_divergence is the next exercise, graded on its own).
    kl, kl_true = (sum(a[x] * math.log(a[x] / b[x]) for x in members) for a, b in ((p, q), (p_true, q_true)))
    assert kl == pytest.approx(kl_true, rel=1e-3, abs=1e-9)
