"""Part 2: the sampling loop ``TransformerSampler.sample``, and the methods end to end.

How the tests judge:

* ``sample`` is compared token for token with Hugging Face ``generate`` on the same
  weights (greedy), with a replay of your own ``sample_next_token`` under the same seed
  (seeded sampling: any correct way of drawing passes), and with small fake models that
  make EOS, the token budget and the n_ctx window observable. The solutions are also
  checked against Hugging Face's seeded sampling, draw for draw.
* End to end, ``sample_next_token``'s frequencies on the reference model's own logits lie
  in exact binomial intervals (a correct implementation fails with probability at most
  ``ALPHA`` = 1e-6, part2_oracles.py), and on real GPT-2, the published expectations.

The methods one by one are graded in test_part2_sampling.py. Every statistical test takes
the ``seed`` fixture (``SAMPLING_COURSE_TEST_SEED``, as there).
"""

from __future__ import annotations

import pytest
import torch

from sampling_course.beside import made_apart, made_beside
from sampling_course.counted_model import ForceEOSAfter

from doubles import NeverEOSModel, counted
from part2_oracles import ALPHA, as_token, draws_of, n_draws, softmax64
from quantiles import binom_isf, binom_ppf


@pytest.fixture(scope="module")
def Sampler(impl):
    """The TransformerSampler class under test."""
    return impl.sampling.TransformerSampler


# ---------------------------------------------------------------------------------------
# sample: the loop, against Hugging Face generate and against fake models
# ---------------------------------------------------------------------------------------

PROMPTS = [
    "John and Mary went to the",
    "Jingle bells, jingle bells, jingle all the way",
    "When I was a kid, the cat sat on the mat",
]


def hf_generate_ids(reference, prompt: str, max_new_tokens: int, processors: tuple = (), seed: int | None = None,
                    **kwargs) -> list[int]:
    """Oracle: prompt and continuation token ids from Hugging Face generate on the reference.

    ``processors`` describes extra logits processors (see ``hf_logits_processors``); a ``seed``
    seeds torch's global generator first, as for seeded sampling."""
    from transformers import LogitsProcessorList

    tokenizer = reference.tokenizer
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    if seed is not None:
        torch.manual_seed(seed)
    out = reference.hf_model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.eos_token_id,
        logits_processor=LogitsProcessorList(hf_logits_processors(processors)),
        **kwargs,
    )
    return out[0].tolist()


def hf_generate(oracle, reference, prompt: str, max_new_tokens: int, **kwargs) -> str:
    return reference.tokenizer.decode(oracle(hf_generate_ids, reference, prompt, max_new_tokens, **kwargs))


@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("sample")
@pytest.mark.parametrize("prompt", PROMPTS)
def test_sample_greedy_matches_hf_generate(Sampler, parity_demo, parity_reference, oracle, prompt):
    """sample(temperature=0) gives exactly Hugging Face's greedy generate(do_sample=False)."""
    sampler = Sampler(parity_demo, parity_reference.tokenizer)
    actual = sampler.sample(prompt, max_tokens_generated=12, temperature=0.0)
    expected = hf_generate(oracle, parity_reference, prompt, 12, do_sample=False)
    assert actual == expected


def replay(Sampler, model, tokenizer, prompt: str, max_tokens: int, seed: int, **settings) -> list[int]:
    """The token ids ``sample(prompt, max_tokens, seed=seed, **settings)`` must produce, from your own
    ``sample_next_token``: seed once, then one call per step on the model's logits for the last
    n_ctx tokens, stopping right after EOS. Any correct way of drawing gives the same text."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids[0]
    torch.manual_seed(seed)
    with torch.inference_mode():
        for _ in range(max_tokens):
            logits = model(ids[None, -model.cfg.n_ctx :])[0, -1]
            token = as_token(Sampler.sample_next_token(ids, logits, **settings), "sample_next_token")
            ids = torch.cat([ids, torch.tensor([token])])
            if token == tokenizer.eos_token_id:
                break
    return ids.tolist()


@pytest.mark.exercise("sample")
@pytest.mark.parametrize(
    "settings, torch_seed",
    [(dict(temperature=1.0), 0), (dict(temperature=0.7), 1), (dict(top_k=5), 2), (dict(top_p=0.8, frequency_penalty=0.5), 3)],
    ids=["t=1", "t=0.7", "top_k=5", "top_p=0.8,penalty"],
)
def test_sample_with_seed_replays_sample_next_token(Sampler, demo, reference, settings, torch_seed):
    """sample(seed=s) seeds once and draws each token with sample_next_token: the same as
    seeding, then calling sample_next_token step by step on the model's logits.

    A deterministic comparison, not a statistical one: whatever way of drawing your
    sample_next_token uses, the loop must give exactly its draws.
    """
    sampler = Sampler(demo, reference.tokenizer)
    prompt = PROMPTS[0]
    actual = sampler.sample(prompt, max_tokens_generated=8, seed=torch_seed, **settings)
    expected = replay(Sampler, demo, reference.tokenizer, prompt, 8, torch_seed, **settings)
    assert actual == reference.tokenizer.decode(expected)


@pytest.mark.parametrize("temperature, torch_seed", [(1.0, 0), (1.0, 1), (0.7, 2)])
def test_solution_seeded_sampling_matches_hf(impl, Sampler, demo, reference, oracle, temperature, torch_seed):
    """The solutions draw exactly as Hugging Face does: sample(seed=s) equals HF
    generate(do_sample=True, top_k=0) after torch.manual_seed(s), token for token.

    Both draw one torch.multinomial(softmax(logits / temperature)) per step. Other correct
    ways of drawing (inverse CDF, Categorical) give other tokens, so this checks the
    solutions only; your code is held to the replay test above.
    """
    if impl.package != "solutions":
        pytest.skip("draw-for-draw parity with Hugging Face is a property of the solutions, not a requirement")
    sampler = Sampler(demo, reference.tokenizer)
    prompt = PROMPTS[0]
    actual = sampler.sample(prompt, max_tokens_generated=16, temperature=temperature, seed=torch_seed)
    expected = hf_generate(oracle, reference, prompt, 16, seed=torch_seed, do_sample=True, top_k=0, top_p=1.0,
                           temperature=temperature)
    assert actual == expected


class FrequencyPenaltyProcessor:
    """Subtract penalty x (occurrences so far) from every token's score: the oracle for HF generate."""

    def __init__(self, penalty: float):
        self.penalty = penalty

    def __call__(self, input_ids, scores):
        counts = torch.stack([torch.bincount(row, minlength=scores.shape[-1]) for row in input_ids])
        return scores - self.penalty * counts.to(scores.dtype)


@pytest.mark.exercise("sample")
@pytest.mark.parametrize(
    "settings, processors",
    [
        (dict(top_k=1), ()),  # top-1 sampling is greedy
        (dict(top_p=1e-6), ()),  # so is a nucleus this small
        (dict(top_k=1, frequency_penalty=100.0), (("frequency penalty", 100.0),)),  # no token twice
    ],
    ids=["top_k=1", "top_p=1e-6", "top_k=1,frequency_penalty=100"],
)
def test_sample_passes_its_settings_on(Sampler, demo, reference, oracle, settings, processors):
    """sample() hands top_k, top_p and frequency_penalty to every step: settings that make
    sampling deterministic give HF's greedy generate (with the penalty as a logits processor)."""
    sampler = Sampler(demo, reference.tokenizer)
    prompt = PROMPTS[1]
    actual = sampler.sample(prompt, max_tokens_generated=20, seed=0, **settings)
    expected = hf_generate(oracle, reference, prompt, 20, processors=processors, do_sample=False)
    assert actual == expected


class ForceEOSProcessor:
    """The same rule for Hugging Face generate."""

    def __init__(self, eos: int, length: int):
        self.eos, self.length = eos, length

    def __call__(self, input_ids, scores):
        if input_ids.shape[-1] >= self.length:
            scores = torch.full_like(scores, float("-inf"))
            scores[:, self.eos] = 0.0
        return scores


def hf_logits_processors(described: tuple) -> list:
    """Hugging Face logits processors from their description: ("frequency penalty", penalty), ("force EOS", eos, length)."""
    from transformers import LogitsProcessor

    kinds = {"frequency penalty": FrequencyPenaltyProcessor, "force EOS": ForceEOSProcessor}
    # Each rule as one of Hugging Face's own processors: generate takes those.
    return [type(kind.__name__, (kind, LogitsProcessor), {})(*args) for kind, *args in
            ((kinds[name], *args) for name, *args in described)]


@pytest.mark.exercise("sample")
@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(temperature=1.0, seed=5)], ids=["greedy", "sampling"])
def test_sample_stops_right_after_eos(Sampler, demo, reference, oracle, settings):
    """Generation ends with the EOS token included, and the model is not called again after it.

    EOS is forced once the sequence has 5 new tokens; the expected text comes from HF
    generate with the same rule as a logits processor.
    """
    tokenizer = reference.tokenizer
    prompt = PROMPTS[2]
    prompt_len = len(tokenizer(prompt).input_ids)
    # its calls are counted apart, where sample cannot change the count
    model = made_apart(demo, ForceEOSAfter, tokenizer.eos_token_id, prompt_len + 5)
    actual = Sampler(model, tokenizer).sample(prompt, max_tokens_generated=20, **settings)

    if settings["temperature"] > 0:  # the draws are your sample_next_token's: replay them
        forced = ForceEOSAfter(demo, tokenizer.eos_token_id, prompt_len + 5)  # called here, by the replay
        seed = settings.pop("seed")
        expected_ids = replay(Sampler, forced, tokenizer, prompt, 20, seed, **settings)
    else:
        processors = (("force EOS", tokenizer.eos_token_id, prompt_len + 5),)
        expected_ids = oracle(hf_generate_ids, reference, prompt, 20, processors=processors, do_sample=False)
    assert expected_ids[-1] == tokenizer.eos_token_id and len(expected_ids) <= prompt_len + 6  # the oracle
    expected = tokenizer.decode(expected_ids)
    generated = len(expected_ids) - prompt_len
    assert actual == expected, "the text must end right after the EOS token, EOS included"
    assert model.calls == generated, f"the model was called {model.calls} times for {generated} generated tokens"


@pytest.mark.exercise("sample")
@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(temperature=1.0)], ids=["greedy", "sampling"])
def test_sample_generates_exactly_max_tokens(Sampler, tiny, settings):
    """Without EOS, exactly max_tokens_generated tokens are added (7, 1, then 0), one model call each."""
    tokenizer = tiny.tokenizer
    prompt_ids = tokenizer(PROMPTS[0]).input_ids
    rule = NeverEOSModel(tiny.cfg, tokenizer.eos_token_id)  # the expected text is worked out on this twin
    for max_tokens_generated in (7, 1, 0):
        # made where sample calls it; the calls are recorded apart, where sample cannot change the record
        model = counted(made_beside(Sampler, NeverEOSModel, tiny.cfg, tokenizer.eos_token_id))
        actual = Sampler(model, tokenizer).sample(PROMPTS[0], max_tokens_generated=max_tokens_generated, **settings)
        expected = tokenizer.decode(rule.continuation(prompt_ids, max_tokens_generated))
        assert actual == expected, f"max_tokens_generated={max_tokens_generated}"
        assert len(model.inputs) == max_tokens_generated, (
            f"the model was called {len(model.inputs)} times for {max_tokens_generated} tokens"
        )


@pytest.mark.exercise("sample")
def test_sample_feeds_the_model_the_last_n_ctx_tokens(Sampler, tiny):
    """A prompt longer than n_ctx works: each step the model sees the last n_ctx tokens, and
    the returned text still starts with the whole prompt."""
    tokenizer = tiny.tokenizer
    n_ctx = tiny.cfg.n_ctx
    prompt = " ".join(["the cat sat on the mat"] * 40)
    prompt_ids = tokenizer(prompt).input_ids
    assert len(prompt_ids) > n_ctx + 10
    model = counted(made_beside(Sampler, NeverEOSModel, tiny.cfg, tokenizer.eos_token_id))
    actual = Sampler(model, tokenizer).sample(prompt, max_tokens_generated=4, temperature=0.0)
    full = NeverEOSModel(tiny.cfg, tokenizer.eos_token_id).continuation(prompt_ids, 4)  # on a twin
    assert actual == tokenizer.decode(full)
    assert len(model.inputs) == 4
    for step, seen in enumerate(model.inputs):
        expected = full[: len(prompt_ids) + step][-n_ctx:]
        assert seen.shape == (1, n_ctx), f"step {step}: the model got input of shape {tuple(seen.shape)}"
        assert seen[0].tolist() == expected, f"step {step}: not the last n_ctx tokens"


def hf_greedy_in_window(reference, ids: list[int], steps: int) -> list[int]:
    """Oracle: ``steps`` greedy tokens after ``ids``, each the argmax of HF's logits on the last n_ctx tokens."""
    n_ctx = reference.cfg.n_ctx
    expected = list(ids)
    for _ in range(steps):
        logits = reference.hf_model(torch.tensor([expected[-n_ctx:]])).logits[0, -1]
        expected.append(int(logits.argmax()))
    return expected


@pytest.mark.exercise("sample")
def test_sample_past_n_ctx_on_the_real_model(Sampler, demo, reference, oracle):
    """Greedy decoding of a prompt longer than n_ctx equals HF's argmax on the last n_ctx tokens."""
    tokenizer = reference.tokenizer
    n_ctx = reference.cfg.n_ctx
    words = "the cat sat on the mat and John and Mary went to the church"
    prompt = " ".join([words] * (n_ctx // 10 + 5))
    ids = tokenizer(prompt).input_ids
    assert len(ids) > n_ctx
    if len(ids) > n_ctx + 200:  # keep GPT-2's version short
        prompt = tokenizer.decode(ids[-(n_ctx + 50) :])
        ids = tokenizer(prompt).input_ids
    expected = oracle(hf_greedy_in_window, reference, list(ids), 3)
    actual = Sampler(demo, tokenizer).sample(prompt, max_tokens_generated=3, temperature=0.0)
    assert actual == tokenizer.decode(expected)


@pytest.mark.exercise("sample")
def test_sample_verbose_changes_nothing_but_the_printing(Sampler, demo, tiny, capsys):
    """verbose=True returns the same text as verbose=False, which prints nothing."""
    sampler = Sampler(demo, tiny.tokenizer)
    quiet = sampler.sample(PROMPTS[0], max_tokens_generated=5, temperature=0.0)
    assert capsys.readouterr().out == ""
    assert sampler.sample(PROMPTS[0], max_tokens_generated=5, temperature=0.0, verbose=True) == quiet


# Not graded as the learner's (no exercise marker): what verbose prints is given code, around the
# learner's regions; a sample written whole may print its tokens its own way.
def test_sample_verbose_prints_the_text(Sampler, demo, tiny, capsys):
    """verbose=True prints the text as it grows, the prompt first."""
    sampler = Sampler(demo, tiny.tokenizer)
    loud = sampler.sample(PROMPTS[0], max_tokens_generated=5, temperature=0.0, verbose=True)
    printed = capsys.readouterr().out
    assert PROMPTS[0] in printed and loud in printed.replace("\r", "")


# ---------------------------------------------------------------------------------------
# End to end: the reference model's own next-token distribution
# ---------------------------------------------------------------------------------------


def next_token_logits(model, tokenizer, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids)
    logits = logits.logits if hasattr(logits, "logits") else logits
    return ids[0], logits[0, -1]


def hf_next_token_logits(reference, prompt: str) -> torch.Tensor:
    """Oracle: Hugging Face's logits for the token after ``prompt``."""
    return next_token_logits(reference.hf_model, reference.tokenizer, prompt)[1]


def frequencies_of(Sampler, input_ids, logits, n: int) -> torch.Tensor:
    draws = draws_of(Sampler.sample_next_token, logits, n, before=(input_ids,))
    return torch.bincount(draws, minlength=logits.shape[-1])


@pytest.mark.exercise("sample_next_token")
def test_next_token_frequencies_match_the_reference(Sampler, demo, reference, oracle, seed):
    """Sampling after "John and Mary went to the" gives its two likeliest next tokens (" church"
    and " house" on GPT-2) as often as the reference's own softmax says.

    n_draws() calls of sample_next_token on the logits of the model under test; binomial bounds
    for the two tokens (Bonferroni): false-failure probability <= 1e-6.
    """
    torch.manual_seed(seed)
    prompt = "John and Mary went to the"
    input_ids, logits = next_token_logits(demo, reference.tokenizer, prompt)
    hf_logits = oracle(hf_next_token_logits, reference, prompt)
    probs = softmax64(hf_logits)
    top = probs.topk(2).indices.tolist()
    observed = frequencies_of(Sampler, input_ids, logits, n_draws())
    q = ALPHA / 4
    for token in top:
        p = probs[token].item()
        low, high = binom_ppf(q, n_draws(), p), binom_isf(q, n_draws(), p)
        assert low <= observed[token] <= high, (
            f"{reference.tokenizer.decode(token)!r}: frequency {observed[token].item() / n_draws():.4f}, "
            f"reference probability {p:.4f}"
        )


# ---------------------------------------------------------------------------------------
# Real GPT-2: the published expectations
# ---------------------------------------------------------------------------------------


@pytest.mark.gpt2
@pytest.mark.exercise("sample")
def test_gpt2_jingle_bells_greedy(Sampler, gpt2_demo, gpt2):
    """GPT-2 greedily continues "Jingle bells, jingle bells, jingle all the way" with
    " up to the top of the mountain."."""
    sampler = Sampler(gpt2_demo, gpt2.tokenizer)
    prompt = "Jingle bells, jingle bells, jingle all the way"
    text = sampler.sample(prompt, max_tokens_generated=8, temperature=0.0)
    assert text == prompt + " up to the top of the mountain."


@pytest.mark.gpt2
@pytest.mark.exercise("sample_next_token")
def test_gpt2_church_and_house_frequencies(Sampler, gpt2_demo, gpt2, seed):
    """After "John and Mary went to the", GPT-2 samples " church" 6.48% and " house" 3.67% of the time.

    10000 calls of sample_next_token. The published values are rounded to 4 digits, so the
    true probability lies within +-0.00005 of them: the lower bound is the binomial quantile
    at the low end of that interval and the upper bound the one at the high end, q = 1e-6/4
    per tail and token. False-failure probability <= 1e-6.
    """
    torch.manual_seed(seed)
    n = 10_000
    input_ids, logits = next_token_logits(gpt2_demo, gpt2.tokenizer, "John and Mary went to the")
    observed = frequencies_of(Sampler, input_ids, logits, n)
    q = ALPHA / 4
    for word, published in ((" church", 0.0648), (" house", 0.0367)):
        (token,) = gpt2.tokenizer.encode(word)
        low = binom_ppf(q, n, published - 0.00005)
        high = binom_isf(q, n, published + 0.00005)
        assert low <= observed[token] <= high, (
            f"{word!r}: frequency {observed[token].item() / n:.4f}, published {published}"
        )
