"""The records the course map is made of: an ``Exercise``, a planted ``Mistake`` and a planted ``Variant``.

Each part of the course lists its own in ``sampling_course/grading/parts/``;
``grading.course`` and ``grading.mistakes`` gather them in course order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


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
    # The notebook's label when a part has more than one (part 6's GPU exercises are "6b"); None: str(part).
    section: str | None = None
    # Marked optional in its notebook: a section a learner may skip.
    optional: bool = False

    @property
    def part_label(self) -> str:
        """The part as the notebooks number it: "3", or "6b" for notebook 06b's exercises."""
        return self.section or str(self.part)

    @property
    def location(self) -> str:
        """Where a learner fills it in, e.g. ``exercises/transformer.py: LayerNorm``."""
        return f"exercises/{self.module}.py: {self.target}"

    def hint(self, level: int) -> str:
        """Hint ``level`` (1 = gentle ... 3 = nearly the solution)."""
        if not 1 <= level <= len(self.hints):
            raise ValueError(f"{self.name} has hints 1 to {len(self.hints)}, not {level!r}")
        return self.hints[level - 1]


def exercise(name: str, part: int, module: str, target: str, task: str, *hints: str, section: str | None = None,
             optional: bool = False) -> Exercise:
    if len(hints) != 3:
        raise ValueError(f"{name}: expected 3 hints, got {len(hints)}")
    return Exercise(name, part, module, target, task, tuple(hints), section, optional)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Mistake:
    """A classic mistake, planted by replacing ``old`` (found exactly once in ``solutions/<file>``) with ``new``.

    The tests that must catch it are those marked with its exercise, which
    ``grading.planting.exercises_of`` finds from the code the change rewrites; ``exercise``
    names it instead, for a mistake in code that another exercise's tests reveal (part 1's
    Attention, wrong only once a part-4 cache supplies earlier keys).
    """

    part: int
    name: str
    file: str  # a file in solutions/
    old: str  # text that must occur exactly once in that file
    new: str
    # What the mistake is, in plain words, read after "This matches a classic mistake: "
    # when a learner's failing code behaves like it (see grading/diagnosis.py).
    why: str = ""
    exercise: str | None = None  # as in @pytest.mark.exercise(...); None: the exercise whose code it rewrites
    # How to put it right, shown after "Fix: " with the why: the right call or formula, in one sentence.
    # Most are kept in the part's fixes.py (keyed by name) and filled in by with_fixes.
    fix: str = ""


def with_fixes(mistakes: list[Mistake], fixes: dict[str, str]) -> list[Mistake]:
    """``mistakes`` with each one's ``fix`` taken from ``fixes``, keyed by the mistake's name.

    A part keeps its fixes apart from its mistakes (``parts/<part>/fixes.py``), so a fix that
    names no mistake of the part, or a mistake given a fix twice, is refused.
    """
    names = {mistake.name for mistake in mistakes}
    unknown = sorted(set(fixes) - names)
    if unknown:
        raise ValueError(f"fixes for mistakes this part does not plant: {unknown}")
    twice = sorted(m.name for m in mistakes if m.fix and m.name in fixes)
    if twice:
        raise ValueError(f"mistakes given a fix both in their record and in the fixes: {twice}")
    return [replace(m, fix=fixes[m.name]) if m.name in fixes else m for m in mistakes]


@dataclass(frozen=True)
class Variant:
    """A correct implementation in another style than the solution's, which every test must accept.

    Planted like a ``Mistake`` (``old``, found exactly once in ``solutions/<file>``, becomes
    ``new``); then the tests of ``exercise`` must all pass. A variant that a test rejects
    is a bug in the test.
    """

    part: int
    exercise: str  # the exercise whose tests must pass, as in @pytest.mark.exercise(...)
    name: str
    file: str
    old: str
    new: str
