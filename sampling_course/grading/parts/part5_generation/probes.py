"""Part 5's probes: hand-made batches of logits for the filters and penalties, a small random
DemoTransformer for the padded forward pass, and a cached toy language model for ``generate``.

The filters' outputs are compared with every removed logit written as -inf, whatever the
learner wrote there (-inf, -1e10, the dtype's lowest value).
"""

from __future__ import annotations

import io
from typing import Any

import torch

from sampling_course.grading.matching import frequencies, plain
from sampling_course.grading.probing import (
    CachedToyLM, Impl, attn_params, demo_params, generator, loaded, probe, randn, small_config, tokenizer, word_ids,
    word_table,
)


def logits_of(*rows: tuple[float, ...]) -> torch.Tensor:
    """A ``(batch, d_vocab)`` tensor of logits with the given probabilities per row."""
    return torch.tensor(rows).log()


def removed_as_inf(logits: Any) -> torch.Tensor:
    """A filter's output with every removed logit (-inf, -1e10, ...) written as -inf."""
    logits = plain(logits)
    return logits.masked_fill(logits < -1e4, float("-inf"))


def left_alone(function, logits: torch.Tensor, *args: Any) -> bool:
    """Whether ``function(copy of logits, *args)`` leaves that copy as it was (a filter returns new logits)."""
    given = logits.clone()
    function(given, *args)
    return bool(torch.equal(given, logits))


@probe("top_k_filter")
def _probe_top_k(impl: Impl) -> Any:
    # Distinct values (no ties at the k-th largest), so keeping ties or exactly k agree.
    logits = randn(generator(80), 3, 10, std=2.0)
    return [removed_as_inf(impl.filters.top_k_filter(logits.clone(), k)) for k in (1, 3)] + [
        left_alone(impl.filters.top_k_filter, logits, 3)]


@probe("top_p_filter")
def _probe_top_p(impl: Impl) -> Any:
    # Sorted, row 0 is .40 .25 .15 .10 .05 .05: top_p = 0.6 keeps .40 and .25 (the token that
    # crosses 0.6 stays); an exclusive cutoff keeps .40 only. Row 1's top token alone reaches
    # both cutoffs; row 2 is nearly flat. No running total lands on a cutoff, and no two
    # probabilities tie (a threshold at the last kept logit would keep both).
    logits = logits_of((0.04, 0.40, 0.10, 0.25, 0.15, 0.06), (0.7, 0.1, 0.08, 0.06, 0.04, 0.02),
                       (0.2, 0.18, 0.17, 0.16, 0.15, 0.14))
    # Hugging Face's own row: .5 + .3 is exactly 0.8, so top_p = 0.8 keeps two (a running total
    # taken as cumsum - p rounds below 0.8 and keeps a third). With min_tokens_to_keep = 3 row 1 keeps three.
    hf_row = logits_of((0.3, 0.1, 0.1, 0.5))
    return [removed_as_inf(impl.filters.top_p_filter(logits.clone(), p)) for p in (0.6, 0.3)] + [
        removed_as_inf(impl.filters.top_p_filter(hf_row, 0.8)),
        removed_as_inf(impl.filters.top_p_filter(logits.clone(), 0.3, min_tokens_to_keep=3))]


@probe("min_p_filter")
def _probe_min_p(impl: Impl) -> Any:
    # min_p = 0.3: row 0's bar is 0.3 x .40 = .12, keeping .40 .25 .15 (a bar of 0.3 itself
    # keeps .40 only); row 1's top token is .9, whose bar .27 is near the unscaled one.
    logits = logits_of((0.04, 0.40, 0.10, 0.25, 0.15, 0.06), (0.9, 0.04, 0.03, 0.01, 0.01, 0.01))
    return [removed_as_inf(impl.filters.min_p_filter(logits.clone(), m)) for m in (0.3, 0.05)] + [
        left_alone(impl.filters.min_p_filter, logits, 0.3)]


@probe("warp_logits")
def _probe_warp(impl: Impl) -> Any:
    # Raw probabilities .61 .22 .08 .05 .03 .01; at temperature 2 they are .38 .23 .14 .11
    # .09 .05. top_p = 0.7 keeps two tokens of the raw ones, three of the tempered ones.
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.5, 0.0, -1.0], [-1.0, 0.5, 2.0, 0.0, 3.0, 1.0]])
    warp = impl.batched_sampling.warp_logits
    return [
        removed_as_inf(warp(logits.clone(), temperature=2.0, top_p=0.7)),
        removed_as_inf(warp(logits.clone(), temperature=2.0, top_k=4, top_p=0.9, min_p=0.1)),
        removed_as_inf(warp(logits.clone(), temperature=0.5)),
        # The newer steps in Hugging Face's order, and an order asked for: on a row with a flat tail
        # typical first removes the (atypical) top token, after which min-p's bar follows the new top
        # token and keeps 22 tokens; in Hugging Face's order min-p leaves the top token alone.
        removed_as_inf(warp(logits.clone(), temperature=2.0, typical_p=0.8, epsilon_cutoff=0.02, top_n_sigma=2.0)),
        removed_as_inf(warp(_flat_tail(), min_p=0.5, typical_p=0.5, samplers="typical_p;min_p")),
    ]


def _flat_tail() -> torch.Tensor:
    """One row: a top token of about .3 and 30 tokens of about .02 each, no two alike."""
    probs = torch.tensor([0.4] + [0.02 + 0.0004 * i for i in range(30)])
    return (probs / probs.sum()).log()[None]


@probe("batched_sample")
def _probe_batched_sample(impl: Impl) -> Any:
    sample = impl.batched_sampling.sample
    # Temperature 0: each row's argmax.
    greedy = plain(sample(randn(generator(81), 3, 10, std=2.0), temperature=0.0))
    # Each row drawn from its own top 3 (row 0: .5 .3 .2 on tokens 0 1 2, row 1: .6 .2 .2 on
    # tokens 0 2 4). Ignoring the generator changes no distribution (the reproducibility check
    # below tells it apart), so the gap only sets the tolerance.
    logits = logits_of((0.5, 0.3, 0.2, 0.0001, 0.0), (0.6, 0.0001, 0.2, 0.0, 0.2))
    g = torch.Generator()
    rows = frequencies(lambda: sample(logits.clone(), top_k=3, generator=g), 5, gap=0.3, seed=82, rows=2, generator=g)

    # The same seeded generator gives the same tokens, whatever torch's global generator did
    # in between. 16 rows of 8 equally likely tokens: code that draws from the global
    # generator instead repeats itself with probability 8^-16.
    flat = torch.zeros(16, 8)

    def seeded() -> torch.Tensor:
        return plain(sample(flat.clone(), generator=torch.Generator().manual_seed(83)))

    first = seeded()
    torch.rand(1)
    reproducible = bool(torch.equal(first, seeded()))

    # A setting of the chain beyond the classic four: epsilon 0.25 leaves row 0 its top token alone
    # (.6; the others are .15 .15 .1), where dropping the setting draws all four.
    chained = logits_of((0.6, 0.15, 0.15, 0.1, 0.0))
    g2 = torch.Generator()
    chain = frequencies(lambda: sample(chained.clone(), generator=g2, epsilon_cutoff=0.25)[0], 5, gap=0.3, seed=88,
                        generator=g2)
    return [greedy, rows, reproducible, chain]


@probe("apply_repetition_penalty")
def _probe_repetition_penalty(impl: Impl) -> Any:
    logits = randn(generator(84), 2, 8, std=2.0)  # both signs
    input_ids = torch.tensor([[1, 3, 3, 5, 0], [2, 2, 6, 7, 4]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])  # row 1's first two are padding
    penalise = impl.penalties.apply_repetition_penalty
    return [plain(penalise(logits.clone(), input_ids, 1.5)), plain(penalise(logits.clone(), input_ids, 1.5, mask)),
            left_alone(penalise, logits, input_ids, 1.5)]


@probe("apply_presence_and_frequency_penalty")
def _probe_presence_frequency(impl: Impl) -> Any:
    logits = randn(generator(85), 2, 8, std=2.0)
    input_ids = torch.tensor([[1, 3, 3, 5, 5, 5], [2, 2, 6, 7, 4, 4]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    penalise = impl.penalties.apply_presence_and_frequency_penalty
    return [plain(penalise(logits.clone(), input_ids, 0.5, 0.3)), plain(penalise(logits.clone(), input_ids, 0.7, 0.0, mask))]


@probe("left_pad")
def _probe_left_pad(impl: Impl) -> Any:
    # Three prompts of different lengths, one of them the longest, and a pad id that is also a token.
    ids, mask = impl.padding.left_pad([[5, 6, 7], [8], [9, 10]], 0)
    return [plain(ids), plain(mask)]


@probe("position_ids_from_mask")
def _probe_position_ids(impl: Impl) -> Any:
    # Left padding, none, nearly all, and pads after real tokens (a finished row).
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1], [0, 1, 1, 0, 0]])
    positions = plain(impl.transformer.position_ids_from_mask(mask))
    # Only the real tokens' positions: a pad's is never read (0 or a clamped count are both fine).
    return [positions[mask.bool()]]


@probe("masked_forward")
def _probe_masked_forward(impl: Impl) -> Any:
    cfg, g = small_config(), generator(88)
    attn = loaded(impl.transformer.Attention(cfg), attn_params(cfg, g))
    x = randn(g, 2, 5, cfg.d_model)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    real = mask.bool()

    class ListCache:  # keys and values kept in order, the new ones after the old (a cache of the protocol)
        kv: tuple[torch.Tensor, torch.Tensor] | None = None

        def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if self.kv is not None:
                k, v = torch.cat([self.kv[0], k], 1), torch.cat([self.kv[1], v], 1)
            self.kv = (k, v)
            return k, v

    LayerCache = impl.kv_cache.LayerCache
    # Every position new; then with a cache: three positions, and the last two on top of them.
    whole, _ = attn(x, LayerCache(ListCache(), 0, real[:, None, None, :]))
    cache = ListCache()
    first, _ = attn(x[:, :3], LayerCache(cache, 0, real[:, None, None, :3]))
    rest, _ = attn(x[:, 3:], LayerCache(cache, 0, real[:, None, None, :]))
    # Only the real tokens' outputs: what a pad query sees is no one's business.
    return [plain(whole)[real], plain(first)[real[:, :3]], plain(rest)[real[:, 3:]]]


@probe("padded_forward")
def _probe_padded_forward(impl: Impl) -> Any:
    cfg, g = small_config(), generator(86)
    model = loaded(impl.transformer.DemoTransformer(cfg), demo_params(cfg, g))
    tokens = torch.randint(0, cfg.d_vocab, (2, 6), generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]])
    real = mask.bool()
    # Only the real tokens' logits: what a pad query sees is no one's business.
    whole = plain(model(tokens, attention_mask=mask))[real]
    # With a cache: the first four positions, then the last two on top.
    cache = impl.transformer.KeyValueCache.new_empty(cfg, batch=2)
    first, cache = model(tokens[:, :4], cache, attention_mask=mask[:, :4])
    rest, cache = model(tokens, cache, attention_mask=mask)
    return [whole, plain(first)[real[:, :4]], plain(rest)[real[:, 4:]]]


@probe("generate")
def _probe_generate(impl: Impl) -> Any:
    tok, words = tokenizer(), word_ids()
    eos = tok.eos_token_id
    g = generator(87)
    table, row_of = word_table(g)
    # End-of-text is forced after the token at real position 3: the long prompt's row (its last
    # prompt token sits at position 2) ends after two new tokens, the short one's after four.
    by_position = torch.zeros(64, len(tok))
    by_position[:, list(words)] = randn(g, 64, len(words), std=1.0)
    by_position[3, eos] = 100.0
    model = CachedToyLM(small_config(d_vocab=len(tok), n_ctx=32), table, row_of, by_position)
    prompts = [tok.decode(words[:3]), tok.decode(words[3:4])]
    # Greedy with a repetition penalty: the scores (after the penalty) differ from the raw log-probs.
    out = impl.generate.generate(model, tok, prompts, 6, temperature=0.0, repetition_penalty=1.3,
                                 return_dict_in_generate=True)
    calls = list(model.calls)
    # The presence and frequency penalties count the generated tokens only, never the prompt's.
    penalised = impl.generate.generate(model, tok, prompts, 6, temperature=0.0, presence_penalty=0.8,
                                       frequency_penalty=0.5, return_dict_in_generate=True)
    # The processors: no end-of-text before 4 new tokens (it is forced at position 3), a banned
    # word, a bias. Sequences only: the scores above already say what each step was drawn from.
    processed = impl.generate.generate(CachedToyLM(model.cfg, table, row_of, by_position), tok, prompts, 6,
                                       temperature=0.0, min_new_tokens=4, bad_words_ids=[[words[5]]],
                                       logit_bias={words[6]: 3.0})
    return [plain(out.sequences), plain(out.scores), plain(out.logprobs), calls, plain(penalised.scores),
            plain(processed), _mirostat_second_token(impl)]


def _mirostat_second_token(impl: Impl) -> Any:
    """The second tokens mirostat draws in 64 rows of one seeded batch; each depends on the state the row's first draw left.

    After the start token the model offers three words, .5 .25 .25; after any word .5 .3 .2. With
    tau 1.2 and eta 2, mu starts at 2.4 bits and keeps all three. Drawing the .5 word (1 bit)
    raises mu to 2.8 and the second step keeps all three again; drawing a .25 word (2 bits) drops
    it to 0.8, and the second step keeps the .5 word alone. A state that is not carried keeps all
    three at the second step, so some of the 64 rows draw another word. One seeded call makes
    every draw (the rows' draws are ``choose_tokens``', given code), so the output is exact.
    """
    tok, words = tokenizer(), word_ids()
    first, second, third = words[:3]
    rows = {w: {first: 0.5, second: 0.3, third: 0.2} for w in words}
    rows[tok.eos_token_id] = {first: 0.5, second: 0.25, third: 0.25}
    table, row_of = word_table(generator(92), rows=rows)
    model = CachedToyLM(small_config(d_vocab=len(tok), n_ctx=32), table, row_of)
    prompts = [tok.decode([tok.eos_token_id])] * 64
    out = impl.generate.generate(model, tok, prompts, 2, mirostat=2, mirostat_tau=1.2, mirostat_eta=2.0,
                                 eos_token_id=-1, seed=93)
    return plain(out[:, -1])


@probe("StopStringCriteria")
def _probe_stop_strings(impl: Impl) -> Any:
    tok = tokenizer()
    cases = [
        (" the cat was", "t w"),  # spans the last two tokens
        (" the cat was", " was"),  # the newest token alone
        (" the cat was", "the"),  # ended before the newest token: not looked at again
        (" the caf\u00e9", "\u00e9"),  # a character whose two bytes are two tokens
        (" the cat was", "dog"),  # nowhere
    ]
    verdicts = []
    for text, stop in cases:
        ids = torch.tensor([tok.encode(text)])
        criterion = impl.outputs.StopStringCriteria(tok, stop)
        verdicts.append(plain(torch.as_tensor(criterion(ids, torch.zeros(1, len(tok))))).bool())
    return verdicts


@probe("TextStreamer")
def _probe_streamer(impl: Impl) -> Any:
    tok = tokenizer()
    printed = io.StringIO()
    streamer = impl.outputs.TextStreamer(tok, file=printed)
    # A prompt, then one token at a time: words, a character split over two tokens, a newline.
    streamer.put(torch.tensor(tok.encode(" the cat")))
    seen = [printed.getvalue()]
    for token in tok.encode(" was caf\u00e9 au\nlait and"):
        streamer.put(torch.tensor([token]))
        seen.append(printed.getvalue())
    streamer.end()
    seen.append(printed.getvalue())
    return seen


# ---------------------------------------------------------------------------------------
# The newer filters, mirostat, DRY and banned words
# ---------------------------------------------------------------------------------------


@probe("typical_filter")
def _probe_typical(impl: Impl) -> Any:
    # Row 0: .40 .25 .15 .10 .06 .04 (entropy 1.52 nats); ranked by |surprise - entropy| the
    # most typical tokens are .25 and .15, and top-p's ranking would start with .40. Row 1 has
    # one likely token over a flat tail: the likely token is the least typical. No running
    # total lands on a cutoff.
    logits = logits_of((0.04, 0.40, 0.10, 0.25, 0.15, 0.06), (0.55, 0.1, 0.09, 0.09, 0.085, 0.085))
    # A uniform row: every token is as typical as the cut token, so all stay (Hugging Face's rule).
    uniform = torch.zeros(1, 5)
    return [removed_as_inf(impl.modern_filters.typical_filter(logits.clone(), p)) for p in (0.3, 0.5, 0.85)] + [
        removed_as_inf(impl.modern_filters.typical_filter(uniform, 0.5))]


@probe("epsilon_filter")
def _probe_epsilon(impl: Impl) -> Any:
    # epsilon 0.2 keeps .40 .25 of row 0 and nothing of the flat row 1 but its top token; 0.05 keeps
    # row 0's first five and all of row 1.
    logits = logits_of((0.04, 0.40, 0.10, 0.25, 0.15, 0.06), (0.18, 0.17, 0.17, 0.16, 0.16, 0.16))
    return [removed_as_inf(impl.modern_filters.epsilon_filter(logits.clone(), e)) for e in (0.2, 0.05)]


@probe("eta_filter")
def _probe_eta(impl: Impl) -> Any:
    # A peaked row (entropy 0.56 nats: sqrt(eta) exp(-H) is .126 for eta .05, so the bar is eta itself
    # and the .1 token stays) and a flat one (the bar falls far below eta).
    logits = logits_of((0.85, 0.1, 0.03, 0.01, 0.005, 0.005), (0.18, 0.17, 0.17, 0.16, 0.16, 0.16),
                       (0.04, 0.40, 0.10, 0.25, 0.15, 0.06))
    return [removed_as_inf(impl.modern_filters.eta_filter(logits.clone(), eta)) for eta in (0.05, 0.3)]


@probe("top_n_sigma_filter")
def _probe_top_n_sigma(impl: Impl) -> Any:
    # Row 1 has tokens an earlier filter removed (-inf): the statistics must leave them out.
    logits = torch.tensor([[3.0, 2.0, 1.5, 0.5, 0.0, -1.0], [3.0, float("-inf"), 1.0, float("-inf"), 0.0, -0.5]])
    return [removed_as_inf(impl.modern_filters.top_n_sigma_filter(logits.clone(), n)) for n in (0.5, 1.0, 2.0)]


@probe("xtc_filter")
def _probe_xtc(impl: Impl) -> Any:
    # Probability 1 cuts whenever it can (the same for any correct draw), probability 0 never.
    # Row 0 has three tokens at or above 0.1, row 1 one, row 2 two.
    logits = logits_of((0.45, 0.3, 0.15, 0.05, 0.05), (0.8, 0.05, 0.05, 0.05, 0.05), (0.5, 0.4, 0.04, 0.03, 0.03))
    xtc = impl.modern_filters.xtc_filter
    return [removed_as_inf(xtc(logits.clone(), t, p, torch.Generator().manual_seed(89)))
            for t, p in ((0.1, 1.0), (0.2, 1.0), (0.1, 0.0))]


@probe("mirostat_step")
def _probe_mirostat(impl: Impl) -> Any:
    step = impl.modern_filters.mirostat_step
    logits = logits_of((0.5, 0.25, 0.15, 0.1), (0.5, 0.25, 0.15, 0.1), (0.7, 0.2, 0.06, 0.04))
    # Each row its own mu (bits): 0.5 keeps the top token only, 2.2 keeps .5 .25, 3.5 keeps .5 .25 .15 .1.
    mu = torch.tensor([0.5, 2.2, 3.5])
    _, _, kept = step(logits.clone(), mu.clone(), 3.0, 0.5, torch.Generator().manual_seed(90))
    # Rows whose cut leaves one token draw it for sure: then the new mu is known (the drawn
    # token's surprise after renormalising is 0, so mu moves by eta * tau).
    tokens, new_mu, _ = step(logits.clone(), torch.tensor([0.5, 0.5, 0.3]), 3.0, 0.5, torch.Generator().manual_seed(91))
    return [removed_as_inf(kept), plain(tokens), plain(new_mu)]


@probe("apply_dry_penalty")
def _probe_dry(impl: Impl) -> Any:
    dry = impl.penalties.apply_dry_penalty
    a, b, c, y, brk = 0, 1, 2, 3, 4
    breakers = torch.tensor([False, False, False, False, True, False])
    histories = torch.tensor([[a, b, c, c, b, c, y, a, b, c], [c, a, b, y, a, brk, c, a, b, c]])
    mask = torch.tensor([[1] * 10, [0, 0] + [1] * 8])  # row 1's first two are padding
    # A breaker as the very next token of a repeat ("a b" was followed by the breaker before).
    breaker_next = torch.tensor([[y, a, b, brk, c, a, b]])
    # A repeat of 4 that reaches back across a breaker ("c brk a b" occurred before, followed by y):
    # the breaker caps it at the 2 tokens after it.
    across = torch.tensor([[c, brk, a, b, y, c, brk, a, b]])
    return [
        plain(dry(torch.zeros(2, 6), histories, 1.0, 2.0, 2, breakers, -1, mask)),
        plain(dry(torch.zeros(2, 6), histories, 0.5, 1.5, 1, breakers, 6, mask)),
        plain(dry(torch.zeros(1, 6), breaker_next, 1.0, 2.0, 2, breakers)),
        plain(dry(torch.zeros(1, 6), across, 1.0, 2.0, 2, breakers)),
    ]


@probe("ban_bad_words")
def _probe_ban_bad_words(impl: Impl) -> Any:
    ban = impl.penalties.ban_bad_words
    history = torch.tensor([[7, 7, 1], [1, 2, 2], [9, 1, 2], [3, 4, 5]])
    mask = torch.tensor([[0, 0, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1]])
    bad = [[7, 1, 5], [2, 2, 4], [1, 2, 8], [6], [3, 4]]
    # [[eos]] is left out, as Hugging Face leaves it out: the end of the text stays allowed.
    return [removed_as_inf(ban(torch.zeros(4, 10), history, bad, mask)), removed_as_inf(ban(torch.zeros(4, 10), history, bad)),
            removed_as_inf(ban(torch.zeros(4, 10), history, [[9], [3]], mask, eos_token_id=9))]

