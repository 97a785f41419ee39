"""The GPU bench (``sampling-course bench --device cuda``): its logic on the CPU, its refusal without a GPU.

On the CPU the same methods run without the CUDA graph and without ``torch.compile`` (the
labels say so), which checks everything but those two and the CUDA timers. No timing is
asserted.
"""

from __future__ import annotations

import argparse
import io

import pytest
import torch
from rich.console import Console

from sampling_course.apps import bench, bench_gpu


def quick_args(**changes) -> argparse.Namespace:
    args = bench.parse_args(["--quick", "--device", "cpu", "--no-progress"])
    for key, value in changes.items():
        setattr(args, key, value)
    return args


def test_the_gpu_methods_agree_and_report_on_the_cpu():
    """float32 and bfloat16: every method runs and, in float32, gives HF eager's tokens."""
    args = quick_args(batch_sizes=[1], dtypes=["float32", "bfloat16"])
    cases, label = bench_gpu.build_cases(args, torch.device("cpu"), capture=False, compile=False)
    assert [(c.dtype, c.batch) for c in cases] == [("float32", 1), ("bfloat16", 1)]
    bench_gpu.run_cases(cases, torch.device("cpu"), repeats=1, prompt=args.prompt_tokens)
    assert bench_gpu.float32_agrees(cases) == []
    for case in cases:
        assert [m.name for m in case.methods] == ["static", "captured", "hf", "hf_compiled"]
        assert all(m.tokens.shape == (case.batch, args.prompt_tokens + args.new_tokens) for m in case.methods)
        assert all(len(m.times) == 1 and m.times[0] > 0 for m in case.methods)
    console = Console(file=io.StringIO(), width=200)
    outcomes = bench_gpu.report(cases, args.new_tokens, None, console, label)
    out = console.file.getvalue()
    assert "tokens/s" in out and "same as HF eager" in out and "fixed-shape step, eager (no capture)" in out
    assert len(outcomes) == 2 * len(bench_gpu.TARGETS)  # one per target and dtype, at batch 1


def test_the_budget_limits_the_timed_rounds_but_one_always_runs():
    """--budget: no timed round starts past a case's share of it, yet every case gets one; without it, every round runs."""
    args = quick_args(batch_sizes=[1, 2], dtypes=["float32"])
    cases, _ = bench_gpu.build_cases(args, torch.device("cpu"), capture=False, compile=False)
    assert bench_gpu.run_cases(cases, torch.device("cpu"), repeats=3, prompt=args.prompt_tokens, budget_s=1e-9) == 1
    assert all(len(m.times) == 1 for case in cases for m in case.methods)
    cases, _ = bench_gpu.build_cases(args, torch.device("cpu"), capture=False, compile=False)
    assert bench_gpu.run_cases(cases, torch.device("cpu"), repeats=2, prompt=args.prompt_tokens) == 2
    assert all(len(m.times) == 2 for case in cases for m in case.methods)


def test_the_report_says_when_the_budget_cut_the_rounds(monkeypatch, capsys):
    """The whole command's flow on the CPU (device name, bandwidth and the GPU-only methods stood in)."""
    build = bench_gpu.build_cases
    monkeypatch.setattr(bench_gpu, "build_cases", lambda args, device: build(args, device, capture=False, compile=False))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a stand-in GPU")
    monkeypatch.setattr(bench_gpu, "measure_gpu_bandwidth", lambda device, megabytes=1024: 1e12)
    monkeypatch.setenv("COLUMNS", "200")
    args = quick_args(batch_sizes=[1], dtypes=["float32"], repeats=3, budget=1e-9)
    assert bench_gpu.main(args, torch.device("cpu")) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "up to 3 timed rounds after 2 warm-ups" in out
    assert "as few as 1 of 3 timed rounds: --budget 1e-09 s is shared equally by the runs of each dtype and batch (1)" in out
    assert "medians of 1 to 3 runs" in out


def test_a_disagreement_is_located():
    a = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    b = a.clone()
    assert bench_gpu.first_difference(a, b, prompt=2) is None
    b[1, 3] = 0
    assert bench_gpu.first_difference(a, b, prompt=2) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: nothing to refuse")
def test_without_a_gpu_the_gpu_bench_refuses_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--device", "cuda"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("sampling-course bench: error: --device cuda: cuda is not available here")


def test_the_notebooks_step_measurements_run_on_the_cpu(tiny_demo, impl):
    """What notebook 06b measures on a GPU, run here: times, no kernel count off a GPU, and a table."""
    costs = bench_gpu.eager_step_costs(tiny_demo, impl.caches, batches=(1, 2), context=8, repeats=2)
    assert [c.batch for c in costs] == [1, 2] and all(c.ms > 0 and c.kernels is None for c in costs)
    console = Console(file=io.StringIO(), width=200)
    console.print(bench_gpu.step_cost_table(costs, bandwidth=1e10))
    assert "ms per step" in console.file.getvalue()
    prompts = torch.randint(0, tiny_demo.cfg.d_vocab, (2, 4), generator=torch.Generator().manual_seed(0))
    decoder = impl.gpu_decoding.CapturedDecoder(tiny_demo, 2, 12)
    assert bench_gpu.ms_per_token(decoder, prompts, 6, repeats=1) > 0
