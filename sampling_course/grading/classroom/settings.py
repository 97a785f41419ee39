"""What a grading run counts and allows: exercises, points, partial credit, time and memory limits.

The defaults need no file: every exercise of the course is worth one point, all or nothing.
An instructor changes them with a small TOML file (``sampling-course grade --config FILE``):

```toml
[grading]
exercises = ["LayerNorm", "Embed", "sample_top_p"]   # which exercises count (default: all)
points = 1                    # the default points per exercise
seconds_per_test = 60         # time limit for one test (a call into the submission is stopped after it)
seconds_per_exercise = 300    # time limit for one exercise's tests together
seconds_per_submission = 3600 # time limit for a whole submission
memory_mb = 4096              # memory a submission's process may add

[points]
LayerNorm = 2                                  # worth 2, all or nothing
sample_top_p = { points = 3, partial = true }  # worth 3, in proportion to the tests passed
```

With ``partial = true`` an exercise scores ``points * passed / tests run``; otherwise it scores
its points when every test passes and nothing else.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sampling_course.grading.course import EXERCISES, get_exercise

__all__ = ["GradeSettings", "Points", "load_settings"]


@dataclass(frozen=True)
class Points:
    """What one exercise is worth and whether it earns part of it."""

    points: float = 1.0
    partial: bool = False

    def score(self, passed: int, ran: int, done: bool) -> float:
        if self.partial:
            return self.points * passed / ran if ran else 0.0
        return self.points if done else 0.0


@dataclass(frozen=True)
class GradeSettings:
    """Everything ``grade_submission`` needs besides the submission; plain values, so it travels to workers."""

    exercises: tuple[str, ...] = tuple(e.name for e in EXERCISES)
    points: dict[str, Points] = field(default_factory=dict)
    default_points: float = 1.0
    seconds_per_test: float = 60.0
    seconds_per_exercise: float = 300.0
    seconds_per_submission: float = 3600.0
    memory_mb: int = 4096
    diagnose: bool = True  # name the classic mistake behind each failure
    unsafe_no_sandbox: bool = False  # grade without bubblewrap (only from the command line; every report says so)

    def points_of(self, exercise: str) -> Points:
        return self.points.get(exercise, Points(self.default_points))

    @property
    def max_score(self) -> float:
        return sum(self.points_of(name).points for name in self.exercises)

    def with_exercises(self, names: list[str]) -> "GradeSettings":
        return replace(self, exercises=_in_course_order(names))


def _in_course_order(names: list[str]) -> tuple[str, ...]:
    wanted = {get_exercise(name).name for name in names}  # raises a ValueError naming the valid ones
    return tuple(e.name for e in EXERCISES if e.name in wanted)


def _number(value: Any, what: str, low: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low:
        raise ValueError(f"{what} must be a number >= {low:g}, got {value!r}")
    return float(value)


def load_settings(path: Path | None = None, **overrides: Any) -> GradeSettings:
    """The settings from a TOML file (or the defaults), with ``overrides`` applied on top.

    Raises ValueError naming the key that is wrong and what is allowed.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path} is not valid TOML: {exc}") from None
    unknown = set(data) - {"grading", "points"}
    if unknown:
        raise ValueError(f"unknown section(s) {sorted(unknown)} in {path}; allowed: [grading], [points]")
    grading = data.get("grading", {})
    allowed = {"exercises", "points", "seconds_per_test", "seconds_per_exercise", "seconds_per_submission",
               "memory_mb", "diagnose"}
    if set(grading) - allowed:
        raise ValueError(f"unknown key(s) {sorted(set(grading) - allowed)} in [grading]; allowed: {sorted(allowed)}")
    settings = GradeSettings()
    if "exercises" in grading:
        if not isinstance(grading["exercises"], list) or not grading["exercises"]:
            raise ValueError("[grading] exercises must be a non-empty list of exercise names")
        settings = settings.with_exercises(grading["exercises"])
    changes: dict[str, Any] = {}
    if "points" in grading:
        changes["default_points"] = _number(grading["points"], "[grading] points")
    for key in ("seconds_per_test", "seconds_per_exercise", "seconds_per_submission"):
        if key in grading:
            changes[key] = _number(grading[key], f"[grading] {key}", 1.0)
    if "memory_mb" in grading:
        changes["memory_mb"] = int(_number(grading["memory_mb"], "[grading] memory_mb", 256))
    if "diagnose" in grading:
        changes["diagnose"] = bool(grading["diagnose"])
    points: dict[str, Points] = {}
    for name, value in data.get("points", {}).items():
        exercise = get_exercise(name).name
        if isinstance(value, dict):
            if set(value) - {"points", "partial"}:
                raise ValueError(f"[points] {name}: allowed keys are points and partial, got {sorted(value)}")
            points[exercise] = Points(_number(value.get("points", changes.get("default_points", 1.0)),
                                              f"[points] {name}.points"), bool(value.get("partial", False)))
        else:
            points[exercise] = Points(_number(value, f"[points] {name}"))
    settings = replace(settings, points=points, **changes)
    for key, value in overrides.items():
        if value is not None:
            settings = settings.with_exercises(value) if key == "exercises" else replace(settings, **{key: value})
    return settings
