"""Part 9's attention-sink cache as a Hugging Face ``Cache`` (``sampling_course.hf_generate.SinkCache``).

The oracle is the course's own sink cache, part 9's ``RotatingSinkCache`` on part 9's
``LlamaTransformer`` (the solutions; ``test_part9_rope_sink`` checks it against a brute force
built from Hugging Face's layers), on the same weights as Hugging Face's Llama and Qwen3 models.
Prompts and continuations run well past the cache's capacity, so keys are evicted and re-rotated
at almost every step. Three ways of driving the Hugging Face model must match it: a step-by-step
loop (``make_room`` then the model), the course's ``custom_generate``, and Hugging Face's own
``generate``, which gives tokens their text positions and leaves the cache to change frames.
"""

from __future__ import annotations

import pytest
import torch

from sampling_course.grading.tolerances import parity
from sampling_course.implementation import Impl
from sampling_course.llama_config import LlamaConfig
from sampling_course.llama_weights import random_llama_weights
from sampling_course.weights import load_weights

from test_hf_generate import LLAMA, QWEN3, hf_gpt2, hf_llama

TOL = parity("cpu")
N_SINK, WINDOW, PROMPT, NEW = 2, 5, 4, 16
CONFIGS = {"llama": LLAMA, "qwen3": QWEN3}
SOLUTIONS = Impl("solutions")


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request):
    """Hugging Face's model and the course's, on the same perturbed random weights."""
    cfg: LlamaConfig = CONFIGS[request.param]
    ours = load_weights(SOLUTIONS.llama.LlamaTransformer(cfg), random_llama_weights(cfg, 35)).eval()
    return cfg, hf_llama(cfg, seed=35), ours


def prompt(cfg: LlamaConfig, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, cfg.d_vocab, (batch, PROMPT), generator=torch.Generator().manual_seed(4))


@torch.no_grad()
def course_greedy(cfg, ours, tokens: torch.Tensor, n_sink: int = N_SINK) -> tuple[torch.Tensor, torch.Tensor]:
    """The course's own sink cache, greedy: the sequences and each new token's raw log-probability."""
    cache = SOLUTIONS.rope_sink.RotatingSinkCache(cfg, n_sink=n_sink, window=WINDOW)
    logits = ours(tokens, cache)[0][:, -1]  # the cache makes room itself (its prepare)
    chosen = []
    for _ in range(NEW):
        token = logits.argmax(-1, keepdim=True)
        chosen.append(logits.log_softmax(-1).gather(-1, token)[:, 0])
        tokens = torch.cat([tokens, token], dim=1)
        logits = ours(tokens, cache)[0][:, -1]  # the whole text so far: the cache runs the new token
    return tokens, torch.stack(chosen, dim=1)


def new_sink_cache(model, n_sink: int = N_SINK):
    from sampling_course.hf_generate import SinkCache

    return SinkCache(model.config, n_sink, WINDOW)


@pytest.mark.parametrize("n_sink", [N_SINK, pytest.param(0, marks=pytest.mark.slow)])
def test_stepping_the_hugging_face_model_gives_the_courses_logits(pair, n_sink):
    """make_room, then the model without positions: every step's logits equal part 9's, past the capacity."""
    cfg, model, ours = pair
    tokens = torch.randint(0, cfg.d_vocab, (2, 20), generator=torch.Generator().manual_seed(5))
    cache = SOLUTIONS.rope_sink.RotatingSinkCache(cfg, n_sink=n_sink, window=WINDOW)
    expected = SOLUTIONS.rope_sink.stream_logits(ours, tokens, cache, prefill=3)
    hf_cache, steps = new_sink_cache(model, n_sink), []
    with torch.no_grad():
        for start, stop in [(0, 3), *((t, t + 1) for t in range(3, tokens.shape[1]))]:
            hf_cache.make_room(stop - start)
            steps.append(model(input_ids=tokens[:, start:stop], past_key_values=hf_cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, **TOL)
    assert hf_cache.get_seq_length() == n_sink + WINDOW


@pytest.mark.parametrize("way", ["course", "hugging face"])
def test_generate_with_the_sink_cache_gives_the_courses_tokens(pair, way):
    """Greedy, 16 new tokens after a 4-token prompt through 2 sinks and a window of 5: the course's tokens,
    and each token's raw log-probability, whether the course's loop or Hugging Face's drives the model."""
    from sampling_course.hf_generate import course_decoding

    cfg, model, ours = pair
    tokens = prompt(cfg)
    expected, expected_logprobs = course_greedy(cfg, ours, tokens)
    settings = dict(input_ids=tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=NEW, do_sample=False,
                    past_key_values=new_sink_cache(model), return_dict_in_generate=True)
    if way == "course":
        out = model.generate(**settings, custom_generate=course_decoding)
        logprobs = out.logprobs
    else:
        out = model.generate(**settings, output_logits=True)
        logprobs = torch.stack([step.log_softmax(-1) for step in out.logits], 1).gather(
            -1, out.sequences[:, PROMPT:, None])[..., 0]
    assert torch.equal(out.sequences, expected)
    torch.testing.assert_close(logprobs, expected_logprobs, **TOL)


def test_a_window_longer_than_the_text_is_a_plain_cache(pair):
    """Nothing evicted: the sink cache in the course's loop gives Hugging Face's own greedy tokens."""
    from sampling_course.hf_generate import SinkCache, course_decoding

    _, model, _ = pair
    tokens = prompt(LLAMA)
    settings = dict(input_ids=tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=NEW, do_sample=False)
    with_sinks = model.generate(**settings, past_key_values=SinkCache(model.config, 2, 40), custom_generate=course_decoding)
    assert torch.equal(with_sinks, model.generate(**settings))


def test_the_sink_cache_refuses_what_it_cannot_do(llama):
    from sampling_course.hf_generate import SinkCache, course_decoding

    with pytest.raises(ValueError, match="Llama or Qwen3"):
        SinkCache(hf_gpt2().config, 2, 5)
    with pytest.raises(ValueError, match="window"):
        SinkCache(llama.config, 2, 0)
    tokens = torch.arange(8)[None].expand(2, -1)
    padded = torch.ones_like(tokens)
    padded[1, 0] = 0
    with pytest.raises(ValueError, match="padding"):
        llama.generate(input_ids=tokens, attention_mask=padded, max_new_tokens=2, pad_token_id=0,
                       past_key_values=SinkCache(llama.config, 2, 10), custom_generate=course_decoding)
    with pytest.raises(ValueError, match="window=5"):
        llama.generate(input_ids=tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=2,
                       past_key_values=SinkCache(llama.config, 2, 5), custom_generate=course_decoding)


@pytest.fixture(scope="module")
def llama():
    return hf_llama(LLAMA)
