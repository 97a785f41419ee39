"""The long-text experiment (``sampling-course long-text``) runs, and its numbers can be trusted.

No quality or timing is asserted (those are what the experiment measures). What must hold:

* wherever a method sees the whole prefix at its true positions, it gives full attention's
  NLL: every cache before its window fills, the recomputed sliding window at a position its
  window covers, full attention through the static cache against one uncached pass;
* the sliding window's NLL, and the re-prefilled window's at every position, is the one
  Hugging Face's model gives on the same window, and the windowed methods really differ
  from full attention once the window is full (so the equalities above are not vacuous);
* attention patterns from the independent route are distributions over the keys a query
  may see, and the mass on the first tokens is read from them correctly.

All on the stand-in "tiny" (random weights, n_ctx 128) with short texts: a few seconds.
"""

from __future__ import annotations

import pytest
import torch

from sampling_course.apps import attention_sinks, long_text
from sampling_course.apps.long_text_nll import reprefill_starts, sliding_window_nll
from sampling_course.apps.long_text_results import FULL, POSITION_RULES, REPREFILL, SLIDING, cache_method, smoothed_nll
from sampling_course.implementation import impl_module, load_demo
from sampling_course.stories import parse_story

TOL = 1e-4  # fp32 NLLs of two correct routes agree to ~1e-5
WINDOW, SINKS, STRIDE = 16, 4, 5


@pytest.fixture(scope="module")
def model(tiny):
    return load_demo(tiny, impl_module("transformer", "solutions"))


@pytest.fixture(scope="module")
def tokens(tiny):
    return long_text.story_texts(tiny.tokenizer, n_texts=2, length=tiny.cfg.n_ctx + 24, seed=7)


@pytest.fixture(scope="module")
def results(model, tokens):
    caches = impl_module("caches", "solutions")
    return long_text.run_experiment(model, caches, tokens, WINDOW, SINKS, STRIDE, model_name="tiny")


def test_quick_mode_runs_and_prints_the_table(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")  # rich wraps to the terminal's width; keep the method names whole
    assert long_text.main(["--quick", "--model", "tiny"]) == 0
    out = capsys.readouterr().out
    for expected in ("Long texts on tiny", "full attention", "sliding window", "re-prefilled", "window cache", "sink cache",
                     "absolute positions", "checked:", "Share of attention on the first 4 tokens"):
        assert expected in out, f"{expected!r} missing from the quick run's output:\n{out}"


def test_story_texts_are_stories_after_end_of_text(tiny):
    texts = long_text.story_texts(tiny.tokenizer, n_texts=2, length=1000, seed=3)
    eos = tiny.tokenizer.eos_token_id
    assert texts.shape == (2, 1000) and (texts[:, 0] == eos).all()
    assert torch.equal(texts, long_text.story_texts(tiny.tokenizer, n_texts=2, length=1000, seed=3))
    assert not torch.equal(texts, long_text.story_texts(tiny.tokenizer, n_texts=2, length=1000, seed=4))
    ids = texts[0].tolist()
    starts = [i for i, token in enumerate(ids) if token == eos]
    assert len(starts) >= 2, "1000 tokens should hold more than one story"
    for start, end in zip(starts, starts[1:]):  # every complete story between two end-of-text tokens
        assert parse_story(tiny.tokenizer.decode(ids[start + 1 : end])) is not None


def test_every_method_equals_full_attention_until_the_window_fills(results):
    full = results.methods[FULL].nll
    torch.testing.assert_close(full, results.uncached_full_nll, atol=TOL, rtol=0, equal_nan=True)
    for name, result in results.methods.items():
        scored = ~result.nll[:, :WINDOW].isnan()
        assert scored.any(), name
        diff = (result.nll[:, :WINDOW] - full[:, :WINDOW])[scored].abs().max().item()
        assert diff < TOL, f"{name}: NLL differs from full attention by {diff:.2e} before the window fills"
    assert max(results.checks().values()) < TOL


def test_windowed_methods_differ_once_the_window_is_full(results):
    """Past W the methods see less than the prefix: their NLL must move (else the checks above prove nothing)."""
    full = results.methods[FULL].nll
    n_ctx = results.n_ctx
    for name, result in results.methods.items():
        if name == FULL:
            continue
        past = result.nll[:, WINDOW:n_ctx] - full[:, WINDOW:n_ctx]
        assert past[~past.isnan()].abs().max() > 1e-2, f"{name} equals full attention even after the window is full"


def test_which_positions_each_method_scores(results, tokens):
    n_ctx, length = results.n_ctx, tokens.shape[1]
    full = results.methods[FULL].nll
    assert not full[:, :n_ctx].isnan().any() and full[:, n_ctx:].isnan().all()
    sliding = results.methods[SLIDING].nll
    assert (~sliding.isnan()).any(0).nonzero().flatten().tolist() == list(range(0, length - 1, STRIDE))
    names = [REPREFILL] + [cache_method(s, r) for s in (0, SINKS) for r in POSITION_RULES]
    for name in names:
        assert not results.methods[name].nll.isnan().any(), f"{name} must score every position"
    assert results.methods[cache_method(SINKS, "cache")].cache_bytes * n_ctx == (
        results.methods[FULL].cache_bytes * WINDOW
    ), "a cache of W slots holds W / n_ctx of a full cache"
    assert results.methods[SLIDING].cache_bytes == 0
    # The table compares every method on the positions they all scored: the sliding window's.
    _, start, end = results.ranges()[1]
    on_stride = [t for t in range(start, end) if t % STRIDE == 0]
    assert results.common_positions(start, end).any(0).nonzero().flatten().add(start).tolist() == on_stride
    assert results.mean_nll(FULL, start, end) == pytest.approx(full[:, on_stride].mean().item(), rel=1e-6)
    assert results.mean_nll(FULL, start, end, common=False) == pytest.approx(
        full[:, start:end].mean().item(), rel=1e-6  # float32 means summed in another order
    )


def test_sliding_window_covering_the_whole_prefix_is_full_attention(model, tokens, results):
    full = results.methods[FULL].nll
    positions = [0, 40, results.n_ctx - 1]
    nll, _ = sliding_window_nll(model, tokens, window=results.n_ctx, positions=positions)
    torch.testing.assert_close(nll[:, positions], full[:, positions], atol=TOL, rtol=0)


def test_sliding_window_equals_hugging_face_on_the_same_window(tiny, model, tokens):
    t = tokens.shape[1] - 2  # the last position: past n_ctx
    nll, _ = sliding_window_nll(model, tokens, WINDOW, [t])
    with torch.inference_mode():
        logits = tiny.hf_model(tokens[:, t + 1 - WINDOW : t + 1]).logits[:, -1]
    expected = -logits.log_softmax(-1).gather(-1, tokens[:, t + 1 : t + 2])[:, 0]
    torch.testing.assert_close(nll[:, t], expected, atol=TOL, rtol=0)


def test_reprefill_windows_follow_their_schedule():
    """The window starts at token 0 until it holds W tokens; then each new window starts with the last W // 2 tokens
    (the arriving one included) and grows to W again: a prefill every W - W // 2 + 1 tokens."""
    window, keep = 6, 3
    starts = reprefill_starts(20, window)
    assert starts[:window] == [0] * window
    for t, start in enumerate(starts):
        assert start <= t and t - start < window, f"token {t}: window from {start} holds more than {window} tokens"
        if t and start != starts[t - 1]:
            assert t - starts[t - 1] == window and t - start == keep - 1, f"token {t}: new window from {start}"
    assert sorted(set(starts)) == [0, 4, 8, 12, 16]


def test_reprefill_equals_hugging_face_on_each_window(tiny, model, tokens, results):
    """At every position the re-prefilled window gives Hugging Face's NLL for the tokens from its window's start,
    run from scratch at positions 0, 1, ... (an independent route: one uncached forward per position)."""
    nll = results.methods[REPREFILL].nll
    starts = reprefill_starts(tokens.shape[1] - 1, WINDOW)
    with torch.inference_mode():
        for t, start in enumerate(starts):
            logits = tiny.hf_model(tokens[:, start : t + 1]).logits[:, -1]
            expected = -logits.log_softmax(-1).gather(-1, tokens[:, t + 1 : t + 2])[:, 0]
            torch.testing.assert_close(nll[:, t], expected, atol=TOL, rtol=0, msg=lambda m: f"position {t}.\n{m}")
    new_windows = sum(1 for a, b in zip(starts, starts[1:]) if a != b)
    assert f"({new_windows} prefills)" in results.methods[REPREFILL].how


def test_attention_patterns_are_distributions_and_the_mass_is_read_from_them(tiny, tokens):
    hf = attention_sinks.eager_hf_model(tiny)
    n = tiny.cfg.n_ctx
    patterns = attention_sinks.attention_patterns(hf, tokens[:, :n])
    assert len(patterns) == tiny.cfg.n_layers
    for pattern in patterns:
        assert pattern.shape == (tokens.shape[0], tiny.cfg.n_heads, n, n)
        torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:-1]), atol=1e-5, rtol=0)
        assert pattern.triu(diagonal=1).abs().max() == 0, "a query attends to a later key"
    mass = attention_sinks.attention_mass_on_first(hf, tokens, k=3, from_position=10)
    assert mass.shape == (tiny.cfg.n_layers, tiny.cfg.n_heads)
    assert ((mass >= 0) & (mass <= 1)).all()
    expected = torch.stack([p[:, :, 10:, :3].sum(-1).mean(dim=(0, 2)) for p in patterns])
    torch.testing.assert_close(mass, expected, atol=1e-5, rtol=0)
    everything = attention_sinks.attention_mass_on_first(hf, tokens, k=n, from_position=10)
    torch.testing.assert_close(everything, torch.ones_like(everything), atol=1e-5, rtol=0)
    eos = tokens == tiny.tokenizer.eos_token_id
    on_eos = attention_sinks.attention_mass(hf, tokens, eos, from_position=10)
    expected = torch.stack([(p[:, :, 10:] * eos[:, None, None, :n]).sum(-1).mean(dim=(0, 2)) for p in patterns])
    torch.testing.assert_close(on_eos, expected, atol=1e-5, rtol=0)
    assert attention_sinks.uniform_mass_on_first(1, 0, 2) == pytest.approx(0.75)  # queries 0 and 1: 1/1 and 1/2


def test_attention_on_the_latest_marked_token_is_read_per_query(tiny, tokens):
    """latest_marks marks, for each query, the last <|endoftext|> at or before it (a loop finds it here);
    attention_mass reads each query's own keys from the patterns; uniform_mass is 1/(q+1) where one is marked."""
    hf = attention_sinks.eager_hf_model(tiny)
    n = tiny.cfg.n_ctx
    eos = tiny.tokenizer.eos_token_id
    marks = attention_sinks.latest_marks(tokens, eos)
    assert marks.shape == (*tokens.shape, tokens.shape[1])
    for text in range(tokens.shape[0]):
        seen = [p for p in range(tokens.shape[1]) if tokens[text, p] == eos]
        for query in range(tokens.shape[1]):
            before = [p for p in seen if p <= query]
            assert marks[text, query].nonzero().flatten().tolist() == before[-1:], (text, query)
    patterns = attention_sinks.attention_patterns(hf, tokens[:, :n])
    mass = attention_sinks.attention_mass(hf, tokens, marks, from_position=10)
    expected = torch.stack([(p[:, :, 10:] * marks[:, None, 10:n, :n]).sum(-1).mean(dim=(0, 2)) for p in patterns])
    torch.testing.assert_close(mass, expected, atol=1e-5, rtol=0)
    has_one = marks[:, 10:n, :n].any(-1).float()
    expected_uniform = (has_one / torch.arange(11, n + 1)).mean().item()
    assert attention_sinks.uniform_mass(marks[:, :n, :n], 10) == pytest.approx(expected_uniform)
    with pytest.raises(ValueError, match="one row per query"):
        attention_sinks.attention_mass(hf, tokens, marks[:, :5], from_position=10)


def test_bad_settings_fail_with_a_message(model, tokens, tiny):
    caches = impl_module("caches", "solutions")
    with pytest.raises(ValueError, match="window must be an integer"):
        long_text.run_experiment(model, caches, tokens, tiny.cfg.n_ctx + 1)
    with pytest.raises(ValueError, match="window must be an integer"):
        long_text.run_experiment(model, caches, tokens, 1)
    with pytest.raises(ValueError, match="num_sink_tokens"):
        long_text.run_experiment(model, caches, tokens, 8, num_sink_tokens=8)
    with pytest.raises(ValueError, match="next token"):
        sliding_window_nll(model, tokens, 8, [tokens.shape[1] - 1])
    assert long_text.main(["--model", "tiny", "--window", str(tiny.cfg.n_ctx + 1), "--texts", "1"]) == 2


def test_smoothed_nll_averages_what_was_scored():
    nll = torch.tensor([[1.0, float("nan"), 3.0, 5.0, float("nan")], [3.0, float("nan"), 5.0, 7.0, float("nan")]])
    curve = smoothed_nll(nll, width=2)
    # Position means 2, -, 4, 6, -; windows of 2 ending at each position; nothing after the last one scored.
    torch.testing.assert_close(curve, torch.tensor([2.0, 2.0, 4.0, 5.0, float("nan")]), equal_nan=True)
    assert smoothed_nll(torch.full((2, 3), float("nan"))).isnan().all()
