"""Write the executed copies of the course notebooks: notebooks/executed/<name>, outputs included.

    python scripts/execute_notebooks.py                       # every notebook (about 25 minutes)
    python scripts/execute_notebooks.py 05_generation_engine  # only those named (with or without .ipynb)
    python scripts/execute_notebooks.py --check               # which executed copies are missing or stale

Each notebook runs top to bottom against the solutions (``SAMPLING_COURSE_IMPL=solutions``) on
the CPU, with the offline story model (GPT-2 is hidden from it: an empty Hugging Face cache and
no hub), in a fresh kernel running this interpreter. A learner reads the copies without running
anything: every table, plot and check panel as the finished course shows them.

Each copy records, in its metadata, a hash of its notebook's cells (type and source): the fast
test ``test_executed_copy_is_current`` fails when a notebook changed and its copy did not.
Timing cells measured this machine, under whatever else it was running.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"
EXECUTED_DIR = NOTEBOOK_DIR / "executed"
METADATA_KEY = "sampling_course"


def source_hash(notebook: dict) -> str:
    """SHA-256 of a notebook's cells, type and source only: ids, metadata and outputs do not count."""
    cells = [[cell["cell_type"], "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]]
             for cell in notebook["cells"]]
    return hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode()).hexdigest()


def stale(names: list[str]) -> list[str]:
    """The notebooks among ``names`` whose executed copy is missing or was made from other cells."""
    out = []
    for name in names:
        copy = EXECUTED_DIR / name
        source = json.loads((NOTEBOOK_DIR / name).read_text())
        if not copy.exists():
            out.append(name)
            continue
        recorded = json.loads(copy.read_text()).get("metadata", {}).get(METADATA_KEY, {}).get("source_hash")
        if recorded != source_hash(source):
            out.append(name)
    return out


def execute(name: str, kernel_dir: Path, timeout: int) -> float:
    """Run notebook ``name`` and write its executed copy; returns the seconds it took."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    digest = source_hash(json.loads((NOTEBOOK_DIR / name).read_text()))
    km = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)]))
    client = NotebookClient(nb, km=km, kernel_name="python3", timeout=timeout, record_timing=False,
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    start = time.perf_counter()
    try:
        client.execute()  # raises CellExecutionError at the first failing cell: no copy is written then
    finally:
        if km.has_kernel:  # each notebook's kernel ends with it
            km.shutdown_kernel(now=True)
    seconds = time.perf_counter() - start
    nb.metadata[METADATA_KEY] = {
        "source_hash": digest,
        "executed_with": "solutions/, CPU, offline story model (scripts/execute_notebooks.py)",
    }
    EXECUTED_DIR.mkdir(exist_ok=True)
    nbformat.write(nb, EXECUTED_DIR / name)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="notebooks to execute (default: all)")
    parser.add_argument("--check", action="store_true", help="list the missing or stale copies and exit 1 if any")
    parser.add_argument("--stale", action="store_true", help="execute only the notebooks whose copy is missing or stale")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds a cell may run (default 1200)")
    args = parser.parse_args(argv)

    every = sorted(p.name for p in NOTEBOOK_DIR.glob("*.ipynb"))
    names = [n if n.endswith(".ipynb") else f"{n}.ipynb" for n in args.names] or every
    unknown = [n for n in names if n not in every]
    if unknown:
        parser.error(f"no such notebook in notebooks/: {', '.join(unknown)}; the notebooks are {', '.join(every)}")
    if args.check:
        old = stale(names)
        for name in names:
            print(f"{'stale  ' if name in old else 'current'}  {name}")
        return 1 if old else 0
    if args.stale:
        names = stale(names)

    # The kernel inherits this environment: the solutions, the CPU, and no GPT-2 (the story model).
    os.environ.update(SAMPLING_COURSE_IMPL="solutions", SAMPLING_COURSE_DEVICE="cpu", HF_HUB_OFFLINE="1",
                      TRANSFORMERS_OFFLINE="1", PYDEVD_DISABLE_FILE_VALIDATION="1")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HF_HOME"] = str(Path(tmp) / "hf")  # an empty cache: GPT-2 is unavailable
        spec = Path(tmp) / "kernels" / "python3"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (sampling-course)", "language": "python",
        }))
        for name in names:
            print(f"{name}: executing...", flush=True)
            seconds = execute(name, spec.parent, args.timeout)
            size = (EXECUTED_DIR / name).stat().st_size
            print(f"{name}: {seconds:.0f} s, {size / 1e6:.2f} MB -> {(EXECUTED_DIR / name).relative_to(REPO)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
