"""Run the statistical tests of part 2's two test files (tests/grading/test_part2_sampling.py, test_part2_sample.py),
test_part6b_gpu_decoding.py and part 7's three test files over many seeds and count the failures.

Each statistical test in those files takes the ``seed`` fixture, seeds torch with
it and promises a false-failure probability of at most 1e-6. This script checks that
promise empirically: it sets ``SAMPLING_COURSE_TEST_SEED=1-200`` (which parametrizes every
such test over the seeds), selects only the tests that use ``seed`` and runs them in
``--jobs`` worker processes, each with its own slice of the seeds, so the references and
imports are loaded once per worker rather than once per seed.

    python scripts/stress_statistical.py                 # seeds 1-200 against solutions/
    python scripts/stress_statistical.py --seeds 1-20 --jobs 1
    python scripts/stress_statistical.py --gpt2          # include the real-GPT-2 tier

Prints how many (test, seed) runs failed and which; exits 1 if any did.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEST_FILES = [REPO / "tests" / "grading" / name for name in
              ("test_part2_sampling.py", "test_part2_sample.py", "test_part6b_gpu_decoding.py",
               "test_part7_speculative.py", "test_part7_speculative_loop.py", "test_part7_prompt_lookup.py")]


class _SeededOnly:
    """pytest plugin: keep the tests that take ``seed`` and record every outcome."""

    def __init__(self) -> None:
        self.seed_of: dict[str, int] = {}
        self.outcomes: dict[str, str] = {}
        self.messages: dict[str, str] = {}

    def pytest_collection_modifyitems(self, config, items) -> None:
        keep = [item for item in items if "seed" in getattr(item, "fixturenames", ())]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep
        self.seed_of = {item.nodeid: item.callspec.params["seed"] for item in keep}

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed:
            self.outcomes[report.nodeid] = "failed"
            self.messages[report.nodeid] = str(report.longrepr)[-2000:]
        elif report.when == "call" or (report.when == "setup" and report.skipped):
            self.outcomes.setdefault(report.nodeid, report.outcome)


def run_worker(seeds: str, impl: str, gpt2: bool, out: Path) -> int:
    """Run the seeded tests for ``seeds`` in this process; write the outcomes to ``out`` as JSON."""
    import pytest

    os.environ["SAMPLING_COURSE_TEST_SEED"] = seeds
    plugin = _SeededOnly()
    args = [*map(str, TEST_FILES), "-q", "-p", "no:cacheprovider", "--impl", impl, "--rootdir", str(REPO)]
    if not gpt2:
        args += ["-m", "not gpt2"]
    code = pytest.main(args, plugins=[plugin])
    out.write_text(json.dumps({"seed_of": plugin.seed_of, "outcomes": plugin.outcomes, "messages": plugin.messages}))
    return int(code)


def parse_seeds(text: str) -> list[int]:
    """'1-200', '7' or '1,5,9-12' -> a list of seeds."""
    seeds: list[int] = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        seeds.extend(range(int(first), int(last or first) + 1))
    return seeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1-200", help="seeds: a range like 1-200 (default), or 1,5,9-12")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--impl", default="solutions", choices=["solutions", "exercises"])
    parser.add_argument("--gpt2", action="store_true", help="also run the real-GPT-2 statistical tests")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: output JSON path
    args = parser.parse_args(argv)

    if args.worker:
        return run_worker(args.seeds, args.impl, args.gpt2, Path(args.worker))

    seeds = parse_seeds(args.seeds)
    jobs = max(1, min(args.jobs, len(seeds)))
    chunks = [seeds[i::jobs] for i in range(jobs)]  # every worker gets its own share of the seeds
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stress-") as tmp:
        procs = []
        for index, chunk in enumerate(chunks):
            out = Path(tmp) / f"worker{index}.json"
            seed_spec = ",".join(map(str, chunk))
            cmd = [sys.executable, __file__, "--worker", str(out), "--seeds", seed_spec, "--impl", args.impl]
            if args.gpt2:
                cmd.append("--gpt2")
            procs.append((subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), out))
        results = []
        for proc, out in procs:
            _, stderr = proc.communicate()
            if not out.exists():
                print(f"worker failed to report (exit {proc.returncode}):\n{stderr[-3000:]}", file=sys.stderr)
                return 2
            results.append(json.loads(out.read_text()))
    elapsed = time.perf_counter() - start

    outcomes: dict[str, str] = {}
    seed_of: dict[str, int] = {}
    messages: dict[str, str] = {}
    for result in results:
        outcomes.update(result["outcomes"])
        seed_of.update(result["seed_of"])
        messages.update(result["messages"])
    failed = sorted((n for n, o in outcomes.items() if o == "failed"), key=lambda n: (seed_of.get(n, -1), n))
    passed = sum(o == "passed" for o in outcomes.values())
    skipped = sum(o == "skipped" for o in outcomes.values())
    tests = {n.replace(f"seed{seed_of[n]}", "") for n in outcomes if n in seed_of}
    print(f"{len(tests)} statistical tests x {len(seeds)} seeds ({args.seeds}) against {args.impl}/, {jobs} workers")
    print(f"runs: {len(outcomes)}, passed: {passed}, skipped: {skipped}, failed: {len(failed)}")
    print(f"failing seeds: {sorted({seed_of[n] for n in failed}) or 'none'}")
    for nodeid in failed:
        print(f"FAILED {nodeid}\n{messages.get(nodeid, '')[-800:]}\n")
    print(f"wall time: {elapsed:.0f} s")
    return 1 if failed or not outcomes else 0


if __name__ == "__main__":
    raise SystemExit(main())
