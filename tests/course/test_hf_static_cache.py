"""Part 6's static cache as a Hugging Face ``Cache`` (``sampling_course.hf_generate.StaticKeyValueCache``).

The oracle is Hugging Face's own ``generate`` on the same model and inputs, with its default
dynamic cache and with its own ``StaticCache``: greedy decoding must give its tokens, seeded
sampling its draws (the cache changes no number the draws depend on), beam search its
sequences and ``sequences_scores`` (beam search reorders the cache's rows at every step: part 6's
``reorder``). The models are the trained story-llama (``LlamaForCausalLM``, grouped-query
attention) and random GPT-2, Llama and Qwen3 configurations; the prompts are left-padded, so
the cache must leave Hugging Face's attention mask and positions alone.
"""

from __future__ import annotations

import pytest
import torch

from sampling_course.implementation import Impl
from sampling_course.reference import load_reference

from test_hf_generate import BUILDERS, course, prompts

NEW = 24


@pytest.fixture(scope="module")
def story_llama():
    """story-llama's Hugging Face model and two left-padded story prompts (7 and 2 tokens)."""
    ref = load_reference("story-llama", "cpu")
    rows = [ref.tokenizer.encode(text) for text in ("Once upon a time, a fox", "The little")]
    width, eos = max(map(len, rows)), ref.tokenizer.eos_token_id
    ids = torch.tensor([[eos] * (width - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    assert bool((mask == 0).any()) and ids.shape[1] > 2, "precondition: the prompts are left-padded"
    return ref.hf_model, dict(input_ids=ids, attention_mask=mask, pad_token_id=eos, eos_token_id=eos)


def static(model, batch: int = 2, max_len: int = 64, impl: str | None = None):
    from sampling_course.hf_generate import StaticKeyValueCache

    return StaticKeyValueCache(model.config, batch, max_len, impl=impl)


@pytest.mark.parametrize("way", ["hugging face", "course"])
def test_greedy_on_story_llama_is_hugging_faces(story_llama, way):
    """24 greedy tokens after two left-padded prompts: Hugging Face's tokens with its dynamic cache and with its
    StaticCache, whether Hugging Face's loop or the course's drives the model through the course's cache."""
    from transformers import StaticCache

    model, batch = story_llama
    settings = dict(**batch, max_new_tokens=NEW, do_sample=False)
    expected = model.generate(**settings)
    assert torch.equal(model.generate(**settings, past_key_values=StaticCache(model.config, max_cache_len=64)), expected)
    cache = static(model)
    got = model.generate(**settings, past_key_values=cache, **(course("callable") if way == "course" else {}))
    assert torch.equal(got, expected)
    # The course's cache held the model's keys: every position run, its key/value heads, in part 6's buffer.
    positions = batch["input_ids"].shape[1] + NEW - 1
    assert cache.get_seq_length() == positions
    assert cache.course.buffer.shape == (model.config.num_hidden_layers, 2, 2, 64, model.config.num_key_value_heads,
                                         model.config.head_dim)


@pytest.mark.parametrize("way", ["hugging face", pytest.param("course", marks=pytest.mark.slow)])
def test_seeded_sampling_on_story_llama_draws_what_hugging_face_draws(story_llama, way):
    """Seeded alike, sampling with top-p and a temperature through the course's cache draws Hugging Face's tokens."""
    model, batch = story_llama
    settings = dict(**batch, max_new_tokens=NEW, do_sample=True, top_k=0, top_p=0.95, temperature=1.3)
    for seed in (1, 2):
        torch.manual_seed(seed)
        expected = model.generate(**settings)
        torch.manual_seed(seed)
        got = model.generate(**settings, past_key_values=static(model),
                             **(course("callable") if way == "course" else {}))
        assert torch.equal(got, expected), f"seed {seed}"


def test_beam_search_on_story_llama_reorders_the_cache_as_hugging_face_does(story_llama):
    """Hugging Face's beam search (3 beams, 2 returned) through the course's cache: its sequences and scores.
    The cache holds every beam of every prompt (6 rows) and part 6's reorder follows the beams."""
    model, batch = story_llama
    settings = dict(**batch, max_new_tokens=12, do_sample=False, num_beams=3, num_return_sequences=2,
                    return_dict_in_generate=True, output_scores=True)
    expected = model.generate(**settings)
    got = model.generate(**settings, past_key_values=static(model, batch=6))
    assert torch.equal(got.sequences, expected.sequences)
    torch.testing.assert_close(got.sequences_scores, expected.sequences_scores, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def model(request):
    return BUILDERS[request.param]()


def test_greedy_on_random_models_is_hugging_faces(model):
    """GPT-2, Llama (grouped-query) and Qwen3 (q/k norms) random models, left-padded prompts: Hugging Face's tokens."""
    settings = dict(**prompts(), max_new_tokens=12, do_sample=False, pad_token_id=0)
    expected = model.generate(**settings)
    assert torch.equal(model.generate(**settings, past_key_values=static(model, batch=3, max_len=20)), expected)
    assert torch.equal(model.generate(**settings, past_key_values=static(model, batch=3, max_len=20),
                                      **course("callable")), expected)


def test_a_cache_with_more_rows_than_the_batch_takes_it(model):
    """An empty cache takes any batch that fits its rows, as part 6's does."""
    settings = dict(**prompts(), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(**settings, past_key_values=static(model, batch=5, max_len=11)),
                       model.generate(**settings))


def test_the_implementation_asked_for_stores_the_keys(story_llama):
    """``impl=`` picks whose part 6 holds the keys; the exercises' stubs are not the solutions'."""
    model, batch = story_llama
    cache = static(model, impl="solutions")
    model.generate(**batch, max_new_tokens=2, do_sample=False, past_key_values=cache)
    assert type(cache.course) is Impl("solutions").caches.StaticKeyValueCache
    assert static(model, impl="exercises").caches is Impl("exercises").caches


@pytest.mark.parametrize("way", ["hugging face", "course"])
def test_a_cache_too_short_or_too_narrow_is_refused(story_llama, way):
    """max_len under prompt + max_new_tokens - 1, or fewer rows than the batch: a ValueError saying what to allocate.
    The course's loop refuses before the first step; Hugging Face's at the step that does not fit."""
    model, batch = story_llama
    ours = course("callable") if way == "course" else {}
    width = batch["input_ids"].shape[1]
    settings = dict(**batch, max_new_tokens=NEW, do_sample=False)
    with pytest.raises(ValueError, match="max_len"):
        model.generate(**settings, past_key_values=static(model, max_len=width + NEW - 2), **ours)
    with pytest.raises(ValueError, match="batch=2"):
        model.generate(**settings, past_key_values=static(model, batch=1), **ours)
    # Exactly enough room: the last token is never run.
    exact = model.generate(**settings, past_key_values=static(model, max_len=width + NEW - 1), **ours)
    assert torch.equal(exact, model.generate(**settings))


def test_bad_arguments_are_refused(story_llama):
    from sampling_course.hf_generate import StaticKeyValueCache

    model, _ = story_llama
    with pytest.raises(ValueError, match="batch"):
        static(model, batch=0)
    with pytest.raises(ValueError, match="max_len"):
        static(model, max_len=0)
    with pytest.raises(ValueError, match="model.config"):
        StaticKeyValueCache(object(), 2, 64)
    cache = static(model)
    with pytest.raises(ValueError, match="negative|minus"):
        cache.crop(3)


def test_a_generation_keeps_its_rows(story_llama):
    """Rows that change in the middle of a generation are refused; reset() starts a new one."""
    model, batch = story_llama
    cache = static(model)
    with torch.no_grad():
        model(**{k: batch[k] for k in ("input_ids", "attention_mask")}, past_key_values=cache, use_cache=True)
        with pytest.raises(ValueError, match="rows"):
            model(input_ids=batch["input_ids"][:1, -1:], past_key_values=cache, use_cache=True)
    cache.reset()
    assert cache.get_seq_length() == 0
    settings = dict(**batch, max_new_tokens=4, do_sample=False)
    assert torch.equal(model.generate(**settings, past_key_values=cache), model.generate(**settings))
