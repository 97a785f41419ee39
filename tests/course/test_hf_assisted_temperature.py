"""Notebook 07's claim about the pinned transformers, checked on the installed library by what it does: in
assisted generation with sampling at temperature ``T``, the draft's distribution ``q`` is
``softmax(draft logits / T**2)`` (the temperature applied twice), the draft's guesses are drawn from that ``q``,
and the acceptance rule compares it with the target's ``p = softmax(target logits / T)`` (applied once).

Two tiny random GPT-2 models run a real ``generate(..., assistant_model=...)``; the test records what the
candidate generator returns and what the acceptance rule (``_speculative_sampling``) receives, and recomputes
both models' raw logits on the same tokens. If a release applies the temperature once, the first check fails,
and the notebook's question must change with it.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402
from transformers.generation import candidate_generator, utils  # noqa: E402


def tiny_gpt2(seed: int) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=50, n_positions=64, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=None)
    model = GPT2LMHeadModel(config).eval()
    model.generation_config.eos_token_id = None
    return model


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_assisted_generation_applies_the_temperature_twice_to_the_draft_and_once_to_the_target(temperature, monkeypatch):
    target, draft = tiny_gpt2(0), tiny_gpt2(1)
    # The settings notebook 07 uses (sampling_course.apps.speculative_pair.hf_generate): exactly 3 guesses a round.
    draft.generation_config.num_assistant_tokens = 3
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    drafted, judged = [], []
    get_candidates = candidate_generator.AssistedCandidateGenerator.get_candidates
    speculative_sampling = utils._speculative_sampling

    def recording_get_candidates(self, input_ids, **kwargs):
        rng = torch.get_rng_state()
        ids, logits = get_candidates(self, input_ids, **kwargs)
        if logits is not None:  # None: the text is already as long as asked, nothing drafted
            drafted.append((rng, input_ids.shape[1], ids.clone(), logits.clone()))
        return ids, logits

    def recording_speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits, **kwargs):
        judged.append((candidate_input_ids.clone(), candidate_logits.clone(), new_logits.clone()))
        return speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits, **kwargs)

    monkeypatch.setattr(candidate_generator.AssistedCandidateGenerator, "get_candidates", recording_get_candidates)
    monkeypatch.setattr(utils, "_speculative_sampling", recording_speculative_sampling)
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    torch.manual_seed(0)
    with torch.no_grad():
        target.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=draft, do_sample=True,
                        temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=12, pad_token_id=0)
    assert drafted and judged and sum(ids.shape[1] - length for _, length, ids, _ in drafted) >= 6

    for rng, length, ids, logits in drafted:
        with torch.no_grad():
            raw = draft(ids).logits[:, length - 1 : -1]  # the draft's logits for each guess
        q = logits.log_softmax(-1)
        torch.testing.assert_close(q, (raw / temperature**2).log_softmax(-1), atol=1e-5, rtol=0)
        assert (q - (raw / temperature).log_softmax(-1)).abs().max() > 0.05  # not the temperature once
        # The guesses are drawn from that q: replaying the generator's random state through one
        # torch.multinomial(softmax, 1) per guess (how Hugging Face samples a step) gives the same tokens.
        torch.set_rng_state(rng)
        guesses = [torch.multinomial(logits[:, i].softmax(-1), 1).item() for i in range(logits.shape[1])]
        assert guesses == ids[0, length:].tolist()

    for ids, candidate_logits, new_logits in judged:
        n_guesses = candidate_logits.shape[1]
        with torch.no_grad():
            raw_draft = draft(ids).logits[:, -n_guesses - 1 : -1]
            raw_target = target(ids).logits[:, -n_guesses - 1 :]
        torch.testing.assert_close(candidate_logits.log_softmax(-1), (raw_draft / temperature**2).log_softmax(-1),
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(new_logits.log_softmax(-1), (raw_target / temperature).log_softmax(-1),
                                   atol=1e-5, rtol=0)
