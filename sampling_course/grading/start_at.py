"""Start the course at any part: the finished code of every earlier exercise put into ``exercises/``.

The checks of a later part run the learner's own earlier parts (part 5's checks load their
``DemoTransformer``; part 10's engine imports their part-5 sampler chain), so a learner who
starts at part N needs every exercise before N filled in. Which ones those are comes from the
course's catalogue: the exercises listed before part N's first (``exercises_before``), in the
files that hold them (``files_before``).

``start_at`` fills them in without losing anything the learner wrote. It works one function at
a time: each function or method that holds a solution region of an earlier exercise is replaced
by the solutions' version only while the learner's copy of it is still the untouched stub. In the
solutions' version, regions of part N and later stay stubs (``exercises/transformer.py`` holds
parts 1, 4 and 5: starting at part 5 fills parts 1 and 4 and leaves the three padding
exercises to write). A function the learner has edited is left as it is and reported. Every file
it changes is first copied to ``exercises/.backup/<time>/``.
"""

from __future__ import annotations

import ast
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from sampling_course.grading.catalogue import Exercise
from sampling_course.grading.course import EXERCISES
from sampling_course.grading.planting import solution_sources
from sampling_course.grading.stubs import (
    BEGIN_MARKER, DEFAULT_EXERCISES_DIR, END_MARKER, STUB_LINE, make_exercise_file, make_stub_source,
)
from sampling_course.grading.walk import regions, walk_sources

__all__ = ["BACKUP_FOLDER", "StartReport", "exercises_before", "files_before", "finished_sources", "part_labels", "start_at"]

BACKUP_FOLDER = ".backup"  # inside exercises/; a folder name with a dot is never imported as a module


def part_labels() -> list[str]:
    """The parts as the notebooks number them, in course order: "1", ..., "6", "6b", ..., "10"."""
    labels: list[str] = []
    for exercise in EXERCISES:
        if exercise.part_label not in labels:
            labels.append(exercise.part_label)
    return labels


def exercises_before(part: str | int) -> tuple[Exercise, ...]:
    """Every exercise the course lists before part ``part``'s first (all of parts 1-4 for part 5)."""
    label = str(part).strip().lower()
    labels = part_labels()
    if label not in labels:
        raise ValueError(f"part must be one of {', '.join(labels)}, got {part!r}")
    first = next(index for index, exercise in enumerate(EXERCISES) if exercise.part_label == label)
    return EXERCISES[:first]


def files_before(part: str | int) -> tuple[str, ...]:
    """The modules of ``exercises/`` (without ``.py``) that hold an exercise before part ``part``, in course order."""
    modules: list[str] = []
    for exercise in exercises_before(part):
        if exercise.module not in modules:
            modules.append(exercise.module)
    return tuple(modules)


@dataclass
class StartReport:
    """What ``start_at`` did: per module, the functions it filled in, the learner's it kept, and where the backup is."""

    part: str
    filled: dict[str, list[str]] = field(default_factory=dict)
    kept: dict[str, list[str]] = field(default_factory=dict)
    # Functions the learner edited that still hold a stub of an earlier exercise: theirs to finish.
    unfinished: dict[str, list[str]] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # files that do not parse: left alone
    backup: Path | None = None
    changed: list[str] = field(default_factory=list)


def _spans(source: str) -> dict[str, tuple[int, int]]:
    """Qualified name -> (first line, last line) of every function and class in ``source``."""
    spans: dict[str, tuple[int, int]] = {}

    def visit(node: ast.AST, names: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = ".".join(names + (child.name,))
                spans[name] = (child.lineno, child.end_lineno or child.lineno)
                visit(child, names + (child.name,))
            else:
                visit(child, names)

    visit(ast.parse(source), ())
    return spans


def _text(lines: list[str], span: tuple[int, int]) -> str:
    return "".join(lines[span[0] - 1 : span[1]])


def _split(text: str) -> tuple[str, str]:
    """(generated header, body) of an exercise file; no header: ("", text)."""
    lines = text.splitlines(keepends=True)
    if lines and lines[0].startswith("# GENERATED from solutions/") and len(lines) >= 3:
        return "".join(lines[:3]), "".join(lines[3:])
    return "", text


def finished_sources(n_solved: int) -> dict[str, str]:
    """The solutions with the regions of the first ``n_solved`` exercises filled in and every later one a
    stub, without the region markers: what a learner who finished those exercises has."""
    if n_solved == 0:
        return {}
    return {module: "".join(line for line in source.splitlines(keepends=True)
                            if line.strip() not in (BEGIN_MARKER, END_MARKER))
            for module, source in walk_sources(n_solved - 1).items()}


def start_at(part: str | int, exercises_dir: Path | str = DEFAULT_EXERCISES_DIR) -> StartReport:
    """Fill in every exercise before part ``part`` in ``exercises_dir``, keeping the learner's own code."""
    before = exercises_before(part)
    report = StartReport(str(part).strip().lower())
    exercises_dir = Path(exercises_dir)
    solutions = solution_sources()
    # The solutions with the regions of the earlier exercises kept and every later one stubbed.
    targets = finished_sources(len(before))
    earlier = set(before)
    pending: dict[str, str] = {}
    for module in files_before(part):
        holders = sorted({r.holder for r in regions(module) if r.owner in earlier and r.holder})
        pristine = make_stub_source(solutions[module], f"solutions/{module}.py")
        path = exercises_dir / f"{module}.py"
        header, body = _split(path.read_text(encoding="utf-8")) if path.exists() else ("", pristine)
        if not header:
            header, _ = _split(make_exercise_file(solutions[module], f"{module}.py"))
        try:
            mine = _spans(body)
        except SyntaxError:
            report.unreadable.append(module)
            continue
        stub_spans, target_spans = _spans(pristine), _spans(targets[module])
        stub_lines = pristine.splitlines(keepends=True)
        target_lines = targets[module].splitlines(keepends=True)
        lines = body.splitlines(keepends=True)
        replacements: list[tuple[tuple[int, int], str]] = []
        for holder in holders:
            # A holder inside another one being replaced is replaced with it.
            if any(other != holder and holder.startswith(other + ".") for other in holders):
                continue
            if holder not in mine:
                report.unfinished.setdefault(module, []).append(holder)
                continue
            current = _text(lines, mine[holder])
            finished = _text(target_lines, target_spans[holder])
            if current == finished:  # filled in already (an earlier start-at, or the learner's copy)
                continue
            if current == _text(stub_lines, stub_spans[holder]):
                replacements.append((mine[holder], finished))
                report.filled.setdefault(module, []).append(holder)
            elif STUB_LINE in current:
                report.unfinished.setdefault(module, []).append(holder)
            else:
                report.kept.setdefault(module, []).append(holder)
        for (first, last), finished in sorted(replacements, reverse=True):  # from the end: line numbers stay valid
            lines[first - 1 : last] = [finished]
        if replacements or not path.exists():
            body = "".join(lines)
            if STUB_LINE not in body:  # the header no longer asks for anything to be filled in
                head = header.splitlines(keepends=True)
                header = head[0] + f"# Filled in by `sampling-course start-at {report.part}`: no stub left in this file.\n" + head[2]
            pending[module] = header + body
    if pending:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        backup = exercises_dir / BACKUP_FOLDER / stamp
        suffix = 1
        while backup.exists():
            suffix += 1
            backup = exercises_dir / BACKUP_FOLDER / f"{stamp}-{suffix}"
        for module, text in pending.items():
            path = exercises_dir / f"{module}.py"
            if path.exists():
                backup.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, backup / path.name)
                report.backup = backup
            # The header keeps the stub's checksum, so `make-exercises` counts the file as the
            # learner's and never overwrites it without --force.
            path.write_text(text, encoding="utf-8")
            report.changed.append(module)
    return report
