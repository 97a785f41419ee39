"""Time the checker the way a learner meets it, and compare with its speed targets.

Three numbers, each measured in fresh processes so that nothing is already imported:

* the first check in a new process: ``sampling-course check NAME`` from a shell, for
  exercises of parts 1-3, 8, 9 and 10 (target under 5 s);
* a later check in the same process: ``check(NAME)`` again in one Python process, as in a
  notebook after the first cell (target under 1 s);
* ``sampling-course progress``: every exercise, its stored verdicts reused where nothing they
  depend on changed (target under 15 s), and with ``--rerun-progress`` also ``progress --rerun``
  (every test run again; no target);
* ``progress`` after an edit: in a copy of the course (made once, in a temporary folder), each
  file named by ``--edit`` gets one more comment line before every timed run, so that the
  exercises whose verdicts depend on it run again, as after a learner saves that file
  (target under 10 s, also with one core busy);
* with ``--watch``, ``sampling-course watch`` in the same copy: its start-up (torch and the
  reference models, once), then each timed exercise's definition saved with one more comment
  line, once per round: the time from the save to the end of its panel, and the CPU seconds
  the watch process spent on it (the targets of a later check: it runs in a warm process; the
  wall time includes up to 0.2 s of waiting for the next look at the files).

Each is measured on the machine as it is and with ``--busy N`` extra processes that each keep
a core busy (default: 0, then 1), as a learner's laptop runs a browser and an IDE beside the
course; the targets with one busy core are 8 s for a first check and 25 s for ``progress``.

The references' outputs are stored the first time they are computed (see
``sampling_course.grading.oracle``), so the script first runs one untimed check of the
chosen exercises to fill the store (its time is printed, as "filling the store"); every
timed check then reuses them, and the last column says whether a check still imported
transformers or transformer_lens (it should not).

    python scripts/time_checks.py                       # against exercises/ (your code)
    python scripts/time_checks.py --impl solutions      # against the finished solutions
    python scripts/time_checks.py --repeat 3 LayerNorm sample_top_p
    python scripts/time_checks.py --impl solutions --repeat 3      # the figures the README quotes
    python scripts/time_checks.py --record     # each exercise's check in the course walked in order
    python scripts/time_checks.py --impl solutions --repeat 3 --busy 1 --no-progress --watch   # watch's re-checks

``--record`` times something else: it walks the course in order (``grading/walk.py``, what
``pytest -m walk`` checks: each exercise graded on the solutions with every earlier exercise solved
and every later one a stub, in worker processes that keep Python, torch and the references loaded,
one thread each) and writes the wall-clock and CPU seconds each exercise's tests took, with the
machine, its load and the date, to ``sampling_course/assets/check_times.json``, which the
notebooks' workload tables (``sampling_course.workload``) read. ``--jobs N`` walks with N workers
(default 1, so that no two checks share the machine's cores).

Timings on a shared machine are noisy: the load average is printed next to them, the
CPU seconds (user + system) are printed next to the wall-clock seconds (on a busy machine
they are closer to what an idle one would take), and ``--repeat N`` runs N interleaved
rounds and prints the median and the spread (fastest-slowest) of each measurement. Each round
also times ``python -c "import torch"``, the floor of any first check: a first check's CPU
target is at most 1.0 CPU-s beyond it, a later check's at most 0.5 CPU-s. The wall-clock
targets are for the median wall-clock time; the last columns say which target was missed
(cpu, wall); exits 1 when one is.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import queue
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from importlib.metadata import version
from pathlib import Path

from timing import load_average, median_and_spread

# Targets in seconds, on the machine as it is (0 busy cores) and with one core kept busy.
TARGETS = {"first check": (5.0, 8.0), "later check": (1.0, 1.0), "progress": (15.0, 25.0),
           "progress after an edit": (10.0, 10.0)}
# CPU-second targets: a first check at most this much beyond starting Python and importing torch
# (the baseline, measured beside it), a later check at most this much in all.
CPU_TARGETS = {"first check": 1.0, "later check": 0.5}
# One exercise per kind of test fixture: part 1 (TransformerLens activations), part 2, part 3, and the
# heavier later parts: part 8's index, part 9's model (Hugging Face's Llama), part 10's scheduler.
DEFAULT_EXERCISES = ["LayerNorm", "Attention", "sample_top_p", "sample", "Beams.filter", "beam_search",
                     "build_index", "LlamaTransformer", "Scheduler.schedule"]
# The floor no check in a fresh process can go under: Python starting and importing torch.
_BASELINE = [sys.executable, "-c", "import torch"]

# Run in a child process: check each exercise twice in that one process and report the second timing.
_LATER = """
import json, sys, time
from sampling_course.grading.checking import check
seconds = {}
for name in sys.argv[2:]:
    check(name, impl=sys.argv[1], display=False)  # the first check of this process: not what is timed
    start, cpu = time.perf_counter(), time.process_time()
    check(name, impl=sys.argv[1], display=False)
    imported = sorted({m.split(".")[0] for m in sys.modules} & {"transformers", "transformer_lens"})
    seconds[name] = (time.perf_counter() - start, time.process_time() - cpu, ", ".join(imported) or "none")
print(json.dumps(seconds))
"""


# The same as the `sampling-course` command, without relying on PATH; its last line on stderr
# lists the oracle's libraries that the command imported.
_COMMAND = """
import json, sys
from sampling_course.apps.cli import main
code = main(sys.argv[1:])
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & {"transformers", "transformer_lens"})), file=sys.stderr)
sys.exit(code)
"""


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", _COMMAND, *args]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(command: list[str], cwd: Path | None = None) -> tuple[float, float, str]:
    """(wall-clock seconds, CPU seconds, oracle libraries imported) of running ``command`` to its end (in the
    course at ``cwd``, imported from there, when given)."""
    env = None if cwd is None else {**os.environ, "PYTHONPATH": str(cwd)}
    start, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
    wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
    lines = proc.stderr.strip().splitlines()
    try:
        imported = ", ".join(json.loads(lines[-1])) or "none"
    except (IndexError, ValueError):
        imported = "?"
    return wall, cpu, imported


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exercise", nargs="*", default=DEFAULT_EXERCISES, help="exercises to time (default: a few of parts 1-3)")
    parser.add_argument("--impl", default="exercises", choices=["exercises", "solutions"])
    parser.add_argument("--repeat", type=int, default=1, help="interleaved rounds; the median counts, the spread is printed (default 1)")
    parser.add_argument("--no-progress", action="store_true", help="skip timing `sampling-course progress`")
    parser.add_argument("--rerun-progress", action="store_true",
                        help="also time `sampling-course progress --rerun` (every test run again)")
    parser.add_argument("--edit", nargs="*", default=["token_index.py"], metavar="FILE",
                        help="files of the implementation's package to edit before timing `progress` again, one "
                             "measurement each (default: token_index.py, part 8's; none: skip)")
    parser.add_argument("--watch", action="store_true",
                        help="also time `sampling-course watch` in a copy of the course: each exercise's definition saved "
                             "once per round, re-checked by the warm process")
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1],
                        help="extra processes keeping a core busy, in turn (default 0 1)")
    parser.add_argument("--record", action="store_true",
                        help="walk the course in order and write each exercise's check seconds to "
                             "sampling_course/assets/check_times.json (the notebooks' workload tables)")
    parser.add_argument("--jobs", type=int, default=1, help="with --record: worker processes (default 1)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or min(args.busy) < 0 or args.jobs < 1:
        parser.error("--repeat and --jobs must be at least 1 and --busy at least 0")
    if args.record:
        return record_walk(args.jobs)

    print(f"Timing checks against {args.impl}/; {load_average()}")
    wall, _, imported = _timed(_cli("check", *args.exercise, "--impl", args.impl))
    print(f"filling the store of reference outputs (one check of them all, untimed target): {wall:.1f} s, "
          f"imported {imported}")
    if not args.no_progress:
        wall, _, _ = _timed(_cli("progress", "--impl", args.impl))
        print(f"storing every exercise's verdict (one progress, untimed): {wall:.1f} s")
    missed = 0
    copy = args.copy = None
    if args.edit and not args.no_progress:
        copy = args.copy = _course_copy()
        for name in args.edit:
            if not (copy / args.impl / name).is_file():
                parser.error(f"--edit: {args.impl}/{name} is not a file of the course")
    try:
        for busy in args.busy:
            missed += _with_busy_cores(args, busy)
    finally:
        if copy is not None:
            shutil.rmtree(copy.parent, ignore_errors=True)
    print(f"after: {load_average()}")
    return 1 if missed else 0


def _machine() -> str:
    """The processor, cores, system and library versions a recording was made with."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.is_file() else [])
             if line.startswith("model name")]
    return (f"{names[0] if names else platform.processor() or 'processor unknown'}, {os.cpu_count()} cores, "
            f"{platform.system()} {platform.machine()}, Python {platform.python_version()}, torch {version('torch')}")


def record_walk(jobs: int) -> int:
    """Walk the course in order and write each exercise's check seconds to the workload tables' file."""
    from sampling_course.grading.course import EXERCISES
    from sampling_course.grading.mistakes import walk_course
    from sampling_course.grading.walk import Step
    from sampling_course.grading.workload import TIMES_COMMAND, TIMES_FILE, times_json, write_data_file

    before = load_average()
    print(f"Recording the walk's check times, {jobs} worker{'s' * (jobs != 1)}; {before}")
    wall, _, _ = _timed(_cli("check", *(e.name for e in EXERCISES), "--impl", "solutions"))
    print(f"filling the store of reference outputs (one check of every exercise, untimed): {wall:.0f} s")
    start = time.perf_counter()
    steps = [Step(i) for i in range(-1, len(EXERCISES))]
    verdicts = walk_course(steps, jobs=jobs)
    seconds, failed = {}, []
    for step, verdict in zip(steps, verdicts):
        if step.graded is None:
            continue
        if verdict.ok and verdict.seconds is not None:
            seconds[step.graded.name] = {"wall": round(verdict.seconds, 2), "cpu": round(verdict.cpu_seconds or 0.0, 2)}
        else:
            failed.append(f"{step.graded.name}: {verdict.detail}")
    head = {
        "about": "Seconds each exercise's tests took in the course walked in order (grading/walk.py): on the "
                 "solutions, every earlier exercise solved and every later one a stub, in worker processes that "
                 "had Python, torch and the reference models loaded. wall: wall-clock seconds; cpu: CPU seconds of "
                 "the worker. Not the time a learner needs to write the exercise, which nothing here measures.",
        "command": TIMES_COMMAND,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": _machine(),
        "load": f"{before} before, {load_average()} after",
        "workers": f"{jobs}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')} each",
    }
    write_data_file(TIMES_FILE, times_json(head, seconds))
    print(f"walked in {time.perf_counter() - start:.0f} s; wrote {len(seconds)} exercises' times to {TIMES_FILE}")
    for line in failed:
        print(f"  not recorded (its step of the walk did not pass): {line}", file=sys.stderr)
    return 1 if failed else 0


_EDITS = itertools.count()


def _course_copy() -> Path:
    """The course (its package, implementations, tests and settings) copied into a temporary folder."""
    root = Path(__file__).resolve().parents[1]
    copy = Path(tempfile.mkdtemp(prefix="time-checks-")) / "course"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".git", "notebooks", "__pycache__", ".venv", "*.egg-info"))
    return copy


def _progress_after_edit(args: argparse.Namespace, name: str) -> tuple[float, float, str]:
    """``progress`` in the copy of the course, after one more comment line in ``name``: a new state of that file."""
    path = args.copy / args.impl / name
    with path.open("a") as file:
        file.write(f"# edited before timing progress ({next(_EDITS)})\n")
    return _timed(_cli("progress", "--impl", args.impl), cwd=args.copy)


def _with_busy_cores(args: argparse.Namespace, busy: int) -> int:
    """``_measure`` with ``busy`` extra processes each keeping a core busy; the targets missed."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        time.sleep(1.0 if busy else 0.0)
        return _measure(args, busy)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _measure(args: argparse.Namespace, busy: int) -> int:
    """Time every measurement in interleaved rounds with ``busy`` cores kept busy; print them; the targets missed."""
    # Interleaved rounds: every measurement once per round, so that a burst of load on the
    # machine spreads over all of them instead of spoiling one.
    runs: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
    watch = _Watch(args.impl) if args.watch else None
    try:
        if not _rounds(args, runs, watch):
            return 1
    finally:
        if watch is not None:
            watch.stop()
    return _table(runs, busy)


def _rounds(args: argparse.Namespace, runs: dict, watch: _Watch | None) -> bool:
    """Every measurement once per round, ``args.repeat`` rounds, into ``runs``; False when the later checks failed."""
    if watch is not None:
        runs[("", "sampling-course watch: start-up")] = [watch.started]
    for _ in range(args.repeat):
        runs.setdefault(("baseline", "python -c 'import torch'"), []).append(_timed(_BASELINE))
        for name in args.exercise:
            runs.setdefault(("first check", f"sampling-course check {name}"), []).append(
                _timed(_cli("check", name, "--impl", args.impl)))
        proc = subprocess.run([sys.executable, "-c", _LATER, args.impl, *args.exercise],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
            return False
        for name, timing in json.loads(proc.stdout.strip().splitlines()[-1]).items():
            runs.setdefault(("later check", f"check({name!r}) again"), []).append(tuple(timing))
        if watch is not None:
            for name in args.exercise:
                runs.setdefault(("later check", f"watch: {name} saved"), []).append(watch.save(name))
        if not args.no_progress:
            # In the copy when there is one: the copy and this course hold the same files, so they share one
            # verdict key, and a progress here would find the verdicts the edited copy stored and run again.
            runs.setdefault(("progress", "sampling-course progress"), []).append(
                _timed(_cli("progress", "--impl", args.impl), cwd=args.copy))
            for name in args.edit:
                runs.setdefault(("progress after an edit", f"progress after editing {name}"), []).append(
                    _progress_after_edit(args, name))
            if args.rerun_progress:
                runs.setdefault(("", "sampling-course progress --rerun"), []).append(
                    _timed(_cli("progress", "--rerun", "--impl", args.impl)))
    return True


def _table(runs: dict, busy: int) -> int:
    """Print the medians and spreads of ``runs``, with the targets; the number of targets missed."""
    missed = 0
    width = max(len(what) for _, what in runs)
    baseline = statistics.median(t[1] for t in runs[("baseline", "python -c 'import torch'")])
    print(f"{busy} busy core{'s' * (busy != 1)} added; {load_average()}")
    print(f"  {'':<{width}}  {'wall':>7}  {'spread':>11}  {'cpu':>7}  {'spread':>11}  {'cpu target':<16}  "
          f"{'target':<12}  {'':<14}  oracle libraries imported")
    for (kind, what), timings in runs.items():
        wall, fastest, slowest = median_and_spread([t[0] for t in timings])
        cpu, cpu_fastest, cpu_slowest = median_and_spread([t[1] for t in timings])
        imported = ", ".join(sorted({t[2] for t in timings}))
        target = TARGETS[kind][min(busy, 1)] if kind in TARGETS else None
        # A first check's CPU target counts beyond the baseline; a later one's is absolute.
        cpu_target = (baseline if kind == "first check" else 0.0) + CPU_TARGETS[kind] if kind in CPU_TARGETS else None
        wall_ok, cpu_ok = target is None or wall < target, cpu_target is None or cpu <= cpu_target
        ok = wall_ok and cpu_ok
        missed += not ok
        spread = f"{fastest:.1f}-{slowest:.1f} s" if len(timings) > 1 else ""
        cpu_spread = f"{cpu_fastest:.2f}-{cpu_slowest:.2f}" if len(timings) > 1 else ""
        wanted = f"target < {target:2.0f} s" if target else ""
        cpu_wanted = f"<= {cpu_target:.2f} s" if cpu_target is not None else ""
        print(f"  {what:<{width}}  {wall:5.1f} s  {spread:>11}  {cpu:5.2f} s  {cpu_spread:>11}  {cpu_wanted:<16}  "
              f"{wanted:<12}  {verdict(kind, cpu_ok, wall_ok):<14}  {imported}", flush=True)
    return missed


class _Watch:
    """``sampling-course watch`` running in a copy of the course of its own (the edits before ``progress`` would set it
    checking), its output read line by line."""

    END = "watching for the next save"  # the line that closes each check's panel

    def __init__(self, impl: str):
        self.copy = _course_copy()
        self.folder, self.saves = self.copy / impl, itertools.count()
        env = {**os.environ, "PYTHONPATH": str(self.copy), "COLUMNS": "120"}
        start = time.perf_counter()
        self.proc = subprocess.Popen(_cli("watch", "--impl", impl, "--interval", "0.2"), cwd=self.copy, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stdout], daemon=True).start()
        self._wait_for("save a file to check")
        self.started = (time.perf_counter() - start, self.cpu(), "?")

    def cpu(self) -> float:
        """CPU seconds (user + system) the watch process has used so far (Linux's /proc; NaN elsewhere)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _wait_for(self, text: str, timeout: float = 600.0) -> None:
        end, seen = time.monotonic() + timeout, []
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=1.0)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            seen.append(line)
            if text in line:
                return
        raise RuntimeError("sampling-course watch did not print " + repr(text) + "; its last lines:\n" + "".join(seen[-20:]))

    def save(self, name: str) -> tuple[float, float, str]:
        """One more comment line in exercise ``name``'s definition (so that only it is checked again): the wall-clock
        and CPU seconds until its panel ends."""
        from sampling_course.grading.course import get_exercise

        exercise = get_exercise(name)
        path = self.folder / f"{exercise.module}.py"
        text, start = path.read_text(), 0
        for part in exercise.target.split("."):  # the class, then the method in it
            found = re.compile(rf"^\s*(class|def) {re.escape(part)}\b", re.MULTILINE).search(text, start)
            if found is None:
                raise RuntimeError(f"--watch: no definition of {exercise.target} in {path}")
            start = found.end()
        line_end = text.index("\n", start) + 1
        while not self.lines.empty():  # what it printed since the last save
            self.lines.get()
        path.write_text(f"{text[:line_end]}    # edited before timing watch ({next(self.saves)})\n{text[line_end:]}")
        wall, cpu = time.perf_counter(), self.cpu()
        self._wait_for(self.END)
        return time.perf_counter() - wall, self.cpu() - cpu, "?"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.copy.parent, ignore_errors=True)


def verdict(kind: str, cpu_ok: bool, wall_ok: bool) -> str:
    """"ok", or which target was missed: the CPU seconds (which load changes little) or the wall-clock time."""
    if kind not in TARGETS:
        return ""
    missed = [what for what, ok in (("cpu", cpu_ok), ("wall", wall_ok)) if not ok]
    return "ok" if not missed else "MISSED " + "+".join(missed)


if __name__ == "__main__":
    raise SystemExit(main())
