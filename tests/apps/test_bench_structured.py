"""The structured-generation benchmark (``sampling-course bench-structured``) runs, and its checks can fail.

No timing is asserted: only that a smoke run (``--quick``: the story model's vocabulary, two
expressions) measures every library it finds and prints its tables, that the token paths it
replays end at the end-of-text token, and that a library masking a token the path takes is
reported as an error instead of being timed.
"""

from __future__ import annotations

import sys

import pytest
import torch

from sampling_course.apps import bench_structured as bench


@pytest.fixture(scope="module")
def quick():
    # Torch's default device elsewhere, as a notebook on a GPU sets it: the bench still runs on the CPU.
    with torch.device("meta"):
        return bench.measure("solutions", quick=True, repeats=1)


def test_quick_run_measures_every_library(quick, capsys):
    from rich.console import Console

    assert [row.name for row in quick["rows"]] == list(bench.QUICK_EXPRESSIONS)
    for row in quick["rows"]:
        assert set(row.build) == set(row.per_token) == {"ours", *quick["peers"]}, row.notes
        assert all(seconds > 0 for seconds in row.build.values())
        # CPU seconds beside the wall seconds, for every library and every round.
        assert set(row.build_cpu) == set(row.per_token_cpu) == set(row.build), row.notes
        assert {lib: len(runs) for lib, runs in row.build_cpu_runs.items()} == {lib: 1 for lib in row.build}
        assert all(seconds >= 0 for seconds in [*row.build_cpu.values(), *row.per_token_cpu.values()])
    assert quick["trie_cpu_seconds"] >= 0
    assert quick["step"] > 0
    bench.report(quick, Console(width=200))
    out = capsys.readouterr().out
    assert "Index build time" in out and "Masking overhead per token" in out and "story model" in out


def test_token_paths_end_at_eos_inside_the_language():
    from solutions import token_constraint

    from sampling_course.reference import load_reference

    tokenizer = load_reference("story").tokenizer
    constraint = token_constraint.regex_constraint(bench.EXPRESSIONS["date"], tokenizer)
    for seed in range(3):
        path = bench.token_path(constraint, seed)
        assert path[-1] == tokenizer.eos_token_id and tokenizer.eos_token_id not in path[:-1]
        import re

        assert re.fullmatch(bench.EXPRESSIONS["date"], constraint.text(path))


def test_a_stepper_that_masks_the_path_is_an_error():
    class Wrong:
        def __init__(self, built, d_vocab):
            pass

        def step(self, logits, token):
            return logits.index_fill(-1, torch.tensor([token]), float("-inf"))

    with pytest.raises(AssertionError, match="masks token"):
        bench.per_token(Wrong, None, 10, [1, 2, 3], 1)


def test_each_peer_is_timed_with_its_own_package_alone(monkeypatch):
    """With outlines-core installed and xgrammar not, outlines-core is measured in full (its masking needs nothing
    of xgrammar's), its index allows the same tokens as ours, and xgrammar is reported missing."""
    pytest.importorskip("outlines_core")
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` now raises ImportError
    results = bench.measure("solutions", quick=True, repeats=1)
    assert results["peers"] == ["outlines-core"]
    assert any(line.startswith("xgrammar: not available") for line in results["missing"])
    for row in results["rows"]:
        assert not row.notes, row.notes
        assert set(row.build) == set(row.per_token) == {"ours", "outlines-core"}
        assert row.agreement == "yes", row.agreement


def test_the_install_line_prints_the_extra(capsys):
    """rich reads "[bench]" as markup unless it is escaped: the printed command must keep it."""
    from rich.console import Console

    row = bench.Row("date", bench.EXPRESSIONS["date"], build={"ours": 0.1}, per_token={"ours": 1e-5})
    results = {"vocabulary": "a [test] vocabulary", "rows": [row], "peers": [], "step": 1e-3, "step_label": "a step",
               "trie_seconds": 0.01, "repeats": 1,
               "missing": [f"xgrammar: not available (ImportError); install the bench extra: {bench.INSTALL_BENCH}"]}
    bench.report(results, Console(width=300))
    out = capsys.readouterr().out
    assert "pip install -c constraints.txt -e '.[bench]'" in out and "a [test] vocabulary" in out


def test_the_masking_ratio_is_ours_over_outlines_core_with_its_per_round_spread(capsys):
    """The masking table's last column: ours over outlines-core per token, the ratio of the medians and
    the spread of the ratios of the interleaved rounds."""
    from rich.console import Console

    row = bench.Row("date", bench.EXPRESSIONS["date"], build={"ours": 0.1, "outlines-core": 0.2},
                    per_token={"ours": 2e-5, "outlines-core": 4e-5},
                    build_runs={"ours": [0.1, 0.1, 0.1], "outlines-core": [0.2, 0.2, 0.2]},
                    per_token_runs={"ours": [1e-5, 2e-5, 3e-5], "outlines-core": [5e-5, 4e-5, 3e-5]})
    assert bench.ratio_text(row, ["outlines-core"], masking=True) == "0.50x (0.20-1.00)"
    assert bench.ratio_text(row, ["outlines-core"]) == "0.50x (0.50-0.50)"
    results = {"vocabulary": "v", "rows": [row], "peers": ["outlines-core"], "step": 1e-3, "step_label": "a step",
               "trie_seconds": 0.01, "repeats": 3, "missing": []}
    bench.report(results, Console(width=300))
    out = capsys.readouterr().out
    assert "ours / outlines-core" in out and "0.50x (0.20-1.00)" in out


class FakeClocks:
    """A stand-in for the ``time`` module: each call of ``work`` moves the wall clock by ``wall`` and the CPU
    clock by ``cpu`` (a build on two threads spends twice its wall time in CPU time)."""

    def __init__(self):
        self.wall_now = self.cpu_now = 0.0

    def perf_counter(self):
        return self.wall_now

    def process_time(self):
        return self.cpu_now

    def work(self, wall, cpu):
        self.wall_now, self.cpu_now = self.wall_now + wall, self.cpu_now + cpu


def test_builds_record_cpu_seconds_and_the_cpu_ratio_is_computed_from_them(monkeypatch, capsys):
    """``timed`` reads the CPU clock as well as the wall clock, and the build table's CPU-seconds column is ours
    over outlines-core in CPU seconds: on one thread ours is slower by the wall clock and faster by the CPU clock."""
    from rich.console import Console

    clocks = FakeClocks()
    monkeypatch.setattr(bench, "time", clocks)
    ours = [(0.3, 0.3), (0.2, 0.2), (0.4, 0.4)]  # (wall, CPU) of each round: one thread
    theirs = [(0.2, 0.4), (0.1, 0.25), (0.25, 0.5)]  # two threads
    row = bench.Row("date", bench.EXPRESSIONS["date"])
    for library, rounds in (("ours", ours), ("outlines-core", theirs)):
        for wall, cpu in rounds:
            seconds, cpu_seconds, result = bench.timed(lambda wall=wall, cpu=cpu: clocks.work(wall, cpu) or "built", 1)
            assert result == "built"
            row.build_runs.setdefault(library, []).append(seconds)
            row.build_cpu_runs.setdefault(library, []).append(cpu_seconds)
    assert row.build_cpu_runs["outlines-core"] == pytest.approx([0.4, 0.25, 0.5])
    row.build = {lib: sorted(runs)[1] for lib, runs in row.build_runs.items()}
    row.build_cpu = {lib: sorted(runs)[1] for lib, runs in row.build_cpu_runs.items()}
    # Wall: 0.3 / 0.2 (per round 1.50, 2.00, 1.60). CPU: 0.3 / 0.4 (per round 0.75, 0.80, 0.80).
    assert bench.ratio_text(row, ["outlines-core"]) == "1.50x (1.50-2.00)"
    assert bench.ratio_text(row, ["outlines-core"], cpu=True) == "0.75x (0.75-0.80)"
    row.per_token, row.per_token_cpu = {"ours": 1e-5, "outlines-core": 2e-5}, {"ours": 1e-5, "outlines-core": 4e-5}
    results = {"vocabulary": "v", "rows": [row], "peers": ["outlines-core"], "step": 1e-3, "step_label": "a step",
               "trie_seconds": 0.01, "trie_cpu_seconds": 0.02, "repeats": 3, "missing": []}
    bench.report(results, Console(width=300))
    out = capsys.readouterr().out
    assert "ours / outlines-core (CPU s)" in out and "0.75x (0.75-0.80)" in out and "1.50x (1.50-2.00)" in out
    assert "0.020 CPU s" in out
    assert "0.25x" in out  # masking in CPU seconds: 1e-5 / 4e-5


def test_masking_records_cpu_seconds_per_token(monkeypatch):
    """``per_token`` divides the CPU clock's advance over a pass by the path's length, as it does the wall clock's."""
    clocks = FakeClocks()
    monkeypatch.setattr(bench, "time", clocks)

    class TwoThreads:
        def __init__(self, built, d_vocab):
            pass

        def step(self, logits, token):
            clocks.work(1e-5, 3e-5)
            return logits

    wall, cpu = bench.per_token(TwoThreads, None, 10, [1, 2, 3, 4], 3)
    assert wall == pytest.approx(1e-5) and cpu == pytest.approx(3e-5)
