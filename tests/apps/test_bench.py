"""The benchmark (``sampling-course bench``) runs, and its built-in checks hold and can fail.

No timing is asserted here: only that every method runs, generates exactly the requested
number of tokens and agrees with the others (the bench's own checks), on a tiny random
model (``--quick``).
"""

from __future__ import annotations

import pytest
import torch

from sampling_course.apps import bench, bench_setup


@pytest.fixture(scope="module")
def quick_setup():
    return bench_setup.build(bench.parse_args(["--quick"]))


def test_id_tokenizer_round_trip():
    """IdTokenizer reads and writes space-separated ids and has an EOS id no model produces."""
    tok = bench_setup.IdTokenizer()
    assert torch.equal(tok.encode("5 17 3", return_tensors="pt"), torch.tensor([[5, 17, 3]]))
    assert tok.encode("5 17 3") == [5, 17, 3]
    assert tok.decode(torch.tensor([5, 17, 3])) == "5 17 3" and tok.decode(7) == "7"
    assert tok.eos_token_id < 0


@pytest.mark.slow
def test_quick_bench_runs_and_its_checks_pass(quick_setup):
    """Every method runs (warm-up, then one timed round); greedy and beam answers agree (run() raises otherwise)."""
    results = bench.run(quick_setup, repeats=1, progress=False)
    assert {(v.task, v.name) for v in results} == {
        (task, name) for task in ("greedy", "beam") for name in ("uncached", "cached", "static", "hf")
    } | {("batched", "engine"), ("batched", "static"), ("batched", "hf")}
    assert all(len(v.times) == 1 and v.times[0] > 0 for v in results)


def test_checks_catch_a_wrong_answer(quick_setup):
    """A greedy or batched answer that differs from HF's, a beam with another score, or a wrong length is an error."""
    methods = {(m.task, m.name): m for m in bench_setup.methods(quick_setup)}
    greedy = {name: methods["greedy", name].run(quick_setup.new_tokens) for name in ("uncached", "cached", "hf")}
    bench.check_greedy(greedy)
    wrong = [list(greedy["cached"][0])]
    wrong[0][-1] = (wrong[0][-1] + 1) % quick_setup.demo.cfg.d_vocab
    with pytest.raises(bench.BenchCheckError, match="cached differs"):
        bench.check_greedy({**greedy, "cached": wrong})
    with pytest.raises(bench.BenchCheckError, match="static differs"):
        bench.check_greedy({**greedy, "static": wrong})
    with pytest.raises(bench.BenchCheckError, match="lengths"):
        bench.check_lengths(methods["greedy", "cached"], [wrong[0][:-1]], quick_setup)

    batched = {name: methods["batched", name].run(quick_setup.batch_new_tokens) for name in ("engine", "hf")}
    bench.check_batched(batched)
    bench.check_lengths(methods["batched", "engine"], batched["engine"], quick_setup)
    shifted = [list(row) for row in batched["engine"]]
    shifted[3][-1] = (shifted[3][-1] + 1) % quick_setup.demo.cfg.d_vocab
    with pytest.raises(bench.BenchCheckError, match="row 3 differs"):
        bench.check_batched({**batched, "engine": shifted})
    with pytest.raises(bench.BenchCheckError, match="static: row 3 differs"):
        bench.check_batched({**batched, "static": shifted})
    with pytest.raises(bench.BenchCheckError, match="lengths"):
        bench.check_lengths(methods["batched", "engine"], batched["engine"][:-1], quick_setup)

    beams = {name: methods["beam", name].run(quick_setup.beam_new_tokens) for name in ("uncached", "cached", "hf")}
    bench.check_beams(quick_setup, beams)
    reversed_beams = beams["cached"][::-1]
    with pytest.raises(bench.BenchCheckError, match="summed log-probs"):
        bench.check_beams(quick_setup, {**beams, "cached": reversed_beams})


def test_budget_stops_after_the_first_round(quick_setup):
    """A budget already spent still runs (and checks) one round, and no more."""
    results = bench.run(quick_setup, repeats=3, progress=False, budget_s=0.0)
    assert all(len(v.times) == 1 for v in results)


def test_main_quick_prints_the_tables(capsys):
    """`sampling-course bench --quick` exits 0 and prints tokens/s, the targets and the bandwidth limit."""
    assert bench.main(["--quick", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "Targets" in out and "checked" in out
    assert "memory bandwidth" in out and "of the limit" in out


def test_weight_bytes_per_token_counts_what_a_decode_step_reads(quick_setup):
    """Every block, final LayerNorm and unembedding weight, and one row of each embedding table."""
    model, cfg = quick_setup.demo, quick_setup.demo.cfg
    blocks = sum(p.numel() for p in model.blocks.parameters())
    expected = 4 * (blocks + 2 * cfg.d_model + cfg.d_model * cfg.d_vocab + cfg.d_vocab + 2 * cfg.d_model)
    assert bench.weight_bytes_per_token(model) == expected


def test_measured_bandwidth_is_plausible():
    """A streaming read runs between 0.1 GB/s and 10 TB/s on any machine this course runs on."""
    assert 1e8 < bench.measure_bandwidth(megabytes=16, repeats=2) < 1e13
