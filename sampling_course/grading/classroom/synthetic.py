"""A synthetic class whose true grades are known before grading: for the tests and the bench.

Each student's submission is the solutions with, for every graded exercise, one of: nothing
changed, a planted correct variant of it (another style that its tests must accept), or one
of its planted classic mistakes (which its tests must catch), drawn at random from a seeded
generator. The true grade follows from the draw: an exercise passes exactly when no mistake
was planted in it. ``sampling-course plant-mistakes`` checks both halves of that rule for
each change on its own; the synthetic class checks that the grader reproduces it for every
student, changes combined.

For the rule to hold with changes combined, the graded exercises must not share code in
their tests: ``EXERCISES`` is such a set (each exercise's tests call its own code only, and
only mistakes that belong to exactly one exercise, outside any constructor, are drawn).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from sampling_course.grading.catalogue import Mistake, Variant
from sampling_course.grading.course import MISTAKES, VARIANTS, get_exercise
from sampling_course.grading.planting import exercises_of, mistake_target, planted_sources

__all__ = ["EXERCISES", "Student", "make_class"]

# Independent exercises: none of their tests runs another one's code (see the module docstring).
EXERCISES = ("LayerNorm", "MLP", "greedy_search", "apply_temperature", "apply_frequency_penalty", "top_p_filter",
             "min_p_filter")


@dataclass(frozen=True)
class Student:
    """One synthetic submission: what was planted, and the grade that follows."""

    name: str
    changes: dict[str, str]  # exercise -> "solution", "variant: <name>" or "mistake: <name>"
    passes: dict[str, bool]  # exercise -> whether its tests must pass


def _mistakes_of(exercise: str) -> list[Mistake]:
    return [m for m in MISTAKES if [e.name for e in exercises_of(m)] == [exercise]
            and not (mistake_target(m) or "").endswith("__init__")]


def _variants_of(exercise: str) -> list[Variant]:
    return [v for v in VARIANTS if v.exercise == exercise]


def _draw(rng: random.Random, exercises: tuple[str, ...], p_mistake: float) -> tuple[dict, list]:
    changes: dict[str, str] = {}
    planted: list[Mistake | Variant] = []
    for exercise in exercises:
        roll = rng.random()
        mistakes, variants = _mistakes_of(exercise), _variants_of(exercise)
        if roll < p_mistake and mistakes:
            change = rng.choice(mistakes)
            changes[exercise] = f"mistake: {change.name}"
        elif roll < p_mistake + (1 - p_mistake) / 2 and variants:
            change = rng.choice(variants)
            changes[exercise] = f"variant: {change.name}"
        else:
            changes[exercise] = "solution"
            continue
        planted.append(change)
    return changes, planted


def make_class(out: Path, size: int, seed: int = 0, exercises: tuple[str, ...] = EXERCISES,
               p_mistake: float = 0.4) -> list[Student]:
    """Write ``size`` submissions into ``out/<student>/exercises/`` and the truth into ``out/../truth.json``.

    Returns the students with their true grades. Raises ValueError for an exercise with no
    planted change to draw from.
    """
    for name in exercises:
        get_exercise(name)
        if not _mistakes_of(name) and not _variants_of(name):
            raise ValueError(f"{name} has no planted mistake or variant to build a synthetic class from")
    rng = random.Random(seed)
    out = Path(out)
    students = []
    for index in range(size):
        while True:  # two changes may rewrite the same text: draw again
            changes, planted = _draw(rng, exercises, p_mistake)
            try:
                sources = planted_sources(*planted)
                break
            except ValueError:
                continue
        name = f"student{index:03d}"
        package = out / name / "exercises"
        package.mkdir(parents=True)
        for module, source in sources.items():
            (package / f"{module}.py").write_text(source)
        passes = {e: not changes[e].startswith("mistake") for e in exercises}
        students.append(Student(name, changes, passes))
    (out.parent / f"{out.name}-truth.json").write_text(json.dumps([asdict(s) for s in students], indent=1))
    return students
