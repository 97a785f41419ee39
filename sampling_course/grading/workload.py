"""A part's workload, from measured facts only: ``workload("5b")`` shows, for each exercise of the part in
course order, the lines of code the course's own solution writes in it, its hints, whether the notebook
marks it optional, and how long its check took when the course was walked in order.

Two files in ``sampling_course/assets/`` hold the facts, so that the student release, which has no
``solutions/``, shows the same table:

* ``exercise_lines.json``: for each exercise, the non-blank, non-comment lines inside its solution
  regions (``### BEGIN SOLUTION`` ... ``### END SOLUTION``; which exercise owns a region is
  ``grading/walk.py``'s rule). ``sampling-course make-exercises`` writes it from ``solutions/`` beside the
  stubs, and ``make-exercises --check`` fails when it is out of date.
* ``check_times.json``: the wall-clock and CPU seconds each exercise's tests took in the course walked in
  order (``grading/walk.py``: every earlier exercise solved, every later one a stub), with the machine,
  its load and the date. ``python scripts/time_checks.py --record`` writes it.

Neither number is the time a learner needs to write an exercise: nothing in the course measures that.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from sampling_course.files import ASSET_MANIFEST, ASSETS_DIR, asset_listing, describe, write_atomic
from sampling_course.grading.classroom.release import LEVEL_THREE
from sampling_course.grading.course import EXERCISES, SECTIONS
from sampling_course.grading.stubs import BEGIN_MARKER, END_MARKER
from sampling_course.grading.walk import regions_in

__all__ = ["LINES_FILE", "TIMES_FILE", "ExerciseWorkload", "count_lines", "lines_json", "part_labels", "sync_lines_file",
           "times_json", "workload", "write_data_file"]

LINES_FILE = ASSETS_DIR / "exercise_lines.json"
TIMES_FILE = ASSETS_DIR / "check_times.json"
LINES_COMMAND = "sampling-course make-exercises"
TIMES_COMMAND = "python scripts/time_checks.py --record"


@dataclass(frozen=True)
class ExerciseWorkload:
    """One exercise's row: ``lines`` of the course's solution in its own regions (``written_in``: the exercises
    whose regions hold its code when it has none of its own), its hints, and its check's seconds in the walk
    (None where the walk's record has no time for it)."""

    exercise: str
    lines: int | None
    written_in: tuple[str, ...]
    hints: int
    optional: bool
    check_seconds: float | None
    check_cpu_seconds: float | None


def part_labels() -> list[str]:
    """The parts as the notebooks number them, in course order ("1", ..., "5", "5b", "6", "6b", ..., "11")."""
    return list(dict.fromkeys(e.part_label for e in EXERCISES))


# ---------------------------------------------------------------------------------------
# Lines, counted from the solutions (for make-exercises)
# ---------------------------------------------------------------------------------------


def _code_lines(body: list[str]) -> int:
    """The lines of a region's body that are code: not blank, not a comment, not a marker."""
    return sum(1 for line in body if line.strip() and not line.strip().startswith("#")
               and line.strip() not in (BEGIN_MARKER, END_MARKER))


def count_lines(sources: Mapping[str, str]) -> dict[str, dict]:
    """For every exercise, in course order: ``{"lines": n, "regions": k}`` summed over the regions it owns in
    ``sources`` (module name -> source of ``solutions/<module>.py``); an exercise that owns none also gets
    ``"written_in"``, the owners of the regions inside its target (its code extends theirs)."""
    found = {module: regions_in(module, source) for module, source in sorted(sources.items())}
    counts: dict[str, dict] = {}
    for exercise in EXERCISES:
        owned = [(module, r) for module, rs in found.items() for r in rs if r.owner == exercise]
        lines = sum(_code_lines(sources[module].splitlines()[r.begin - 1:r.end]) for module, r in owned)
        entry: dict = {"lines": lines, "regions": len(owned)}
        if not owned:
            inside = [r.owner.name for r in found.get(exercise.module, ()) if r.owner is not None
                      and (r.holder == exercise.target or r.holder.startswith(exercise.target + "."))]
            entry["written_in"] = list(dict.fromkeys(inside))
        counts[exercise.name] = entry
    return counts


def lines_json(sources: Mapping[str, str]) -> str:
    """The text of ``exercise_lines.json`` for ``sources``."""
    about = ("Non-blank, non-comment lines inside each exercise's ### BEGIN SOLUTION / ### END SOLUTION regions of "
             "solutions/, counted by sampling_course.grading.workload.count_lines: the length of the course's own "
             "solution, not the time a learner needs.")
    return _one_line_each({"about": about, "command": LINES_COMMAND}, "exercises", count_lines(sources))


def _one_line_each(head: dict, key: str, entries: dict) -> str:
    """JSON of ``head`` plus ``key``: ``entries``, one entry a line, so that a diff shows which exercise changed."""
    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    body = [f"  {json.dumps(name)}: {json.dumps(entry)}" for name, entry in entries.items()]
    return "{\n" + "\n".join(lines) + f"\n {json.dumps(key)}: {{\n" + ",\n".join(body) + "\n }\n}\n"


def times_json(head: dict, seconds: dict[str, dict]) -> str:
    """The text of ``check_times.json``: ``head`` (what was measured, where, when) and each exercise's seconds."""
    return _one_line_each(head, "seconds", seconds)


def write_data_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` at once; a file of the course's assets is also listed anew in their manifest."""
    write_atomic(path, text.encode())
    if path.resolve().parent == ASSETS_DIR.resolve():
        listing = asset_listing()
        listing.update(describe(ASSETS_DIR, [path.name]))
        write_atomic(ASSET_MANIFEST, (json.dumps(listing, indent=1, sort_keys=True) + "\n").encode())


def sync_lines_file(solutions_dir: Path, path: Path = LINES_FILE, *, check: bool = False) -> str:
    """Bring ``path`` up to date with ``solutions_dir``: "unchanged", "written", or (``check``: nothing is
    written) "stale"."""
    sources = {p.stem: p.read_text(encoding="utf-8") for p in sorted(Path(solutions_dir).glob("*.py"))}
    text = lines_json(sources)
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return "unchanged"
    if check:
        return "stale"
    write_data_file(path, text)
    return "written"


# ---------------------------------------------------------------------------------------
# The table a notebook shows
# ---------------------------------------------------------------------------------------


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _rows(label: str, lines: dict, times: dict) -> list[ExerciseWorkload]:
    # The hints count those hint() can show: the student release withholds level 3 (LEVEL_THREE stands in).
    rows = []
    for e in (e for e in EXERCISES if e.part_label == label):
        counted, timed = lines.get(e.name, {}), times.get(e.name, {})
        rows.append(ExerciseWorkload(
            e.name, counted.get("lines"), tuple(counted.get("written_in", ())),
            sum(hint != LEVEL_THREE for hint in e.hints), e.optional, timed.get("wall"), timed.get("cpu")))
    return rows


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render_workload(label: str, rows: list[ExerciseWorkload], record: dict) -> Group:
    """The table of ``rows`` for part ``label``, with what its numbers are and are not beneath it."""
    table = Table(title=f"Workload of part {label}: {SECTIONS[label]}", title_justify="left",
                  show_edge=False, pad_edge=False, box=None)
    for name, justify in (("exercise", "left"), ("lines", "right"), ("hints", "right"), ("optional", "left"),
                          ("check, s", "right"), ("CPU s", "right")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for row in rows:
        lines = "?" if row.lines is None else str(row.lines)
        if row.lines == 0 and row.written_in:
            lines = "in " + ", ".join(row.written_in)
        table.add_row(row.exercise, lines, str(row.hints), "optional" if row.optional else "",
                      _seconds(row.check_seconds), _seconds(row.check_cpu_seconds))
    timed = [row for row in rows if row.check_seconds is not None]
    table.add_row(Text(f"all {len(rows)}", style="bold"), str(sum(row.lines or 0 for row in rows)), "", "",
                  _seconds(sum(row.check_seconds or 0.0 for row in timed) if timed else None),
                  _seconds(sum(row.check_cpu_seconds or 0.0 for row in timed) if timed else None))
    where = (f"{record.get('date', 'date unknown')}, {record.get('machine', 'machine unknown')}, "
             f"{record.get('load', 'load unknown')}") if record else "none recorded yet"
    notes = [
        "lines: non-blank, non-comment lines of the course's own solution in the exercise's regions; yours may be "
        "longer or shorter.",
        f"check, s: seconds the exercise's tests took in the course walked in order, wall-clock and CPU "
        f"(`{TIMES_COMMAND}`): {where}; '-': not measured.",
        "Neither is how long the exercise takes you to write: the course does not measure that.",
    ]
    if any(row.lines is None for row in rows):
        notes.insert(1, f"?: not in {LINES_FILE.name}, which `{LINES_COMMAND}` writes from solutions/.")
    return Group(table, *(Text(note, style="dim") for note in notes))


def workload(part: str | int, *, display: bool = True, console: Console | None = None) -> list[ExerciseWorkload]:
    """The exercises of part ``part`` ("1" ... "11", "5b", "6b"; an int for the parts without a letter) with
    their lines, hints, optional mark and check seconds; shown as a table unless ``display`` is False."""
    labels = part_labels()
    label = str(part).strip().lower() if isinstance(part, (str, int)) and not isinstance(part, bool) else None
    if label not in labels:
        raise ValueError(f"there is no part {part!r}; the parts are {', '.join(labels)}")
    record = _read(TIMES_FILE)
    rows = _rows(label, _read(LINES_FILE).get("exercises", {}), record.get("seconds", {}))
    if display:
        (console or Console()).print(render_workload(label, rows, {k: v for k, v in record.items() if k != "seconds"}))
    return rows
