"""Planted changes: one way to apply a ``Mistake`` or ``Variant`` to the solutions, and to find
the exercise it belongs to.

A planted change rewrites text ``old`` (found exactly once in ``solutions/<file>``) into
``new``. Everything that plants goes through ``planted_sources``: the planter that checks the
tests catch each mistake (``grading/mistakes.py``, which writes the planted copy to disk with
``write_package``), the diagnosis that names a learner's mistake (which imports the copy from
memory with ``planted``), and the tests of both.

Which exercise a change belongs to. The function or class that holds the rewritten text (its
qualified name, found with ``ast``) names the code it breaks, e.g. ``LayerNorm.forward`` or
``TransformerSampler.sample_top_p``. The change belongs to every exercise of the same part
whose module is that file and whose target is that name or contains it (``LayerNorm`` covers
``LayerNorm.forward``; ``Attention`` covers ``Attention.apply_causal_mask`` as well as
``apply_causal_mask`` does). A mistake may name its exercise instead (``Mistake.exercise``),
when the code it rewrites belongs to an earlier part but only a later exercise's tests
reveal it. The tests that must catch a mistake are then simply the tests marked with its
exercises.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.abc
import importlib.util
import itertools
import os
import sys
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from sampling_course.grading.catalogue import Exercise, Mistake, Variant
from sampling_course.grading.course import EXERCISES, MISTAKES, get_exercise

__all__ = [
    "SOLUTIONS", "exercises_of", "mistake_target", "mistakes_of", "planted", "planted_sources", "solution_sources",
    "write_package",
]

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"

Change = Mistake | Variant


@lru_cache(maxsize=None)
def _solution_sources() -> dict[str, str]:
    return {path.stem: path.read_text() for path in sorted(SOLUTIONS.glob("*.py"))}


def solution_sources() -> dict[str, str]:
    """Every module of ``solutions/`` by name (``"__init__"`` for the package itself), read once."""
    return dict(_solution_sources())


def planted_sources(*changes: Change) -> dict[str, str]:
    """The sources of ``solutions/`` with every change in ``changes`` applied, in order.

    Raises ValueError when a change's text is not found exactly once in its file.
    """
    sources = solution_sources()
    for change in changes:
        module = Path(change.file).stem
        count = sources.get(module, "").count(change.old)
        if count != 1:
            raise ValueError(
                f"{change.name!r}: expected its text once in solutions/{change.file}, found it {count} times"
            )
        sources[module] = sources[module].replace(change.old, change.new)
    return sources


def write_package(directory: Path, *changes: Change, name: str = "exercises") -> Path:
    """Write the solutions with ``changes`` planted as the package ``directory/name``; return its folder."""
    package = Path(directory) / name
    package.mkdir(parents=True)
    for module, source in planted_sources(*changes).items():
        (package / f"{module}.py").write_text(source)
    return package


# ---------------------------------------------------------------------------------------
# Imported from memory
# ---------------------------------------------------------------------------------------


@lru_cache(maxsize=256)
def _compiled(source: str, filename: str) -> Any:
    # Unchanged modules compile once per process, however many copies are planted.
    return compile(source, filename, "exec", dont_inherit=True)


class _PlantedPackages(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports planted copies of the solutions from memory: package name -> {module: source}."""

    def __init__(self) -> None:
        self.packages: dict[str, dict[str, str]] = {}
        self.imported: dict[str, set[str]] = {}  # package -> the module names imported from it

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        package, _, module = fullname.partition(".")
        sources = self.packages.get(package)
        if sources is None or "." in module or (module or "__init__") not in sources:
            return None
        origin = str(SOLUTIONS / f"{module or '__init__'}.py")
        return importlib.util.spec_from_loader(fullname, self, origin=origin, is_package=not module)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        package, _, name = module.__name__.partition(".")
        filename = module.__spec__.origin
        module.__file__ = filename
        self.imported.setdefault(package, set()).add(module.__name__)
        exec(_compiled(self.packages[package][name or "__init__"], filename), module.__dict__)


_FINDER = _PlantedPackages()
_COUNTER = itertools.count()


@contextlib.contextmanager
def planted(*changes: Change) -> Iterator[str]:
    """The solutions with ``changes`` planted, importable under a unique package name inside the block.

    Nothing is copied to disk: the package is served from memory while the block runs,
    and its modules leave ``sys.modules`` when it ends.
    """
    sources = planted_sources(*changes)
    name = f"_planted_solutions_{os.getpid()}_{next(_COUNTER)}"
    _FINDER.packages[name] = sources
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    try:
        yield name
    finally:
        del _FINDER.packages[name]
        for key in _FINDER.imported.pop(name, ()):
            sys.modules.pop(key, None)
        if not _FINDER.packages and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)


# ---------------------------------------------------------------------------------------
# Which exercise a change belongs to
# ---------------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def _spans(file: str) -> tuple[tuple[str, int, int], ...]:
    """(qualified name, first line, last line) of every function and class in ``solutions/<file>``."""
    spans: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, names: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                spans.append((".".join(names + (child.name,)), first, child.end_lineno or child.lineno))
                visit(child, names + (child.name,))
            else:
                visit(child, names)

    visit(ast.parse(_solution_sources()[Path(file).stem]), ())
    return tuple(spans)


@lru_cache(maxsize=None)
def mistake_target(change: Change) -> str | None:
    """The function or class of ``solutions/<file>`` that the change rewrites, e.g. ``"LayerNorm.forward"``."""
    source = _solution_sources().get(Path(change.file).stem)
    if source is None or not change.old or source.count(change.old) != 1:
        return None
    start = source.index(change.old)
    first = source.count("\n", 0, start) + 1
    last = source.count("\n", 0, start + len(change.old) - 1) + 1
    # The innermost (longest name) function or class that spans every line of the text.
    holders = [name for name, a, b in _spans(change.file) if a <= first and last <= b]
    return max(holders, key=lambda name: name.count("."), default=None)


@lru_cache(maxsize=None)
def exercises_of(change: Change) -> tuple[Exercise, ...]:
    """The exercises a change belongs to: the one a mistake names (``Mistake.exercise``), else
    those of the change's part whose code the change rewrites."""
    if isinstance(change, Mistake) and change.exercise is not None:
        return (get_exercise(change.exercise),)
    target = mistake_target(change)
    if target is None:
        return ()
    module = Path(change.file).stem
    return tuple(
        e for e in EXERCISES
        if e.part == change.part and e.module == module and (target == e.target or target.startswith(e.target + "."))
    )


def mistakes_of(exercise: Exercise | str) -> list[Mistake]:
    """The planted mistakes that belong to ``exercise``, in catalogue order."""
    exercise = get_exercise(exercise)
    return [m for m in MISTAKES if exercise in exercises_of(m)]
