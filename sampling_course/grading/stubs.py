"""Generate the learner's ``exercises/`` from the complete ``solutions/``.

Every solution file marks the code a learner must write with nbgrader-style regions::

    def apply_temperature(logits, temperature):
        \"\"\"docstring stays\"\"\"
        ### BEGIN SOLUTION
        # Hint: divide, don't multiply.
        return logits / temperature
        ### END SOLUTION

The generated exercise keeps everything outside the regions verbatim and replaces
each region with ``raise NotImplementedError()`` at the indentation of its
``### BEGIN SOLUTION`` line, keeping the ``# Hint:`` comments that were inside it::

    def apply_temperature(logits, temperature):
        \"\"\"docstring stays\"\"\"
        # Hint: divide, don't multiply.
        raise NotImplementedError()

Each generated file starts with a comment header that records a checksum of the
body below it. That lets ``make-exercises`` tell an untouched exercise (safe to
regenerate) from one the learner has worked on (never overwritten without
``--force``).

``sampling-course make-exercises`` (``sampling_course.apps.course_commands``) calls
:func:`make_exercises` and prints its ``Report``.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "StubError",
    "Report",
    "make_stub_source",
    "make_exercise_file",
    "body_checksum",
    "is_learner_edited",
    "make_exercises",
    "DEFAULT_SOLUTIONS_DIR",
    "DEFAULT_EXERCISES_DIR",
]

BEGIN_MARKER = "### BEGIN SOLUTION"
END_MARKER = "### END SOLUTION"
HINT_PREFIX = "# Hint:"
STUB_LINE = "raise NotImplementedError()"

# The repo root is the parent of this package. This also holds for a regular
# (non-editable) install, because setuptools installs `solutions` and
# `exercises` as top-level packages next to `sampling_course`.
_REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SOLUTIONS_DIR = _REPO_ROOT / "solutions"
DEFAULT_EXERCISES_DIR = _REPO_ROOT / "exercises"

_HEADER_FIRST_LINE_PREFIX = "# GENERATED from solutions/"
_CHECKSUM_RE = re.compile(r"^# stub-checksum: (?P<digest>[0-9a-f]{64})$")
_HEADER_LINE_COUNT = 3

OUT_OF_DATE_MESSAGE = (
    "exercises/ is out of date with solutions/: run `sampling-course make-exercises`"
)


class StubError(ValueError):
    """A solution file has malformed ``### BEGIN/END SOLUTION`` markers."""


# --------------------------------------------------------------------------- #
# Pure text transformation
# --------------------------------------------------------------------------- #


def _indent_of(line: str) -> str:
    """Return the leading whitespace of ``line``."""
    return line[: len(line) - len(line.lstrip())]


def make_stub_source(source: str, filename: str = "<string>") -> str:
    """Replace every solution region in ``source`` with a ``raise NotImplementedError()``.

    Only the region replacement happens here (no header); see
    :func:`make_exercise_file` for the full generated file.

    Args:
        source: Python source of a solution file.
        filename: Name used in error messages.

    Returns:
        The stub source. Lines outside regions are copied verbatim; inside a region
        only comment lines starting with ``# Hint:`` survive, at their own indentation,
        followed by the ``raise`` at the indentation of the BEGIN marker.

    Raises:
        StubError: For an END without BEGIN, a nested BEGIN, a BEGIN never closed
            before end of file, or BEGIN/END markers at different indentation.
            The message names ``filename:line``.
    """
    out: list[str] = []
    # Where the currently open region started: (line number, indentation), or None.
    open_region: tuple[int, str] | None = None
    hints: list[str] = []

    for lineno, line in enumerate(source.splitlines(keepends=True), start=1):
        stripped = line.strip()

        if stripped == BEGIN_MARKER:
            if open_region is not None:
                raise StubError(
                    f"{filename}:{lineno}: nested '{BEGIN_MARKER}' "
                    f"(the region opened at line {open_region[0]} is not closed yet)"
                )
            open_region = (lineno, _indent_of(line))
            hints = []
            continue

        if stripped == END_MARKER:
            if open_region is None:
                raise StubError(
                    f"{filename}:{lineno}: '{END_MARKER}' without a matching '{BEGIN_MARKER}'"
                )
            begin_lineno, indent = open_region
            if _indent_of(line) != indent:
                raise StubError(
                    f"{filename}:{lineno}: '{END_MARKER}' is indented differently from "
                    f"its '{BEGIN_MARKER}' at line {begin_lineno} "
                    f"({len(_indent_of(line))} vs {len(indent)} characters)"
                )
            out.extend(hints)
            # The stub always ends in a newline, even if END was the last line
            # without one, so that following code stays on its own line.
            out.append(f"{indent}{STUB_LINE}\n")
            open_region = None
            continue

        if open_region is None:
            out.append(line)
        elif stripped.startswith(HINT_PREFIX):
            # Keep the hint as written, only normalising a missing final newline.
            hints.append(line if line.endswith("\n") else line + "\n")
        # Any other line inside a region is solution code: dropped.

    if open_region is not None:
        raise StubError(
            f"{filename}:{open_region[0]}: '{BEGIN_MARKER}' is never closed "
            f"by an '{END_MARKER}' before the end of the file"
        )
    return "".join(out)


def body_checksum(body: str) -> str:
    """SHA-256 hex digest of a generated file's body (everything below the header)."""
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


# The header's second line: what the learner does with the file. A file with no solution
# region (given code that runs the learner's other exercises) has nothing to fill in.
FILL_IN_LINE = "# Fill in each `raise NotImplementedError()` below with your own code.\n"
GIVEN_LINE = "# Given code: nothing to fill in here; it runs on the exercises of the other files.\n"


def _header(solution_name: str, checksum: str, has_stubs: bool = True) -> str:
    # A comment-only header is legal before a module docstring and before
    # `from __future__ import ...`: comments are not statements. (A shebang or
    # coding cookie from the solution ends up below it, as an inert comment;
    # exercises are imported, never executed directly, and UTF-8 is the default.)
    return (
        f"{_HEADER_FIRST_LINE_PREFIX}{solution_name} by `sampling-course make-exercises`.\n"
        + (FILL_IN_LINE if has_stubs else GIVEN_LINE)
        + f"# stub-checksum: {checksum}\n"
    )


def make_exercise_file(source: str, solution_name: str) -> str:
    """Return the full generated exercise text (header + stub body) for one solution.

    Args:
        source: Python source of ``solutions/<solution_name>``.
        solution_name: File name of the solution, e.g. ``"sampling.py"``.
    """
    body = make_stub_source(source, filename=f"solutions/{solution_name}")
    return _header(solution_name, body_checksum(body), has_stubs=body != source) + body


def _split_header(text: str) -> tuple[str, str] | None:
    """Split generated text into (recorded checksum, body), or None if there is no header."""
    lines = text.splitlines(keepends=True)
    if len(lines) < _HEADER_LINE_COUNT or not lines[0].startswith(_HEADER_FIRST_LINE_PREFIX):
        return None
    match = _CHECKSUM_RE.match(lines[_HEADER_LINE_COUNT - 1].rstrip("\r\n"))
    if match is None:
        return None
    return match["digest"], "".join(lines[_HEADER_LINE_COUNT:])


def _read_text(path: Path) -> str:
    # Universal-newline reading, so a CRLF checkout (git autocrlf on Windows)
    # neither looks learner-edited nor stale.
    return path.read_text(encoding="utf-8")


def is_learner_edited(path: Path | str) -> bool:
    """Whether an existing exercise file was changed since it was generated.

    True when the body no longer matches the checksum in its header, and also when
    the file has no generated header at all (a foreign or hand-written file must
    not be silently overwritten either).
    """
    parsed = _split_header(_read_text(Path(path)))
    if parsed is None:
        return True
    recorded, body = parsed
    return body_checksum(body) != recorded


# --------------------------------------------------------------------------- #
# Directory generation
# --------------------------------------------------------------------------- #


@dataclass
class Report:
    """What :func:`make_exercises` did (or, in check mode, would do).

    All entries are paths of files in the exercises directory.
    """

    written: list[Path] = field(default_factory=list)
    """Files created or regenerated."""
    unchanged: list[Path] = field(default_factory=list)
    """Files already identical to what would be generated."""
    skipped_edited: list[Path] = field(default_factory=list)
    """Learner-edited files that differ but were not overwritten (no ``force``)."""
    stale: list[Path] = field(default_factory=list)
    """Check mode only: files missing or differing from what would be generated."""
    orphans: list[Path] = field(default_factory=list)
    """Exercise ``.py`` files with no matching solution; reported, never deleted."""

    @property
    def ok(self) -> bool:
        """True when exercises are (now) in sync and nothing was refused."""
        return not self.stale and not self.skipped_edited


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a crash never leaves a half-written exercise."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def make_exercises(
    solutions_dir: Path,
    exercises_dir: Path,
    *,
    force: bool = False,
    check: bool = False,
) -> Report:
    """Generate ``exercises_dir/*.py`` from ``solutions_dir/*.py``.

    Args:
        solutions_dir: Directory of complete solutions (only its top-level ``*.py``).
        exercises_dir: Directory to write the generated exercises into.
        force: Overwrite learner-edited exercises too (their work is lost).
        check: Write nothing; list missing or out-of-date exercises in ``Report.stale``.

    Returns:
        A :class:`Report`. Exercise files that have no solution are listed in
        ``orphans`` and left alone.

    Raises:
        StubError: If any solution has malformed markers. All solutions are
            converted before anything is written, so a bad file writes nothing.
    """
    solutions_dir = Path(solutions_dir)
    exercises_dir = Path(exercises_dir)
    if not solutions_dir.is_dir():
        raise FileNotFoundError(f"solutions directory not found: {solutions_dir}")

    solution_files = sorted(p for p in solutions_dir.glob("*.py") if p.is_file())
    # Convert everything first so that one broken file leaves exercises/ untouched.
    generated = {
        p.name: make_exercise_file(_read_text(p), p.name) for p in solution_files
    }

    report = Report()
    if not check:
        exercises_dir.mkdir(parents=True, exist_ok=True)

    for name, text in generated.items():
        target = exercises_dir / name
        current = _read_text(target) if target.is_file() else None

        if current == text:
            report.unchanged.append(target)
        elif check:
            report.stale.append(target)
        elif current is not None and not force and is_learner_edited(target):
            report.skipped_edited.append(target)
        else:
            _atomic_write(target, text)
            report.written.append(target)

    if exercises_dir.is_dir():
        report.orphans = sorted(
            p for p in exercises_dir.glob("*.py") if p.is_file() and p.name not in generated
        )
    return report
