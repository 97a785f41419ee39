"""Part 9: the Llama-style model decoded by the course's engine (``sampling_course.llama_engine.LlamaForEngine``,
the model with the engine's ``cfg``; the model's own forward pass meets the engine's caches).

The model under test is the implementation's ``LlamaTransformer`` holding story-llama's weights;
the engine is the solutions' (part 5's ``generate``, part 3's ``Beams``, the caches of parts 4
and 6; in the student release, which has no solutions, the learner's own). The oracle is Hugging
Face's ``LlamaForCausalLM`` on the same folder: its ``generate(num_beams=..., do_sample=False)`` sequences and ``sequences_scores``, its greedy and
seeded sampled tokens, and the log-probabilities its forward pass gives each beam's tokens.
Everything runs on the CPU, where Hugging Face's model runs, also in a grading session on a GPU
(the plugin's ``cpu_session``).
"""

from __future__ import annotations

import pytest
import torch

from sampling_course.grading.tolerances import parity
from sampling_course.implementation import Impl, solved_earlier
from sampling_course.llama_engine import LlamaForEngine
from sampling_course.reference import load_reference
from sampling_course.weights import load_weights

pytestmark = pytest.mark.usefixtures("cpu_session")
TOL = parity("cpu")
# The course's earlier parts: the solutions', or in the student release (no solutions) the learner's own.
EARLIER = solved_earlier(Impl("exercises"))
# Two prompts of one length (9 tokens); the padded test has its own.
PROMPTS = ["One day, Max and Sunny went to the", "One day, Nora and Coco went to the"]
BEAM_SETTINGS = [(lp, es) for lp in (0.0, 1.0, 2.0, -1.0) for es in (True, False, "never")]
FAST_SETTINGS = [(1.0, False), (2.0, "never")]


@pytest.fixture(scope="module")
def story_llama(impl):
    """story-llama: Hugging Face's model, the tokenizer, and the implementation's LlamaTransformer behind the engine's call."""
    ref = load_reference("story-llama", "cpu")
    model = load_weights(impl.llama.LlamaTransformer(ref.cfg), ref.weights).to("cpu").eval()
    return ref.hf_model, ref.tokenizer, LlamaForEngine(model)


def prompt_ids(tokenizer, prompts: list[str]) -> torch.Tensor:
    rows = [tokenizer.encode(p) for p in prompts]
    assert len({len(row) for row in rows}) == 1, "precondition: the prompts have one length"
    return torch.tensor(rows)


def hf_beams(hf_model, ids: torch.Tensor, new: int, length_penalty: float, early_stopping, eos: int):
    out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False, num_beams=3,
                            num_return_sequences=2, length_penalty=length_penalty, early_stopping=early_stopping,
                            eos_token_id=eos, pad_token_id=eos, output_scores=True, return_dict_in_generate=True)
    return out.sequences, out.sequences_scores


def check_beam_settings(story_llama, settings) -> set:
    """generate(num_beams=3, num_return_sequences=2, ...) on both prompts against Hugging Face's; the answers seen."""
    hf_model, tokenizer, engine = story_llama
    dot = tokenizer.encode(".")[0]  # the end-of-text token here, so that beams end at different lengths
    ids = prompt_ids(tokenizer, PROMPTS)
    answers = set()
    for lp, es in settings:
        out = EARLIER.generate.generate(engine, tokenizer, PROMPTS, 10, temperature=0.0, num_beams=3,
                                          num_return_sequences=2, length_penalty=lp, early_stopping=es,
                                          eos_token_id=dot, return_dict_in_generate=True)
        sequences, scores = hf_beams(hf_model, ids, 10, lp, es, dot)
        assert out.sequences.shape == sequences.shape and torch.equal(out.sequences, sequences), (
            f"beams with length_penalty={lp}, early_stopping={es!r}: {out.sequences.tolist()} against "
            f"Hugging Face's {sequences.tolist()}")
        torch.testing.assert_close(out.sequences_scores, scores, **TOL,
                                   msg=lambda m: f"sequences_scores, length_penalty={lp}, early_stopping={es!r}.\n{m}")
        answers.add(tuple(map(tuple, sequences.tolist())))
    return answers


def test_engine_beam_search_on_story_llama_is_hugging_faces(story_llama):
    """Part 5's beam search (3 beams, 2 returned, two prompts) on your model: Hugging Face's sequences and scores,
    for two settings whose answers differ (checked, so that each setting is really compared)."""
    assert len(check_beam_settings(story_llama, FAST_SETTINGS)) == 2


@pytest.mark.slow
def test_engine_beam_search_on_story_llama_for_every_setting(story_llama):
    """length_penalty 0, 1, 2, -1 with early_stopping True, False, "never": Hugging Face's sequences and scores."""
    assert len(check_beam_settings(story_llama, BEAM_SETTINGS)) >= 2


@pytest.mark.parametrize("cache", ["KeyValueCache", "StaticKeyValueCache"])
def test_engine_greedy_on_story_llama_is_hugging_faces(story_llama, cache):
    """Greedy, 20 tokens, both prompts, with part 4's cache (the default) or part 6's static cache: Hugging Face's tokens."""
    hf_model, tokenizer, engine = story_llama
    ids = prompt_ids(tokenizer, PROMPTS)
    kv_cache = None
    if cache == "StaticKeyValueCache":
        kv_cache = EARLIER.caches.StaticKeyValueCache.new_empty(engine.cfg, batch=2, max_len=ids.shape[1] + 20)
    got = EARLIER.generate.generate(engine, tokenizer, PROMPTS, 20, temperature=0.0, kv_cache=kv_cache)
    eos = tokenizer.eos_token_id
    expected = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False,
                                 eos_token_id=eos, pad_token_id=eos)
    assert torch.equal(got, expected)
    if kv_cache is not None:
        assert kv_cache.seq_len == ids.shape[1] + 19, "the static cache held every position the model ran"


def test_engine_seeded_sampling_on_story_llama_draws_what_hugging_face_draws(story_llama):
    """generate(seed=s) draws what torch's global generator draws after manual_seed(s): Hugging Face's tokens,
    sampled with a temperature and top-p from the same distributions. "." ends a row, so rows end at different
    steps (checked): a finished row's pads, which the model reads as tokens, change nothing in the others."""
    hf_model, tokenizer, engine = story_llama
    ids = prompt_ids(tokenizer, PROMPTS)
    dot = tokenizer.encode(".")[0]
    ends = set()
    for seed in (1, 2):
        got = EARLIER.generate.generate(engine, tokenizer, PROMPTS, 16, temperature=1.3, top_k=0, top_p=0.95,
                                          seed=seed, eos_token_id=dot)
        torch.manual_seed(seed)
        expected = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=True,
                                     temperature=1.3, top_k=0, top_p=0.95, eos_token_id=dot, pad_token_id=dot)
        assert torch.equal(got, expected), f"seed {seed}"
        new = got[:, ids.shape[1] :].tolist()
        ends |= {row.index(dot) if dot in row else len(row) for row in new}
    assert len(ends) > 1, "precondition: rows end at different steps"


def part3_beam_search(engine, tokenizer, prompt: str, kv_cache, steps: int = 6, k: int = 3):
    """Part 3's loop: every step each beam proposes its k best tokens and the k best of all go on."""
    tokens = torch.tensor([tokenizer.encode(prompt)])
    beams = EARLIER.beams.Beams(engine, tokenizer, torch.zeros(1), tokens, kv_cache)
    for _ in range(steps):
        beams, _ = beams.generate(k).filter(k)
    return beams


@pytest.mark.parametrize("cache", [None, "KeyValueCache", "StaticKeyValueCache"])
def test_part3_beams_on_story_llama_sum_hugging_faces_log_probabilities(story_llama, cache):
    """Part 3's Beams on your model, uncached, with part 4's cache (rows indexed) or part 6's (reordered in place):
    each beam's sum is the log-probability Hugging Face's model gives its tokens, and the three runs agree."""
    hf_model, tokenizer, engine = story_llama
    prompt = PROMPTS[0]
    kv_cache = None
    if cache == "KeyValueCache":
        kv_cache = EARLIER.kv_cache.KeyValueCache.new_empty(engine.cfg)
    elif cache == "StaticKeyValueCache":
        kv_cache = EARLIER.caches.StaticKeyValueCache.new_empty(engine.cfg, max_len=32)
    beams = part3_beam_search(engine, tokenizer, prompt, kv_cache)
    width = len(tokenizer.encode(prompt))
    with torch.no_grad():
        logprobs = hf_model(beams.tokens).logits.log_softmax(-1)
    expected = logprobs[:, width - 1 : -1].gather(-1, beams.tokens[:, width:, None])[..., 0].sum(-1)
    torch.testing.assert_close(beams.logprob_sums, expected, **TOL)
    assert bool((beams.logprob_sums[:-1] >= beams.logprob_sums[1:]).all()), "filter keeps the beams best first"
    if cache is not None:
        uncached = part3_beam_search(engine, tokenizer, prompt, None)
        assert torch.equal(beams.tokens, uncached.tokens)


def test_engine_greedy_on_left_padded_prompts_is_hugging_faces(story_llama):
    """Prompts of different lengths, left-padded by part 5: each row's positions count its own real tokens and no
    query sees a pad (the cache's step: part 4's cache with the attention mask), so greedy decoding gives Hugging
    Face's tokens, from its generate on the same left-padded batch and attention mask."""
    hf_model, tokenizer, engine = story_llama
    prompts = ["Once", "One day, Max and Sunny went to the"]
    got = EARLIER.generate.generate(engine, tokenizer, prompts, 12, temperature=0.0)
    rows = [tokenizer.encode(p) for p in prompts]
    width, eos = max(map(len, rows)), tokenizer.eos_token_id
    ids = torch.tensor([[eos] * (width - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    expected = hf_model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=eos,
                                 pad_token_id=eos)
    assert got.shape == expected.shape and torch.equal(got[:, width:], expected[:, width:])


def test_other_models_and_caches_are_refused(story_llama):
    _, _, engine = story_llama
    with pytest.raises(TypeError, match="LlamaTransformer"):
        LlamaForEngine(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="KeyValueCache"):
        engine(torch.zeros(1, 3, dtype=torch.long), object())


def test_one_cache_protocol_for_both_families(impl):
    """The caches meet both models through the same three calls: part 9's LlamaCache runs GPT-2's DemoTransformer
    (the solutions'), one token at a time, and gives the logits of GPT-2's own pass over the whole sequence."""
    from sampling_course.config import Config

    cfg = Config(d_model=32, d_vocab=50, n_ctx=16, d_head=8, d_mlp=64, n_heads=4, n_layers=2)
    torch.manual_seed(0)
    gpt2 = EARLIER.transformer.DemoTransformer(cfg).eval()
    for parameter in gpt2.parameters():  # biases and LayerNorm away from their 0 and 1
        parameter.data.add_(0.1 * torch.randn_like(parameter))
    tokens = torch.randint(0, cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(1))
    cache = impl.llama.LlamaCache(cfg.n_layers)
    with torch.no_grad():
        full = gpt2(tokens)
        steps = [gpt2(tokens[:, :3], cache)[0]]
        steps += [gpt2(tokens[:, : t + 1], cache)[0] for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOL)
    assert cache.seq_len == 7
