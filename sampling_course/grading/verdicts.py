"""Verdicts kept between runs of ``progress``: an exercise's result is reused while nothing it depends on changed.

``progress`` runs every exercise's tests; on a finished course that is minutes of CPU time for
answers that cannot have changed since the last run. So each verdict is stored with what it
depends on, and reused while all of it is as it was:

* the course: every Python file of ``sampling_course`` and the asset manifest, every Python
  file of ``tests/`` and ``pyproject.toml`` (a new version of the course, or new tests);
* the libraries: every installed distribution's name and version, and Python's version;
* the run's settings: the implementation, the device, the seeds, the time limit, and whether
  real GPT-2 weights are cached (their tests skip otherwise);
* when the learner's ``exercises`` are graded in the course's checkout, every file of
  ``solutions`` (the tests run the course's own earlier parts around the code under test);
* the implementation's files the exercise's tests can reach: the modules of the package its
  test files asked for during the run, and every module those import, found in their source
  (``grading.depends`` says why nothing else can change the outcome), so a solution split into
  several files needs no list kept by hand; a module asked for but absent counts as absent
  (creating it runs the tests again). A failing verdict depends on every file of the package.

A verdict that depends on the machine's speed (a test stopped for taking too long) is never
stored. The files live under ``cache_home()/verdicts/``, one per exercise and course state,
written atomically and checked when read (a damaged one is simply computed again).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import sys
from dataclasses import asdict, fields
from functools import cache
from pathlib import Path
from typing import Any

from sampling_course.files import cache_home, read_cached, write_cached
from sampling_course.grading.course import Exercise, get_exercise
from sampling_course.grading.results import FAILING, TOOK_TOO_LONG, Result

FORMAT = 3  # bump to ignore every verdict stored by an older version of this module
# Settings of a run that can change a verdict; the device is passed explicitly.
SETTINGS_ENV = ("SAMPLING_COURSE_TEST_SEED", "SAMPLING_COURSE_TEST_TIMEOUT", "SAMPLING_COURSE_DEVICE")


def _digest_files(root: Path, pattern: str) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob(pattern)) if path.is_file() and "__pycache__" not in path.parts}


def package_digests(package_dir: Path) -> dict[str, str]:
    """``{path relative to the package: SHA-256}`` of every Python file of an implementation's package."""
    return _digest_files(package_dir, "*.py")


@cache
def _libraries() -> tuple[tuple[str, str], ...]:
    return tuple(sorted({(d.metadata["Name"] or "", d.version) for d in importlib.metadata.distributions()}))


def course_key(impl: str, tests: Path, device: str | None) -> str:
    """One hash of everything but the implementation that a verdict depends on (see the module)."""
    from sampling_course.reference import gpt2_local_dir

    package = Path(__file__).resolve().parents[1]
    description = {
        "format": FORMAT,
        "course": _digest_files(package, "*.py"),
        "assets": hashlib.sha256((package / "assets" / "MANIFEST.json").read_bytes()).hexdigest()
        if (package / "assets" / "MANIFEST.json").is_file() else None,
        "tests": _digest_files(tests, "*.py"),
        "solutions": _digest_files(tests.parent / "solutions", "*.py")
        if impl != "solutions" and (tests.parent / "solutions").is_dir() else None,
        "pyproject": hashlib.sha256((tests.parent / "pyproject.toml").read_bytes()).hexdigest()
        if (tests.parent / "pyproject.toml").is_file() else None,
        "libraries": _libraries(),
        "python": sys.version,
        "impl": impl,
        "device": device,
        "settings": {name: os.environ.get(name) for name in SETTINGS_ENV},
        "gpt2": str(gpt2_local_dir() or ""),
    }
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()


def result_to_json(result: Result) -> dict[str, Any]:
    """A ``Result`` as plain data (the exercise by name)."""
    data = asdict(result)
    data["exercise"] = result.exercise.name
    return data


def result_from_json(data: dict[str, Any]) -> Result:
    """The ``Result`` that ``result_to_json`` described; a ValueError when it does not describe one."""
    names = {f.name for f in fields(Result)}
    if not isinstance(data, dict) or set(data) != names:
        raise ValueError("not a stored verdict")
    values = dict(data, exercise=get_exercise(data["exercise"]), stubs=tuple(data["stubs"]))
    return Result(**values)


class VerdictStore:
    """Stored verdicts, looked up by exercise under one ``course_key`` and the implementation's file digests."""

    def __init__(self, key: str, digests: dict[str, str], folder: Path | None = None, package: Path | None = None):
        self.key = key
        self.digests = digests
        self.folder = folder or cache_home() / "verdicts"
        self.package = package  # the implementation's folder: where a file with no digest is looked for

    def _path(self, exercise: Exercise) -> Path:
        name = hashlib.sha256(f"{self.key}/{exercise.name}".encode()).hexdigest()
        return self.folder / name[:2] / f"{name}.json"

    def get(self, exercise: Exercise) -> Result | None:
        """The stored verdict of ``exercise`` when every file it depends on is as it was; else None."""
        data, _ = read_cached(self._path(exercise))
        if data is None:
            return None
        try:
            entry = json.loads(data)
            depends = entry["depends"]
            if not isinstance(depends, dict) or any(self.digests.get(p) != d for p, d in depends.items()):
                return None
            return result_from_json(entry["result"])
        except (ValueError, KeyError, TypeError):
            return None

    def put(self, result: Result, imported: set[str] | None) -> None:
        """Keep ``result`` with the files it depends on: ``imported`` (paths relative to the package; one that is
        absent is kept as absent), or every file of the package for a failing verdict or when they are unknown."""
        if result.status == TOOK_TOO_LONG:
            return  # depends on the machine's speed, not only on the code
        if result.status != FAILING and imported is not None:
            depends: dict[str, str | None] = {}
            for p in sorted(imported):
                if p in self.digests:
                    depends[p] = self.digests[p]
                elif self.package is not None and not (self.package / p).exists():
                    depends[p] = None  # absent: the verdict holds until it is created
                else:
                    return  # a file that appeared during the run: no digest to compare with next time
        else:
            depends = dict(self.digests)
        entry = {"depends": depends, "result": result_to_json(result)}
        try:
            write_cached(self._path(result.exercise), json.dumps(entry, sort_keys=True).encode())
        except OSError:
            pass  # a read-only or full disk: the next progress simply runs the tests again
