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
