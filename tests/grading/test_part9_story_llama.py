"""Part 9: the trained Llama-style story model ("story-llama") against Hugging Face's LlamaForCausalLM.

The shipped checkpoint is checked against the asset manifest; the course's ``LlamaTransformer``
holding its weights must give the logits of ``LlamaForCausalLM.from_pretrained`` on the same
folder (part 1's tolerances), in one pass and through a cache; and the held-out loss its
``training.json`` reports is recomputed here by Hugging Face's model, against the grammar's
exact entropy floor on the same stories.
"""

from __future__ import annotations

import json

import pytest
import torch

from sampling_course.apps.long_text import story_texts
from sampling_course.files import check_assets
from sampling_course.grading.tolerances import parity
from sampling_course.llama_config import LlamaConfig
from sampling_course.reference import load_reference, reference_settings
from sampling_course.stories import entropy_floor, heldout_stories
from sampling_course.tokenizer import ASSETS_DIR
from sampling_course.weights import load_weights

TOL = parity()
FOLDER = ASSETS_DIR / "story-llama"


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    expected = expected.to(actual.device)
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    torch.testing.assert_close(actual, expected, **TOL, msg=lambda m: f"{what} differs from Hugging Face's.\n{m}")


def hf_logits(name: str, digest: str, tokens: torch.Tensor) -> torch.Tensor:
    """The oracle: Hugging Face's LlamaForCausalLM on the shipped model ``name`` (whose weights' SHA-256,
    ``digest``, keys the stored output) on ``tokens``."""
    ref = load_reference(name, "cpu")
    if ref.digest != digest:
        raise ValueError(f"{name}'s weights changed while the oracle was asked for their logits")
    return ref.hf_model(tokens).logits


@pytest.fixture(scope="module")
def trained(impl, device, oracle):
    """The shipped model in the implementation under test, Hugging Face's logits on the same folder, and two texts."""
    ref = load_reference("story-llama", "cpu")
    model = load_weights(impl.llama.LlamaTransformer(ref.cfg), ref.weights).to(device).eval()
    # On the CPU with Hugging Face's model, whatever device the session grades on (pytest --device).
    tokens = story_texts(ref.tokenizer, n_texts=2, length=160).cpu()
    # Stored after the first run: a check of LlamaTransformer need not import transformers (seconds of CPU).
    expected = oracle(hf_logits, ref.name, ref.digest, tokens)
    return dict(ref=ref, model=model, tokens=tokens, expected=expected, device=device)


def test_story_llama_ships_with_its_manifest():
    listed = check_assets(FOLDER)  # sizes and SHA-256 as the manifest says
    on_disk = sorted(p.name for p in FOLDER.iterdir() if p.is_file())
    assert sorted(listed) == on_disk, "every file of assets/story-llama is listed in assets/MANIFEST.json"
    name, cfg, tokenizer = reference_settings("story-llama")
    assert name == "story-llama" and isinstance(cfg, LlamaConfig)
    assert cfg.n_key_value_heads < cfg.n_heads, "the story model has grouped-query attention"
    assert len(tokenizer) == cfg.d_vocab == len(reference_settings("story")[2])
    raw = json.loads((FOLDER / "config.json").read_text())
    assert raw["model_type"] == "llama" and raw["architectures"] == ["LlamaForCausalLM"]


def test_story_llama_loads_as_a_llama_reference():
    ref = load_reference("story-llama", "cpu")
    assert type(ref.hf_model).__name__ == "LlamaForCausalLM"
    assert set(ref.weights) >= {"W_E", "W_U", "ln_final.w", "blocks.0.attn.W_K"}
    assert ref.weights["blocks.0.attn.W_K"].shape == (ref.cfg.n_key_value_heads, ref.cfg.d_model, ref.cfg.d_head)
    with pytest.raises(ValueError, match="story-llama"):
        load_reference("story-lama")


@pytest.mark.exercise("LlamaTransformer")
def test_trained_model_logits_match_hugging_face(trained):
    with torch.no_grad():
        logits = trained["model"](trained["tokens"].to(trained["device"]))
    assert_close(logits, trained["expected"], "story-llama logits")


@pytest.mark.exercise("LlamaTransformer")
def test_trained_model_cached_steps_match_hugging_face(trained, impl):
    """A prefill of 100 tokens, then one token per step: each step's logits are Hugging Face's at that position."""
    model, tokens, expected = trained["model"], trained["tokens"].to(trained["device"]), trained["expected"]
    cache = impl.llama.LlamaCache(model.cfg.n_layers)
    with torch.no_grad():
        assert_close(model(tokens[:, :100], cache)[0], expected[:, :100], "prefill logits")
        for position in range(100, 110):
            assert_close(model(tokens[:, : position + 1], cache)[0], expected[:, position : position + 1],
                         f"cached step at position {position}")


@pytest.mark.slow
def test_the_reported_heldout_loss_and_floor_are_true():
    """Hugging Face's model on the held-out stories (each <|endoftext|> + story + <|endoftext|>, scored on
    the story and the closing token) gives training.json's loss; the grammar gives its floor."""
    ref = load_reference("story-llama", "cpu")
    figures = json.loads((FOLDER / "training.json").read_text())
    stories = heldout_stories(ref.tokenizer, ref.cfg.n_ctx)
    eos = ref.tokenizer.eos_token_id
    nats, count = 0.0, 0
    with torch.no_grad():
        for story in stories:
            ids = torch.tensor([[eos, *ref.tokenizer(story.text).input_ids, eos]])
            logp = torch.log_softmax(ref.hf_model(ids).logits[0, :-1].float(), dim=-1)
            nats -= logp.gather(-1, ids[0, 1:, None]).sum().item()
            count += ids.shape[1] - 1
    assert len(stories) == figures["heldout_stories"]
    assert abs(entropy_floor(stories, ref.tokenizer) - figures["entropy_floor"]) < 1e-4
    assert abs(nats / count - figures["heldout_loss"]) < 2e-3


def test_trained_model_exports_and_loads_back(trained, impl, tmp_path):
    """export_llama writes the learner's model holding story-llama's weights; from_pretrained gives Hugging Face's logits."""
    from transformers import AutoModelForCausalLM

    from sampling_course.export import export_llama

    ref = trained["ref"]
    model = load_weights(impl.llama.LlamaTransformer(ref.cfg), ref.weights).to("cpu").eval()  # where HF's runs
    folder = export_llama(model, ref.cfg, tmp_path / "exported")
    loaded = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).to("cpu").eval()
    assert type(loaded).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        assert_close(loaded(trained["tokens"]).logits, trained["expected"], "exported story-llama logits")
