"""The course notebooks: stored clean, complete, free of solutions, and runnable top to bottom.

The fast tests read the notebooks as JSON. The ``notebooks``-marked tests execute every
notebook with nbclient against the solutions (``SAMPLING_COURSE_IMPL=solutions``) in a
fresh kernel running this interpreter, fail on the first cell error, and report each
notebook's execution time. Deselect them with ``-m "not notebooks"``.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from pathlib import Path

import pytest

from sampling_course.grading.course import EXERCISES, get_exercise
from sampling_course.grading.lean_imports import import_jsonschema
from sampling_course.grading.stubs import BEGIN_MARKER, END_MARKER

import_jsonschema()  # nbformat imports jsonschema: this makes that import lean
import nbformat  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = REPO / "notebooks"
SOLUTIONS_DIR = REPO / "solutions"

# Course part -> notebook file.
NOTEBOOKS = {
    1: "01_transformer_from_scratch.ipynb",
    2: "02_sampling.ipynb",
    3: "03_beam_search.ipynb",
    4: "04_kv_cache.ipynb",
    5: "05_generation_engine.ipynb",
    6: "06_caches.ipynb",
    7: "07_speculative_decoding.ipynb",
    8: "08_structured_generation.ipynb",
    9: "09_modern_decoders.ipynb",
    10: "10_serving.ipynb",
    11: "11_quantisation.ipynb",
}
# A part's exercises of one module may have a notebook of their own, after the part's:
# notebook -> (part, module). Part 6's GPU lesson (exercises/gpu_decoding.py).
MODULE_NOTEBOOKS = {"06b_gpu_decoding.ipynb": (6, "gpu_decoding")}
# Or a part's named exercises: notebook -> (part, exercises). Part 5b: the sampler chain and penalties,
# after part 5's engine.
EXERCISE_NOTEBOOKS = {
    "05b_sampler_chain.ipynb": (5, (
        "typical_filter", "epsilon_filter", "eta_filter", "top_n_sigma_filter", "xtc_filter", "mirostat_step",
        "apply_repetition_penalty", "apply_presence_and_frequency_penalty", "apply_dry_penalty", "ban_bad_words",
    )),
}
ALL_NOTEBOOKS = sorted([*NOTEBOOKS.values(), *MODULE_NOTEBOOKS, *EXERCISE_NOTEBOOKS])
NOTEBOOK_PART = ({name: part for part, name in NOTEBOOKS.items()} | {name: p for name, (p, _) in MODULE_NOTEBOOKS.items()}
                 | {name: p for name, (p, _) in EXERCISE_NOTEBOOKS.items()})

# How each notebook gets its models, on the device it picked: the reference chosen by "auto",
# except in part 7, which needs a target and a draft (the story pair, or a labelled stand-in pair).
MODEL_LOADING = {name: 'load_reference("auto", device=DEVICE)' for name in ALL_NOTEBOOKS}
MODEL_LOADING["07_speculative_decoding.ipynb"] = "load_pair(EARLIER_IMPL, device=DEVICE)"


def checked_in(name: str) -> list[str]:
    """The exercises notebook ``name`` checks, in course order."""
    part = NOTEBOOK_PART[name]
    if name in EXERCISE_NOTEBOOKS:
        return [e.name for e in EXERCISES if e.name in EXERCISE_NOTEBOOKS[name][1]]
    own_module = MODULE_NOTEBOOKS.get(name, (part, None))[1]
    elsewhere = {module for p, module in MODULE_NOTEBOOKS.values() if p == part}
    taken = {n for p, names in EXERCISE_NOTEBOOKS.values() if p == part for n in names}
    return [e.name for e in EXERCISES if e.part == part and e.name not in taken
            and (e.module == own_module if own_module else e.module not in elsewhere)]


def test_every_exercise_given_its_own_notebook_exists():
    names = {e.name for e in EXERCISES}
    for notebook, (part, exercises) in EXERCISE_NOTEBOOKS.items():
        missing = [n for n in exercises if n not in names or get_exercise(n).part != part]
        assert not missing, f"{notebook} names exercises that part {part} does not have: {missing}"

CHECK_CALL = re.compile(r"""\bcheck\(\s*["']([^"']+)["']([^)]*)\)""")


def load(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOK_DIR / name, as_version=4)


def code_cells(nb: nbformat.NotebookNode) -> list[str]:
    return [cell.source for cell in nb.cells if cell.cell_type == "code"]


def solution_lines() -> dict[str, str]:
    """Every non-trivial line inside a solution region of solutions/*.py -> where it comes from."""
    lines: dict[str, str] = {}
    for path in sorted(SOLUTIONS_DIR.glob("*.py")):
        inside = False
        for number, raw in enumerate(path.read_text().splitlines(), start=1):
            line = raw.strip()
            if line.startswith(BEGIN_MARKER):
                inside = True
            elif line.startswith(END_MARKER):
                inside = False
            elif inside and len(line) >= 16 and not line.startswith("#"):
                lines[line] = f"{path.name}:{number}"
    return lines


# ---------------------------------------------------------------------------------------
# Fast: how the notebooks are stored
# ---------------------------------------------------------------------------------------


# Parts whose exercises and tests exist but whose notebook is still to be written.
NOTEBOOK_PENDING: set[int] = set()


def test_every_part_has_its_notebook():
    parts = sorted({e.part for e in EXERCISES} - NOTEBOOK_PENDING)
    assert parts == sorted(NOTEBOOKS), f"course parts {parts}, notebooks for {sorted(NOTEBOOKS)}"
    found = sorted(p.name for p in NOTEBOOK_DIR.glob("*.ipynb"))
    assert found == ALL_NOTEBOOKS, f"unexpected notebooks in notebooks/: {found}"


@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_notebook_is_valid_and_stored_without_outputs(name):
    nb = load(name)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{name}: kernelspec must be python3"
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert cell.outputs == [], f"{name}: code cell {index} is stored with outputs; clear them"
        assert cell.execution_count is None, f"{name}: code cell {index} has an execution_count; clear it"


@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_notebook_checks_every_exercise_of_its_part(name):
    """One ``check("<exercise>", impl=IMPL)`` per exercise, in course order, and no check of another part
    (the exercises of a module with a notebook of their own are checked there)."""
    calls = [m for source in code_cells(load(name)) for m in CHECK_CALL.finditer(source)]
    checked = [m.group(1) for m in calls]
    expected = checked_in(name)
    assert checked == expected, f"{name}: check() cells for {checked}, expected {expected}"
    for m in calls:
        # check() grades exercises/ unless told otherwise: it must grade what the notebook runs.
        assert "impl=IMPL" in m.group(2), f"{name}: {m.group(0)} must pass impl=IMPL"


@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_notebook_selects_the_implementation_from_the_environment(name):
    setup = "\n".join(code_cells(load(name)))
    assert 'IMPL = os.environ.get("SAMPLING_COURSE_IMPL", "exercises")' in setup
    assert MODEL_LOADING[name] in setup
    # Learner code is imported from the chosen package, never from a fixed one.
    assert not re.search(r"^\s*(from|import) (solutions|exercises)\b", setup, re.MULTILINE), (
        f"{name} imports solutions/ or exercises/ directly; use importlib with IMPL"
    )


REPO_URL = re.compile(r'"SAMPLING_COURSE_REPO", "(https://[^"]+)"')


@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_the_first_cell_installs_the_course_picks_the_device_and_prints_it(name):
    """Colab-ready: the first code cell installs the course from its repository when it is not installed (the
    same repository everywhere, the README's), picks the device by the course's rule, and prints it."""
    first = code_cells(load(name))[0]
    assert 'importlib.util.find_spec("sampling_course") is None' in first and '"pip", "install"' in first
    urls = set(REPO_URL.findall(first))
    readme_urls = set(re.findall(r"https://[^\s)`\"]+", (REPO / "README.md").read_text()))
    assert len(urls) == 1 and urls <= readme_urls, (
        f"{name}: the first cell installs from {urls}; the README's Colab section must name the same repository"
    )
    assert "DEVICE = pick_device()" in first and 'print(f"device: {DEVICE}")' in first


@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_notebook_holds_no_solution_code(name):
    nb = load(name)
    text = json.dumps(nb)
    assert BEGIN_MARKER not in text and END_MARKER not in text, f"{name} contains solution markers"
    lines = solution_lines()
    assert len(lines) > 50, "found too few solution lines in solutions/*.py to compare with"
    for index, source in enumerate(code_cells(nb)):
        for line in source.splitlines():
            where = lines.get(line.strip())
            assert where is None, f"{name}: code cell {index} copies a solution line ({where}): {line.strip()!r}"


def executed_copies():
    """scripts/execute_notebooks.py, loaded from its file (scripts/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("execute_notebooks", REPO / "scripts" / "execute_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Executed copies are for reading: plots as PNG, no huge tensors printed.
EXECUTED_COPY_MAX_BYTES = 3_000_000


@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_executed_copy_is_current(name):
    """notebooks/executed/<name> was made from the present notebook, solutions, tests and assets it ran, and shows
    no failing panel and no unexpected error: ``python scripts/execute_notebooks.py --check``, one notebook
    (``python scripts/execute_notebooks.py --stale`` makes the rejected copies again)."""
    script = executed_copies()
    problems = script.problems(name)
    assert not problems, (f"the executed copy of {name} cannot be trusted: {'; '.join(problems)}. "
                          f"Run python scripts/execute_notebooks.py {name}")
    copy = script.EXECUTED_DIR / name
    executed = nbformat.read(copy, as_version=4)
    assert [c.source for c in executed.cells] == [c.source for c in load(name).cells]
    assert copy.stat().st_size <= EXECUTED_COPY_MAX_BYTES, f"the executed copy of {name} is {copy.stat().st_size:,} bytes"


def test_source_hash_sees_the_cells_and_nothing_else():
    script = executed_copies()
    nb = json.loads((NOTEBOOK_DIR / ALL_NOTEBOOKS[0]).read_text())
    before = script.source_hash(nb)
    nb["cells"][0]["id"] = "changed"
    nb["metadata"]["something"] = 1
    assert script.source_hash(nb) == before
    nb["cells"][0]["source"] = ["an edit"]
    assert script.source_hash(nb) != before


@pytest.fixture
def small_repo(tmp_path, monkeypatch):
    """scripts/execute_notebooks.py pointed at a repository of a few files: one notebook, its copy, solutions,
    tests (one test file, its conftest and helper, and a test file the notebook never ran) and assets."""
    script = executed_copies()
    files = {
        "solutions/a.py": "A = 1\n", "solutions/unused.py": "B = 2\n",
        "tests/conftest.py": "", "tests/doubles.py": "D = 1\n", "tests/unrelated.py": "",
        "tests/grading/test_a.py": "from doubles import D\nimport os\n", "tests/grading/test_b.py": "",
        "sampling_course/assets/model/config.json": "{}", "sampling_course/assets/model/weights.bin": "w",
        "sampling_course/assets/other/config.json": "{}",
        "sampling_course/lab.py": "L = 1\n", "sampling_course/unused.py": "U = 1\n",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    for name, value in dict(REPO=tmp_path, NOTEBOOK_DIR=tmp_path / "notebooks", EXECUTED_DIR=tmp_path / "notebooks" / "executed",
                            TESTS_DIR=tmp_path / "tests", ASSETS_DIR=tmp_path / "sampling_course" / "assets").items():
        monkeypatch.setattr(script, name, value)
    (tmp_path / "notebooks" / "executed").mkdir(parents=True)
    check_cell = nbformat.v4.new_code_cell('check("A", impl=IMPL);')
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A"), check_cell])
    nbformat.write(nb, tmp_path / "notebooks" / "a.ipynb")
    opened = [tmp_path / "solutions" / "__pycache__" / "a.cpython-312.pyc", tmp_path / "sampling_course/assets/model/config.json",
              tmp_path / "sampling_course" / "__pycache__" / "lab.cpython-312.pyc",
              tmp_path / "tests" / "grading" / "test_b.py"]  # collected, never selected: not an input
    inputs = script.inputs_of("a.ipynb", [str(p) for p in opened], [str(tmp_path / "tests/grading/test_a.py")],
                              script.source_hash(nb))
    check_cell.outputs = [nbformat.v4.new_output("display_data", {"text/plain": "\x1b[32m✓ All 3 tests passed.\x1b[0m"})]
    nb.metadata[script.METADATA_KEY] = {"inputs": inputs}
    nbformat.write(nb, tmp_path / "notebooks" / "executed" / "a.ipynb")
    return script, tmp_path, inputs


def test_a_copy_records_what_its_run_read(small_repo):
    script, _, inputs = small_repo
    assert sorted(inputs) == ["notebooks/a.ipynb#cells", "sampling_course/assets/model/config.json",
                              "sampling_course/assets/model/weights.bin",  # its folder was read: native code reads the rest
                              "sampling_course/lab.py",  # the course's own code a cell ran (a bench, a lab, the grader)
                              "solutions/a.py",  # imported from its cached bytecode
                              "tests/conftest.py", "tests/doubles.py", "tests/grading/test_a.py"]
    assert script.problems("a.ipynb") == []


@pytest.mark.parametrize("path, stale", [
    ("solutions/a.py", True), ("tests/doubles.py", True), ("tests/conftest.py", True),
    ("sampling_course/assets/model/weights.bin", True),
    ("solutions/unused.py", False), ("tests/grading/test_b.py", False), ("tests/unrelated.py", False),
    ("sampling_course/assets/other/config.json", False),
    ("sampling_course/lab.py", True), ("sampling_course/unused.py", False),
])
def test_the_check_fails_when_an_input_changed_and_only_then(small_repo, path, stale):
    script, root, _ = small_repo
    (root / path).write_text((root / path).read_text() + "# an edit\n")
    assert bool(script.problems("a.ipynb")) is stale, script.problems("a.ipynb")
    if stale:
        assert script.problems("a.ipynb") == [f"{path} changed"]


def test_the_check_fails_when_the_cells_change_or_an_input_is_gone(small_repo):
    script, root, _ = small_repo
    (root / "tests" / "doubles.py").unlink()
    assert script.problems("a.ipynb") == ["tests/doubles.py is gone"]
    nb = nbformat.read(root / "notebooks" / "a.ipynb", as_version=4)
    nb.cells[0].source = "# B"
    nbformat.write(nb, root / "notebooks" / "a.ipynb")
    assert {"notebooks/a.ipynb#cells changed", "the copy's cells are not the notebook's"} <= set(script.problems("a.ipynb"))


def test_the_check_compares_the_copys_own_cells_with_the_notebook(small_repo):
    """A notebook edited while it ran: the record may name the new cells, the copy holds the old ones."""
    script, root, _ = small_repo
    copy = root / "notebooks" / "executed" / "a.ipynb"
    nb = nbformat.read(copy, as_version=4)
    nb.cells[0].source = "# what ran"
    nbformat.write(nb, copy)
    assert script.problems("a.ipynb") == ["the copy's cells are not the notebook's"]


@pytest.mark.parametrize("shown", ["✗ 1 of 3 tests failing  (2 passed)", "… Not implemented yet: A", "error: no tests/",
                                   "✗ Took longer than 60 s and was stopped"])
def test_the_check_fails_on_a_panel_that_does_not_pass(small_repo, shown):
    script, root, _ = small_repo
    copy = root / "notebooks" / "executed" / "a.ipynb"
    nb = nbformat.read(copy, as_version=4)
    nb.cells[1].outputs = [nbformat.v4.new_output("display_data", {"text/plain": f"\x1b[31m{shown}\x1b[0m"})]
    nbformat.write(nb, copy)
    assert [p for p in script.problems("a.ipynb") if "shows" in p], shown


def test_the_check_fails_on_an_error_the_notebook_does_not_expect(small_repo):
    script, root, _ = small_repo
    copy = root / "notebooks" / "executed" / "a.ipynb"
    nb = nbformat.read(copy, as_version=4)
    nb.cells[1].outputs.append(nbformat.v4.new_output("error", ename="ValueError", evalue="x", traceback=[]))
    nbformat.write(nb, copy)
    assert script.problems("a.ipynb") == [f"cell 1 shows an error (ValueError) and is not tagged {script.EXPECTED_ERROR_TAG}"]
    nb.cells[1].metadata["tags"] = [script.EXPECTED_ERROR_TAG]
    nbformat.write(nb, copy)
    assert script.problems("a.ipynb") == []


def test_a_copy_without_recorded_inputs_is_stale(small_repo):
    script, root, _ = small_repo
    copy = root / "notebooks" / "executed" / "a.ipynb"
    nb = nbformat.read(copy, as_version=4)
    nb.metadata[script.METADATA_KEY] = {"source_hash": "what the copies recorded before"}
    nbformat.write(nb, copy)
    assert script.problems("a.ipynb") == ["the copy records no inputs (made by an older version of this script)"]


# ---------------------------------------------------------------------------------------
# Slow: run every notebook top to bottom against the solutions
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kernel_spec_dir(tmp_path_factory) -> Path:
    """A "python3" kernelspec that runs *this* interpreter, whatever else is installed."""
    root = tmp_path_factory.mktemp("kernels")
    spec = root / "python3"
    spec.mkdir()
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (sampling-course tests)",
        "language": "python",
    }))
    return root


@pytest.fixture(scope="module")
def timings(request):
    """Collects each notebook's execution time and prints them at the end of the module."""
    collected: dict[str, float] = {}
    yield collected
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if collected and reporter is not None:
        # Straight to the terminal, past pytest's output capture.
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            reporter.write_line("")
            for name, seconds in collected.items():
                reporter.write_line(f"notebook {name}: executed in {seconds:.1f} s")


def _text_of(outputs) -> str:
    parts = []
    for output in outputs:
        if output.get("output_type") == "stream":
            parts.append(output.get("text", ""))
        elif "data" in output:
            parts.append(output["data"].get("text/plain", ""))
        elif output.get("output_type") == "error":
            parts.append("\n".join(output.get("traceback", [])))
    return "".join(parts)


@pytest.mark.notebooks
@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_notebook_runs_top_to_bottom(name, kernel_spec_dir, timings, monkeypatch, pytestconfig, record_property):
    if pytestconfig.getoption("--impl") != "solutions":
        pytest.skip("the notebooks are executed against the solutions only (run without --impl exercises)")
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    # The kernel subprocess inherits this environment.
    monkeypatch.setenv("SAMPLING_COURSE_IMPL", "solutions")
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # quiets a debugger warning on stderr
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)

    nb = load(name)
    # One extra cell at the end records which interpreter ran the notebook.
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable)"))
    km = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_spec_dir)]))
    client = NotebookClient(nb, km=km, kernel_name="python3", timeout=600,
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    start = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as exc:
        pytest.fail(f"{name} failed while running against solutions/:\n{exc}", pytrace=False)
    finally:
        if km.has_kernel:  # each notebook's kernel ends with its test
            km.shutdown_kernel(now=True)
    seconds = time.perf_counter() - start
    timings[name] = seconds
    record_property("execution_seconds", round(seconds, 1))

    assert _text_of(nb.cells[-1].outputs).strip() == sys.executable, "the notebook ran on another interpreter"
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.get("output_type") == "error"]
        assert not errors, f"{name}: code cell {index} raised {errors[0].get('ename')}"
        if CHECK_CALL.search(cell.source):
            # Every check must grade solutions/ here, and the solutions must pass.
            shown = _text_of(cell.outputs)
            for bad in ("Not implemented yet", "tests failing", "First failure"):
                if bad in shown:
                    panel = shown[max(0, shown.index(bad) - 200) :][:1200]
                    pytest.fail(f"{name}: {cell.source.strip()} reports {bad!r} on solutions/:\n{panel}", pytrace=False)
            assert "passed" in shown, f"{name}: {cell.source.strip()} did not report passing tests:\n{shown[-1200:]}"


def test_the_first_cell_clones_and_installs_the_course_where_it_is_missing(monkeypatch, tmp_path):
    """The install block, run where sampling_course cannot be imported (as on Colab): it clones the repository
    (once), installs it editable with this interpreter's pip, and makes it importable without a restart."""
    import importlib.util
    import subprocess

    block = code_cells(load(ALL_NOTEBOOKS[0]))[0].split("%load_ext", 1)[0]
    commands = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    monkeypatch.setattr(subprocess, "run", lambda command, check: commands.append(command))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("SAMPLING_COURSE_REPO", "https://example.org/fork")
    exec(compile(block, "first cell", "exec"), {})
    assert commands == [
        ["git", "clone", "--depth", "1", "https://example.org/fork", "sampling-course"],
        [sys.executable, "-m", "pip", "install", "-q", "-e", "sampling-course"],
    ]
    assert sys.path[0] == str(tmp_path / "sampling-course")
    (tmp_path / "sampling-course").mkdir()  # run again: already cloned, so only the install
    commands.clear()
    exec(compile(block, "first cell", "exec"), {})
    assert [c[0] for c in commands] == [sys.executable]
