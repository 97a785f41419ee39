"""Every planted mistake says how to put it right: once a learner's failing code is matched with a
classic mistake, the panel shows that mistake's why and then "Fix: " with its own remedy (the right
call or formula), in place of the exercise's first hint (see grading/diagnosis.describe_match)."""

from __future__ import annotations

import pytest

from sampling_course.grading.catalogue import Mistake, with_fixes
from sampling_course.grading.course import EXERCISES, MISTAKES

# Mistakes allowed without a fix because their why already says the remedy exactly. None today: a
# mistake added here needs the reason, and its why must say what to write instead.
WHY_SAYS_THE_FIX: dict[str, str] = {}


def test_every_mistake_has_a_fix():
    missing = [f"part {m.part}: {m.name}" for m in MISTAKES if not m.fix.strip() and m.name not in WHY_SAYS_THE_FIX]
    assert not missing, "planted mistakes without a fix (parts/<part>/fixes.py): " + "; ".join(missing)
    stale = set(WHY_SAYS_THE_FIX) - {m.name for m in MISTAKES if not m.fix.strip()}
    assert not stale, f"WHY_SAYS_THE_FIX lists mistakes that have a fix or do not exist: {sorted(stale)}"


@pytest.mark.parametrize("mistake", [m for m in MISTAKES if m.fix], ids=lambda m: f"{m.part}-{m.name}")
def test_a_fix_is_one_short_line_of_its_own(mistake: Mistake):
    """One line that adds to the why: not the why again, not an exercise's hint, not a paragraph."""
    fix = mistake.fix.strip()
    assert "\n" not in fix and len(fix) <= 200, fix
    assert fix.rstrip(".") not in mistake.why, "the fix repeats the why"
    assert fix not in {hint for exercise in EXERCISES for hint in exercise.hints}


def test_with_fixes_fills_in_and_refuses_strangers_and_doubles():
    a = Mistake(1, "a", "transformer.py", "x", "y", why="why a")
    b = Mistake(1, "b", "transformer.py", "x", "y", why="why b", fix="already")
    filled = with_fixes([a, b], {"a": "do this"})
    assert [m.fix for m in filled] == ["do this", "already"] and a.fix == ""
    with pytest.raises(ValueError, match="does not plant.*'c'"):
        with_fixes([a, b], {"c": "do that"})
    with pytest.raises(ValueError, match="both.*'b'"):
        with_fixes([a, b], {"b": "do that"})
