"""How ``progress`` gets every exercise's verdict: reused where nothing changed, the rest run on the cores it has.

Stored verdicts come from ``grading.verdicts``. The exercises left to run are split over
``jobs`` worker processes (each a fresh Python running ``run_report`` on its share, in
course order, round robin so that each part's expensive tests are spread out), whose
results come back as JSON on their last line of output; with one job they run in this
process. Every new verdict is stored for the next run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sampling_course.grading.course import EXERCISES, Exercise
from sampling_course.grading.results import CheckReport, Result
from sampling_course.grading.verdicts import VerdictStore, course_key, package_digests, result_from_json, result_to_json

# A worker: run_report on the exercises named on its command line, then one line of JSON.
_WORKER = """
import json, sys
from sampling_course.grading.runner import run_report
from sampling_course.grading.verdicts import result_to_json
impl, device, threads, *names = sys.argv[1:]
report = run_report(names, impl, diagnose=False, device=device or None, threads=int(threads) if threads else None)
print(json.dumps({"results": [result_to_json(r) for r in report.results], "error": report.error,
                  "broken": report.broken, "collection_errors": report.collection_errors, "notices": report.notices,
                  "imported": {k: sorted(v) for k, v in report.imported.items()}}))
"""


def _in_workers(names: list[str], impl: str, device: str | None, threads: int | None, jobs: int) -> CheckReport:
    """``run_report`` of ``names`` split over ``jobs`` processes, merged into one report."""
    groups = [names[i::jobs] for i in range(jobs)]
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, impl, device or "", str(threads or ""), *group],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for group in groups if group]
    merged = CheckReport([], impl=impl)
    for proc in procs:
        out, err = proc.communicate()
        try:
            data = json.loads(out.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise RuntimeError(f"a progress worker stopped (exit code {proc.returncode}):\n{err[-2000:]}") from None
        merged.results += [result_from_json(r) for r in data["results"]]
        merged.collection_errors += data["collection_errors"]
        merged.notices += data["notices"]
        merged.imported.update({k: frozenset(v) for k, v in data["imported"].items()})
        merged.error = merged.error or data["error"]
        merged.broken = merged.broken or data["broken"]
    return merged


def progress_report(impl: str, device: str | None = None, threads: int | None = None, recompute: bool = False,
                    reuse: bool = True, jobs: int = 1) -> CheckReport:
    """Every exercise's ``Result`` in course order: stored verdicts reused (unless ``reuse`` is off or the
    oracle is recomputed), the rest run, split over ``jobs`` processes when there are several."""
    from sampling_course.grading.runner import run_report, tests_dir  # loads pytest and torch
    from sampling_course.implementation import StaleInstallError, stale_install_message

    tests = tests_dir().resolve()
    # A copy installed by `pip install .` would be graded instead of the checkout, by the
    # workers and by stored verdicts alike: say so before anything runs.
    stale = stale_install_message(impl, tests.parent)
    if stale:
        raise StaleInstallError(stale)
    package = tests.parent / impl
    store = VerdictStore(course_key(impl, tests, device), package_digests(package), package=package) if package.is_dir() else None
    reused: dict[str, Result] = {}
    if store is not None and reuse and not recompute:
        for exercise in EXERCISES:
            result = store.get(exercise)
            if result is not None:
                reused[exercise.name] = result
    todo: list[Exercise] = [e for e in EXERCISES if e.name not in reused]
    if not todo:
        report = CheckReport([], impl=impl)
    elif jobs > 1 and len(todo) > 1 and not recompute:
        report = _in_workers([e.name for e in todo], impl, device, threads, jobs)
    else:
        report = run_report(todo, impl, diagnose=False, device=device, threads=threads, recompute_oracle=recompute)
    if report.error:
        return report
    if store is not None and not report.collection_errors and not report.broken:
        for result in report.results:
            store.put(result, report.imported.get(result.name))
    by_name = {**reused, **{r.name: r for r in report.results}}
    report.results = [by_name[e.name] for e in EXERCISES if e.name in by_name]
    return report


def stored_verdict_folder() -> Path:
    """Where the verdicts live (``cache_home()/verdicts``): delete it to make ``progress`` run every test again."""
    return VerdictStore("", {}).folder
