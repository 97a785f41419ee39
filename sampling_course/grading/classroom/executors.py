"""Map ``grade_submission`` over a class: in this process, a local process pool, or a Dask cluster.

Grading is one pure function from a submission to its result, so any executor can map it:

* ``jobs=1``: one after another;
* ``jobs=N``: a pool of N processes on this machine;
* ``scheduler=ADDRESS`` (or a ``distributed.Client``): the tasks go to a Dask cluster. Each
  submission travels to the cluster as the bytes of a zip of its exercise files, so the
  workers need the course installed (``pip install -e '.[grading]'``) but not the
  submissions; the results come back as plain data. Each worker process grades one
  submission at a time (a lock serialises them when it runs several threads).

Whatever the executor, each submission is graded in a grading process of its own, forked for
it (``isolated``) and ended after it: what one submission does to the grader's state (a cached
reference model, a tokenizer's settings) cannot reach another's grade. A grading process that
fails gives that submission an ``error`` result instead of stopping the class.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import tempfile
import threading
import traceback
import zipfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from sampling_course.grading.classroom.grade import grade_submission
from sampling_course.grading.classroom.settings import GradeSettings
from sampling_course.grading.classroom.submission import module_names

__all__ = ["grade_all", "grade_packed", "pack"]

_ONE_AT_A_TIME = threading.Lock()  # a grading session changes sys.modules: one per process at a time


def pack(submission: Path) -> bytes:
    """The submission's ``.py`` files as the bytes of a zip (what travels to a cluster)."""
    submission = Path(submission)
    if submission.is_file():
        return submission.read_bytes()
    buffer = io.BytesIO()
    wanted = {f"{name}.py" for name in module_names()}
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(submission.rglob("*.py")):
            if path.name in wanted and path.is_file() and not path.is_symlink():
                zf.write(path, path.relative_to(submission))
    return buffer.getvalue()


def grade_packed(student: str, data: bytes, settings: GradeSettings, tests: str | None = None) -> dict[str, Any]:
    """``grade_submission`` for a submission given as zip bytes (``pack``); runs on a cluster's worker."""
    with _ONE_AT_A_TIME, tempfile.TemporaryDirectory(prefix="sampling-course-packed-") as folder:
        archive = Path(folder) / "submission.zip"
        archive.write_bytes(data)
        result = isolated(grade_submission, archive, settings, student=student, tests=tests)
        result["submission"] = student
        return result


def _safely(student: str, path: Path, settings: GradeSettings, tests: str | None) -> dict[str, Any]:
    try:
        with _ONE_AT_A_TIME:
            return isolated(grade_submission, path, settings, student=student, tests=tests)
    except Exception:  # noqa: BLE001 - one submission's failure must not stop the class
        return _failed(student, path, settings, traceback.format_exc(limit=3))


def isolated(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` in a forked child of this process, its result pickled back through a pipe.

    The child starts with everything this process has loaded (torch, the tests' imports) and
    ends when the function returns, taking whatever it changed with it.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        code = 0
        try:
            data = pickle.dumps(("ok", function(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - carried to the parent as text
            data, code = pickle.dumps(("error", f"{type(exc).__name__}: {exc}")), 1
        with os.fdopen(write_end, "wb") as out:
            out.write(data)
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as incoming:
        data = incoming.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise RuntimeError(f"the grading process ended without a result (exit status {status})")
    kind, value = pickle.loads(data)  # noqa: S301 - our own child wrote it (a submission's code never runs in it)
    if kind != "ok":
        raise RuntimeError(value)
    return value


def _failed(student: str, path: Path | str, settings: GradeSettings, why: str) -> dict[str, Any]:
    from sampling_course.grading.classroom.grade import not_graded

    why = f"the grader failed on this submission: {why.strip().splitlines()[-1][:300] if why.strip() else why}"
    return {"student": student, "submission": str(path), "flags": [], "notes": [], "sandbox": {}, "error": why,
            "exercises": [not_graded(n, settings, why) for n in settings.exercises], "score": 0.0,
            "max_score": settings.max_score, "seconds": 0.0}


def _pool_init() -> None:
    import torch

    torch.set_num_threads(1)


def grade_all(submissions: list[tuple[str, Path]], settings: GradeSettings, *, jobs: int = 1,
              scheduler: Any = None, tests: str | Path | None = None,
              progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Grade every ``(student, path)``; results in the order given. ``progress`` is called with each result."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    tests = str(tests) if tests else None
    done: dict[str, dict[str, Any]] = {}

    def finish(student: str, result: dict[str, Any]) -> None:
        done[student] = result
        if progress is not None:
            progress(result)

    if scheduler is not None:
        _on_dask(submissions, settings, scheduler, tests, finish)
    elif jobs == 1 or len(submissions) == 1:
        for student, path in submissions:
            finish(student, _safely(student, path, settings, tests))
    else:
        context = multiprocessing.get_context("spawn")  # a clean interpreter, whatever this one imported
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_pool_init) as pool:
            futures = {pool.submit(_safely, student, path, settings, tests): (student, path)
                       for student, path in submissions}
            for future in as_completed(futures):
                student, path = futures[future]
                try:
                    finish(student, future.result())
                except Exception as exc:  # noqa: BLE001 - the grading process itself died
                    finish(student, _failed(student, path, settings, f"{type(exc).__name__}: {exc}"))
    return [done[student] for student, _ in submissions]


def _on_dask(submissions: list[tuple[str, Path]], settings: GradeSettings, scheduler: Any, tests: str | None,
             finish: Callable[[str, dict[str, Any]], None]) -> None:
    try:
        from distributed import Client, as_completed as dask_completed
    except ImportError:
        raise RuntimeError("grading on a Dask cluster needs the grading extra: "
                           "pip install -c constraints.txt -e '.[grading]'") from None
    client = scheduler if isinstance(scheduler, Client) else Client(scheduler)
    try:
        futures = {}
        for student, path in submissions:
            future = client.submit(grade_packed, student, pack(path), settings, tests, pure=False,
                                   key=f"grade-{student}-{id(path)}")
            futures[future] = (student, path)
        for future in dask_completed(futures):
            student, path = futures[future]
            try:
                finish(student, future.result())
            except Exception as exc:  # noqa: BLE001
                finish(student, _failed(student, path, settings, f"{type(exc).__name__}: {exc}"))
    finally:
        if client is not scheduler:
            client.close()
