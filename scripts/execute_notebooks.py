"""Write the executed copies of the course notebooks (notebooks/executed/<name>), and check them.

    python scripts/execute_notebooks.py --all                 # every notebook, two at a time
    python scripts/execute_notebooks.py 05_generation_engine  # only those named (with or without .ipynb)
    python scripts/execute_notebooks.py --stale               # only those whose copy --check rejects
    python scripts/execute_notebooks.py --check               # which copies are stale or show a failure

Each notebook runs top to bottom against the solutions (``SAMPLING_COURSE_IMPL=solutions``) on
the CPU, with the offline story model (GPT-2 is hidden from it: an empty Hugging Face cache and
no hub), in a fresh kernel running this interpreter, with tqdm's progress bars off (a bar's
redraws would be stored as outputs). ``--jobs`` notebooks run at once
(default 2, one per core: the notebooks use one torch thread each). A learner reads the copies
without running anything: every table, plot and check panel as the finished course shows them.

What a copy records, and what ``--check`` compares (no kernel needed, a second or so):

* the notebook's cells (type and source; ids, metadata and outputs do not count);
* every file of ``solutions/`` the kernel opened (an import opens the module's source or its
  cached bytecode, so a module the notebook and its checks never imported does not count), and
  every module of the course package ``sampling_course/`` it opened the same way (the benches,
  labs and tables a cell calls print what that code computes, and the check panels are drawn by
  the grader's code);
* the test files whose tests its ``check(...)`` cells ran (the items pytest selected, not every
  module it collected), the ``conftest.py`` files above them, and the helper modules of tests/
  those import (followed through their ``import`` statements);
* the assets of ``sampling_course/assets`` it read: a model or tokenizer folder counts whole when
  any file in it was opened (its weights are read by native code that Python does not see open).

``--check`` fails when any recorded file changed or disappeared, when a copy records no inputs,
and when a copy shows what the finished course must not: a check panel that is failing, not
implemented yet, stopped, or without tests (or a check that could not run), or an error output in
a cell not tagged ``raises-exception`` (Jupyter's tag for an error the notebook means to show).
Timing cells measured the machine that made the copy, under whatever else it was running.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"
EXECUTED_DIR = NOTEBOOK_DIR / "executed"
TESTS_DIR = REPO / "tests"
ASSETS_DIR = REPO / "sampling_course" / "assets"
METADATA_KEY = "sampling_course"
EXPECTED_ERROR_TAG = "raises-exception"  # nbclient's and Jupyter Book's tag for a cell meant to raise

# A check() or progress() call in a cell: its outputs are verdict panels.
CHECK_CELL = re.compile(r"\b(check|progress)\(")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# What a panel or a check's one-line error says when the finished course does not pass
# (sampling_course.grading.render and grading.checking): none may appear in an executed copy.
BAD_VERDICTS = ("tests failing", "Not implemented yet", "and was stopped", "No tests for this exercise yet",
                "error:", "First failure")


def source_hash(notebook: dict) -> str:
    """SHA-256 of a notebook's cells, type and source only: ids, metadata and outputs do not count."""
    cells = [[cell["cell_type"], "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]]
             for cell in notebook["cells"]]
    return hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode()).hexdigest()


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def notebook_key(name: str) -> str:
    """The inputs' key for a notebook's cells (its outputs are not an input)."""
    return f"notebooks/{name}#cells"


# ---------------------------------------------------------------------------------------
# What a run read: recorded inside the kernel by two hidden cells around the notebook's own
# ---------------------------------------------------------------------------------------

# Runs first, in the notebook's kernel: an audit hook notes every file opened under the repository,
# and pytest's sessions (one per check()) note the test files of the items they selected.
RECORDER = r"""
import os as _os, sys as _sys
_sc_repo = {repo!r}
_sc_opened, _sc_selected = set(), set()
def _sc_audit(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes)):
        path = _os.path.abspath(_os.fsdecode(args[0]))
        if path.startswith(_sc_repo):
            _sc_opened.add(path)
_sys.addaudithook(_sc_audit)
class _SCSelected:
    def pytest_collection_finish(self, session):
        _sc_selected.update(str(item.path) for item in session.items)
import pytest as _sc_pytest
_sc_main = _sc_pytest.main
def _sc_recording_main(args=None, plugins=None, **kwargs):
    return _sc_main(args, plugins=[*(plugins or []), _SCSelected()], **kwargs)
_sc_pytest.main = _sc_recording_main
# No progress bars: a bar's redraws would be stored as outputs. TQDM_DISABLE alone does not reach the notebook
# bars (tqdm.notebook sets disable=False itself when it is not given), so every tqdm is made with disable=True.
import tqdm.std as _sc_tqdm
_sc_tqdm_init = _sc_tqdm.tqdm.__init__
def _sc_quiet_init(self, *args, **kwargs):
    kwargs["disable"] = True
    _sc_tqdm_init(self, *args, **kwargs)
_sc_tqdm.tqdm.__init__ = _sc_quiet_init
"""
# Runs last: hands the two sets back as one line of JSON.
REPORTER = ('import json as _j, sampling_course as _sc; print(_j.dumps({"opened": sorted(_sc_opened), '
            '"selected": sorted(_sc_selected), "package": _sc.__file__}))')


def _bytecode_source(path: Path) -> Path:
    """solutions/__pycache__/x.cpython-312.pyc -> solutions/x.py (an import may open only the cache)."""
    if path.suffix == ".pyc" and path.parent.name == "__pycache__":
        return path.parent.parent / (path.name.split(".", 1)[0] + ".py")
    return path


def _test_helpers(files: set[Path]) -> set[Path]:
    """``files`` with the conftest.py files above them and the tests/ modules they import, transitively."""
    folders = {TESTS_DIR, TESTS_DIR / "grading", TESTS_DIR / "course", TESTS_DIR / "apps"}
    todo = set(files)
    for f in files:
        for parent in f.parents:
            if parent == TESTS_DIR.parent:
                break
            if (parent / "conftest.py").is_file():
                todo.add(parent / "conftest.py")
    done: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in done or not path.is_file():
            continue
        done.add(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                parts = name.split(".")
                if parts[0] == "tests":
                    parts = parts[1:]
                for folder in {path.parent, *folders}:
                    candidate = folder.joinpath(*parts).with_suffix(".py") if parts else None
                    if candidate is not None and candidate.is_file():
                        todo.add(candidate)
    return done


def inputs_of(name: str, opened: list[str], selected: list[str], cells: str) -> dict[str, str]:
    """The files a run of notebook ``name`` depended on -> their SHA-256 (see the module's docstring); ``cells`` is
    the hash of the cells it ran, taken when the run started (the notebook may be edited while it runs)."""
    files: set[Path] = set()
    for raw in opened:
        path = _bytecode_source(Path(raw))
        if ASSETS_DIR in path.parents and path.is_file():
            top = ASSETS_DIR / path.relative_to(ASSETS_DIR).parts[0]
            files.update(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else files.add(path)
        elif path.suffix == ".py" and path.is_file() and any(
                (REPO / code) in path.parents for code in ("solutions", "sampling_course")):
            files.add(path)
    files |= _test_helpers({Path(s) for s in selected if TESTS_DIR in Path(s).parents})
    inputs = {notebook_key(name): cells}
    inputs.update({str(p.relative_to(REPO)): file_hash(p) for p in sorted(files) if "__pycache__" not in p.parts})
    return inputs


# ---------------------------------------------------------------------------------------
# The check: no kernel, only hashes and the stored outputs
# ---------------------------------------------------------------------------------------


def _output_text(output: dict) -> str:
    if output.get("output_type") == "stream":
        text = output.get("text", "")
    else:
        text = output.get("data", {}).get("text/plain", "")
    return ANSI.sub("", "".join(text) if isinstance(text, list) else text)


def problems(name: str) -> list[str]:
    """Why the executed copy of notebook ``name`` cannot be trusted; empty when it can."""
    copy = EXECUTED_DIR / name
    if not copy.exists():
        return ["no executed copy"]
    executed = json.loads(copy.read_text())
    found = []
    if source_hash(executed) != source_hash(json.loads((NOTEBOOK_DIR / name).read_text())):
        found.append("the copy's cells are not the notebook's")
    inputs = executed.get("metadata", {}).get(METADATA_KEY, {}).get("inputs")
    if not inputs:
        found.append("the copy records no inputs (made by an older version of this script)")
    else:
        for key, digest in inputs.items():
            if key == notebook_key(name):
                now = source_hash(json.loads((NOTEBOOK_DIR / name).read_text()))
            else:
                path = REPO / key
                now = file_hash(path) if path.is_file() else None
            if now is None:
                found.append(f"{key} is gone")
            elif now != digest:
                found.append(f"{key} changed")
    for index, cell in enumerate(executed["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        tags = cell.get("metadata", {}).get("tags", [])
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error" and EXPECTED_ERROR_TAG not in tags:
                found.append(f"cell {index} shows an error ({output.get('ename')}) and is not tagged {EXPECTED_ERROR_TAG}")
        if CHECK_CELL.search(source):
            shown = "".join(_output_text(o) for o in cell.get("outputs", []))
            bad = [marker for marker in BAD_VERDICTS if marker in shown]
            if bad:
                found.append(f"cell {index} ({source.strip().splitlines()[-1][:60]}) shows {bad[0]!r}")
    return found


# ---------------------------------------------------------------------------------------
# Executing
# ---------------------------------------------------------------------------------------


def execute(name: str, timeout: int) -> float:
    """Run notebook ``name`` in a fresh kernel and write its executed copy; returns the seconds it took."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    cells = source_hash(nb)  # what runs: the notebook as read now, whatever happens to its file meanwhile
    own = len(nb.cells)
    nb.cells.insert(0, nbformat.v4.new_code_cell(RECORDER.format(repo=str(REPO) + os.sep)))
    nb.cells.append(nbformat.v4.new_code_cell(REPORTER))
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "kernels" / "python3"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (sampling-course)", "language": "python",
        }))
        km = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)]))
        client = NotebookClient(nb, km=km, kernel_name="python3", timeout=timeout, record_timing=False,
                                resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
        start = time.perf_counter()
        try:
            client.execute()  # raises CellExecutionError at the first failing untagged cell: no copy then
        finally:
            if km.has_kernel:  # each notebook's kernel ends with it
                km.shutdown_kernel(now=True)
    seconds = time.perf_counter() - start
    record = json.loads(next(o["text"] for o in nb.cells[-1].outputs if o.get("output_type") == "stream"))
    if Path(record["package"]).resolve().parent != REPO / "sampling_course":
        raise RuntimeError(f"the kernel imported the course from {record['package']}, not from {REPO}: install this "
                           "checkout (pip install -e .) or put it first on PYTHONPATH")
    nb.cells = nb.cells[1:-1]  # the hidden cells go; the notebook's own cells are numbered from 1
    assert len(nb.cells) == own
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.execution_count:
            cell.execution_count -= 1
            for output in cell.outputs:
                if "execution_count" in output:
                    output["execution_count"] = cell.execution_count
    nb.metadata[METADATA_KEY] = {
        "inputs": inputs_of(name, record["opened"], record["selected"], cells),
        "executed_with": "solutions/, CPU, offline story model (scripts/execute_notebooks.py)",
    }
    EXECUTED_DIR.mkdir(exist_ok=True)
    partial = EXECUTED_DIR / f".{name}.partial"
    nbformat.write(nb, partial)
    partial.replace(EXECUTED_DIR / name)  # a reader never sees half a copy
    return seconds


def _environment(tmp: str) -> dict[str, str]:
    """The kernel's environment: the solutions, the CPU, no GPT-2 (the story model), no progress bars."""
    return {**os.environ, "SAMPLING_COURSE_IMPL": "solutions", "SAMPLING_COURSE_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1", "TQDM_DISABLE": "1",
            "HF_HOME": str(Path(tmp) / "hf")}  # an empty cache: GPT-2 is unavailable


def _run_one(name: str, timeout: int, tmp: str) -> tuple[str, int, str]:
    """Executes one notebook in its own process (nbclient's event loop is per process): (name, status, output)."""
    done = subprocess.run([sys.executable, __file__, "--one", name, "--timeout", str(timeout)], env=_environment(tmp),
                          capture_output=True, text=True)
    return name, done.returncode, (done.stdout + done.stderr).strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="notebooks to execute or check (default: all)")
    parser.add_argument("--all", action="store_true", help="every notebook (the default when none is named)")
    parser.add_argument("--check", action="store_true", help="list the copies that are stale or show a failure; exit 1 if any")
    parser.add_argument("--stale", action="store_true", help="execute only the notebooks whose copy --check rejects")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks executed at once (default 2)")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds a cell may run (default 1200)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the worker: executes one notebook in this process
    args = parser.parse_args(argv)

    if args.one:
        seconds = execute(args.one, args.timeout)
        print(f"{args.one}: {seconds:.0f} s")
        return 0
    every = sorted(p.name for p in NOTEBOOK_DIR.glob("*.ipynb"))
    names = [n if n.endswith(".ipynb") else f"{n}.ipynb" for n in args.names]
    unknown = [n for n in names if n not in every]
    if unknown:
        parser.error(f"no such notebook in notebooks/: {', '.join(unknown)}; the notebooks are {', '.join(every)}")
    if args.all or not names:  # no names: every notebook
        names = every
    if args.check or args.stale:
        found = {name: problems(name) for name in names}
        if args.check:
            for name in names:
                print(f"{'stale  ' if found[name] else 'current'}  {name}" + "".join(f"\n         {p}" for p in found[name]))
            return 1 if any(found.values()) else 0
        names = [name for name in names if found[name]]

    failed = []
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        print(f"executing {len(names)} notebook(s), {args.jobs} at a time", flush=True)
        for name, status, output in pool.map(lambda n: _run_one(n, args.timeout, tmp), names):
            print(output if status == 0 else f"{name}: FAILED, no copy written\n{output[-3000:]}", flush=True)
            if status != 0:
                failed.append(name)
    shown = {name: problems(name) for name in names if name not in failed}
    for name, found in shown.items():
        for problem in found:
            print(f"{name}: {problem}")
    return 1 if failed or any(shown.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
