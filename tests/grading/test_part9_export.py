"""Part 9: the course's models exported in Hugging Face's format and loaded back with
``AutoModelForCausalLM.from_pretrained`` (offline, from the folder): the same logits (part 1's
tolerances) and the same greedy tokens (Hugging Face's ``generate`` against the course's loop).

The GPT-2 side exports the solutions' DemoTransformer (the learner's own in the student release) holding the offline story model's
weights; the Llama side exports the Llama-style model on the perturbed random Llama and Qwen3
configurations. These tests import transformers and write checkpoints: ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from sampling_course.config import Config
from sampling_course.export import export_gpt2, export_llama, gpt2_hf_state_dict
from sampling_course.grading.tolerances import parity
from sampling_course.implementation import Impl, load_demo, solved_earlier
from sampling_course.llama_config import LlamaConfig
from sampling_course.llama_weights import random_llama_weights
from sampling_course.weights import load_weights

TOL = parity("cpu")
# The course's earlier parts: the solutions', or in the student release (no solutions) the learner's own.
EARLIER = solved_earlier(Impl("exercises"))
LLAMAS = {
    "llama": LlamaConfig(d_model=64, d_vocab=96, n_ctx=64, d_head=16, d_mlp=160, n_heads=4, n_key_value_heads=2),
    "qwen3": LlamaConfig(d_model=64, d_vocab=96, n_ctx=64, d_head=12, d_mlp=128, n_heads=6, n_key_value_heads=2,
                         qk_norm=True),
}


def loaded_back(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()


def hf_greedy(model, tokens: torch.Tensor, steps: int) -> torch.Tensor:
    model.generation_config.eos_token_id = None  # every step, whatever token comes
    return model.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=steps, do_sample=False,
                          pad_token_id=0)


def course_greedy_gpt2(model, tokens: torch.Tensor, steps: int) -> torch.Tensor:
    """Argmax of the course's model, one full forward per step (no cache: nothing else to trust)."""
    with torch.no_grad():
        for _ in range(steps):
            tokens = torch.cat([tokens, model(tokens)[:, -1:].argmax(-1)], dim=1)
    return tokens


@pytest.mark.slow
def test_story_demo_transformer_round_trips_as_gpt2(tmp_path):
    from sampling_course.reference import load_reference

    reference = load_reference("story", device="cpu")
    model = load_demo(reference, EARLIER.transformer, device="cpu")
    folder = export_gpt2(model, reference.cfg, tmp_path / "story-gpt2", tokenizer=reference.tokenizer)
    hf = loaded_back(folder)
    assert type(hf).__name__ == "GPT2LMHeadModel"
    tokens = torch.tensor([reference.tokenizer("Once upon a time, the little fox").input_ids])
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens), **TOL)
    assert hf_greedy(hf, tokens, 10).tolist() == course_greedy_gpt2(model, tokens, 10).tolist()


def test_gpt2_export_refuses_an_unembedding_bias():
    cfg = Config(d_model=8, d_vocab=10, n_ctx=4, d_head=4, d_mlp=16, n_heads=2, n_layers=1)
    model = EARLIER.transformer.DemoTransformer(cfg)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state["unembed.b_U"] = torch.ones(cfg.d_vocab)
    with pytest.raises(ValueError, match="b_U"):
        gpt2_hf_state_dict(state, cfg)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LLAMAS))
def test_llama_style_model_round_trips(name, tmp_path):
    cfg = LLAMAS[name]
    model = load_weights(EARLIER.llama.LlamaTransformer(cfg), random_llama_weights(cfg, 5)).eval()
    hf = loaded_back(export_llama(model, cfg, tmp_path / name))
    assert type(hf).__name__ == ("Qwen3ForCausalLM" if cfg.qk_norm else "LlamaForCausalLM")
    tokens = torch.randint(0, cfg.d_vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens), **TOL)
    assert hf_greedy(hf, tokens, 12).tolist() == EARLIER.llama.greedy(model, tokens, 12).tolist()


def test_export_llama_wants_its_config(tmp_path):
    with pytest.raises(TypeError, match="LlamaConfig"):
        export_llama(torch.nn.Linear(2, 2), Config(), tmp_path)
