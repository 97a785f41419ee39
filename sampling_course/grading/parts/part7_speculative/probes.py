"""Part 7's probes: hand-made distributions for the acceptance rule (drawn exactly for planted code,
counted for the learner's, see ``grading/matching.py``) and cached toy language models over ten
tokens for the draft and the round.

A round at temperature 0 is deterministic (every distribution is one-hot, so every
acceptance test and every draw has one outcome): the round's probe uses it, with a draft
that agrees with the target on its first proposal and not on its second.
"""

from __future__ import annotations

from typing import Any

import torch

from sampling_course.grading.matching import attempt, frequencies, plain
from sampling_course.grading.probing import CachedToyLM, Impl, generator, probe, randn, small_config

V = 10  # the toy models' vocabulary


def _chain_model(g: torch.Generator, next_of: dict[int, int]) -> CachedToyLM:
    """A cached toy model over V tokens whose favourite next token after ``a`` is ``next_of[a]``
    (5 nats ahead of the rest, which are random)."""
    table = randn(g, V, V, std=1.0)
    for a, b in next_of.items():
        table[a, b] += 5.0
    return CachedToyLM(small_config(d_vocab=V, n_ctx=16), table, torch.arange(V))


# The target's favourite: the next token, cyclically.
_TARGET = {a: (a + 1) % V for a in range(V)}


@probe("filtered_probs")
def _probe_filtered_probs(impl: Impl) -> Any:
    filtered = impl.speculative.filtered_probs
    # Sorted, the probabilities are .42 .25 .13 .08 .07 .05. top_p = 0.6 keeps .42 and .25
    # (inclusive); an exclusive cutoff keeps .42 only. top_k = 3 renormalises the top three
    # to .525 .3125 .1625, so top_p = 0.5 then keeps one token; top-p first would keep two.
    logits = torch.tensor([0.07, 0.42, 0.13, 0.25, 0.05, 0.08]).log()
    batch = randn(generator(100), 2, 6, std=1.5)
    return [
        plain(filtered(logits.clone())),
        plain(filtered(batch.clone(), 2.0)),  # each row of a batch, at temperature 2
        plain(filtered(logits.clone(), 1.0, 0, 0.6)),
        plain(filtered(logits.clone(), 1.0, 3, 0.5)),
        plain(filtered(logits.clone(), 0.5, 4, 0.9)),
        plain(filtered(batch.clone(), 0.0)),  # greedy: one-hot at the argmax
    ]


@probe("draft_tokens")
def _probe_draft_tokens(impl: Impl) -> Any:
    # The proposals are drawn from the q rows the function returns, so comparing q compares
    # what is drawn. The first row depends on the prompt only; later ones on earlier draws.
    g = generator(101)
    draft = CachedToyLM(small_config(d_vocab=V, n_ctx=16), randn(g, V, V, std=1.5), torch.arange(V))
    tokens = torch.tensor([1, 2, 3])
    out = []
    for temperature, top_k, top_p in ((2.0, 4, 1.0), (0.7, 0, 0.8)):
        cache = impl.kv_cache.KeyValueCache.new_empty(draft.cfg)
        proposals, q, cache = impl.speculative.draft_tokens(draft, tokens.clone(), cache, 2, temperature, top_k, top_p,
                                                             generator=torch.Generator().manual_seed(102))
        out.append([tuple(proposals.shape), tuple(q.shape), plain(q[0]), int(cache.shape[3])])
    return out


@probe("residual_probs")
def _probe_residual_probs(impl: Impl) -> Any:
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0, 0.0], [0.2, 0.2, 0.2, 0.4, 0.0], [0.1, 0.2, 0.3, 0.4, 0.0]])
    q = torch.tensor([[0.1, 0.3, 0.1, 0.5, 0.0], [0.2, 0.2, 0.2, 0.4, 0.0], [0.4, 0.3, 0.2, 0.1, 0.0]])
    residual = impl.speculative.residual_probs
    return [plain(residual(p.clone(), q.clone())), plain(residual(p[2].clone(), q[2].clone()))]


def _outcome(new: Any, proposals: torch.Tensor, n_vocab: int) -> int:
    """A round's new tokens as one category: (number of tokens - 1) * n_vocab + the last token,
    or the last category when they do not start with the proposals (which no candidate does)."""
    new = [int(t) for t in new]
    if not new or new[:-1] != proposals.tolist()[: len(new) - 1]:
        return (len(proposals) + 1) * n_vocab
    return (len(new) - 1) * n_vocab + new[-1]


@probe("accept_or_resample")
def _probe_accept_or_resample(impl: Impl) -> Any:
    accept = impl.speculative.accept_or_resample
    # Every ratio p/q at a proposal is 0 (always rejected) or at least 1 (always accepted), so
    # which proposals are kept is certain; only the replacement or bonus token is drawn.
    #   1. Proposals 1 and 2, both accepted: the bonus comes from p[2] (.1 .2 .3 .4).
    #   2. Proposal 3 rejected (p[0][3] = 0): the replacement comes from max(0, p - q),
    #      normalised (.8 0 .2), not from p[0] (.5 .3 .2).
    # Accepting when r >= p/q keeps proposal 3 and rejects the rest; no bonus ends setting 1
    # with two tokens. Every two candidates differ by at least 0.3 in one setting.
    p_accepts = [[0.1, 0.5, 0.2, 0.2, 0.0], [0.2, 0.2, 0.3, 0.3, 0.0], [0.1, 0.2, 0.3, 0.4, 0.0]]
    q_accepts = [[0.2, 0.4, 0.2, 0.2, 0.0], [0.3, 0.2, 0.3, 0.2, 0.0]]
    p_rejects = [[0.5, 0.3, 0.2, 0.0, 0.0]] + p_accepts[1:]
    q_rejects = [[0.1, 0.3, 0.1, 0.5, 0.0], q_accepts[1]]
    settings = [(p_accepts, q_accepts, [1, 2]), (p_rejects, q_rejects, [3, 2])]
    categories = 3 * 5 + 1
    out = []
    for i, (p, q, proposals) in enumerate(settings):
        p, q, proposals = torch.tensor(p), torch.tensor(q), torch.tensor(proposals)

        def draw(p: torch.Tensor = p, q: torch.Tensor = q, proposals: torch.Tensor = proposals) -> int:
            return _outcome(accept(p.clone(), q.clone(), proposals.clone()), proposals, 5)

        out.append(frequencies(draw, categories, gap=0.3, seed=103 + i))
    return out


@probe("crop_cache")
def _probe_crop_cache(impl: Impl) -> Any:
    crop = impl.speculative.crop_cache
    cache = impl.kv_cache.KeyValueCache(randn(generator(104), 2, 2, 3, 5, 2, 4))
    cropped = crop(cache, 2)

    class CropsInPlace:
        seq_len = 5

        def crop(self, n: int) -> None:
            self.seq_len = n

    class CropsToACopy:
        seq_len = 5

        def crop(self, n: int) -> Any:
            return ("a cropped copy", n)

    in_place = CropsInPlace()
    return [plain(cropped), isinstance(cropped, impl.kv_cache.KeyValueCache),
            crop(in_place, 3) is in_place, in_place.seq_len, crop(CropsToACopy(), 1)]


@probe("speculative_round")
def _probe_speculative_round(impl: Impl) -> Any:
    g = generator(105)
    target = _chain_model(g, _TARGET)
    KeyValueCache = impl.kv_cache.KeyValueCache

    def round_after(prompt: list[int], draft: CachedToyLM, gamma: int) -> Any:
        target.calls.clear()
        new, target_cache, draft_cache = impl.speculative.speculative_round(
            target, draft, torch.tensor(prompt), KeyValueCache.new_empty(target.cfg), KeyValueCache.new_empty(draft.cfg),
            gamma, 0.0, generator=torch.Generator().manual_seed(106),
        )
        return [plain(new), int(target_cache.shape[3]), int(draft_cache.shape[3]), list(target.calls), draft.calls]

    # 1. The draft proposes 4 8 9 after 1 2 3: the target accepts 4, rejects 8 and puts 5.
    #    (Judged against the target's first positions instead, 4 is rejected for 2.)
    # 2. The draft agrees with the target: 7 and 8 accepted, and a bonus token 9 (a crop past
    #    what the target's cache holds raises).
    return [
        attempt(lambda: round_after([1, 2, 3], _chain_model(g, {**_TARGET, 4: 8}), 3)),
        attempt(lambda: round_after([5, 6], _chain_model(g, _TARGET), 2)),
    ]


@probe("prompt_lookup")
def _probe_prompt_lookup(impl: Impl) -> Any:
    lookup = impl.speculative.prompt_lookup
    cases = [
        ([1, 2, 3, 4, 9, 1, 2], 3, 2),  # a repeated phrase: 3 4 9
        ([5, 2, 7, 6, 2, 8, 5, 2], 2, 2),  # the 2-gram 5 2 wins over the later 1-gram 2: 7 6
        ([1, 2, 3, 1, 2, 4, 1, 2], 1, 2),  # the most recent occurrence: 4
        ([4, 4, 4, 4], 3, 2),  # an occurrence overlapping the ending: 4
        ([1, 2, 3, 9, 3], 2, 3),  # no 3- or 2-gram: the 1-gram 3 gives 9 3
        ([1, 2, 3, 4], 3, 2),  # nothing
    ]
    return [attempt(lambda t=tokens, k=k, n=n: plain(lookup(torch.tensor(t), k, n))) for tokens, k, n in cases]
