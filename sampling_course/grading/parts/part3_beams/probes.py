"""Part 3's probes: hand-made beams and toy language models whose best continuations are known."""

from __future__ import annotations

from typing import Any

import torch

from sampling_course.grading.matching import attempt, plain
from sampling_course.grading.probing import (
    Impl, ToyLM, generator, probe, randn, small_config, tokenizer, word_ids, word_table,
)


def _beams_state(beams: Any) -> tuple[Any, Any]:
    return plain(beams.logprob_sums), plain(beams.tokens)


@probe("Beams.generate")
def _probe_generate(impl: Impl) -> Any:
    tok, words = tokenizer(), word_ids()
    g = generator(40)
    table, row_of = word_table(g)
    table += randn(g, table.shape[0], 1, std=3.0)  # rows far from normalised: logits != log-probs
    model = ToyLM(small_config(d_vocab=len(tok), n_ctx=32), table, row_of)
    beams_cls = impl.beams.Beams
    # Each beam holds the bigram (a, its favourite next token) and ends in a: blocking bigrams
    # must take the favourite out of its top k.
    rows = []
    for i, a in enumerate(words[:3]):
        favourite = int(table[row_of[a]].argmax())
        rows.append([a, favourite, words[10 + i], a])
    tokens = torch.tensor(rows)
    sums = torch.tensor([-1.0, -2.5, -0.5])
    plain = beams_cls(model, tok, sums.clone(), tokens.clone()).generate(k=3)
    blocked = beams_cls(model, tok, sums.clone(), tokens.clone()).generate(k=2, no_repeat_ngram_size=2)
    return [_beams_state(plain), _beams_state(blocked)]


@probe("Beams.filter")
def _probe_filter(impl: Impl) -> Any:
    tok, words = tokenizer(), word_ids()
    eos = tok.eos_token_id
    tokens = torch.tensor([[words[i], words[i + 6], eos if i in (1, 4) else words[i + 12]] for i in range(6)])
    sums = torch.tensor([-3.0, -0.5, -2.0, -4.0, -1.0, -1.5])
    continuing, terminated = impl.beams.Beams(None, tok, sums, tokens).filter(k=4)
    return [_beams_state(continuing), _beams_state(terminated)]


@probe("Beams.get_topk_non_repeating")
def _probe_ngram_blocking(impl: Impl) -> Any:
    tok = tokenizer()
    g = generator(50)
    base = randn(g, 2, 20)

    def top(history: list[list[int]], n: int | None, k: int = 4) -> Any:
        tokens = torch.tensor(history)
        # The tokens a beam already holds are the likeliest, so blocking them changes its top k.
        boost = torch.zeros(2, 20).scatter_(1, tokens, 4.0)
        logprobs = (base + boost).log_softmax(dim=-1)
        beams = impl.beams.Beams(None, tok, torch.zeros(2), tokens)
        values, indices = beams.get_topk_non_repeating(logprobs.clone(), n, k)
        return plain(values), plain(indices)

    scenarios = [
        ([[3, 5, 3, 7, 3], [4, 6, 9, 6, 6]], 2),  # blocks 5 and 7; 9 and 6 (the last bigram)
        ([[1, 2, 3, 1, 2], [8, 8, 8, 8, 8]], 3),  # blocks 3; 8
        ([[2, 2, 2], [4, 7, 4]], 3),  # a history exactly n long: blocks 2; nothing
        ([[3, 5, 3], [6, 6, 1]], 1),  # n = 1 blocks every token present
        ([[3, 5, 3, 7, 3], [4, 6, 9, 6, 6]], None),  # a plain top k
    ]
    return [attempt(lambda h=history, n=n: top(h, n)) for history, n in scenarios]


@probe("beam_search")
def _probe_beam_search(impl: Impl) -> Any:
    tok, words = tokenizer(), word_ids()
    eos, vocab = tok.eos_token_id, len(tok)
    a, b, c, d, e, x = words[:6]
    g = generator(60)
    cfg = small_config(d_vocab=vocab, n_ctx=32)

    def run(rows: dict[int, dict[int, float]], **kwargs: Any) -> Any:
        model = ToyLM(cfg, *word_table(g, std=1.0, rows=rows))
        out = impl.sampling.TransformerSampler(model, tok).beam_search(tok.decode([a]), **kwargs)
        return [(float(lp), text) for lp, text in out], model.longest_input

    others = {w: 0.1 for w in words[6:14]}
    return [
        # A beam finishes at step 1 and must come first, never extended; then the best live ones.
        run({a: {eos: 0.5, b: 0.3, c: 0.2}, b: {d: 0.9, e: 0.1}, c: {e: 0.6, d: 0.4}, eos: {x: 0.99, d: 0.01}},
            num_return_sequences=3, num_beams=3, max_new_tokens=3),
        # Enough beams finish early: return at once (the longest input stays short).
        run({a: {eos: 0.5, b: 0.3, d: 0.2}, b: {eos: 0.6, d: 0.4}, d: {b: 1.0}},
            num_return_sequences=1, num_beams=3, max_new_tokens=6),
        run({a: {eos: 0.5, b: 0.3, d: 0.2}, b: {eos: 0.6, d: 0.4}, d: {b: 1.0}},
            num_return_sequences=2, num_beams=2, max_new_tokens=6),
        # A model that likes repeating itself, under no_repeat_ngram_size=2.
        run({a: {a: 0.6, b: 0.4}, b: {a: 0.7, b: 0.3}}, num_return_sequences=2, num_beams=2, max_new_tokens=4,
            no_repeat_ngram_size=2),
        # Two beams find the likelier sequence that one beam (greedy) misses.
        run({a: {b: 0.6, c: 0.4}, b: {x: 0.2, **others}, c: {d: 0.9, e: 0.1}},
            num_return_sequences=1, num_beams=2, max_new_tokens=2),
    ]


@probe("BeamHypotheses")
def _probe_beam_hypotheses(impl: Impl) -> Any:
    # Finished beams of different lengths, added one at a time: the kept set and is_done after each,
    # for every length_penalty sign and every early_stopping rule.
    finished = [(-3.0, 3, "a"), (-5.0, 6, "b"), (-1.5, 1, "c"), (-6.5, 8, "d"), (-4.2, 2, "e")]
    runs = []
    for length_penalty in (0.0, 1.0, 2.0, -1.0):
        for early_stopping in (True, False, "never"):

            def run(lp: float = length_penalty, es: Any = early_stopping) -> Any:
                hyps = impl.beams.BeamHypotheses(3, lp, es, 12)
                trace = []
                for logprob_sum, length, beam in finished:
                    hyps.add(logprob_sum, length, beam)
                    kept = [(float(score), float(s), b) for score, s, b in hyps.hypotheses]
                    done = [bool(hyps.is_done(best, n)) for best in (-0.5, -2.5, -6.0) for n in (1, 4, 9)]
                    trace.append((kept, done))
                return [float(hyps.score(-6.0, 3))], trace

            runs.append(attempt(run))
    return runs
