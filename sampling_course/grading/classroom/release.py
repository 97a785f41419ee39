"""The student release: the course as students get it, without solutions and without hidden tests.

``make_release(OUT)`` writes the course's package, the stubs in ``exercises/``, the notebooks,
the grading tests in ``tests/grading/`` (with ``tests/conftest.py``), ``pyproject.toml``,
``constraints.txt`` and the README into ``OUT``, and leaves out:

* ``solutions/`` and everything that exists to check them (``tests/course``, ``tests/apps``,
  ``scripts/``, CI);
* every test marked ``@pytest.mark.hidden`` (a test function or class, a ``pytest.param``
  case, or a whole file with ``pytestmark = pytest.mark.hidden``): instructors keep those for
  grading time, when ``sampling-course grade`` runs them and the feedback names only the
  exercise and the mistake;
* the text of the planted mistakes and correct variants in ``grading/parts/`` (it is copied
  from the solutions).

In the release, ``pytest`` checks ``exercises/`` by default (``--impl exercises``).
"""

from __future__ import annotations

import ast
import re
import shutil
import tomllib
from pathlib import Path

from sampling_course.grading.planting import SOLUTIONS

__all__ = ["HIDDEN", "ReleaseError", "hidden_spans", "make_release", "strip_hidden"]

CHECKOUT = SOLUTIONS.parent
HIDDEN = "hidden"  # the marker's name: @pytest.mark.hidden
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "*.egg-info")


class ReleaseError(ValueError):
    """The release cannot be written (OUT exists and is not empty, or a test file cannot be read)."""


def _is_hidden_mark(node: ast.AST) -> bool:
    """``pytest.mark.hidden`` or ``mark.hidden`` (called or not)."""
    if isinstance(node, ast.Call):
        node = node.func
    if not (isinstance(node, ast.Attribute) and node.attr == HIDDEN):
        return False
    owner = node.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "mark") or (isinstance(owner, ast.Name) and owner.id == "mark")


def _marks_hidden(node: ast.AST | None) -> bool:
    """A marks value (one mark, or a list or tuple of them) that holds the hidden mark."""
    if node is None:
        return False
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_is_hidden_mark(e) for e in node.elts)
    return _is_hidden_mark(node)


def file_is_hidden(tree: ast.Module) -> bool:
    """Whether a test module marks all of its tests hidden (``pytestmark = pytest.mark.hidden``)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            if _marks_hidden(node.value):
                return True
    return False


def hidden_spans(source: str) -> list[tuple[int, int]]:
    """Character spans of ``source`` to delete: hidden tests, test classes and ``pytest.param`` cases."""
    tree = ast.parse(source)
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(line: int, col: int) -> int:
        return starts[line - 1] + len(source.splitlines(keepends=True)[line - 1].encode()[:col].decode())

    spans = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and any(
                _is_hidden_mark(d) for d in node.decorator_list):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            spans.append((starts[first - 1], starts[node.end_lineno]))
    taken = [range(a, b) for a, b in spans]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "param"
                and any(k.arg == "marks" and _marks_hidden(k.value) for k in node.keywords)):
            start = offset(node.lineno, node.col_offset)
            end = offset(node.end_lineno, node.end_col_offset)
            if any(start in r for r in taken):
                continue
            after = re.match(r"\s*,\s*", source[end:])
            spans.append((start, end + (after.end() if after else 0)))
    return sorted(spans)


def strip_hidden(source: str) -> str | None:
    """``source`` without its hidden tests; None when the whole file is hidden."""
    if file_is_hidden(ast.parse(source)):
        return None
    for start, end in reversed(hidden_spans(source)):
        source = source[:start] + source[end:]
    ast.parse(source)  # what is left must still be Python
    return source


def _strip_planted_text(path: Path) -> None:
    """Empty MISTAKES and VARIANTS in a part's grader data, and drop the private helpers only they used:
    their text is copied from the solutions."""
    lines = path.read_text().splitlines(keepends=True)
    tree = ast.parse("".join(lines))
    for node in sorted(tree.body, key=lambda n: -n.lineno):
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if any(isinstance(t, ast.Name) and t.id in ("MISTAKES", "VARIANTS") for t in targets) and node.value:
            value = node.value
            head = lines[value.lineno - 1][:value.col_offset]
            tail = lines[value.end_lineno - 1][value.end_col_offset:]
            lines[value.lineno - 1:value.end_lineno] = [f"{head}[]  # not in the student release{tail}"]
    while True:  # private module-level names nothing uses any more
        source = "".join(lines)
        tree = ast.parse(source)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        unused = [n for n in tree.body if _private_name(n) and _private_name(n) not in used]
        if not unused:
            break
        for node in sorted(unused, key=lambda n: -n.lineno):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            del lines[first - 1:node.end_lineno]
    path.write_text("".join(lines))


def _private_name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        name = node.name
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
        name = targets[0].id if len(targets) == 1 and isinstance(targets[0], ast.Name) else None
    else:
        return None
    return name if name and name.startswith("_") and not name.startswith("__") else None


def _release_pyproject(text: str) -> str:
    """The pyproject for students: pytest checks exercises/ by default; no solutions package."""
    text = text.replace('"solutions*", ', "").replace(', "solutions*"', "")
    text = re.sub(r'(addopts = ")', r"\1--impl exercises ", text, count=1)
    tomllib.loads(text)  # still valid
    return text


def make_release(out: Path, checkout: Path = CHECKOUT) -> dict[str, list[str]]:
    """Write the student release into ``out`` (new or empty). Returns what was left out, by kind."""
    out, checkout = Path(out), Path(checkout)
    if out.exists() and any(out.iterdir()):
        raise ReleaseError(f"{out} exists and is not empty; choose a new folder")
    if out.resolve() == checkout.resolve() or checkout.resolve() in out.resolve().parents:
        raise ReleaseError("write the release outside the course's own folder")
    out.mkdir(parents=True, exist_ok=True)
    left_out: dict[str, list[str]] = {"hidden test files": [], "hidden tests": []}
    for name in ("pyproject.toml", "constraints.txt", "README.md", "LICENSE"):
        if (checkout / name).is_file():
            shutil.copyfile(checkout / name, out / name)
    (out / "pyproject.toml").write_text(_release_pyproject((out / "pyproject.toml").read_text()))
    for folder in ("sampling_course", "exercises", "notebooks"):
        if (checkout / folder).is_dir():
            shutil.copytree(checkout / folder, out / folder, ignore=_SKIP)
    for part in sorted((out / "sampling_course" / "grading" / "parts").glob("*/__init__.py")):
        _strip_planted_text(part)
    tests = checkout / "tests"
    (out / "tests" / "grading").mkdir(parents=True)
    shutil.copyfile(tests / "conftest.py", out / "tests" / "conftest.py")
    for path in sorted((tests / "grading").rglob("*.py")):
        relative = path.relative_to(tests)
        source = path.read_text()
        try:
            stripped = strip_hidden(source) if path.name.startswith("test_") else source
        except SyntaxError as exc:
            raise ReleaseError(f"{relative} is not valid Python: {exc}") from None
        if stripped is None:
            left_out["hidden test files"].append(str(relative))
            continue
        if stripped != source:
            left_out["hidden tests"].append(f"{relative} ({len(hidden_spans(source))} hidden)")
        (out / "tests" / relative).parent.mkdir(parents=True, exist_ok=True)
        (out / "tests" / relative).write_text(stripped)
    return left_out
