"""Which files of an implementation's package one exercise's verdict depends on.

A verdict of ``progress`` is reused while nothing it depends on changed (``grading.verdicts``),
so what it depends on must be a superset of every file that can change its tests' outcome,
and should be little more, or an edit to part 8 runs part 11 again. It is found in two steps:

1. **Roots, recorded during the run** (``RootRecorder``): the modules of the package that code
   outside it (the tests, their fixtures, the course) asked for, by an ``import`` statement,
   ``importlib.import_module`` (which ``Impl("exercises").transformer`` calls) or an import of
   a module not loaded before, per test file: a module-scoped fixture such as ``demo`` is built
   once per file and used by every test of that file, so every test of a file counts the roots
   of the whole file. Requests made outside a test (collection) or while a session-scoped
   fixture is set up (it outlives its file) count for every exercise.
2. **The static import closure of the roots** (``import_closure``): every module named by an
   ``import`` anywhere in a root's source (at the top or inside a function), then theirs, and
   so on, with each package's ``__init__.py``.

Why this is enough: the package's code and data reach a test only through a module object, and
code outside the package gets module objects only by the requests of step 1; code inside it
reaches other modules only by its imports (step 2). An object built by a module's code, even
one kept from an earlier test (a cached fixture), comes from a module of the closure of the
roots that built it, and those roots belong to the same file or to every exercise. A source that
looks modules up by a computed name (``importlib``, ``__import__``, ``sys.modules[name]``,
``pkgutil``, ``exec``) or does not parse depends on every file of the package; the one dynamic
look-up left alone is ``sys.modules[type(x).__module__]``, the module of a class whose object
the code already holds, which is in the closure by the same argument. A cache shared between
test files must therefore be keyed by the package's objects it uses (as part 7's
``reference_pair(name, transformer)`` is): its caller then asked for them itself.

What a verdict does not depend on: state that an earlier exercise's tests leave in the package's
modules (a learner's module-level cache filled by part 4, read in part 9), which a ``check`` of
the exercise alone never sees either.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# Names whose use means "a module chosen at run time": the file then depends on every file. Bare names
# (``eval`` as an attribute is ``model.eval()``), then attributes (``importlib.import_module``).
_DYNAMIC_NAMES = {"__import__", "import_module", "exec", "eval"}
_DYNAMIC_ATTRIBUTES = {"__import__", "import_module", "iter_modules", "walk_packages", "run_module", "run_path",
                       "reload", "find_spec", "module_from_spec", "spec_from_file_location"}
_DYNAMIC_MODULES = {"importlib", "pkgutil", "runpy", "imp", "zipimport"}
EVERY = None  # what ``file_imports`` and ``import_closure`` return when every file counts


def module_files(package: str, module: str, files: set[str]) -> tuple[str, ...]:
    """The files (relative to the package's folder) that ``module`` of ``package`` is, or would be were it
    there: one when it is there, both candidates when not, none when it is not in the package or cannot be
    a module (a name inside a module file, as ``transformer.LayerNorm``)."""
    if module != package and not module.startswith(package + "."):
        return ()
    parts = module.split(".")[1:]
    candidates = (("/".join(parts) + ".py",) if parts else ()) + ("/".join([*parts, "__init__.py"]),)
    there = tuple(c for c in candidates if c in files)
    if there:
        return there[:1]
    parent = parts[:-1]
    if parts and "/".join([*parent, "__init__.py"]) not in files:
        return ()  # its parent is a module file (or absent, and recorded as such): no submodule to wait for
    return candidates


def _looks_up_modules(node: ast.AST) -> bool:
    """Whether ``node`` picks a module by a name computed at run time."""
    if isinstance(node, ast.Name):
        return node.id in _DYNAMIC_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in _DYNAMIC_ATTRIBUTES or (
            node.attr == "modules" and isinstance(node.value, ast.Name) and node.value.id == "sys")
    return False


def _class_module_lookups(tree: ast.AST) -> set[int]:
    """The ``sys.modules`` nodes of ``sys.modules[x.__module__]`` and ``sys.modules.get(x.__module__, ...)``:
    the module of the class of an object the code already holds."""
    def of_class(arg: ast.AST) -> bool:
        return isinstance(arg, ast.Attribute) and arg.attr == "__module__"

    allowed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and of_class(node.slice):
            allowed.add(id(node.value))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and of_class(node.args[0])):
            allowed.add(id(node.func.value))
    return allowed


def file_imports(package: str, module: str, source: bytes) -> set[str] | None:
    """The modules of ``package`` (and names in them) that the source of ``module`` imports anywhere;
    None (every module) when it does not parse or looks modules up by a computed name. ``module`` is
    dotted (``exercises.engine``; a package's ``__init__.py`` is ``exercises.__init__``)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return EVERY
    here = module.split(".")[:-1]  # the package a relative import starts from
    found: set[str] = set()
    allowed = _class_module_lookups(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in _DYNAMIC_MODULES:
                    return EVERY
                if alias.name == package or alias.name.startswith(package + ".") and not alias.asname:
                    return EVERY  # binds the package itself: any module loaded by then is an attribute away
                if alias.name.startswith(package + "."):
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level - 1 >= len(here):
                    return EVERY  # above the package: not ours to follow
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
                if base.split(".")[0] in _DYNAMIC_MODULES or base == "sys" and any(a.name == "modules" for a in node.names):
                    return EVERY
            if base != package and not base.startswith(package + "."):
                continue
            found.add(base)
            for alias in node.names:
                if alias.name == "*":
                    return EVERY  # whatever the module holds, submodules loaded by then included
                found.add(f"{base}.{alias.name}")  # a submodule when one has that name, else a name in base
        elif _looks_up_modules(node) and id(node) not in allowed:
            return EVERY
    return found


def import_closure(package: str, roots: set[str], sources: dict[str, bytes],
                   parsed: dict[str, set[str] | None] | None = None) -> dict[str, bool] | None:
    """``{file: whether it is there}`` for the modules ``roots`` (dotted names) and everything they import,
    with the ``__init__.py`` of each package above: files relative to the package's folder, the keys of
    ``sources``. A module asked for but absent counts too (a new file would change the outcome). None when
    every file counts. ``parsed`` keeps each file's imports between calls (one parse per file, not one per
    exercise)."""
    parsed = {} if parsed is None else parsed
    files = set(sources)
    found: dict[str, bool] = {}
    todo = [package, *roots]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for end in range(1, len(parts) + 1):  # importing a.b.c runs a's and a.b's __init__ first
            for file in module_files(package, ".".join(parts[:end]), files):
                if file in found:
                    continue
                found[file] = file in sources
                if not found[file]:
                    continue
                if file not in parsed:
                    parsed[file] = file_imports(package, ".".join([package, *file.removesuffix(".py").split("/")]),
                                                sources[file])
                imports = parsed[file]
                if imports is EVERY:
                    return EVERY
                todo += imports
    return found


class RootRecorder:
    """Records which modules of ``package`` code outside it asks for, per test file (see the module)."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.prefix = package + "."
        self.bucket: set[str] = set()  # where requests go now: a test file's roots, or the shared ones
        self.shared: set[str] = self.bucket
        self.by_file: dict[str, set[str]] = {}
        self._loaded: set[str] = set()

    def _note(self, name: str) -> None:
        if name == self.package or name.startswith(self.prefix):
            self.bucket.add(name)

    def look(self) -> None:
        """Modules of the package loaded since the last look, by whatever route (not only the two watched):
        into the current bucket."""
        loaded = {n for n in list(sys.modules) if n == self.package or n.startswith(self.prefix)}
        for name in loaded - self._loaded:
            self.bucket.add(name)
        self._loaded = loaded

    def enter(self, test_file: str | None) -> None:
        """From now on, requests count for ``test_file``; None: a test ended (or collection did), and requests
        count for every exercise. Modules loaded since the last look, by whatever route, go to the bucket left
        (a look at ``sys.modules`` per test, not two)."""
        if test_file is None:
            self.look()
            self.bucket = self.shared
        else:
            self.bucket = self.by_file.setdefault(test_file, set())

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Inside the block, ``import`` statements and ``importlib.import_module`` report the package's modules."""
        original_import, original_import_module = builtins.__import__, importlib.import_module
        package, prefix = self.package, self.prefix

        def recording_import(name, globals=None, locals=None, fromlist=(), level=0):
            if level:
                base = (globals or {}).get("__package__") or ""
                if base == package or base.startswith(prefix):
                    # From inside the package: its static imports already cover this.
                    return original_import(name, globals, locals, fromlist, level)
            elif name == package or name.startswith(prefix):
                self.bucket.add(name)
                for item in fromlist or ():
                    self.bucket.add(f"{name}.{item}")
            return original_import(name, globals, locals, fromlist, level)

        def recording_import_module(name, package=None):  # the signature importlib.import_module has
            if not name.startswith("."):
                self._note(name)
            elif package:
                self._note(importlib.util.resolve_name(name, package))
            return original_import_module(name, package)

        builtins.__import__, importlib.import_module = recording_import, recording_import_module
        try:
            yield
        finally:
            builtins.__import__, importlib.import_module = original_import, original_import_module
            self.look()

    def roots(self, test_files: set[str]) -> set[str]:
        """The modules asked for by ``test_files``' tests and outside any test."""
        found = set(self.shared)
        for file in test_files:
            found |= self.by_file.get(file, set())
        return found
