"""A failing check that names a classic mistake shows that mistake's own sentence (what is wrong, and how to
fix it) instead of the exercise's first hint; without a named mistake the first hint is shown."""

from __future__ import annotations

import io

from rich.console import Console

from sampling_course.grading.course import MISTAKES, get_exercise
from sampling_course.grading.diagnosis import explain
from sampling_course.grading.render import render_result
from sampling_course.grading.results import FAILING, Result


def shown(result: Result) -> str:
    out = io.StringIO()
    Console(file=out, width=400, color_system=None).print(render_result(result))
    return out.getvalue()


def test_a_named_mistake_shows_its_own_fix_not_the_first_hint():
    exercise = get_exercise("generate")
    mistake = next(m for m in MISTAKES if m.name == "a generate that keeps sampling finished rows")
    sentence = f"This matches a classic mistake: {explain(mistake)}"
    named = Result(exercise, FAILING, total=3, failed=1, passed=2, hint=exercise.hint(1), mistake=sentence)
    text = shown(named)
    assert "next_tokens.masked_fill(finished, pad_token_id)" in text
    assert exercise.hint(1)[:40] not in text
    plain = Result(exercise, FAILING, total=3, failed=1, passed=2, hint=exercise.hint(1))
    assert exercise.hint(1)[:40] in shown(plain)
