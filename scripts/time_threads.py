"""Time the course's thread policy against torch's default, idle and with busy cores.

Two workloads, each in a fresh process:

* ``sampling-course demo --reference story`` from start to end;
* a 64-token greedy decode without a cache (``TransformerSampler.sample(prompt, 64,
  temperature=0)``) on the story model, after a short warm-up.

Each runs with torch's default threads (one per physical core: ``--threads`` set to
that number) and with the course's policy (no ``--threads``; see
``sampling_course.apps.threads``), first on the machine as it is, then with ``--busy N``
extra processes that each keep a core busy (``python -c "while True: pass"``), started
and stopped by this script.

    python scripts/time_threads.py              # idle, then one busy core
    python scripts/time_threads.py --busy 0 1 2
    python scripts/time_threads.py --repeat 3   # median and spread of three interleaved runs each

Only the wall-clock times of an otherwise idle machine mean what they say; the script
prints the load average next to them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from timing import load_average, median_and_spread

DECODE = """
import sys, time
import torch
from sampling_course.apps.threads import course_threads
from sampling_course.implementation import impl_module, load_demo
from sampling_course.reference import load_reference

threads = int(sys.argv[1]) if sys.argv[1] != "policy" else None
ref = load_reference("story")
chosen = course_threads(threads, ref.cfg.d_model)
if chosen is not None:
    torch.set_num_threads(chosen)
sampler = impl_module("sampling", "solutions").TransformerSampler(load_demo(ref), ref.tokenizer)
prompt = "<|endoftext|>Once upon a time, there was a little girl named Lily."
sampler.sample(prompt, 4, temperature=0.0)  # warm-up
start = time.perf_counter()
sampler.sample(prompt, 64, temperature=0.0)
print(f"{time.perf_counter() - start:.3f} {torch.get_num_threads()}")
"""

DEMO = "import sys; from sampling_course.apps.cli import main; sys.exit(main(sys.argv[1:]))"


def _default_threads() -> int:
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                         capture_output=True, text=True, env=_env(), check=True)
    return int(out.stdout.strip())


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # the policy and torch's default decide, not the caller's setting
    env["HF_HUB_OFFLINE"] = "1"
    return env


def _demo(threads: str) -> float:
    argv = ["demo", "--reference", "story"] + ([] if threads == "policy" else ["--threads", threads])
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", DEMO, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env=_env(), check=True)
    return time.perf_counter() - start


def _decode(threads: str) -> float:
    out = subprocess.run([sys.executable, "-c", DECODE, threads], capture_output=True, text=True, env=_env(), check=True)
    return float(out.stdout.split()[0])


def _summary(seconds: list[float]) -> str:
    """The median, and the spread (fastest-slowest) when there are several runs."""
    median, fastest, slowest = median_and_spread(seconds)
    return f"{median:.2f} s" + (f" ({fastest:.2f}-{slowest:.2f})" if len(seconds) > 1 else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1], help="busy processes to add, in turn (default 0 1)")
    parser.add_argument("--repeat", type=int, default=1, help="interleaved runs per measurement; the median counts, the spread is printed (default 1)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or min(args.busy) < 0:
        parser.error("--repeat must be >= 1 and --busy >= 0")
    default = str(_default_threads())
    print(f"torch's default: {default} threads; {load_average()}")
    print(f"{'extra busy processes':>20}  {'workload':<28} {'default (' + default + ' threads)':>22} {'policy':>22}")
    for busy in args.busy:
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
        try:
            time.sleep(1.0 if busy else 0.0)
            for name, run in (("demo (story)", _demo), ("64-token uncached decode", _decode)):
                # Interleaved: default, policy, default, policy, ... so that drifting load hits both alike.
                timings: dict[str, list[float]] = {default: [], "policy": []}
                for _ in range(args.repeat):
                    for threads in timings:
                        timings[threads].append(run(threads))
                print(f"{busy:>20}  {name:<28} {_summary(timings[default]):>22} {_summary(timings['policy']):>22}",
                      flush=True)
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
    print(f"after: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
