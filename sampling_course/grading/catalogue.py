"""The records the course map is made of: an ``Exercise`` and a planted ``Mistake``.

Each part of the course lists its own in ``sampling_course/grading/parts/``;
``grading.course`` and ``grading.mistakes`` gather them in course order.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Exercise:
    """One exercise of the course.

    ``module`` is the file in ``solutions/``/``exercises/`` that holds the code and
    ``target`` the attribute path inside it (``"LayerNorm"``,
    ``"TransformerSampler.sample_top_p"``) that ``check(name, obj=...)`` replaces.
    """

    name: str
    part: int
    module: str
    target: str
    task: str
    hints: tuple[str, str, str]

    @property
    def part_title(self) -> str:
        from sampling_course.grading.course import PARTS

        return PARTS[self.part]

    @property
    def location(self) -> str:
        """Where a learner fills it in, e.g. ``exercises/transformer.py: LayerNorm``."""
        return f"exercises/{self.module}.py: {self.target}"

    def hint(self, level: int) -> str:
        """Hint ``level`` (1 = gentle ... 3 = nearly the solution)."""
        if not 1 <= level <= len(self.hints):
            raise ValueError(f"{self.name} has hints 1 to {len(self.hints)}, not {level!r}")
        return self.hints[level - 1]


def exercise(name: str, part: int, module: str, target: str, task: str, *hints: str) -> Exercise:
    if len(hints) != 3:
        raise ValueError(f"{name}: expected 3 hints, got {len(hints)}")
    return Exercise(name, part, module, target, task, tuple(hints))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Mistake:
    """A classic mistake, planted by replacing ``old`` (found exactly once in ``solutions/<file>``) with ``new``."""

    part: int
    name: str
    file: str  # a file in solutions/
    old: str  # text that must occur exactly once in that file
    new: str
    tests: str  # the test file expected to catch it
