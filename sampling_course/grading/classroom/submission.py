"""A submission on disk: find each student's, and copy one into a fresh folder for grading.

A submission is a student's copy of the release: a folder or a ``.zip`` holding
``exercises/`` (at its top or a few folders down; notebooks and anything else are ignored),
or just the exercise files themselves (``sampling.py``, ``beams.py``, ... as plain ``.py``
files, as Gradescope receives them). Modules it lacks are taken from the course's stubs, so
a student who hands in only ``sampling.py`` is graded on it, the rest counting as not done.

Only plain ``.py`` files with the course's module names are copied, each at most
``MAX_FILE_BYTES``; no link is followed (a folder or file that is a link, at any depth, is
skipped and named in the notes: ``mywork -> ../classmate`` would grade a classmate's work),
links, absolute paths and ``..`` in a zip are skipped, and a zip is refused past
``MAX_ZIP_BYTES`` unpacked.
"""

from __future__ import annotations

import os
import shutil
import stat
import zipfile
from pathlib import Path

from sampling_course.grading.planting import SOLUTIONS

__all__ = ["STUBS", "SubmissionError", "find_submissions", "module_names", "prepare_copy"]

STUBS = SOLUTIONS.parent / "exercises"
MAX_FILE_BYTES = 2 << 20
MAX_ZIP_BYTES = 64 << 20
MAX_ZIP_FILES = 5000


class SubmissionError(ValueError):
    """The submission holds nothing gradable (no exercise files), or is malformed."""


def module_names() -> set[str]:
    """The course's exercise modules (``transformer``, ``sampling``, ...) and the package's ``__init__``."""
    return {path.stem for path in STUBS.glob("*.py")}


def find_submissions(root: Path) -> list[tuple[str, Path]]:
    """``(student, path)`` for every submission in ``root``: each folder or zip in it, named by its stem.

    A ``root`` that is itself one submission (it holds ``exercises/`` or exercise files) is
    the only one, named after the folder.
    """
    root = Path(root)
    if root.is_file() and root.suffix == ".zip":
        return [(root.stem, root)]
    if not root.is_dir():
        raise SubmissionError(f"{root} is neither a folder of submissions nor a .zip")
    if (root / "exercises").is_dir() or any(p.name in _files() for p in root.glob("*.py")):
        return [(root.name, root)]
    found = [(p.stem, p) for p in sorted(root.iterdir())
             if not p.name.startswith(".") and (p.is_dir() or p.suffix == ".zip")]
    if not found:
        raise SubmissionError(f"{root} holds no submissions (expected a folder or .zip per student)")
    names = [name for name, _ in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise SubmissionError(f"two submissions share a name (a folder and a zip?): {', '.join(twice)}")
    return found


def _files() -> set[str]:
    return {f"{name}.py" for name in module_names()}


def _unzip(archive: Path, into: Path) -> Path:
    """Unpack the ``.py`` files of ``archive`` into ``into``, safely; return ``into``."""
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_ZIP_FILES or sum(i.file_size for i in infos) > MAX_ZIP_BYTES:
                raise SubmissionError(f"the zip holds more than {MAX_ZIP_FILES} files or "
                                      f"{MAX_ZIP_BYTES >> 20} MiB unpacked")
            for info in infos:
                parts = Path(info.filename).parts
                is_link = stat.S_ISLNK(info.external_attr >> 16)
                if (info.is_dir() or is_link or not info.filename.endswith(".py") or info.filename.startswith("/")
                        or ".." in parts or info.file_size > MAX_FILE_BYTES or "__MACOSX" in parts):
                    continue
                target = into.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(info))
    except zipfile.BadZipFile as exc:
        raise SubmissionError(f"the submission is not a valid zip ({exc})") from None
    return into


def _exercise_folder(root: Path, links: list[str]) -> Path | None:
    """The folder whose ``.py`` files are the submission's exercises: ``exercises/`` or loose files.

    No link is followed (a link to a classmate's folder would grade the classmate's work): a link
    met on the way is added to ``links`` (its path in the submission) and left alone.
    """
    wanted = _files()
    named, loose = [], []  # (depth, path) of folders called exercises/, and of folders of loose exercise files
    for folder, names, files in os.walk(root, followlinks=False):
        here = Path(folder)
        depth = len(here.relative_to(root).parts)
        for name in sorted(names + files):
            if (here / name).is_symlink():
                links.append(str((here / name).relative_to(root)))
        names[:] = [n for n in names if not n.startswith(".") and not (here / n).is_symlink() and depth < 3]
        real = {f for f in files if not (here / f).is_symlink()}
        if here.name == "exercises" and real & wanted:
            named.append((depth, str(here)))
        elif real & (wanted - {"__init__.py"}):
            loose.append((depth, str(here)))
    links.sort()
    found = min(named, default=None) or min(loose, default=None)  # the shallowest, then the first by name
    return Path(found[1]) if found else None


def _listed(links: list[str]) -> str:
    shown = ", ".join(links[:5]) + (f" and {len(links) - 5} more" if len(links) > 5 else "")
    return f"{len(links)} link{'s' if len(links) != 1 else ''} ({shown})"


def prepare_copy(submission: Path, into: Path, graded: set[str] | None = None) -> tuple[Path, list[str]]:
    """Copy ``submission``'s exercise files to ``into/exercises``; return (that folder's parent, notes).

    A module missing from the submission is noted only when ``graded`` (module names; all when None) holds it.

    Raises SubmissionError when the submission holds no exercise file at all.
    """
    submission, into = Path(submission), Path(into)
    source_root = submission
    if submission.is_file() and submission.suffix == ".zip":
        source_root = _unzip(submission, into / "unpacked")
    links: list[str] = []
    folder = _exercise_folder(source_root, links)
    skipped = f"; links are never followed, and it holds {_listed(links)}" if links else ""
    if folder is None:
        # Said without the file's name (a cluster's worker sees a zip it named itself) and without the list of
        # every module: the row it is reported on names the student.
        raise SubmissionError(f"no exercise files found (expected exercises/ holding the course's modules, e.g. "
                              f"transformer.py and sampling.py){skipped}")
    package = into / "copy" / "exercises"
    package.mkdir(parents=True)
    notes = [f"links are never followed: skipped {_listed(links)}"] if links else []
    for name in sorted(module_names()):
        source = folder / f"{name}.py"
        if source.is_file() and not source.is_symlink() and source.stat().st_size <= MAX_FILE_BYTES:
            shutil.copyfile(source, package / f"{name}.py")
        else:
            shutil.copyfile(STUBS / f"{name}.py", package / f"{name}.py")
            if name != "__init__" and (graded is None or name in graded):
                notes.append(f"{name}.py was not in the submission: the course's stub counts in its place")
    if (into / "unpacked").exists():
        shutil.rmtree(into / "unpacked")
    return package.parent, notes
