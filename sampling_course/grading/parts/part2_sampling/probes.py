"""Part 2's probes: hand-made logits for the samplers (drawn exactly for planted code, counted
for the learner's, see ``grading/matching.py``) and a toy language model for ``sample``."""

from __future__ import annotations

from typing import Any

import torch

from collections.abc import Callable

from sampling_course.grading.matching import as_int, frequencies, plain
from sampling_course.grading.probing import (
    Impl, ToyLM, generator, probe, randn, small_config, tokenizer, word_ids, word_table,
)


@probe("greedy_search")
def _probe_greedy(impl: Impl) -> Any:
    sampler = impl.sampling.TransformerSampler
    return [as_int(sampler.greedy_search(row.clone())) for row in randn(generator(10), 4, 12)]


@probe("apply_temperature")
def _probe_temperature(impl: Impl) -> Any:
    sampler = impl.sampling.TransformerSampler
    logits = randn(generator(11), 12)
    given = logits.clone()  # the last entry says whether the method wrote into its argument
    return [plain(sampler.apply_temperature(given, 0.5)), plain(sampler.apply_temperature(logits.clone(), 2.0)),
            not torch.equal(given, logits)]


@probe("apply_frequency_penalty")
def _probe_frequency_penalty(impl: Impl) -> Any:
    sampler = impl.sampling.TransformerSampler
    input_ids = torch.tensor([1, 3, 3, 5, 5, 5, 0])
    logits = randn(generator(12), 8)
    given = logits.clone()  # the last entry says whether the method wrote into its argument
    return [plain(sampler.apply_frequency_penalty(input_ids.clone(), given, 0.7)), not torch.equal(given, logits)]


def logits_of(*probs: float) -> torch.Tensor:
    return torch.tensor(probs).log()


@probe("sample_basic")
def _probe_sample_basic(impl: Impl) -> Any:
    sampler = impl.sampling.TransformerSampler
    # Solution [.1 .6 .2 .1], argmax [0 1 0 0], uniform [.25 ...]: every pair differs by >= 0.35.
    logits = logits_of(0.1, 0.6, 0.2, 0.1)
    return frequencies(lambda: sampler.sample_basic(logits.clone()), 4, gap=0.35, seed=13)


@probe("sample_top_k")
def _probe_sample_top_k(impl: Impl) -> Any:
    sampler = impl.sampling.TransformerSampler
    # k = 2 keeps tokens 4 and 2. First 9:1 (uniform over the top k gives 1:1), then 55:45
    # (k - 1 tokens gives 1:0); a rank returned for a token lands on ids 0 and 1. Every pair
    # of the solution and the three mistakes differs by >= 0.4 in one of the two.
    # Every call of a setting gets the same tensor; the last entry says whether it changed.
    settings = [logits_of(0.05, 0.06, 0.08, 0.04, 0.72, 0.05), logits_of(0.05, 0.03, 0.36, 0.04, 0.44, 0.08)]
    given = [logits.clone() for logits in settings]
    drawn: list[Any] = [
        frequencies(lambda: sampler.sample_top_k(given[i], 2), 6, gap=0.4, seed=14 + i) for i in range(len(settings))
    ]
    return drawn + [any(not torch.equal(g, logits) for g, logits in zip(given, settings))]


@probe("sample_top_p")
def _probe_sample_top_p(impl: Impl) -> Any:
    sampler = impl.sampling.TransformerSampler
    # Sorted, the tokens are 3 (.44), 5 (.30), 0 (.15), 2 (.06), 4 (.03), 1 (.02).
    # top_p = 0.6 keeps 3 and 5 (.595, .405); an exclusive cutoff keeps only 3; ascending
    # keeps them all; ranks land on ids 0 and 1. top_p = 0.1 with min_tokens_to_keep = 3
    # keeps 3, 5, 0; ignoring min_tokens_to_keep keeps 3 only; ascending keeps 1, 4, 2.
    # Every pair differs by >= 0.4 in one of the two.
    # The first setting's calls all get the same tensor; the last entry says whether it changed.
    logits = logits_of(0.15, 0.02, 0.06, 0.44, 0.03, 0.30)
    given = logits.clone()
    return [
        frequencies(lambda: sampler.sample_top_p(given, 0.6), 6, gap=0.4, seed=16),
        frequencies(lambda: sampler.sample_top_p(logits.clone(), 0.1, min_tokens_to_keep=3), 6, gap=0.4, seed=17),
        not torch.equal(given, logits),
    ]


@probe("sample_next_token")
def _probe_sample_next_token(impl: Impl) -> Any:
    sampler = impl.sampling.TransformerSampler
    # Temperature 4 then a penalty of 3 on token 1 gives (.88, .12); the penalty first gives
    # (.44, .56). top_k=1 and top_p=0.3 keep token 0 only; ignoring them draws from
    # (.36, .30, .22, .13). Every pair differs by >= 0.4 in one setting.
    penalised = torch.tensor([0.0, 4.0, -30.0, -30.0])
    flat = torch.tensor([1.0, 0.8, 0.5, 0.0])
    once = torch.tensor([1])

    def draw(logits: torch.Tensor, **kwargs: Any) -> Callable[[], Any]:
        return lambda: sampler.sample_next_token(once.clone(), logits.clone(), **kwargs)

    return [
        frequencies(draw(penalised, temperature=4.0, frequency_penalty=3.0), 4, gap=0.4, seed=18),
        frequencies(draw(flat, top_k=1), 4, gap=0.4, seed=19),
        frequencies(draw(flat, top_p=0.3), 4, gap=0.4, seed=20),
    ]

@probe("sample")
def _probe_sample(impl: Impl) -> Any:
    tok, words = tokenizer(), word_ids()
    eos, vocab = tok.eos_token_id, len(tok)
    sampler = impl.sampling.TransformerSampler
    prompt = tok.decode(words[:2])
    texts = []

    # 1. top_k=1 and a frequency penalty on a peaked model: deterministic. The favourite
    # next tokens cycle w0 -> w1 -> w2 -> w0, so the penalty changes the path; a sampler that
    # drops top_k and the penalty follows the cycle (the favourite is 40 nats ahead).
    g = generator(30)
    table, row_of = word_table(g, std=1.0)
    for i, w in enumerate(words):
        table[row_of[w], words[(i + 1) % 3 if i < 3 else (i + 1) % len(words)]] = 40.0
    model = ToyLM(small_config(d_vocab=vocab, n_ctx=32), table, row_of)
    texts.append(sampler(model, tok).sample(prompt, max_tokens_generated=8, temperature=1.0, top_k=1,
                                            frequency_penalty=45.0, seed=0))

    # 2. Greedy, with end-of-text forced as the token after position 4: the loop must stop
    # right after it and keep it. 3. Greedy without end-of-text: exactly 3 new tokens.
    table, row_of = word_table(g)
    forced = torch.zeros(64, vocab)
    forced[4, eos] = 100.0
    model = ToyLM(small_config(d_vocab=vocab, n_ctx=32), table, row_of, forced)
    texts.append(sampler(model, tok).sample(prompt, max_tokens_generated=8, temperature=0.0))
    model = ToyLM(small_config(d_vocab=vocab, n_ctx=32), table, row_of)
    texts.append(sampler(model, tok).sample(prompt, max_tokens_generated=3, temperature=0.0))

    # 4. Greedy past n_ctx = 5, on a model whose logits depend on the position: the window
    # the model sees (the last n_ctx tokens) decides every token.
    by_position = torch.zeros(64, vocab)
    by_position[:, list(words)] = randn(g, 64, len(words), std=2.0)
    model = ToyLM(small_config(d_vocab=vocab, n_ctx=5), table, row_of, by_position)
    texts.append(sampler(model, tok).sample(prompt, max_tokens_generated=8, temperature=0.0))
    return texts
