"""The long-text experiment on a rotary model: what each method scores, with and without the
recomputed sliding window (notebook 09 runs the second model without it)."""

import importlib
import math

import pytest
import torch

from sampling_course.apps import long_text_llama
from sampling_course.apps.long_text_results import FULL, SLIDING
from sampling_course.llama_config import LlamaConfig
from sampling_course.llama_weights import random_llama_weights
from sampling_course.weights import load_weights


@pytest.fixture(scope="module")
def setup():
    llama = importlib.import_module("solutions.llama")
    rope_sink = importlib.import_module("solutions.rope_sink")
    cfg = LlamaConfig(d_vocab=32, n_ctx=16, n_layers=1, n_heads=2, n_key_value_heads=1, d_head=8, d_model=16, d_mlp=32)
    model = load_weights(llama.LlamaTransformer(cfg), random_llama_weights(cfg, seed=0)).eval()
    texts = torch.randint(0, 32, (2, 40), generator=torch.Generator().manual_seed(1))
    return model, llama, rope_sink, texts


def test_leaving_out_the_recomputed_window_changes_no_other_method(setup):
    model, llama, rope_sink, texts = setup
    both = long_text_llama.run_llama_experiment(model, llama, rope_sink, texts, window=8, num_sink_tokens=2, stride=4)
    fewer = long_text_llama.run_llama_experiment(model, llama, rope_sink, texts, window=8, num_sink_tokens=2, stride=4,
                                                 recompute_window=False)
    assert SLIDING in both.methods and SLIDING not in fewer.methods
    assert list(fewer.methods) == [name for name in both.methods if name != SLIDING]
    for name, result in fewer.methods.items():
        torch.testing.assert_close(result.nll, both.methods[name].nll, equal_nan=True)
    # Without the recomputed window the table still averages over the positions it scores (every 4th past
    # the window), so the two tables agree on every other method.
    sliding = both.methods[SLIDING].nll
    assert torch.equal(long_text_llama.sliding_positions(40, 8, 4), ~sliding[0].isnan())
    assert sliding[:, 7:].isnan().any() and not sliding[:, 7::4][:, 1:].isnan().any()
    for start, end in [(0, 8), (8, 16), (16, 39)]:
        assert torch.equal(fewer.common_positions(start, end), both.common_positions(start, end))
        for name in fewer.methods:
            a, b = fewer.mean_nll(name, start, end), both.mean_nll(name, start, end)
            assert a == b or (math.isnan(a) and math.isnan(b)), (name, start, end, a, b)
    assert both.common_positions(8, 16).sum() < 2 * 8
    # Where the window covers the prefix, the recomputed window is full attention.
    torch.testing.assert_close(sliding[:, :7], both.methods[FULL].nll[:, :7])


def test_a_window_at_text_positions_is_the_re_rotated_window_and_sinks_are_not(setup):
    """Rotary scores depend on distances only: a window (no sinks) whose keys stay at their text positions, with
    each query at its own, gives the re-rotated window's NLL at every position. Sinks at their text positions
    sit ever farther from the query, so past the window they give other numbers than re-rotated sinks."""
    model, llama, rope_sink, texts = setup
    results = long_text_llama.run_llama_experiment(model, llama, rope_sink, texts, window=8, num_sink_tokens=2,
                                                   stride=4, recompute_window=False, ablations=True)
    methods = results.methods
    torch.testing.assert_close(methods[long_text_llama.WINDOW_TEXT].nll, methods[long_text_llama.WINDOW_CACHE].nll)
    sinks_text, sinks = methods[long_text_llama.SINK_TEXT].nll, methods[long_text_llama.SINK_CACHE].nll
    torch.testing.assert_close(sinks_text[:, :7], sinks[:, :7])  # the window still holds the whole prefix
    assert (sinks_text[:, 8:] - sinks[:, 8:]).abs().max() > 1e-3
    plain = long_text_llama.run_llama_experiment(model, llama, rope_sink, texts, window=8, num_sink_tokens=2,
                                                 stride=4, recompute_window=False)
    assert long_text_llama.WINDOW_TEXT not in plain.methods and long_text_llama.SINK_TEXT not in plain.methods


def test_the_text_position_cache_numbers_each_query_by_its_place_in_the_text():
    from solutions.kv_cache import CacheStep

    cache = long_text_llama.TextPositionCache(n_layers=2, n_sink=1, window=2, step=CacheStep)
    text = torch.arange(5)[None]
    for t in range(5):
        step = cache.prepare(text[:, : t + 1])
        assert step.new_tokens.tolist() == [[t]] and step.positions.tolist() == [[t]]  # its place in the text
        assert cache.seq_len == min(t, 2)  # room made: the sink and one recent token stay
        for layer in range(2):
            k = torch.full((1, 1, 1, 2), float(t))
            keys, _ = cache.update(layer, k, k)
        assert cache.commit() is cache
    assert keys[0, :, 0, 0].tolist() == [0.0, 3.0, 4.0] and cache.seq_len == 3


def test_the_paired_difference_and_its_interval_over_texts():
    """The difference is the table's (mean of a minus mean of b), and its interval and p-value are the sign-flip
    test's on each text's total difference over its scored positions (one NaN position left out of every
    method's mean); a method against itself gives exactly 0 with a p-value of 1."""
    from sampling_course.apps.long_text_results import LongTextResults, MethodResult
    from sampling_course.apps.sign_flip import sign_flip

    a = torch.arange(8.0)[:, None] + torch.tensor([[1.0, 1.5, 2.0, 2.5]])
    shift = torch.tensor([0.1, 0.2, 0.6, -0.05, 0.3, 0.25, 0.4, 0.15])
    b = a - shift[:, None] * torch.tensor([[1.0, 2.0, 1.0, 0.0]])
    a[:, 3] = float("nan")  # scored by no method at the last position: every method's mean leaves it out
    results = LongTextResults("m", n_ctx=4, window=4, num_sink_tokens=0, stride=1, tokens=torch.zeros(8, 5, dtype=torch.long))
    results.methods = {"a": MethodResult("a", a, 1.0, 0, ""), "b": MethodResult("b", b, 1.0, 0, "")}
    found = long_text_llama.paired_difference(results, "a", "b", 0, 4)
    assert math.isclose(found.estimate, results.mean_nll("a", 0, 4) - results.mean_nll("b", 0, 4), rel_tol=1e-6)
    expected = sign_flip((4 * shift).tolist(), [3] * 8)  # each text: shift * (1 + 2 + 1) over 3 positions
    assert found[:3] == pytest.approx(expected[:3], rel=1e-6) and found[3:] == expected[3:]  # float32 NLL
    assert found.separated() == "higher" and found.below == 1 and found.above == 7
    itself = long_text_llama.paired_difference(results, "a", "a", 0, 4)
    assert (itself.estimate, itself.low, itself.high, itself.p_value) == (0.0, 0.0, 0.0, 1.0)
