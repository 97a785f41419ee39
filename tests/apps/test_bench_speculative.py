"""The speculative-decoding benchmark (``sampling-course bench-speculative``) runs, and its checks can fail.

No timing is asserted: only that a smoke run (``--quick``, tiny random models) prints its
table, that its greedy check rejects a wrong answer, that every method generates exactly
the tokens asked for even when the models' end-of-text token comes first, that the
theory's formulas give their known values, and that the truncated draft is the same model
for us and for Hugging Face.
"""

from __future__ import annotations

import pytest
import torch

from sampling_course.apps import bench_speculative as bench
from sampling_course.apps import speculative_pair
from sampling_course.apps.speculative_pair import hf_generate, load_pair


@pytest.fixture(scope="module")
def quick_pair():
    return load_pair("solutions", quick=True)


def test_theory_formulas():
    """(1 - a^(g+1)) / (1 - a): 1 token when nothing is accepted, g + 1 when everything is."""
    assert bench.expected_tokens_per_forward(0.0, 4) == 1.0
    assert bench.expected_tokens_per_forward(1.0, 4) == 5.0
    assert bench.expected_tokens_per_forward(0.5, 2) == pytest.approx(1.75)
    assert bench.expected_speedup(0.5, 2, draft_cost=0.25, verify_cost=1.0) == pytest.approx(1.75 / 1.5)


def test_draft_is_the_same_model_for_us_and_for_hugging_face(quick_pair):
    """The draft DemoTransformer and the truncated GPT2LMHeadModel give the same logits."""
    tokens = torch.tensor([quick_pair.prompts[0]])
    with torch.inference_mode():
        ours, theirs = quick_pair.draft(tokens), quick_pair.hf_draft(tokens).logits
    assert quick_pair.draft.cfg.n_layers == 1 == quick_pair.hf_draft.config.n_layer
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_greedy_check_catches_a_wrong_text(quick_pair, monkeypatch):
    """A speculative greedy text that differs from plain greedy is a BenchCheckError."""
    real = speculative_pair.ours_speculative

    def off_by_one(pair, prompt, n, gamma, temperature, seed, cache="dynamic"):
        ids, stats = real(pair, prompt, n, gamma, temperature, seed, cache)
        return ids[:-1] + [(ids[-1] + 1) % pair.target.cfg.d_vocab], stats

    bench.check_greedy(quick_pair, [2], 6)
    monkeypatch.setattr(speculative_pair, "ours_speculative", off_by_one)
    with pytest.raises(bench.BenchCheckError, match="gamma=2"):
        bench.check_greedy(quick_pair, [2], 6)


def with_early_eos(pair, temperature: float, gamma: int | None):
    """Make the first token Hugging Face generates (seed 0) the EOS of both its models, as the story models'
    end-of-text token is at the end of every story; returns that token."""
    ids, _ = hf_generate(pair, pair.prompts[0], 1, temperature, 0, gamma)
    eos = ids[len(pair.prompts[0])]
    for model in (pair.hf_target, pair.hf_draft):
        model.generation_config.eos_token_id = eos
    return eos


@pytest.mark.parametrize("temperature, gamma", [(0.0, None), (0.0, 2), (1.0, None)])
def test_hugging_face_generates_every_token_asked_for_past_its_eos(temperature, gamma):
    """`eos_token_id=None` in the GenerationConfig is not enough: generate fills it from the model's own config.

    Greedy text, and a seeded sample's first token, are the same whether EOS stops
    generation or not, so EOS is certain to come first here.
    """
    pair = load_pair("solutions", quick=True)
    eos = with_early_eos(pair, temperature, gamma)
    prompt = pair.prompts[0]
    configs = [model.generation_config.to_dict() for model in (pair.hf_target, pair.hf_draft)]
    ids, _ = hf_generate(pair, prompt, 6, temperature, 0, gamma)
    assert len(ids) == len(prompt) + 6 and ids[len(prompt)] == eos
    # The models' own configs (shared, read-only references in a real run) come back unchanged.
    assert [model.generation_config.to_dict() for model in (pair.hf_target, pair.hf_draft)] == configs


def test_measure_times_equal_work_when_eos_comes_first():
    """Every method of a timed round generates the tokens asked for, with an EOS at the first new position."""
    pair = load_pair("solutions", quick=True)
    with_early_eos(pair, 0.0, None)
    results = bench.measure(pair, [1, 2], 6, temperature=0.0, repeats=1)
    for row in results.rows:
        assert row.new_tokens == row.hf_new_tokens == 6 * len(pair.prompts)
        assert row.lookup_new_tokens == row.hf_lookup_new_tokens == 6 * len(pair.prompts)


def test_a_short_run_is_a_bench_check_error(quick_pair, monkeypatch):
    """A method that stops early fails with BenchCheckError naming it (not a bare assert, which -O removes)."""
    real = speculative_pair.ours_speculative

    def stops_early(pair, prompt, n, gamma, temperature, seed, cache="dynamic"):
        ids, stats = real(pair, prompt, n, gamma, temperature, seed, cache)
        return ids[:-1], stats

    monkeypatch.setattr(speculative_pair, "ours_speculative", stops_early)
    with pytest.raises(bench.BenchCheckError, match=r"speculative_generate \(gamma=1\) generated 5 new tokens"):
        bench.measure(quick_pair, [1], 6, temperature=1.0, repeats=1, hf=False, check=False)


def test_static_caches_are_checked_and_timed(quick_pair, monkeypatch):
    """With static=True the greedy check runs on StaticKeyValueCaches too (and fails on a wrong text there), and
    every round times speculative and target-only generation on them."""
    results = bench.measure(quick_pair, [1, 2], 5, temperature=1.0, repeats=1, hf=False, static=True)
    assert len(results.static_baseline) == len(quick_pair.prompts)
    assert all(len(row.static_seconds) == len(quick_pair.prompts) for row in results.rows)
    assert "static" in "".join(str(column.header) for column in bench.table(results).columns)
    real = speculative_pair.ours_speculative

    def wrong_on_static(pair, prompt, n, gamma, temperature, seed, cache="dynamic"):
        ids, stats = real(pair, prompt, n, gamma, temperature, seed, cache)
        return (ids[:-1] + [(ids[-1] + 1) % pair.target.cfg.d_vocab] if cache == "static" else ids), stats

    monkeypatch.setattr(speculative_pair, "ours_speculative", wrong_on_static)
    with pytest.raises(bench.BenchCheckError, match="static caches"):
        bench.check_greedy(quick_pair, [2], 6, ("dynamic", "static"))


def test_main_quick_prints_the_table(capsys):
    """`sampling-course bench-speculative --quick` exits 0 and prints the measured and theoretical columns."""
    assert bench.main(["--quick", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "checked" in out and "alpha" in out and "theory" in out and "HF" in out and "c = draft cost" in out
    assert "Prompt-lookup drafting" in out
