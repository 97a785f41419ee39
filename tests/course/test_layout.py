"""The package's house rules (docs/design.md, "Who imports whom"), checked on its source.

Every import counts, including those inside functions: an import deferred to run time
still ties two modules together, and a cycle among them is still a cycle.
"""

from __future__ import annotations

import ast
from functools import cache
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

import sampling_course

PACKAGE = Path(sampling_course.__file__).parent
MAX_LINES = 500


@cache
def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


@cache
def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for every absolute import in the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


@cache
def _graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from pkg import mod`` counts as importing mod)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for target, names in _imports(path):
            for candidate in [target, *(f"{target}.{n}" for n in names)]:
                if candidate in modules and candidate != name:
                    graph[name].add(candidate)
    return graph


def test_no_import_cycles():
    """No module imports a module that imports it back, directly or through others."""
    try:
        tuple(TopologicalSorter(_graph()).static_order())
    except CycleError as exc:
        pytest.fail(f"import cycle among sampling_course modules: {' -> '.join(exc.args[1])}")


def test_the_cycle_check_can_fail():
    """The check above sees a cycle when there is one (two modules importing each other)."""
    with pytest.raises(CycleError):
        tuple(TopologicalSorter({"a": {"b"}, "b": {"a"}}).static_order())


ROOT = PACKAGE.parent
# The folders whose files a reader reads whole: the package, the solutions and the stubs made from them.
READ_WHOLE = (PACKAGE, ROOT / "solutions", ROOT / "exercises")
# Files allowed past the limit, named one by one (docs/design.md lists them too). None today: a file
# that grows past the limit is split by concept, or named here with its reason.
LONG_FILES: set[str] = set()


def _line_counts() -> dict[str, int]:
    """Lines of every .py file under READ_WHOLE, by its path from the checkout's root."""
    return {p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
            for folder in READ_WHOLE for p in sorted(folder.rglob("*.py"))}


def test_no_file_is_too_long():
    """Every file of the package, solutions/ and exercises/ fits in 500 lines, so it can be read in
    one sitting; only the files named in LONG_FILES may be longer."""
    long = {path: n for path, n in _line_counts().items() if n > MAX_LINES and path not in LONG_FILES}
    assert not long, f"files over {MAX_LINES} lines (split them by concept): {long}"


def test_every_long_file_exception_is_still_needed():
    """An exception names a file that exists and is still over the limit: once a file is split,
    its entry goes, so the rule covers it again."""
    counts = _line_counts()
    stale = sorted(path for path in LONG_FILES if counts.get(path, 0) <= MAX_LINES)
    assert not stale, f"remove from LONG_FILES (missing, or now within {MAX_LINES} lines): {stale}"


def test_no_private_names_cross_modules():
    """A name two modules share is public: no module imports another's ``_name``."""
    modules = _modules()
    private = [
        f"{name} imports {target}.{n}"
        for name, path in modules.items()
        for target, names in _imports(path)
        if target in modules and target != name
        for n in names
        if n.startswith("_") and not n.startswith("__")
    ]
    assert not private, "private names imported across modules:\n" + "\n".join(private)


def test_the_model_layer_never_imports_the_grader_or_the_programs():
    """The modules at the top of the package (model, references, tokenizer, ...) import
    neither ``grading`` nor ``apps``, so notebooks and programs can use them alone."""
    top = {name for name in _modules() if name.count(".") == 1}
    graph = _graph()
    wrong = sorted(f"{name} imports {target}" for name in top for target in graph[name]
                   if target.startswith(("sampling_course.grading", "sampling_course.apps")))
    assert not wrong, "\n".join(wrong)


def test_the_grader_never_imports_the_programs():
    """``grading/`` never imports ``apps/`` (the programs use the grader, not the other way round)."""
    graph = _graph()
    wrong = sorted(f"{name} imports {target}" for name, targets in graph.items()
                   if name.startswith("sampling_course.grading") for target in targets
                   if target.startswith("sampling_course.apps"))
    assert not wrong, "\n".join(wrong)


def test_every_module_compiles_without_warnings():
    """Every .py file of the package, solutions/ and exercises/ compiles with warnings as errors:
    an invalid escape sequence such as ``"\\d"`` in a docstring is a SyntaxWarning now and a
    SyntaxError in a later Python."""
    import warnings

    warned = []
    for folder in READ_WHOLE:
        for path in sorted(folder.rglob("*.py")):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                try:
                    compile(path.read_text(encoding="utf-8"), str(path), "exec", dont_inherit=True)
                except (SyntaxError, Warning) as exc:
                    warned.append(f"{path.relative_to(ROOT).as_posix()}: {exc}")
    assert not warned, "modules that do not compile cleanly:\n" + "\n".join(warned)
