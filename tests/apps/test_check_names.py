"""Two exercises whose code has the same name: ``check`` says which one it grades, and the other's name is
written in the file a learner fills in."""

from __future__ import annotations

from pathlib import Path

from sampling_course.apps.course_commands import same_name_elsewhere
from sampling_course.grading.course import get_exercise

EXERCISES_DIR = Path(__file__).resolve().parents[2] / "exercises"


def test_check_sample_says_it_grades_part_2_and_names_part_5s():
    note = same_name_elsewhere("sample")
    assert note.startswith("note: sample is part 2's TransformerSampler.sample")
    assert "exercises/batched_sampling.py" in note and "batched_sample" in note
    assert same_name_elsewhere("batched_sample") is None


def test_names_that_differ_from_the_code_are_in_the_exercise_file():
    """``batched_sample`` and ``constrained_generate`` are spelled out in the stubs they grade."""
    for name in ("batched_sample", "constrained_generate"):
        exercise = get_exercise(name)
        text = (EXERCISES_DIR / f"{exercise.module}.py").read_text()
        assert f'check("{name}")' in text, f"{name} is not written in exercises/{exercise.module}.py"
