"""How the grader imports a learner's code: afresh, substituted, and without disturbing the caller.

A check imports the implementation under test afresh (``isolated_package``), so edits to
``exercises/`` count without restarting the kernel, and puts the caller's modules back
afterwards. ``check(name, obj=...)`` swaps an object defined in a notebook into the package
(``substituted``). ``terminal_like`` keeps Jupyter-aware libraries from drawing into the cell
while a nested test session runs there.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from sampling_course.grading.catalogue import Exercise
from sampling_course.grading.course import get_exercise

__all__ = [
    "NESTED_RUN_OPTIONS", "import_all", "isolated_modules", "isolated_package", "isolated_tests", "nested_run_env",
    "resolve_target", "substituted", "terminal_like",
]

# pytest plugins a nested test run (a check, a planted mistake, a graded submission) leaves off.
# The cache provider and faulthandler write files or change process-wide state the caller may
# rely on; random reseeding would change the tests' seeded draws; the unraisable-exception
# plugin runs several full garbage collections when a run ends, which with torch loaded was
# about a fifth of what a first check spends after its imports.
NESTED_RUN_OPTIONS = ["-p", "no:cacheprovider", "-p", "no:faulthandler", "-p", "no:randomly",
                      "-p", "no:unraisableexception"]


@contextmanager
def nested_run_env(**values: str | None) -> Iterator[None]:
    """Inside the block, the environment variables in ``values`` set (or removed, for None), and
    pytest plugins installed in the environment not loaded: the course's tests need none of them
    (a notebook server such as Colab's has several), and each would cost its import on every check.
    The whole environment is restored on exit."""
    saved = dict(os.environ)
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def isolated_modules(ours: Callable[[str, ModuleType], bool]) -> Iterator[None]:
    """Inside the block, modules for which ``ours(name, module)`` holds are imported afresh;
    afterwards the caller's own modules are put back and the fresh ones dropped."""
    saved = {name: module for name, module in list(sys.modules.items()) if module is not None and ours(name, module)}
    for name in saved:
        del sys.modules[name]
    importlib.invalidate_caches()
    try:
        yield
    finally:
        for name, module in list(sys.modules.items()):
            if module is not None and ours(name, module):
                del sys.modules[name]
        sys.modules.update(saved)


def isolated_package(package: str):
    """Import ``package`` afresh inside the block; put the caller's modules back afterwards.

    Fresh: a learner's edits to exercises/*.py count without restarting the kernel.
    Put back: objects the caller already holds (a model, a class) keep working, and an
    outer pytest session that imported ``solutions`` is not disturbed by a nested check.
    """
    return isolated_modules(lambda name, _: name == package or name.startswith(package + "."))


def isolated_tests(tests: Path):
    """The same for conftest.py and the test modules under ``tests``: each run imports the
    tests on disk, and a nested run never touches the module objects of an outer pytest session."""
    tests = Path(tests).resolve()

    def ours(name: str, module: ModuleType) -> bool:
        file = getattr(module, "__file__", None)
        if not file or not os.path.basename(file).startswith(("test_", "conftest")):
            return False  # cheap test first: sys.modules holds thousands of modules
        return tests in Path(file).resolve().parents

    return isolated_modules(ours)


def import_all(package: str) -> list[ModuleType]:
    """Every module of ``package`` that imports; broken ones are left for the tests to report."""
    root = importlib.import_module(package)
    modules = [root]
    for info in pkgutil.iter_modules(root.__path__):
        try:
            modules.append(importlib.import_module(f"{package}.{info.name}"))
        except Exception:  # a learner's syntax error: the tests will say so, with a message
            continue
    return modules


def resolve_target(exercise: Exercise, package: str) -> tuple[Any, str]:
    """``(owner, attribute)`` of the object an exercise asks for, in ``package``.

    ``owner`` is the module (for ``LayerNorm``) or the class (for
    ``TransformerSampler.sample_top_p``) whose attribute ``check(obj=...)`` replaces.
    """
    owner: Any = importlib.import_module(f"{package}.{exercise.module}")
    *path, attr = exercise.target.split(".")
    for part in path:
        owner = getattr(owner, part)
    if attr not in vars(owner):
        raise LookupError(f"{package}.{exercise.module} has no {exercise.target} (needed by exercise {exercise.name})")
    return owner, attr


def replacement_for(obj: Any, owner: Any, attr: str) -> Any:
    """``obj`` in the form ``owner.attr`` needs: a staticmethod for a static method, and so on."""
    original = vars(owner)[attr]
    if isinstance(owner, ModuleType):
        return obj
    if inspect.ismethod(obj):  # a bound method: use the function underneath
        obj = obj.__func__
    if isinstance(obj, type) and not isinstance(original, type):
        # The learner passed their whole class for one method: take that method from it.
        try:
            obj = inspect.getattr_static(obj, attr)
        except AttributeError:
            raise TypeError(f"{obj.__name__} has no attribute {attr!r} to check") from None
    if isinstance(original, staticmethod) and not isinstance(obj, staticmethod):
        return staticmethod(obj)
    if isinstance(original, classmethod) and not isinstance(obj, (classmethod, staticmethod)):
        return classmethod(obj)
    return obj


@contextmanager
def substituted(package: str, exercise: Exercise | str, obj: Any) -> Iterator[None]:
    """Inside the block, ``package`` uses ``obj`` for the exercise's object.

    A module-level object (a class such as ``LayerNorm``) is replaced in every module
    of the package that holds it, so ``DemoTransformer`` builds its blocks from ``obj``.
    A method (``Beams.generate``, the static ``TransformerSampler.sample_top_p``) is
    replaced on its class, wrapped in ``staticmethod`` when the original was one.
    Everything is restored on exit.
    """
    exercise = get_exercise(exercise)
    modules = import_all(package)
    owner, attr = resolve_target(exercise, package)
    original = vars(owner)[attr]
    replacement = replacement_for(obj, owner, attr)
    owners = [m for m in modules if vars(m).get(attr, None) is original] if isinstance(owner, ModuleType) else [owner]
    if owner not in owners:
        owners.append(owner)
    saved = [(o, vars(o)[attr]) for o in owners]
    try:
        for o in owners:
            setattr(o, attr, replacement)
        yield
    finally:
        for o, value in saved:
            setattr(o, attr, value)


@contextmanager
def terminal_like() -> Iterator[None]:
    """Inside the block, libraries that detect Jupyter behave as in a terminal.

    The nested test session runs inside the notebook's kernel, where ``tqdm.auto`` would
    draw widgets and rich would render HTML: both bypass pytest's capture, so they would
    leak into the cell and hide output from the tests that check it. Restored on exit.
    """
    patches: list[tuple[Any, str, Any]] = []
    try:
        import tqdm.asyncio
        import tqdm.auto
        import tqdm.autonotebook
        import tqdm.std

        patches += [
            (tqdm.auto, "tqdm", tqdm.asyncio.tqdm), (tqdm.auto, "trange", tqdm.asyncio.trange),
            (tqdm.autonotebook, "tqdm", tqdm.std.tqdm), (tqdm.autonotebook, "trange", tqdm.std.trange),
        ]
    except ImportError:
        pass
    import rich.console

    if hasattr(rich.console, "_is_jupyter"):
        patches.append((rich.console, "_is_jupyter", lambda: False))
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches if hasattr(owner, name)]
    try:
        for owner, name, value in patches:
            if hasattr(owner, name):
                setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
