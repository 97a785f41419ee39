"""The structured-generation benchmark (``sampling-course bench-structured``) runs, and its checks can fail.

No timing is asserted: only that a smoke run (``--quick``: the story model's vocabulary, two
expressions) measures every library it finds and prints its tables, that the token paths it
replays end at the end-of-text token, and that a library masking a token the path takes is
reported as an error instead of being timed.
"""

from __future__ import annotations

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
    assert quick["step"] > 0
    bench.report(quick, Console(width=200))
    out = capsys.readouterr().out
    assert "Index build time" in out and "Masking overhead per token" in out and "story model" in out


def test_token_paths_end_at_eos_inside_the_language():
    from solutions import structured

    from sampling_course.reference import load_reference

    tokenizer = load_reference("story").tokenizer
    constraint = structured.regex_constraint(bench.EXPRESSIONS["date"], tokenizer)
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
