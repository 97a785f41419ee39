"""The student release: the course as students get it, without solutions and without hidden tests.

``make_release(OUT)`` copies the files an allow-list names (``RELEASED``: the course's package
and its shipped models, the stubs in ``exercises/``, the notebooks, the grading tests in
``tests/grading/`` with ``tests/conftest.py``, ``tests/doubles.py`` and ``tests/part5_shared.py``, ``pyproject.toml``,
``constraints.txt`` and the README) into ``OUT``; nothing else is copied, and of those it leaves out:

* ``solutions/`` and everything that exists to check them (``tests/course``, ``tests/apps``,
  ``scripts/``, CI);
* every test marked ``@pytest.mark.hidden`` (a test function or class, a ``pytest.param``
  case, or a whole file with ``pytestmark = pytest.mark.hidden``): instructors keep those for
  grading time, when ``sampling-course grade`` runs them and the feedback names only the
  exercise and the mistake;
* the text of the planted mistakes and correct variants in ``grading/parts/`` (it is copied
  from the solutions) and their fixes: ``MISTAKES``, ``VARIANTS`` and ``FIXES`` are emptied wherever they are defined,
  a module that held nothing else is not shipped, and an import of one becomes an empty list;
* every exercise's level-3 hint (it nearly spells out the code): one rule for all of them,
  whether or not its text matches a solution line, so ``hint NAME --level 3`` says where to
  turn instead (``LEVEL_THREE``);
* the instructor's README: the release has its own, written for students (``STUDENT_README``).

In the release, ``pytest`` checks ``exercises/`` by default (``--impl exercises``).
"""

from __future__ import annotations

import ast
import fnmatch
import re
import shutil
import tomllib
from pathlib import Path

from sampling_course.grading.planting import SOLUTIONS
from sampling_course.grading.stubs import BEGIN_MARKER, END_MARKER

__all__ = ["HIDDEN", "RELEASED", "ReleaseError", "hidden_spans", "make_release", "released_files", "strip_hidden"]

CHECKOUT = SOLUTIONS.parent
HIDDEN = "hidden"  # the marker's name: @pytest.mark.hidden
# The only files a release holds (paths relative to the checkout, fnmatch patterns).
RELEASED = ("pyproject.toml", "constraints.txt", "README.md", "LICENSE", "sampling_course/*.py",
            "sampling_course/apps/*.py", "sampling_course/grading/*.py", "sampling_course/grading/*/*.py",
            "sampling_course/grading/*/*/*.py", "sampling_course/assets/*", "sampling_course/assets/*/*",
            "exercises/*.py", "notebooks/*.ipynb", "tests/conftest.py", "tests/doubles.py", "tests/part5_shared.py",
            "tests/grading/*.py")
PLANTED = ("MISTAKES", "VARIANTS", "FIXES")  # the names whose values hold text copied from the solutions
LEVEL_THREE = ("Level 3 hints are not in the student release. Levels 1 and 2 are; beyond them, ask your "
               "instructor or a classmate.")
_HINTS_AT = 5  # exercise(name, part, module, target, task, hint 1, hint 2, hint 3): the hints' first position
STUDENT_README = """# sampling-course: your copy

You build GPT-2 from scratch, then the ways of turning its logits into text: greedy search,
temperature, top-k, top-p, beam search, a KV cache, a batched generation engine, caches for
long text, speculative decoding, structured generation, a Llama-style decoder, a serving
engine and quantised weights. Every piece starts as a stub in `exercises/`: each `raise NotImplementedError()` marks
code for you to write, and its docstring says what it must do. The tests in `tests/grading/`
compare your code with independent references on the same weights.

## Install

Python 3.11.5 or newer (the pinned stack in `constraints.txt` needs it). In this folder:

```bash
python3 -m venv .venv && . .venv/bin/activate && pip install -q -c constraints.txt -e .
```

## Work through the course

1. Open the notebooks (`jupyter lab notebooks/`), starting with part 1. Each one explains its
   method, imports your code from `exercises/` and has experiments to run.
2. Fill in a stub, then check it:

   ```bash
   sampling-course check LayerNorm
   ```

   It says passed, not implemented yet, or shows the first failing check with a hint (and,
   when your output matches a classic mistake, which one).
3. Stuck? `sampling-course hint LayerNorm` shows the next hint for that exercise (levels 1 and
   2; level 3 is kept for your instructor).
4. See how far you are: `sampling-course progress` lists every exercise in course order.
5. The whole test suite, on your code: `python -m pytest` (untouched stubs show as "not
   implemented yet").

Without internet access the course uses the small story model shipped in the package instead
of GPT-2; run `sampling-course download-gpt2` once on a machine with internet to cache GPT-2.

## Hand in

Hand in your `exercises/` folder (or a zip of it) as your instructor asks. Your instructor
grades it with the same tests and some more (hidden ones); the feedback names each exercise's
result and, for a failure, the mistake it matches.
"""


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


def _strip_planted_text(source: str, dropped: set[str]) -> str:
    """``source`` with every value of MISTAKES and VARIANTS emptied, ``+=`` to them removed, an import from a
    module in ``dropped`` made an empty list, and the private helpers only they used removed."""
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    for node in sorted(tree.body, key=lambda n: -n.lineno):
        first, last = node.lineno, node.end_lineno
        if isinstance(node, ast.ImportFrom) and node.module in dropped:
            names = [alias.asname or alias.name for alias in node.names]
            lines[first - 1:last] = [f"{name}: list = []  # not in the student release\n" for name in names]
            continue
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id in PLANTED:
            del lines[first - 1:last]
            continue
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if any(isinstance(t, ast.Name) and t.id in PLANTED for t in targets) and node.value:
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
            return source
        for node in sorted(unused, key=lambda n: -n.lineno):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            del lines[first - 1:node.end_lineno]


def _only_planted(source: str) -> bool:
    """Whether a module defines MISTAKES or VARIANTS and nothing else (but what they need): it is not shipped."""
    planted = False
    for node in ast.parse(source).body:
        targets = [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else getattr(node, "targets", [])
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (isinstance(node, ast.Expr) and
                                                               isinstance(node.value, ast.Constant)):
            continue
        if targets and all(isinstance(t, ast.Name) and (t.id in PLANTED or t.id.startswith("_")) for t in targets):
            planted = planted or any(t.id in PLANTED for t in targets)
            continue
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name.startswith("_"):
            continue
        return False
    return planted


def solution_lines(solutions: Path = SOLUTIONS) -> tuple[list[str], set[str]]:
    """Each solution region's code (stripped lines, blanks and comments dropped, joined by newlines), and the
    stripped lines of the solutions outside any region (public: the stubs hold them too)."""
    regions, public = [], set()
    for path in sorted(Path(solutions).glob("*.py")):
        current = None
        for line in path.read_text().splitlines():
            text = line.strip()
            if text == BEGIN_MARKER:
                current = []
            elif text == END_MARKER and current is not None:
                regions.append("\n".join(current))
                current = None
            elif current is not None and text and not text.startswith("#"):
                current.append(text)
            elif current is None and text:
                public.add(text)
    return [r for r in regions if r], public


def _reveals(text: str, regions: list[str], public: set[str]) -> bool:
    """Whether ``text`` holds a whole solution region, or a distinctive line of one."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    joined = "\n".join(lines)
    return any(region in joined for region in regions if region not in public) or any(
        line in region.split("\n") and len(line) >= 25 and line not in public for line in lines for region in regions)


def _scrub_strings(source: str, regions: list[str], public: set[str]) -> str:
    """``source`` with every string that reveals a solution region (a hint that spells out the answer, an
    example) replaced by a placeholder."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line.encode()))
    data = source.encode()
    spans = [(starts[n.lineno - 1] + n.col_offset, starts[n.end_lineno - 1] + n.end_col_offset)
             for n in ast.walk(ast.parse(source))
             if isinstance(n, ast.Constant) and isinstance(n.value, str) and _reveals(n.value, regions, public)]
    for start, end in sorted(spans, reverse=True):
        data = data[:start] + b'"(not in the student release)"' + data[end:]
    return data.decode()


def withhold_level_three(source: str) -> str:
    """``source`` (a part's module) with the level-3 hint of every ``exercise(...)`` it calls replaced by
    ``LEVEL_THREE``."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line.encode()))
    data = source.encode()
    spans = []
    for node in ast.walk(ast.parse(source)):
        name = getattr(node.func, "id", getattr(node.func, "attr", None)) if isinstance(node, ast.Call) else None
        if name == "exercise" and len(node.args) > _HINTS_AT + 2:
            third = node.args[_HINTS_AT + 2]
            spans.append((starts[third.lineno - 1] + third.col_offset, starts[third.end_lineno - 1] + third.end_col_offset))
    for start, end in sorted(spans, reverse=True):
        data = data[:start] + repr(LEVEL_THREE).encode() + data[end:]
    return data.decode()


def released_files(checkout: Path = CHECKOUT) -> list[str]:
    """The checkout's files the allow-list names (relative paths, sorted)."""
    found = []
    for path in sorted(checkout.rglob("*")):
        relative = path.relative_to(checkout).as_posix()
        if path.is_file() and "__pycache__" not in relative and any(fnmatch.fnmatchcase(relative, p) for p in RELEASED):
            found.append(relative)
    return found


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
    left_out: dict[str, list[str]] = {"hidden test files": [], "hidden tests": [], "planted mistakes and variants": []}
    files = released_files(checkout)
    parts = [f for f in files if f.startswith("sampling_course/grading/parts/") and f.endswith(".py")]
    dropped = {f for f in parts if _only_planted((checkout / f).read_text())}
    left_out["planted mistakes and variants"] = sorted(dropped)
    dropped_modules = {f.removesuffix(".py").replace("/", ".") for f in dropped}
    regions, public = solution_lines(checkout / "solutions")
    for relative in files:
        if relative in dropped:
            continue
        target = out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if relative in parts:
            source = withhold_level_three(_strip_planted_text((checkout / relative).read_text(), dropped_modules))
            target.write_text(_scrub_strings(source, regions, public))
        elif relative.startswith("sampling_course/") and relative.endswith(".py"):
            target.write_text(_scrub_strings((checkout / relative).read_text(), regions, public))
        elif relative.startswith("tests/grading/test_"):
            source = (checkout / relative).read_text()
            try:
                stripped = strip_hidden(source)
            except SyntaxError as exc:
                raise ReleaseError(f"{relative} is not valid Python: {exc}") from None
            if stripped is None:
                left_out["hidden test files"].append(relative.removeprefix("tests/"))
                continue
            if stripped != source:
                left_out["hidden tests"].append(f"{relative.removeprefix('tests/')} ({len(hidden_spans(source))} hidden)")
            target.write_text(stripped)
        elif relative == "README.md":
            target.write_text(STUDENT_README)
        elif relative == "pyproject.toml":
            target.write_text(_release_pyproject((checkout / relative).read_text()))
        else:
            shutil.copyfile(checkout / relative, target)
    return left_out
