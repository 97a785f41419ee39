"""Failures name the mistake: ``grading/diagnosis.py`` recognises each planted mistake.

For every part, each planted mistake is planted into a copy of the solutions (imported
under its own name, as a learner's package would be) and must be named: as itself, alone
or beside a mistake listed in ``SAME_BEHAVIOUR`` whose output is provably the same on every
input (the checker then names both); the solutions and the planted correct variants must be
named as nothing. Every planted mistake of every part must be named; a mistake that cannot
be named would be listed in ``UNNAMEABLE`` with the reason (none is). Code written in other
styles than the solutions' is checked in ``test_diagnosis_styles.py``.
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
from sampling_course.grading.course import EXERCISES, MISTAKES, PARTS, VARIANTS, get_exercise
from sampling_course.grading.diagnosis import coverage, describe_match, explain, name_mistake, name_mistakes
from sampling_course.grading.matching import Distribution, Frequencies, draws_for, exact_distribution, same
from sampling_course.grading.planting import exercises_of, mistakes_of, planted, write_package
from sampling_course.grading.probing import load_probes

# Pairs of mistakes whose output is the same on every input (the same error written two ways):
# the checker names both, the first as the match and the other as behaving the same.
SAME_BEHAVIOUR = [
    # cache.repeat(1, 1, k, ...) gives child i the row i % len(beams), which is what the tiled
    # index torch.arange(len(parents)) % len(self) gives it.
    ("cache rows tiled, not following the beams' parents", "cache copied k times in the tiled order"),
    # Both judge top-k and top-p on the untempered logits and return the tempered ones: top-k
    # keeps the same tokens either way (dividing by a positive temperature keeps their order),
    # top_p_filter(logits * temperature) sees the raw logits again, and min-p runs after the
    # temperature in both.
    ("temperature applied after top-p", "top-p judged on the raw logits"),
]
SAME_OUTPUT = {a: {b} for a, b in SAME_BEHAVIOUR} | {b: {a} for a, b in SAME_BEHAVIOUR}

# Planted mistakes that cannot be named, each with the reason (none today).
UNNAMEABLE: dict[str, str] = {}

COURSE_PARTS = tuple(sorted(PARTS))
PROBED, UNNAMED = coverage(COURSE_PARTS)


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


def test_every_mistake_of_every_part_has_an_exercise_with_a_probe():
    assert not UNNAMED, f"mistakes that cannot be named: {[(m.name, why) for m, why in UNNAMED]}"
    assert {m for m, _ in PROBED} == set(MISTAKES)
    assert COURSE_PARTS == (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)


def test_every_exercise_with_planted_mistakes_has_a_probe():
    probes = load_probes()
    assert [e.name for e in EXERCISES if mistakes_of(e) and e.name not in probes] == []
    assert set(probes) <= {e.name for e in EXERCISES}


def test_mistakes_in_another_exercises_code_name_the_exercise_that_reveals_them():
    # Part 1's Attention, wrong only once a cache supplies earlier keys.
    for name, exercise in [("mask not shifted for cached positions", "cached_forward"),
                           ("new keys and values put before the cached ones", "cached_forward")]:
        assert [e.name for e in exercises_of(_mistake(name))] == [exercise], name


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
    # Part 5's padded-model helpers and left_pad are exercises of their own.
    assert names("positions counted over pads") == ["position_ids_from_mask"]
    assert names("pad keys attended") == ["masked_forward"]
    assert names("right padding") == ["left_pad"]
    assert names("padded rows embedded at their columns (PosEmbed)") == ["padded_forward"]
    assert mistakes_of("TransformerBlock") == []


def test_every_mistake_of_parts_1_to_3_says_why_in_one_sentence():
    for mistake in MISTAKES:
        if mistake.part in (1, 2, 3):
            assert mistake.why, f"{mistake.name} has no `why`"
        sentence = explain(mistake)
        assert sentence.endswith(".") and "\n" not in sentence, sentence
    assert explain(Mistake(1, "a name only", "transformer.py", "x", "y")) == "a name only."


# ---------------------------------------------------------------------------------------
# Planted mistakes are named, correct code is not
# ---------------------------------------------------------------------------------------


def _named_as_itself(mistake: Mistake, named: list[Mistake]) -> bool:
    """Named, and only alongside the mistakes listed as behaving the same."""
    return mistake in named and {m.name for m in named} <= {mistake.name} | SAME_OUTPUT.get(mistake.name, set())


@pytest.mark.planted
@pytest.mark.parametrize("part", COURSE_PARTS, ids=[f"part{p}" for p in COURSE_PARTS])
def test_every_planted_mistake_of_the_part_is_named(part):
    """Each mistake of the part, planted in a package of its own that name_mistakes imports
    afresh by name (as it imports a learner's ``exercises``), is named in every exercise it
    belongs to: every one of the part's mistakes is, unless ``UNNAMEABLE`` says why not."""
    mistakes = [m for m in MISTAKES if m.part == part]
    unnamed = {}
    for mistake in mistakes:
        with planted(mistake) as package:
            verdicts = {e.name: name_mistakes(e, package) for e in exercises_of(mistake)}
        wrong = {e: [n.name for n in named] for e, named in verdicts.items() if not _named_as_itself(mistake, named)}
        if wrong or not verdicts:
            unnamed[mistake.name] = wrong
    expected = {name for name in UNNAMEABLE if any(m.name == name for m in mistakes)}
    assert set(unnamed) == expected, "\n".join(f"{m!r} named {w}" for m, w in unnamed.items() if m not in expected)


@pytest.mark.planted
@pytest.mark.parametrize("part", COURSE_PARTS, ids=[f"part{p}" for p in COURSE_PARTS])
def test_correct_code_of_the_part_is_named_nothing(part):
    """The solutions and every planted correct variant of the part (at least one per probed
    exercise) are named nothing."""
    probed = [e for e in EXERCISES if e.part == part and e.name in load_probes()]
    variants = [v for v in VARIANTS if v.part == part and v.exercise in load_probes()]
    assert {e.name for e in probed} <= {v.exercise for v in variants}
    for exercise in probed:
        assert name_mistake(exercise, "solutions") is None, exercise.name
    for variant in variants:
        with planted(variant) as package:
            assert name_mistake(variant.exercise, package) is None, f"{variant.exercise}: {variant.name}"


def test_mistakes_listed_as_the_same_give_the_same_output():
    for name, others in SAME_OUTPUT.items():
        mistake = _mistake(name)
        for other in map(_mistake, others):
            shared = set(exercises_of(mistake)) & set(exercises_of(other))
            assert shared, (name, other.name)
            for exercise in shared:
                assert same(diagnosis.planted_output(exercise, mistake), diagnosis.planted_output(exercise, other))


def test_a_mistake_planted_on_disk_is_named(learner_package):
    """The same through a package of files on sys.path, for one mistake of each part."""
    for name, exercise in [("MLP with erf gelu", "MLP"), ("top-p sorts ascending", "sample_top_p"),
                           ("terminated beams kept alive", "Beams.filter"),
                           ("positional offset off by one", "cached_forward"), ("right padding", "left_pad"),
                           ("reorder keeps the old batch size", "StaticKeyValueCache.reorder"),
                           ("no bonus token when every proposal is accepted", "accept_or_resample")]:
        assert name_mistake(exercise, learner_package(_mistake(name))) == _mistake(name)


@pytest.mark.slow
def test_unfilled_stubs_are_named_nothing():
    """(The solutions are named nothing, every probed exercise of every part: test_correct_code_of_the_part_is_named_nothing.)"""
    for name in load_probes():
        assert name_mistake(name, "exercises") is None, name  # stubs raise NotImplementedError


def test_a_mistake_in_another_exercise_is_not_blamed_here(learner_package):
    # A wrong LayerNorm makes Attention's probe no different: nothing to say about Attention.
    package = learner_package(_mistake("LayerNorm with unbiased variance"))
    assert name_mistake("Attention", package) is None
    assert name_mistake("LayerNorm", package) == _mistake("LayerNorm with unbiased variance")


@pytest.mark.parametrize("mistake, helper, caller", [
    ("n-gram window of n tokens instead of n - 1", "Beams.get_topk_non_repeating", "Beams.generate"),
    ("n-gram blocking misses the last n-gram", "Beams.get_topk_non_repeating", "Beams.generate"),
    ("top-p cutoff exclusive instead of inclusive", "sample_top_p", "sample_next_token"),
    ("LayerNorm eps outside the sqrt", "LayerNorm", "TransformerBlock"),
])
def test_a_mistake_in_a_helper_is_named_on_the_helper_not_its_caller(learner_package, mistake, helper, caller):
    """The caller's probe runs with the solutions' helper (helpers_of), so the helper's mistake
    is not blamed on the caller (a generate that does pass no_repeat_ngram_size on was once
    told it did not)."""
    assert get_exercise(helper) in diagnosis.helpers_of(get_exercise(caller))
    package = learner_package(_mistake(mistake))
    assert name_mistake(helper, package) == _mistake(mistake)
    assert name_mistake(caller, package) is None


def test_a_named_mistake_comes_with_its_own_fix(learner_package):
    """The sentence says the mistake's why and then its fix, not the exercise's general first hint."""
    mistake = _mistake("n-gram window of n tokens instead of n - 1")
    assert mistake.fix
    sentence = describe_match("Beams.get_topk_non_repeating", learner_package(mistake))
    assert sentence == f"This matches a classic mistake: {explain(mistake)} Fix: {mistake.fix}."


# ---------------------------------------------------------------------------------------
# What the checker shows, and what it never does
# ---------------------------------------------------------------------------------------


def unbiased_forward(self, residual):
    """The "unbiased variance" mistake, written in another style than the planted one."""
    residual = residual - residual.mean(dim=-1, keepdim=True)
    return residual / (residual.var(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


def test_describe_match_is_the_sentence_to_show_first(learner_package):
    UnbiasedLayerNorm = type("UnbiasedLayerNorm", (importlib.import_module("solutions.transformer").LayerNorm,),
                             {"forward": unbiased_forward})
    expected = ("This matches a classic mistake: the unbiased variance (dividing by d_model - 1 instead of "
                "d_model), where GPT-2's LayerNorm divides by d_model. Fix: take the plain mean of the squared "
                "deviations, residual.pow(2).mean(dim=-1), which divides by d_model.")
    assert describe_match("LayerNorm", "solutions", UnbiasedLayerNorm) == expected
    assert describe_match("layernorm", learner_package(_mistake("LayerNorm with unbiased variance"))) == expected
    assert describe_match("LayerNorm", "solutions") is None
    assert describe_match("no such exercise", "solutions") is None  # never raises


def test_mistakes_that_behave_the_same_are_named_together():
    with planted(_mistake("top-p judged on the raw logits")) as package:
        first, twin = _mistake("temperature applied after top-p"), _mistake("top-p judged on the raw logits")
        assert describe_match("warp_logits", package) == (
            f"This matches a classic mistake: {explain(first)} It behaves exactly like another one: {explain(twin)}"
            f" Fix: {first.fix}.")  # the first one's fix: the two are one error written two ways
        assert explain(first).startswith("the temperature is applied after the filters")
        assert name_mistake("warp_logits", package) == _mistake("temperature applied after top-p")


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


def _separation(a, b) -> float:
    """How far apart two planted outputs are: inf when a part that is not drawn differs, else
    the largest gap between two exact distributions minus the gap they were built to have."""
    if isinstance(a, Distribution) and isinstance(b, Distribution):
        size = max(len(a.probs), len(b.probs))
        pa, pb = (d.probs + (0.0,) * (size - len(d.probs)) for d in (a, b))
        return max(abs(x - y) for x, y in zip(pa, pb)) - 2 * a.tolerance
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return max([_separation(x, y) for x, y in zip(a, b)], default=-math.inf)
    return -math.inf if same(a, b) else math.inf


def _has_distribution(out) -> bool:
    return isinstance(out, Distribution) or (isinstance(out, (list, tuple)) and any(map(_has_distribution, out)))


@pytest.mark.slow
def test_random_probes_separate_their_candidates_by_the_stated_gap():
    """For each random exercise, the exact outputs of the solution and of every mistake: every
    two of them differ in a part that is not drawn, or by at least the gap (2 x tolerance) in
    some token of some setting."""
    random = [e for e in load_probes() if _has_distribution(diagnosis.planted_output(e, None))]
    assert {"sample_basic", "sample_top_k", "sample_top_p", "sample_next_token", "batched_sample",
            "accept_or_resample"} <= set(random)
    for name in random:
        exercise = get_exercise(name)
        candidates = {None: diagnosis.planted_output(exercise, None)}
        candidates.update({m.name: diagnosis.planted_output(exercise, m) for m in mistakes_of(exercise)})
        for (a, out_a), (b, out_b) in itertools.combinations(candidates.items(), 2):
            assert _separation(out_a, out_b) >= -1e-9, f"{name}: {a} and {b} are closer than the stated gap"


def test_exact_enumeration_of_a_draw():
    logits = torch.tensor([0.1, 0.6, 0.3]).log()
    sampler = importlib.import_module("solutions.sampling").TransformerSampler
    real = torch.multinomial
    dist = exact_distribution(lambda: sampler.sample_top_k(logits, 2), 3, 0.1)
    assert dist.probs == pytest.approx((0.0, 2 / 3, 1 / 3))
    assert torch.multinomial is real, "torch.multinomial was not put back"


def test_exact_enumeration_of_a_batched_draw():
    """One torch.multinomial call on (rows, K) probabilities: every joint choice, each row's marginal."""
    probs = torch.tensor([[0.2, 0.8, 0.0], [0.0, 0.5, 0.5]])
    real = torch.multinomial
    rows = exact_distribution(lambda: torch.multinomial(probs, 1)[:, 0], 3, 0.1, rows=2)
    assert [d.probs for d in rows] == [pytest.approx((0.2, 0.8, 0.0)), pytest.approx((0.0, 0.5, 0.5))]
    assert torch.multinomial is real, "torch.multinomial was not put back"


def test_batched_frequencies_count_each_row_over_the_bound_for_every_row():
    generator = torch.Generator()
    probs = torch.tensor([[0.2, 0.8, 0.0], [0.0, 0.5, 0.5]])
    rows = diagnosis_frequencies(lambda: torch.multinomial(probs, 1, generator=generator)[:, 0], generator)
    n = draws_for(0.3, 2 * 3)  # the union bound runs over every (row, token)
    assert [r.draws for r in rows] == [n, n] and all(sum(r.counts) == n for r in rows)
    assert all(same(r, d) for r, d in zip(rows, exact_distribution(lambda: torch.multinomial(probs, 1)[:, 0], 3, 0.15, 2)))
    # Seeded: the same counts again.
    assert diagnosis_frequencies(lambda: torch.multinomial(probs, 1, generator=generator)[:, 0], generator) == rows


def diagnosis_frequencies(draw, generator):
    from sampling_course.grading.matching import frequencies

    return frequencies(draw, 3, gap=0.3, seed=7, rows=2, generator=generator)
