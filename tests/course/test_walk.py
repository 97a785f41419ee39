"""The course walked in order (``grading/walk.py``): a learner who has solved every exercise up to
one, and none after it, passes that one's check, and the next one's check names its own stub.

Each step is one planted package (``walk_sources``), graded by the planter's workers
(``mistakes.walk_course``): the exercise's tests must all pass (a failure or a stub there means
the check needs a later exercise), and the next exercise's first test must stop at a stub whose
panel says to fill in that exercise, in its file.
"""

from __future__ import annotations

import os

import pytest

from sampling_course.grading import mistakes
from sampling_course.grading.course import EXERCISES, get_exercise
from sampling_course.grading.planting import solution_sources
from sampling_course.grading.render import render_result
from sampling_course.grading.results import TestOutcome, summarize
from sampling_course.grading.stubs import make_stub_source
from sampling_course.grading.walk import Step, regions, walk_sources

# Exercises that own no region of their own: their code is a region of an earlier exercise
# (cached_beam_search extends Beams.generate; constrained_generate extends generate), so
# they have no stub to meet.
NO_OWN_REGION = {"cached_beam_search", "constrained_generate"}


# Found by the walk and still open, each with what its check needs from a later exercise. The walk
# fails on any other problem, and on one of these once it is gone (so the list only shrinks).
KNOWN_OPEN: dict[str, str] = {}


def test_every_region_has_an_owner_and_every_exercise_one_region():
    owned = {r.owner.name for module in solution_sources() for r in regions(module) if r.owner is not None}
    assert all(r.owner is not None for module in solution_sources() for r in regions(module))
    assert {e.name for e in EXERCISES} - owned == NO_OWN_REGION


def test_the_walk_starts_at_the_exercises_and_ends_at_the_solutions():
    sources = solution_sources()
    assert walk_sources(-1) == {m: make_stub_source(s, f"solutions/{m}.py") for m, s in sources.items()}
    assert walk_sources(len(EXERCISES) - 1) == sources
    # The padded branch of step_after is padded_forward's (part 5), its plain branch cached_forward's (part 4);
    # the line of Attention.forward that hides what the cache hides is masked_forward's (part 5), not Attention's.
    after_part_4 = walk_sources(next(i for i, e in enumerate(EXERCISES) if e.name == "cached_beam_search"))
    assert "torch.arange(past, tokens.shape[1]" in after_part_4["kv_cache"]
    assert "position_ids_from_mask(attention_mask)[:, past:]" not in after_part_4["kv_cache"]
    assert "k, v = cache.update(k, v)" in after_part_4["transformer"]
    assert "~cache.mask" not in after_part_4["transformer"]
    assert after_part_4["sampling"] == sources["sampling"]


def panel_text(exercise, stubs) -> str:
    """The panel a learner sees for ``exercise`` when its tests stopped at ``stubs``, as one line."""
    from rich.console import Console

    result = summarize(exercise, [TestOutcome("t", (exercise.name,), "not implemented", f"{s}: not implemented yet", s)
                                  for s in stubs])
    console = Console(record=True, width=400)
    console.print(render_result(result))
    return " ".join(console.export_text().split())


def own_stub_message(exercise, stubs) -> str | None:
    """What is wrong with the panel for ``exercise`` stopped at ``stubs`` (its own); None when it is right."""
    text = panel_text(exercise, stubs)
    if f"Fill it in ({exercise.location})" not in text:
        return f"{exercise.name}'s own stub ({', '.join(stubs)}) reads: {text[:300]}"
    return None


def test_a_stub_is_named_with_the_exercise_whose_target_holds_it_most_closely():
    """cached_forward's stub is in DemoTransformer (part 1) too, and cached_sample's in part 2's sample: each
    is the learner's own; generate stopped at padded_forward's stub sends the learner there."""
    for name, stub in [("padded_forward", "step_after"), ("cached_sample", "TransformerSampler.sample"),
                       ("masked_forward", "Attention.forward"), ("cached_forward", "DemoTransformer.forward")]:
        assert own_stub_message(get_exercise(name), [stub]) is None
    text = panel_text(get_exercise("generate"), ["step_after"])
    assert "calls padded_forward (exercises/kv_cache.py: step_after)" in text, text


@pytest.mark.walk
def test_the_course_walked_in_order():
    steps = [Step(i) for i in range(-1, len(EXERCISES))]
    verdicts = mistakes.walk_course(steps, jobs=os.cpu_count() or 1)
    problems = []
    for step, verdict in zip(steps, verdicts):
        if step.graded is not None and not verdict.ok:
            problems.append(f"{step.graded.name} with every later exercise a stub: {verdict.detail}")
        if step.next is not None and step.next.name not in NO_OWN_REGION:
            if not verdict.stubs:
                problems.append(f"{step.next.name} unwritten ran into no stub: {verdict.detail}")
            else:
                wrong = own_stub_message(step.next, verdict.stubs)
                if wrong:
                    problems.append(wrong)
    found = {problem.split(" ", 1)[0].removesuffix("'s") for problem in problems}
    unknown = [p for p in problems if p.split(" ", 1)[0].removesuffix("'s") not in KNOWN_OPEN]
    assert not unknown, "\n".join(unknown)
    fixed = set(KNOWN_OPEN) - found
    assert not fixed, f"walked in order now: {sorted(fixed)}; take them out of KNOWN_OPEN"
