"""The course's part 5 loop inside Hugging Face's ``generate`` (``sampling_course.hf_generate``).

The oracle is Hugging Face's own ``generate`` on the same model, prompts and settings: greedy
decoding must give the same tokens, both ways of asking for the course's loop (the callable and
the ``custom_generate`` folder); sampling seeded alike must give the same draws (both loops make
one ``torch.multinomial`` draw per row per step from the same generator); the course's
``scores`` and ``logprobs`` must be log_softmax of Hugging Face's processed and raw logits at the
chosen tokens. Where the random streams differ (the course's private generator against torch's
global one), the draws are compared in law with a chi-square test. The models are random GPT-2,
Llama (grouped-query) and Qwen3 (q/k norms) configurations, every weight perturbed, and the
story model.
"""

from __future__ import annotations

import pytest
import torch

from sampling_course.llama_config import LlamaConfig
from sampling_course.llama_weights import hf_llama_state_dict, random_llama_weights

VOCAB = 96
LLAMA = LlamaConfig(d_model=64, d_vocab=VOCAB, n_ctx=64, d_head=16, d_mlp=160, n_heads=4, n_key_value_heads=2)
QWEN3 = LlamaConfig(d_model=64, d_vocab=VOCAB, n_ctx=64, d_head=12, d_mlp=128, n_heads=6, n_key_value_heads=2,
                    rotary_base=1000.0, qk_norm=True)
FALSE_FAILURE = 1e-6


def hf_llama(cfg: LlamaConfig, seed: int = 35):
    """Hugging Face's Llama (or Qwen3, with q/k norms) holding part 9's perturbed random weights."""
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers import LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_class, model_class = (Qwen3Config, Qwen3ForCausalLM) if cfg.qk_norm else (HFLlamaConfig, LlamaForCausalLM)
    model = model_class(config_class(**cfg.hf_kwargs(), bos_token_id=None, eos_token_id=None, pad_token_id=None))
    model.load_state_dict(hf_llama_state_dict(random_llama_weights(cfg, seed), cfg), strict=True)
    return model.eval()


def hf_gpt2(seed: int = 35):
    """A small random GPT-2, every parameter (biases and LayerNorms too) drawn afresh, with peaked logits."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=48, n_layer=2, n_head=4,
                                       bos_token_id=None, eos_token_id=None)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 1.0 if name.startswith("transformer.wte") else 0.3
            p.copy_(torch.randn(p.shape, generator=g) * scale + (1.0 if name.endswith("ln_1.weight") else 0.0))
    return model


BUILDERS = {"gpt2": hf_gpt2, "llama": lambda: hf_llama(LLAMA), "qwen3": lambda: hf_llama(QWEN3)}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def model(request):
    return BUILDERS[request.param]()


@pytest.fixture(scope="module")
def llama():
    return hf_llama(LLAMA)


def prompts(batch: int = 3, length: int = 7, seed: int = 0) -> dict:
    """Left-padded prompts: row i has i pads (so lengths differ), ids drawn from the vocabulary."""
    ids = torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    for row in range(batch):
        mask[row, :row] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


WAYS = ("callable", "folder")


def course(way: str, tokenizer=None) -> dict:
    """The keyword arguments that ask Hugging Face's generate for the course's loop, one way or the other.

    Hugging Face hands a callable no ``tokenizer=``, so the callable takes it as ``text_tokenizer``."""
    from sampling_course.hf_generate import CUSTOM_GENERATE_FOLDER, course_decoding

    if way == "callable":
        return {"custom_generate": course_decoding, **({"text_tokenizer": tokenizer} if tokenizer else {})}
    return {"custom_generate": str(CUSTOM_GENERATE_FOLDER), "trust_remote_code": True,
            **({"tokenizer": tokenizer} if tokenizer else {})}


@pytest.mark.parametrize("way", WAYS)
def test_greedy_is_hugging_faces_token_for_token(model, way):
    """Greedy decoding, a padded batch, 12 new tokens: the course's loop gives Hugging Face's sequences."""
    settings = dict(**prompts(), max_new_tokens=12, do_sample=False, pad_token_id=0)
    expected = model.generate(**settings)
    got = model.generate(**settings, **course(way))
    assert torch.equal(got, expected)


def chosen(step_logits: tuple, sequences: torch.Tensor) -> torch.Tensor:
    """log_softmax of each step's logits at the token chosen there, (batch, new)."""
    new = sequences[:, sequences.shape[1] - len(step_logits) :]
    return torch.stack([s.log_softmax(-1) for s in step_logits], dim=1).gather(-1, new[..., None])[..., 0]


SAMPLING = {
    "temperature, top-k, top-p": dict(temperature=0.8, top_k=20, top_p=0.9),
    "min-p, repetition penalty": dict(temperature=1.2, top_k=0, min_p=0.05, repetition_penalty=1.3),
}
CHAINS = ["temperature, top-k, top-p", pytest.param("min-p, repetition penalty", marks=pytest.mark.slow)]


@pytest.mark.parametrize("way", ["callable", pytest.param("folder", marks=pytest.mark.slow)])
@pytest.mark.parametrize("chain", CHAINS)
def test_seeded_sampling_draws_what_hugging_face_draws(llama, way, chain):
    """With torch's global generator seeded alike, both loops draw one multinomial per row per step from
    the same distributions, so the draws are the same; the course's scores and logprobs are log_softmax of
    Hugging Face's processed and raw logits at the chosen tokens."""
    settings = dict(**prompts(), max_new_tokens=10, do_sample=True, pad_token_id=0, return_dict_in_generate=True,
                    **SAMPLING[chain])
    for seed in (1, 2, 3):
        torch.manual_seed(seed)
        expected = llama.generate(**settings, output_scores=True, output_logits=True)
        torch.manual_seed(seed)
        got = llama.generate(**settings, **course(way))
        assert torch.equal(got.sequences, expected.sequences)
        torch.testing.assert_close(got.scores, chosen(expected.scores, expected.sequences), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.logprobs, chosen(expected.logits, expected.sequences), atol=1e-5, rtol=1e-5)


def test_a_seed_draws_what_the_global_generator_draws_after_manual_seed(llama):
    """``seed=`` seeds part 5's private generator, which draws what torch's global one draws after manual_seed."""
    settings = dict(**prompts(), max_new_tokens=8, do_sample=True, top_k=0, pad_token_id=0)
    torch.manual_seed(7)
    expected = llama.generate(**settings)
    torch.manual_seed(123)  # the global generator elsewhere: it must not matter
    assert torch.equal(llama.generate(**settings, **course("callable"), seed=7), expected)


@pytest.mark.slow
def test_draws_from_another_stream_follow_hugging_faces_law(llama):
    """2,000 continuations of one prompt drawn by the course (its private generator, seeded apart from
    Hugging Face's) against the exact law of Hugging Face's first step (softmax of its processed logits,
    typical-p and temperature on). Support: every draw has positive probability. Frequencies: a
    chi-square test over the tokens expected at least 5 times (the rest pooled), rejecting at its
    1 - 1e-6 quantile, so a correct loop fails with probability at most 1e-6."""
    from scipy import stats

    n = 2000
    ids = prompts(batch=1)["input_ids"]
    chain = dict(do_sample=True, temperature=1.5, top_k=0, typical_p=0.9, max_new_tokens=1, pad_token_id=0)
    reference = llama.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **chain,
                               return_dict_in_generate=True, output_scores=True)
    law = reference.scores[0][0].softmax(-1).double()
    many = ids.expand(n, -1)
    draws = llama.generate(input_ids=many, attention_mask=torch.ones_like(many), **chain, **course("callable"),
                           seed=2024)[:, -1]
    counts = torch.bincount(draws, minlength=VOCAB).double()
    assert bool((law[counts > 0] > 0).all()), "the course drew a token Hugging Face's chain removes"
    expected = law * n
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    wanted = torch.cat([expected[big], expected[~big].sum()[None]])
    if wanted[-1] < 5:  # too few pooled to test: fold them into the largest bin
        observed, wanted = observed[:-1].clone(), wanted[:-1].clone()
        top = int(wanted.argmax())
        observed[top] += counts[~big].sum()
        wanted[top] += expected[~big].sum()
    statistic = float(((observed - wanted) ** 2 / wanted).sum())
    bound = stats.chi2.isf(FALSE_FAILURE, df=len(wanted) - 1)
    assert len(wanted) >= 3 and statistic < bound, f"chi-square {statistic:.1f} >= {bound:.1f} over {len(wanted)} bins"


def test_top_logprobs_are_hugging_faces_best_raw_log_probabilities(llama):
    """``logprobs=k``: each step's k best tokens and log-probabilities under the raw model, Hugging Face's."""
    settings = dict(**prompts(), max_new_tokens=6, do_sample=False, pad_token_id=0)
    expected = llama.generate(**settings, return_dict_in_generate=True, output_logits=True)
    got = llama.generate(**settings, **course("callable"), logprobs=3)
    best = torch.stack([step.log_softmax(-1) for step in expected.logits], dim=1).topk(3, dim=-1)
    assert torch.equal(got.sequences, expected.sequences) and torch.equal(got.top_tokens, best.indices)
    torch.testing.assert_close(got.top_logprobs, best.values, atol=1e-5, rtol=1e-5)


def test_settings_replace_the_configs_sampler_settings(llama):
    """``settings=SamplerSettings(temperature=0)`` decodes greedily even when the config samples."""
    from sampling_course.sampling_settings import SamplerSettings

    settings = dict(**prompts(), max_new_tokens=8, pad_token_id=0)
    expected = llama.generate(**settings, do_sample=False)
    got = llama.generate(**settings, do_sample=True, **course("callable"), settings=SamplerSettings(temperature=0))
    assert torch.equal(got, expected)


def test_the_implementation_is_the_one_asked_for(llama, monkeypatch):
    """``impl=`` picks whose part 5 runs (the solutions when not given)."""
    import sampling_course.hf_generate.engine as engine

    asked = []
    real = engine.impl_module

    def spy(module, impl=None, default="solutions"):
        asked.append((module, impl, default))
        return real(module, "solutions")

    monkeypatch.setattr(engine, "impl_module", spy)
    settings = dict(**prompts(), max_new_tokens=2, do_sample=False, pad_token_id=0)
    llama.generate(**settings, custom_generate=engine.course_decoding)
    llama.generate(**settings, custom_generate=engine.course_decoding, impl="exercises")
    assert asked == [("generate", None, "solutions"), ("generate", "exercises", "solutions")]


@pytest.mark.parametrize("setting, message", [
    (dict(num_beams=2), "num_beams"),
    (dict(no_repeat_ngram_size=2), "no_repeat_ngram_size"),
    (dict(suppress_tokens=[3]), "suppress_tokens"),
])
def test_settings_the_chain_lacks_are_refused_by_name(llama, setting, message):
    with pytest.raises(ValueError, match=message):
        llama.generate(**prompts(), max_new_tokens=2, pad_token_id=0, **setting, **course("callable"))


def test_right_padding_is_refused(llama):
    batch = prompts()
    batch["attention_mask"] = batch["attention_mask"].flip(1)
    with pytest.raises(ValueError, match="left-padded"):
        llama.generate(**batch, max_new_tokens=2, pad_token_id=0, **course("callable"))


@pytest.mark.slow
@pytest.mark.parametrize("way", WAYS)
def test_the_story_model_greedy_and_sampled_with_stop_strings(story, way):
    """The story model (GPT-2 architecture, trained): greedy and seeded sampling with a repetition penalty,
    two prompts of different lengths, the end-of-text token and a stop string on; Hugging Face's tokens."""
    model, tokenizer = story.hf_model, story.hf_tokenizer
    tokenizer.padding_side = "left"
    tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer(["Once upon a time", "The little"], return_tensors="pt", padding=True)
    common = dict(**batch, max_new_tokens=30, pad_token_id=tokenizer.eos_token_id, stop_strings=["."])
    ours = course(way, tokenizer)
    expected = model.generate(**common, tokenizer=tokenizer, do_sample=False)
    assert torch.equal(model.generate(**common, **ours, do_sample=False), expected)
    sampled = dict(common, do_sample=True, top_k=0, top_p=0.95, repetition_penalty=1.2)
    torch.manual_seed(11)
    expected = model.generate(**sampled, tokenizer=tokenizer)
    torch.manual_seed(11)
    assert torch.equal(model.generate(**sampled, **ours), expected)
