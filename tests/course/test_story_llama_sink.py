"""The shipped "story-llama-sink": story-llama fine-tuned with a dedicated sink token at position 0.

Its files are checked against the asset manifest; its tokenizer is the story tokenizer plus one
special token, ``<|sink|>``, that keeps every other id and that no story text encodes to; and its
held-out loss, read after that token, is recomputed here by Hugging Face's model against the
grammar's exact entropy floor on the same stories (``scripts/train_story_llama.py --sink``).
"""

from __future__ import annotations

import json

import pytest
import torch

from sampling_course.files import check_assets
from sampling_course.reference import load_reference
from sampling_course.stories import entropy_floor, heldout_stories, sample_stories
from sampling_course.tokenizer import ASSETS_DIR, load_story_tokenizer

NAME = "story-llama-sink"
FOLDER = ASSETS_DIR / NAME
SINK = "<|sink|>"


@pytest.fixture(scope="module")
def ref():
    return load_reference(NAME, "cpu")


def test_the_sink_model_ships_with_its_manifest(ref):
    listed = check_assets(FOLDER)  # sizes and SHA-256 as the manifest says
    on_disk = sorted(p.name for p in FOLDER.iterdir() if p.is_file())
    assert sorted(listed) == on_disk, f"every file of assets/{NAME} is listed in assets/MANIFEST.json"
    raw = json.loads((FOLDER / "config.json").read_text())
    assert raw["model_type"] == "llama" and raw["architectures"] == ["LlamaForCausalLM"]
    assert type(ref.hf_model).__name__ == "LlamaForCausalLM"
    assert len(ref.tokenizer) == ref.cfg.d_vocab == len(load_story_tokenizer()) + 1


def test_the_sink_token_is_new_and_every_other_id_is_kept(ref):
    story_vocab = load_story_tokenizer().backend_tokenizer.get_vocab(with_added_tokens=True)
    sink_vocab = ref.tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
    sink_id = sink_vocab.pop(SINK)
    assert sink_vocab == story_vocab, "the sink model's tokenizer gives every story token its old id"
    assert sink_id == len(story_vocab), "the sink token takes the one new id, after every other"
    training = json.loads((FOLDER / "training.json").read_text())
    assert training["sink_token"] == SINK and training["sink_token_id"] == sink_id


def test_no_story_text_encodes_to_the_sink_token(ref):
    """400 stories of the source, encoded by the sink model's tokenizer: the story tokenizer's ids, no sink."""
    sink_id = ref.tokenizer.backend_tokenizer.token_to_id(SINK)
    story_tokenizer = load_story_tokenizer()
    for story in sample_stories(400, seed=12345):
        ids = ref.tokenizer(story.text).input_ids
        assert sink_id not in ids, f"a story encodes to the sink token: {story.text[:80]!r}"
        assert ids == story_tokenizer(story.text).input_ids


def test_the_heldout_loss_after_the_sink_is_within_a_tenth_of_a_nat_of_the_floor(ref):
    """Each held-out story read as <|sink|> <|endoftext|> story <|endoftext|>, scored on the story and the
    closing token (the tokens the grammar's floor counts): training.json's loss, under 0.1 nats above the floor."""
    sink_id = ref.tokenizer.backend_tokenizer.token_to_id(SINK)
    eos = ref.tokenizer.eos_token_id
    stories = heldout_stories(ref.tokenizer, ref.cfg.n_ctx)
    nats, count = 0.0, 0
    with torch.no_grad():
        for story in stories:
            ids = torch.tensor([[sink_id, eos, *ref.tokenizer(story.text).input_ids, eos]])
            logp = torch.log_softmax(ref.hf_model(ids).logits[0, 1:-1].float(), dim=-1)  # targets: the story onwards
            nats -= logp.gather(-1, ids[0, 2:, None]).sum().item()
            count += ids.shape[1] - 2
    floor = entropy_floor(stories, ref.tokenizer)
    figures = json.loads((FOLDER / "training.json").read_text())
    assert len(stories) == figures["heldout_stories"]
    assert abs(floor - figures["entropy_floor"]) < 1e-4
    assert abs(nats / count - figures["heldout_loss"]) < 2e-3
    assert nats / count - floor < 0.1, f"held-out loss {nats / count:.4f} is not within 0.1 nats of {floor:.4f}"
