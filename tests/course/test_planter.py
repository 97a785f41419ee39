"""The planter (``grading/mistakes.py``): a planted change runs only its exercise's tests, in a
worker that judges change after change, and a run that disturbs what runs share is noticed.

The in-process judgements use part 2's ``greedy_search``, whose tests take about a second.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from sampling_course.grading import mistakes
from sampling_course.grading.catalogue import Mistake, Variant
from sampling_course.grading.course import MISTAKES

GREEDY_MISTAKE = next(m for m in MISTAKES if m.name == "greedy takes the least likely token")
# Planting the solution's own text changes nothing: a correct "variant" every test must accept.
GREEDY_AS_IS = Variant(2, "greedy_search", "the solution itself", GREEDY_MISTAKE.file, GREEDY_MISTAKE.old,
                       GREEDY_MISTAKE.old)


def test_changes_reach_the_worker_intact():
    for change in (GREEDY_MISTAKE, GREEDY_AS_IS, dataclasses.replace(GREEDY_MISTAKE, exercise="sample_basic")):
        assert mistakes._from_json(mistakes._to_json(change)) == change


def test_a_mistake_runs_its_exercises_tests_and_stops_at_the_first_failure():
    assert mistakes._selection(GREEDY_MISTAKE) == ["--exercise", "greedy_search", "-x"]
    # The two part-4 attention mistakes rewrite part 1's Attention but name the cached forward.
    shifted = next(m for m in MISTAKES if m.name == "mask not shifted for cached positions")
    assert mistakes._selection(shifted) == ["--exercise", "cached_forward", "-x"]
    # A variant must pass every test of its exercise.
    assert mistakes._selection(GREEDY_AS_IS) == ["--exercise", "greedy_search"]


def test_a_mistake_in_no_exercises_code_is_not_caught_and_says_why():
    """Through a real worker process (which, with no test to run, never imports torch)."""
    nowhere = Mistake(1, "given code", "transformer.py", "def check_tokens(", "def check_tokens(")
    [verdict] = mistakes.plant_mistakes([nowhere])
    assert not verdict.ok
    assert verdict.detail == "its code (check_tokens) belongs to no part-1 exercise"


@pytest.fixture
def planted_home(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.planted
def test_the_tests_catch_a_mistake_and_accept_the_solution(planted_home):
    caught = mistakes.judge(GREEDY_MISTAKE, planted_home, "planted_greedy_mistake")
    assert caught.ok and "test_part2_sampling.py::" in caught.detail and not caught.disturbed
    accepted = mistakes.judge(GREEDY_AS_IS, planted_home, "planted_greedy_as_is")
    assert accepted.ok and accepted.detail.endswith(" passed"), accepted
    assert not list(planted_home.iterdir()), "the planted copies are removed"


@pytest.mark.planted
def test_a_run_that_changes_the_shared_state_is_not_trusted(planted_home):
    # Planted code that turns gradients off for the whole process when it runs.
    rude = Variant(2, "greedy_search", "turns gradients off", "sampling.py", GREEDY_MISTAKE.old,
                   "torch.set_grad_enabled(False)\n        " + GREEDY_MISTAKE.old)
    try:
        verdict = mistakes.judge(rude, planted_home, "planted_rude")
    finally:
        torch.set_grad_enabled(True)
    assert verdict.disturbed


def test_model_variants_also_run_the_later_parts_downstream_tests():
    """A correct variant of part 1 or 4 is the model the later parts run on: the planter also runs the
    later parts' tests marked `downstream` on it (and only the later parts'). Other changes do not."""
    files = [path.rsplit("/", 1)[-1] for path in mistakes.downstream_files(1)]
    assert "test_part3_beams.py" in files and "test_part2_sampling.py" in files
    assert not any(name.startswith("test_part1_") for name in files)
    parts = [int(re.match(r"test_part(\d+)", p.rsplit("/", 1)[-1]).group(1)) for p in mistakes.downstream_files(4)]
    assert parts and all(part > 4 for part in parts)
    assert mistakes.downstream_files(GREEDY_AS_IS.part) == [] and mistakes.downstream_files(3) == []


def test_model_variants_are_grouped_one_per_exercise_and_every_one_is_in_a_group():
    """The later parts' downstream tests run once per group of part 1's (or 4's) variants: each group
    holds at most one variant of an exercise, can be planted whole, and every such variant is in
    exactly one group; variants of other parts are in none."""
    from sampling_course.grading.course import VARIANTS
    from sampling_course.grading.planting import planted_sources

    groups = mistakes.downstream_groups(VARIANTS)
    grouped = [variant for group in groups for variant in group.variants]
    assert sorted(map(repr, grouped)) == sorted(repr(v) for v in VARIANTS if v.part in mistakes.DOWNSTREAM_OF)
    for group in groups:
        exercises = [v.exercise for v in group.variants]
        assert len(set(exercises)) == len(exercises) and {v.part for v in group.variants} == {group.part}
        planted_sources(*group.variants)  # raises when one member's text is gone
        assert mistakes._from_json(mistakes._to_json(group)) == group
    for part in mistakes.DOWNSTREAM_OF:
        most = max(sum(v.exercise == e for v in VARIANTS) for e in {v.exercise for v in VARIANTS if v.part == part})
        assert sum(g.part == part for g in groups) == most, "as few groups as the exercise with most variants needs"


@pytest.mark.planted
def test_a_group_runs_the_later_parts_downstream_tests_and_a_wrong_model_fails_them(planted_home):
    """A group of correct variants passes the later parts' downstream tests; the same group with a
    model that is wrong (a classic part-1 mistake planted as if it were a variant) does not."""
    from sampling_course.grading.course import VARIANTS

    correct = next(g for g in mistakes.downstream_groups(VARIANTS) if g.part == 1)
    accepted = mistakes.judge(correct, planted_home, "planted_group")
    assert accepted.ok and accepted.detail.endswith(" passed"), accepted
    wrong = next(m for m in MISTAKES if m.name == "MLP with relu")
    members = tuple(v for v in correct.variants if v.exercise != "MLP")
    rejected = mistakes.judge(mistakes.Downstream(1, (*members, Variant(1, "MLP", wrong.name, wrong.file, wrong.old,
                                                                        wrong.new))), planted_home, "planted_wrong")
    assert not rejected.ok and "test_part" in rejected.detail, rejected
    assert not list(planted_home.iterdir()), "the planted copies are removed"
