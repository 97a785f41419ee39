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
