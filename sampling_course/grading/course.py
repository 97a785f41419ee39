"""The course map: every exercise in order, what it asks, and three hints for each.

The names here are the names the tests use in ``@pytest.mark.exercise("<name>")``, so
``check("LayerNorm")``, ``sampling-course check LayerNorm`` and
``pytest --exercise LayerNorm`` all mean the same tests.

Each exercise also records where its code lives (``module`` and ``target``, relative to
the ``solutions``/``exercises`` package), which is what ``check(name, obj=...)``
replaces with an object defined in a notebook.

Hints are graded: the first nudges, the second names the technique and the classic
trap, the third is close to the solution.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from sampling_course.grading.catalogue import Exercise, Mistake, Variant
from sampling_course.grading.parts import (
    part1_transformer,
    part2_sampling,
    part3_beams,
    part4_kv_cache,
    part5_generation,
    part6_caches,
    part7_speculative,
    part8_structured,
    part9_modern,
    part10_serving,
    part11_quantisation,
)

__all__ = [
    "EXERCISES", "MISTAKES", "PARTS", "PART_MODULES", "SECTIONS", "VARIANTS", "Exercise", "UnknownExerciseError", "exercise_names",
    "get_exercise",
]

# The parts in course order; each module lists its exercises, hints and planted mistakes.
PART_MODULES = (part1_transformer, part2_sampling, part3_beams, part4_kv_cache, part5_generation, part6_caches,
                part7_speculative, part8_structured, part9_modern, part10_serving, part11_quantisation)

PARTS: dict[int, str] = {module.PART: module.TITLE for module in PART_MODULES}
# The parts as the notebooks number them ("6b" is part 6's second notebook), with their titles.
SECTIONS: dict[str, str] = {str(module.PART): module.TITLE for module in PART_MODULES}
SECTIONS.update({label: title for module in PART_MODULES for label, title in getattr(module, "SECTIONS", {}).items()})

EXERCISES: tuple[Exercise, ...] = tuple(exercise for module in PART_MODULES for exercise in module.EXERCISES)

# The planted classic mistakes and correct variants, in course order (see grading/planting.py).
MISTAKES: tuple[Mistake, ...] = tuple(mistake for module in PART_MODULES for mistake in module.MISTAKES)
VARIANTS: tuple[Variant, ...] = tuple(variant for module in PART_MODULES for variant in module.VARIANTS)

_BY_NAME: dict[str, Exercise] = {exercise.name.lower(): exercise for exercise in EXERCISES}


class UnknownExerciseError(ValueError):
    """No exercise of the course has that name."""


def exercise_names() -> list[str]:
    """Every exercise name, in course order."""
    return [exercise.name for exercise in EXERCISES]


def get_exercise(name: str | Exercise) -> Exercise:
    """The exercise called ``name`` (case-insensitive), e.g. ``get_exercise("layernorm")``.

    Raises ``UnknownExerciseError`` (a ValueError) listing the valid names, closest first.
    """
    if isinstance(name, Exercise):
        return name
    if not isinstance(name, str):
        raise TypeError(f"an exercise name must be a string, got {type(name).__name__}")
    try:
        return _BY_NAME[name.strip().lower()]
    except KeyError:
        pass
    close = difflib.get_close_matches(name.strip().lower(), list(_BY_NAME), n=3, cutoff=0.5)
    suggestion = f" Did you mean {' or '.join(repr(_BY_NAME[c].name) for c in close)}?" if close else ""
    by_part = "; ".join(
        f"part {label} ({title}): " + ", ".join(e.name for e in EXERCISES if e.part_label == label)
        for label, title in SECTIONS.items()
    )
    modules = {e.module for e in EXERCISES}
    given = name.strip().lower()
    root = Path(__file__).resolve().parents[2]  # the checkout, or the student release (no solutions/ there)
    if given not in modules and any((root / folder / f"{given}.py").is_file() for folder in ("solutions", "exercises")):
        # A file of the course whose code is all given (part 5b's batched beam search, part 10's engine).
        suggestion = (f" exercises/{given}.py is given code with nothing to fill in: it runs on the exercises of "
                      f"the other files, which its tests check through them.{suggestion}")
    raise UnknownExerciseError(f"there is no exercise called {name!r}.{suggestion} Valid names: {by_part}")
