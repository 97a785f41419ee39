"""scripts/train_story_llama.py: a smoke run trains a LlamaForCausalLM with grouped-query attention and saves it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_training_smoke_run_lowers_the_loss_and_saves_a_llama(tmp_path) -> None:
    from transformers import LlamaForCausalLM

    spec = importlib.util.spec_from_file_location("train_story_llama", ROOT / "scripts" / "train_story_llama.py")
    sys.modules[spec.name] = module = importlib.util.module_from_spec(spec)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    figures = module.main(["--smoke", "--out", str(tmp_path), "--tokens", str(20 * 4 * 128)])
    (stage,) = figures["stages"]
    assert stage["steps"] == 20 and stage["last_train_loss"] < stage["first_train_loss"] - 1.0
    saved = tmp_path / "smoke"
    assert json.loads((saved / "training.json").read_text())["gap"] == figures["gap"]
    model = LlamaForCausalLM.from_pretrained(saved)
    assert model.config.num_key_value_heads < model.config.num_attention_heads


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    sys.modules[spec.name] = module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sink_windows_start_with_the_sink_then_a_story() -> None:
    """--sink's training windows: the sink token at position 0 and nowhere else, then <|endoftext|> and a story."""
    module = load_script("train_story_llama")  # puts scripts/ on the path
    from train_story_models import windows

    tokenizer, sink_id = module.sink_tokenizer()
    assert sink_id == len(tokenizer) - 1 == 1000
    stream = windows(tokenizer, 64, seed=7, prefix=[sink_id])
    for _ in range(20):
        window = next(stream)
        assert len(window) == 64 and window[:2] == [sink_id, tokenizer.eos_token_id]
        assert sink_id not in window[1:]


@pytest.mark.slow
def test_sink_fine_tuning_saves_a_model_with_one_more_token(tmp_path) -> None:
    from transformers import LlamaForCausalLM

    module = load_script("train_story_llama")
    figures = module.main(["--sink", "--out", str(tmp_path), "--tokens", str(2 * 4 * 512)])
    saved = tmp_path / "story-llama-sink"
    assert figures["fine_tuned_from"] == "story-llama" and figures["sink_token_id"] == 1000
    assert LlamaForCausalLM.from_pretrained(saved).config.vocab_size == 1001
    assert json.loads((saved / "training.json").read_text())["gap"] == figures["gap"]
