"""Failures name the mistake: ``grading/diagnosis.py`` recognises each planted mistake.

Every planted mistake whose exercise has a probe is planted into a copy of the solutions
(imported under its own name, as a learner's package would be) and must be named as
itself; the solutions and correct alternatives must be named as nothing. The random
exercises are also checked with another style of drawing than the solutions', which
takes the statistical path (false-match probability at most 1e-6 per setting, see the
module's docstring).
"""

from __future__ import annotations

import importlib
import itertools
import math
import os
import sys
import time

import pytest
import torch

from sampling_course.grading import diagnosis
from sampling_course.grading.catalogue import Mistake
from sampling_course.grading.course import MISTAKES, get_exercise
from sampling_course.grading.diagnosis import coverage, describe_match, explain, name_mistake
from sampling_course.grading.matching import Distribution, Frequencies, draws_for, exact_distribution, same
from sampling_course.grading.planting import exercises_of, mistakes_of, planted, write_package
from sampling_course.grading.probing import load_probes

# Mistakes whose probe output is identical to another's (the same error written two ways):
# either may be named.
SAME_OUTPUT = {
    "cache copied k times in the tiled order": {"cache rows tiled, not following the beams' parents"},
}

PROBED, UNNAMED = coverage((1, 2, 3, 4))


def _mistake(name: str) -> Mistake:
    return next(m for m in MISTAKES if m.name == name)


@pytest.fixture(scope="module")
def learner_package(tmp_path_factory):
    """``make(*mistakes)``: a copy of the solutions with the mistakes planted, importable by its name."""
    root = tmp_path_factory.mktemp("learners")
    sys.path.insert(0, str(root))
    counter = itertools.count()
    prefix = f"learner_{os.getpid()}_"

    def make(*changes: Mistake) -> str:
        name = f"{prefix}{next(counter)}"
        write_package(root, *changes, name=name)
        importlib.invalidate_caches()
        return name

    yield make
    sys.path.remove(str(root))
    for key in [k for k in sys.modules if k.startswith(prefix)]:
        del sys.modules[key]


# ---------------------------------------------------------------------------------------
# Which mistakes belong to which exercise, and which can be named
# ---------------------------------------------------------------------------------------


def test_every_mistake_of_parts_1_to_3_has_an_exercise_with_a_probe():
    probed, unnamed = coverage((1, 2, 3))
    assert not unnamed, f"mistakes that cannot be named: {[(m.name, why) for m, why in unnamed]}"
    assert {m for m, _ in probed} == {m for m in MISTAKES if m.part in (1, 2, 3)}


def test_part_4_leaves_out_only_the_mistakes_outside_its_exercises():
    # Both rewrite Attention, which is a part-1 exercise: no part-4 exercise holds that code.
    assert sorted(m.name for m, _ in UNNAMED) == [
        "mask not shifted for cached positions", "new keys and values put before the cached ones",
    ]


def test_mistakes_map_to_the_exercise_whose_code_they_rewrite():
    names = lambda mistake: sorted(e.name for e in exercises_of(_mistake(mistake)))  # noqa: E731
    assert names("LayerNorm with unbiased variance") == ["LayerNorm"]
    # The mask is its own exercise and part of Attention's code: both name it.
    assert names("causal mask hides the diagonal") == ["Attention", "apply_causal_mask"]
    assert names("frequency penalty applied before the temperature") == ["sample_next_token"]
    assert names("sums not accumulated over steps") == ["Beams.generate"]
    assert names("beam_search drops finished beams") == ["beam_search"]
    # Same code, other part: the part decides.
    assert names("sample drops the cache the model returns") == ["cached_sample"]
    assert names("cache rows tiled, not following the beams' parents") == ["cached_beam_search"]
    assert _mistake("positional offset forgotten") in mistakes_of("cached_forward")
    assert mistakes_of("TransformerBlock") == []


def test_every_mistake_of_parts_1_to_3_says_why_in_one_sentence():
    for mistake in MISTAKES:
        if mistake.part in (1, 2, 3):
            assert mistake.why, f"{mistake.name} has no `why`"
        sentence = explain(mistake)
        assert sentence.endswith(".") and "\n" not in sentence, sentence
    assert explain(Mistake(1, "a name only", "transformer.py", "x", "y", "t.py")) == "a name only."


# ---------------------------------------------------------------------------------------
# Planted mistakes are named, correct code is not
# ---------------------------------------------------------------------------------------


def test_every_probed_mistake_is_named_when_planted():
    """Each (mistake, exercise) pair of parts 1-4, planted in a package of its own that
    name_mistake imports afresh by name, as it imports a learner's ``exercises``."""
    wrong = []
    for mistake, exercise in PROBED:
        with planted(mistake) as package:
            named = name_mistake(exercise, package)
        if named != mistake and (named is None or named.name not in SAME_OUTPUT.get(mistake.name, ())):
            wrong.append(f"{exercise.name}: {mistake.name!r} named {named.name if named else None!r}")
    assert not wrong, "\n".join(wrong)
    assert len(PROBED) == 71


def test_a_mistake_planted_on_disk_is_named(learner_package):
    """The same through a package of files on sys.path, for one mistake of each part."""
    for name, exercise in [("MLP with erf gelu", "MLP"), ("top-p sorts ascending", "sample_top_p"),
                           ("terminated beams kept alive", "Beams.filter"),
                           ("positional offset off by one", "cached_forward")]:
        assert name_mistake(exercise, learner_package(_mistake(name))) == _mistake(name)


def test_the_solutions_and_unfilled_stubs_are_named_nothing():
    for name in load_probes():
        assert name_mistake(name, "solutions") is None, name
        assert name_mistake(name, "exercises") is None, name  # stubs raise NotImplementedError


def test_a_mistake_in_another_exercise_is_not_blamed_here(learner_package):
    # A wrong LayerNorm makes Attention's probe no different: nothing to say about Attention.
    package = learner_package(_mistake("LayerNorm with unbiased variance"))
    assert name_mistake("Attention", package) is None
    assert name_mistake("LayerNorm", package) == _mistake("LayerNorm with unbiased variance")


class FunctionalLayerNorm(torch.nn.Module):
    """A correct LayerNorm in another style: torch's own layer_norm."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.w = torch.nn.Parameter(torch.ones(cfg.d_model))
        self.b = torch.nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, residual):
        return torch.nn.functional.layer_norm(residual, (self.cfg.d_model,), self.w, self.b, self.cfg.layer_norm_eps)


class UnbiasedLayerNorm(FunctionalLayerNorm):
    def forward(self, residual):
        residual = residual - residual.mean(dim=-1, keepdim=True)
        return residual / (residual.var(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


def mask_with_tril(self, attn_scores):
    """A correct causal mask in another style: tril and -inf."""
    q, k = attn_scores.shape[-2:]
    visible = torch.ones(q, k, dtype=torch.bool).tril()
    return attn_scores.masked_fill(~visible, float("-inf"))


def sample_basic_categorical(logits):
    return torch.distributions.Categorical(logits=logits).sample().item()


def sample_basic_uniform_categorical(logits):
    """The "draws uniformly" mistake, drawn in another style than the planted one."""
    return torch.distributions.Categorical(logits=torch.zeros_like(logits)).sample().item()


def sample_top_p_searchsorted(logits, top_p, min_tokens_to_keep=1):
    """A correct top-p in another style: searchsorted on the cumulative probabilities, inverse-CDF draw."""
    probs, order = logits.softmax(-1).sort(descending=True)
    n_kept = max(int(torch.searchsorted(probs.cumsum(-1), torch.tensor(top_p))) + 1, min_tokens_to_keep)
    kept = probs[:n_kept] / probs[:n_kept].sum()
    return int(order[min(int(torch.searchsorted(kept.cumsum(-1), torch.rand(()))), n_kept - 1)])


def sample_top_p_exclusive_inverse_cdf(logits, top_p, min_tokens_to_keep=1):
    """The "exclusive cutoff" mistake, with an inverse-CDF draw instead of torch.multinomial."""
    probs, order = logits.softmax(-1).sort(descending=True)
    n_kept = max(int((probs.cumsum(-1) < top_p).sum()), min_tokens_to_keep)
    kept = probs[:n_kept] / probs[:n_kept].sum()
    return int(order[min(int(torch.searchsorted(kept.cumsum(-1), torch.rand(()))), n_kept - 1)])


@pytest.mark.parametrize("exercise, obj", [
    ("LayerNorm", FunctionalLayerNorm),
    ("apply_causal_mask", mask_with_tril),
    ("Attention", None),
    ("sample_basic", sample_basic_categorical),
    ("sample_top_p", sample_top_p_searchsorted),
], ids=["layer_norm", "tril-mask", "attention", "categorical", "searchsorted-top-p"])
def test_correct_alternatives_are_named_nothing(exercise, obj):
    if exercise == "Attention":  # the tril mask inside the solutions' Attention
        obj = type("TrilAttention", (importlib.import_module("solutions.transformer").Attention,),
                   {"apply_causal_mask": mask_with_tril})
    assert name_mistake(exercise, "solutions", obj) is None


def test_mistakes_drawn_in_another_style_are_named_statistically():
    assert name_mistake("sample_basic", "solutions", sample_basic_uniform_categorical) == _mistake(
        "sample_basic draws uniformly")
    assert name_mistake("sample_top_p", "solutions", sample_top_p_exclusive_inverse_cdf) == _mistake(
        "top-p cutoff exclusive instead of inclusive")


# ---------------------------------------------------------------------------------------
# What the checker shows, and what it never does
# ---------------------------------------------------------------------------------------


def test_describe_match_is_the_sentence_to_show_first(learner_package):
    expected = ("This matches a classic mistake: the unbiased variance (dividing by d_model - 1 instead of "
                "d_model), where GPT-2's LayerNorm divides by d_model.")
    assert describe_match("LayerNorm", "solutions", UnbiasedLayerNorm) == expected
    assert describe_match("layernorm", learner_package(_mistake("LayerNorm with unbiased variance"))) == expected
    assert describe_match("LayerNorm", "solutions") is None
    assert describe_match("no such exercise", "solutions") is None  # never raises


def test_a_probe_that_raises_names_nothing():
    def stub(logits):
        raise NotImplementedError()

    assert name_mistake("greedy_search", "solutions", stub) is None
    assert name_mistake("greedy_search", "solutions", lambda logits: logits) is None  # not one token
    assert name_mistake("greedy_search", "no_such_package_anywhere") is None


@pytest.mark.skipif(sys.gettrace() is not None, reason="a debugger or coverage owns the trace hook")
def test_code_that_never_returns_is_stopped(monkeypatch):
    monkeypatch.setattr(diagnosis, "TIME_LIMIT_S", 0.3)

    def forever(logits):
        while True:
            pass

    start = time.monotonic()
    assert name_mistake("greedy_search", "solutions", forever) is None
    assert time.monotonic() - start < 5


def test_the_callers_random_state_and_modules_are_left_alone():
    before_modules = set(sys.modules)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    name_mistake("sample_top_k", "solutions")
    name_mistake("sample_top_k", "solutions", lambda logits, k: int(logits.argmax()))
    assert torch.equal(torch.rand(3), expected)
    assert not [m for m in set(sys.modules) - before_modules if m.startswith("_planted_solutions")]


# ---------------------------------------------------------------------------------------
# The statistics of the random exercises
# ---------------------------------------------------------------------------------------


def test_draws_for_meets_the_stated_bound():
    for gap, k in [(0.35, 4), (0.4, 6), (0.2, 50)]:
        n = draws_for(gap, k)
        assert 2 * k * math.exp(-n * gap**2 / 2) <= 1e-6 < 2 * k * math.exp(-(n - 2) * gap**2 / 2)


def test_frequencies_match_a_distribution_within_the_tolerance():
    dist = Distribution((0.5, 0.5), 0.2)
    assert same(Frequencies((60, 40), 100, 0.2), dist) and same(dist, Frequencies((31, 69), 100, 0.2))
    assert not same(Frequencies((80, 20), 100, 0.2), dist)
    assert not same(Frequencies((40, 30, 30), 100, 0.2), dist)  # a token the distribution never draws


def test_random_probes_separate_their_candidates_by_the_stated_gap():
    """For each random exercise, the exact distributions of the solution and of every mistake:
    every two of them differ by at least the gap (2 x tolerance) in some token of some setting."""
    for name in ("sample_basic", "sample_top_k", "sample_top_p", "sample_next_token"):
        exercise = get_exercise(name)
        candidates = {None: diagnosis.planted_output(exercise, None)}
        candidates.update({m.name: diagnosis.planted_output(exercise, m) for m in mistakes_of(exercise)})
        settings = lambda out: out if isinstance(out, list) else [out]  # noqa: E731
        for (a, out_a), (b, out_b) in itertools.combinations(candidates.items(), 2):
            gaps = []
            for x, y in zip(settings(out_a), settings(out_b)):
                size = max(len(x.probs), len(y.probs))
                px, py = (d.probs + (0.0,) * (size - len(d.probs)) for d in (x, y))
                gaps.append(max(abs(p - q) for p, q in zip(px, py)) - 2 * x.tolerance)
            assert max(gaps) >= -1e-9, f"{name}: {a} and {b} are closer than the stated gap"


def test_exact_enumeration_of_a_draw():
    logits = torch.tensor([0.1, 0.6, 0.3]).log()
    sampler = importlib.import_module("solutions.sampling").TransformerSampler
    real = torch.multinomial
    dist = exact_distribution(lambda: sampler.sample_top_k(logits, 2), 3, 0.1)
    assert dist.probs == pytest.approx((0.0, 2 / 3, 1 / 3))
    assert torch.multinomial is real, "torch.multinomial was not put back"
