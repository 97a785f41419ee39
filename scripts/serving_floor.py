"""How fast could part 10's server be on bench-serving's stream? Its own schedule, with paging and scheduling free.

    python scripts/serving_floor.py                 # the story model, bench-serving's --all-at-once stream
    python scripts/serving_floor.py --repeat 5 --model random

Three runs, interleaved round by round, in CPU seconds of this process (one thread):

* **course**: part 10's ``Engine`` on the stream, as ``sampling-course bench-serving --all-at-once`` runs it
  (prefix caching on, 256 blocks of 16, at most 16 requests at once);
* **floor**: the forward passes that run made, replayed on part 6's ``StaticKeyValueCache``: each decode pass as
  a batch of as many rows, each row holding as many keys as its request did (left-padded to the longest, as the
  paged cache pads), and each prefill as that many positions of one causal sequence. No block tables, no
  gather through them, no scheduling and no bookkeeping: what is left is the model's own work on the server's
  schedule, a floor under any server that runs this forward pass on this schedule;
* **static**: part 5's ``generate`` on fixed batches of 16, as ``bench-serving`` runs it.

static / floor bounds how far ahead of the static engine a server of this schedule can get; course / floor is
what the server's paging and scheduling cost on top of the model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sampling_course.apps import bench_serving, serving_stream  # noqa: E402
from sampling_course.implementation import impl_module  # noqa: E402


def record_schedule(engine_module, model, stream, n_blocks: int, block_size: int, max_running: int) -> list:
    """Run the course's server on ``stream``; every forward pass it made, as (packed, positions run per request,
    keys held per request after the pass)."""
    passes = []

    class Recording(engine_module.Engine):
        def forward(self, requests, n_new, packed):
            passes.append((packed, list(n_new), [r.n_computed + n for r, n in zip(requests, n_new)]))
            return super().forward(requests, n_new, packed)

    serving_stream.run_course(types.SimpleNamespace(Engine=Recording), model, stream, n_blocks, block_size,
                              max_running, prefix_caching=True)
    return passes


def replay_jobs(passes: list, cfg, generator: torch.Generator) -> list:
    """Inputs of the floor's forward passes: ("prefill", tokens, kept logits) or ("decode", tokens, mask)."""
    jobs = []
    for packed, n_new, ends in passes:
        if packed:  # one causal sequence per n_ctx positions, each keeping the logits of its share of the prompts
            left, total = sum(n_new), sum(n_new)
            while left:
                n = min(left, cfg.n_ctx)
                left -= n
                tokens = torch.randint(0, cfg.d_vocab, (1, n), generator=generator)
                jobs.append(("prefill", tokens, max(1, round(len(n_new) * n / total))))
        else:
            width = max(ends)
            tokens = torch.randint(0, cfg.d_vocab, (len(ends), width), generator=generator)
            mask = torch.zeros(len(ends), width, dtype=torch.long)
            for row, end in enumerate(ends):
                mask[row, width - end:] = 1
            jobs.append(("decode", tokens, mask))
    return jobs


def run_floor(model, caches, jobs: list) -> float:
    """CPU seconds of the floor's forward passes (the caches are made outside the timed calls)."""
    cfg, seconds = model.cfg, 0.0
    with torch.inference_mode():
        for kind, tokens, extra in jobs:
            batch, width = tokens.shape
            cache = caches.StaticKeyValueCache(torch.zeros(cfg.n_layers, 2, batch, width, cfg.n_heads, cfg.d_head))
            if kind == "prefill":
                start = time.process_time()
                model(tokens, cache, logits_to_keep=extra)
            else:
                cache.seq_len = width - 1  # every row's keys but the newest are cached
                start = time.process_time()
                model(tokens, cache, attention_mask=extra)
            seconds += time.process_time() - start
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("story", "random"), default="story")
    parser.add_argument("--impl", default="solutions")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds (default 3)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    torch.set_num_threads(1)
    label, model, _ = bench_serving.load_models(args.model, args.impl, 0)
    # bench-serving's defaults, every request arriving at t = 0.
    stream = serving_stream.make_stream(32, model.cfg.d_vocab, 0, None, (8, 64), (8, 128), 0.5, 32)
    engine_module, generate = impl_module("engine", args.impl), impl_module("generate", args.impl).generate
    caches = impl_module("caches", args.impl)
    passes = record_schedule(engine_module, model, stream, 256, 16, 16)
    jobs = replay_jobs(passes, model.cfg, torch.Generator().manual_seed(0))
    runs = {
        "course": lambda: serving_stream.run_course(engine_module, model, stream, 256, 16, 16,
                                                    prefix_caching=True).cpu_seconds,
        "floor": lambda: run_floor(model, caches, jobs),
        "static": lambda: serving_stream.run_static(generate, model, stream, 16).cpu_seconds,
    }
    for run in runs.values():  # warm-up, untimed
        run()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeat):
        for name, run in runs.items():
            seconds[name].append(run())
    print(f"{label}, code from {args.impl}/; {len(passes)} forward passes "
          f"({sum(p[0] for p in passes)} of them prefills); {args.repeat} interleaved rounds, CPU seconds, one thread")
    for name, values in seconds.items():
        print(f"  {name:7s} {statistics.median(values):.3f} s  ({min(values):.3f}-{max(values):.3f})")
    for top, bottom in (("static", "course"), ("static", "floor"), ("course", "floor")):
        ratios = [a / b for a, b in zip(seconds[top], seconds[bottom])]
        print(f"  {top} / {bottom}: {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
