"""Part 7: speculative decoding.

A forward pass of a large model over several new positions costs little more than over
one: the weights are read once and the positions run side by side. Sampling cannot use
that, because each token depends on the one before. Speculative decoding gets around
it with a second, much smaller model, the *draft*:

    1. the draft proposes ``gamma`` tokens, one cheap forward pass each
       (``draft_tokens``), each drawn from its distribution q;
    2. the *target* scores all of them in ONE cached forward pass, which gives its own
       distribution p at every proposal and one position past the last;
    3. proposal x is accepted with probability min(1, p(x) / q(x)); at the first
       rejection, one token is drawn from normalize(max(0, p - q)) and the round ends;
       when all ``gamma`` are accepted, the target's last distribution gives a bonus
       token for free (``accept_or_resample``, ``residual_probs``);
    4. both caches forget the rejected proposals (``crop_cache``).

Each round costs one target forward and adds between 1 and ``gamma + 1`` tokens.

Why the output follows the target exactly: a token y comes out of one judged position
either as an accepted proposal, with probability q(y) min(1, p(y)/q(y)) = min(p, q)(y),
or as the replacement after a rejection. A rejection happens with probability
1 - sum(min(p, q)) = sum(max(0, p - q)), and the replacement is y with probability
max(0, p - q)(y) / sum(max(0, p - q)). Together:

    min(p, q)(y) + max(0, p - q)(y) = p(y).

So the draft only changes the speed: a good draft (q close to p) gets most proposals
accepted, a bad one wastes its work, and the text has the target's distribution either
way. Temperature 0 is the special case where p and q put all their mass on their argmax:
a proposal is kept exactly when it is the target's greedy choice.

The draft need not be a model. Prompt-lookup drafting (``prompt_lookup``,
``PromptLookupDraft``; Hugging Face's ``prompt_lookup_num_tokens``, vLLM's n-gram
speculator) proposes the tokens that followed the last earlier occurrence of the text's
final n-gram: text that repeats its names and phrases gets them proposed for free. Its
proposals are certain (q is a point mass), so proposal x is accepted with probability
p(x), a rejection is replaced from p without x renormalised, and the output still follows
the target exactly.

The functions here are the exercises, in the order a round uses them;
``speculative_generate`` (solutions/speculative_loop.py) runs the rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sampling_course.devices import check_generator, check_same_device
from sampling_course.sampling_settings import check_sampling_settings

from .kv_cache import KeyValueCache

# ---------------------------------------------------------------------------------------
# The distribution both models sample from
# ---------------------------------------------------------------------------------------


def filtered_probs(
    logits: Float[Tensor, "... d_vocab"], temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> Float[Tensor, "... d_vocab"]:
    """The distribution to sample from: divide by the temperature, keep the top-k, keep the top-p, softmax.

    The target's p and the draft's q both come from here, so each filter shapes both
    alike, and each exactly once. The order is Hugging Face's: temperature, then top-k
    (the ``top_k`` most likely tokens), then top-p (the smallest set of most likely
    tokens whose probability, after top-k, is at least ``top_p``; the token that reaches
    ``top_p`` is kept). ``top_k=0`` and ``top_p=1.0`` turn those filters off, as in part 5
    and in Hugging Face (``sampling_course.sampling_settings`` checks the settings for both).

    Temperature 0 means greedy: all the mass on the argmax (the first one, if several
    tie). The acceptance rule then needs no special case.
    """
    check_sampling_settings(temperature, top_k, top_p)
    top_k = min(top_k, logits.shape[-1])  # more than the vocabulary keeps every token
    ### BEGIN SOLUTION
    # Hint: filtered-out tokens get a logit of -inf, so the final softmax gives them 0.
    if temperature == 0:
        greedy = logits.argmax(dim=-1, keepdim=True)
        return torch.zeros_like(logits).scatter(-1, greedy, 1.0)
    logits = logits / temperature
    if top_k > 0:
        kth_largest = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Keep a token while the mass ranked above it is still short of top_p.
        keep_sorted = sorted_probs.cumsum(dim=-1) - sorted_probs < top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        logits = logits.masked_fill(~keep, float("-inf"))
    return logits.softmax(dim=-1)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# One round: propose, judge, forget the rejected
# ---------------------------------------------------------------------------------------


def prompt_lookup(tokens: Int[Tensor, "pos"], num_tokens: int, max_ngram_size: int = 2) -> Int[Tensor, "n"]:
    """Prompt-lookup drafting: up to ``num_tokens`` tokens that followed the last earlier occurrence of the text's ending.

    For n = ``max_ngram_size`` down to 1: take the last n tokens of ``tokens``; find the
    most recent earlier place where the same n tokens occur (the ending itself does not
    count, but an occurrence may overlap it); if there is one, return the up to
    ``num_tokens`` tokens that followed it (fewer when the text ends first). Longer
    n-grams are tried first because a longer match predicts better. No match for any n:
    an empty tensor. (Hugging Face's prompt lookup takes the first occurrence instead of
    the last; both are exact, since any proposal is.)
    """
    if not isinstance(tokens, Tensor) or tokens.ndim != 1:
        raise ValueError(f"tokens must be a 1-D tensor of token ids, got {tokens!r:.80}")
    for name, value in (("num_tokens", num_tokens), ("max_ngram_size", max_ngram_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    ### BEGIN SOLUTION
    # Hint: compare every window of n tokens (tokens.unfold(0, n, 1)) that starts before the ending with the ending.
    length = len(tokens)
    for n in range(min(max_ngram_size, length - 1), 0, -1):
        windows = tokens[: length - 1].unfold(0, n, 1)
        matches = (windows == tokens[length - n :]).all(dim=-1).nonzero()
        if len(matches):
            start = int(matches[-1]) + n
            return tokens[start : start + num_tokens]
    return tokens[:0]
    ### END SOLUTION


@dataclass
class PromptLookupDraft:
    """A draft without a model: ``prompt_lookup`` proposes, with certainty.

    Pass it as the ``draft`` of ``speculative_generate`` (or use its
    ``prompt_lookup_num_tokens`` setting). ``d_vocab`` is the target's vocabulary size
    (``speculative_generate`` fills it in), for the point-mass distributions q.
    """

    max_ngram_size: int = 2
    d_vocab: int | None = None

    def propose(
        self, tokens: Int[Tensor, "pos"], kv_cache: KeyValueCache, gamma: int
    ) -> tuple[Int[Tensor, "gamma"], Float[Tensor, "gamma d_vocab"], KeyValueCache]:
        """Exactly ``gamma`` looked-up proposals (ask for no more than ``prompt_lookup`` finds), their one-hot q, the cache untouched."""
        if self.d_vocab is None:
            raise ValueError("PromptLookupDraft needs d_vocab (the target's vocabulary size) to build its distributions q")
        proposals = prompt_lookup(tokens, gamma, self.max_ngram_size)
        if len(proposals) != gamma:
            raise ValueError(f"prompt lookup found {len(proposals)} tokens to propose, not gamma={gamma}: ask for fewer")
        q = torch.zeros(gamma, self.d_vocab, device=tokens.device).scatter_(1, proposals[:, None], 1.0)
        return proposals, q, kv_cache


def draft_tokens(
    draft,
    tokens: Int[Tensor, "pos"],
    kv_cache: KeyValueCache,
    gamma: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[Int[Tensor, "gamma"], Float[Tensor, "gamma d_vocab"], KeyValueCache]:
    """The draft proposes ``gamma`` tokens to follow ``tokens``, one cached forward pass each.

    ``kv_cache`` holds the draft's keys and values for the first positions of ``tokens``
    (all but the last, some of them, or none); each forward pass runs only the positions
    it lacks. Proposal i is drawn, with ``generator``, from
    q_i = ``filtered_probs`` of the draft's logits after ``tokens`` and proposals 0..i-1.

    Returns the proposals, the distributions q_0 .. q_{gamma-1} they were drawn from (the
    acceptance rule needs them), and the draft's cache, which then holds every position
    but the last proposal's.
    """
    check_proposal_args(tokens, gamma)
    if isinstance(draft, PromptLookupDraft):  # a draft without a model: its proposals are certain
        return draft.propose(tokens, kv_cache, gamma)
    where = device_and_dtype(draft)[0]
    check_same_device("the tokens", tokens.device, where)
    check_generator(generator, where)
    ### BEGIN SOLUTION
    # Hint: the model wants a batch dimension: draft(sequence[None], kv_cache).
    sequence = tokens
    q_rows = []
    for _ in range(gamma):
        logits, kv_cache = draft(sequence[None], kv_cache)
        q = filtered_probs(logits[0, -1], temperature, top_k, top_p)
        proposal = torch.multinomial(q, num_samples=1, generator=generator)
        sequence = torch.cat([sequence, proposal])
        q_rows.append(q)
    return sequence[len(tokens) :], torch.stack(q_rows), kv_cache
    ### END SOLUTION


def residual_probs(p: Float[Tensor, "... d_vocab"], q: Float[Tensor, "... d_vocab"]) -> Float[Tensor, "... d_vocab"]:
    """normalize(max(0, p - q)): the distribution a rejected proposal's replacement is drawn from.

    It holds the probability that p has and q lacks, which is exactly what accepting
    proposals with probability min(1, p/q) leaves short of p (see the module docstring).
    Where p <= q everywhere, which only rounding can bring about (p and q then agree, and
    a rejection was all but impossible), it returns p.
    """
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    ### BEGIN SOLUTION
    residual = (p - q).clamp(min=0)
    total = residual.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, residual / total, p)
    ### END SOLUTION


def accept_or_resample(
    p: Float[Tensor, "n_proposals_plus_1 d_vocab"],
    q: Float[Tensor, "n_proposals d_vocab"],
    proposals: Int[Tensor, "n_proposals"],
    generator: torch.Generator | None = None,
) -> Int[Tensor, "n_new"]:
    """Judge the proposals in order and return the tokens this round adds.

    ``q[i]`` is the draft's distribution that ``proposals[i]`` was drawn from and ``p[i]``
    the target's distribution at the same position; ``p[-1]`` is the target's
    distribution after the last proposal. Proposal i is accepted with probability
    min(1, p[i][x] / q[i][x]) (one uniform draw from ``generator`` per proposal judged).

    Returns the accepted proposals followed by exactly one token of the target's: at the
    first rejection, a replacement drawn from ``residual_probs(p[i], q[i])`` (the
    proposals after it are never judged); when all are accepted, a bonus token drawn
    from ``p[-1]``. So a round adds between 1 and ``len(proposals) + 1`` tokens.
    """
    check_judge_args(p, q, proposals)
    check_generator(generator, p.device)
    ### BEGIN SOLUTION
    for i, x in enumerate(proposals.tolist()):
        r = torch.rand((), generator=generator, device=p.device)
        # Accept with probability min(1, p/q): always when the target likes x at least as much
        # as the draft did. q[i, x] > 0 because x was drawn from q[i].
        if r < p[i, x] / q[i, x]:
            continue
        replacement = torch.multinomial(residual_probs(p[i], q[i]), num_samples=1, generator=generator)
        return torch.cat([proposals[:i], replacement])
    # Every proposal accepted: the target's distribution after them gives one more token for free.
    bonus = torch.multinomial(p[-1], num_samples=1, generator=generator)
    return torch.cat([proposals, bonus])
    ### END SOLUTION


def crop_cache(kv_cache: KeyValueCache, n: int) -> KeyValueCache:
    """The cache of the first ``n`` positions only: how a cache forgets rejected proposals.

    A cache class with a ``crop(n)`` method of its own (part 6's static cache) crops
    itself; one that crops in place may return nothing, and then the cache itself is the
    result. A ``KeyValueCache`` is sliced along its position dimension (dimension 3),
    which keeps all six dimensions and so gives a ``KeyValueCache`` again.
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= kv_cache.seq_len:
        raise ValueError(f"n must be an integer between 0 and the cache's seq_len={kv_cache.seq_len}, got {n!r}")
    ### BEGIN SOLUTION
    if hasattr(kv_cache, "crop"):
        cropped = kv_cache.crop(n)
        return kv_cache if cropped is None else cropped
    return kv_cache[:, :, :, :n]
    ### END SOLUTION


def speculative_round(
    target,
    draft,
    tokens: Int[Tensor, "pos"],
    target_cache: KeyValueCache,
    draft_cache: KeyValueCache,
    gamma: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[Int[Tensor, "n_new"], KeyValueCache, KeyValueCache]:
    """One round of speculative decoding after ``tokens``: 1 to ``gamma + 1`` new tokens for one target forward.

    The draft proposes ``gamma`` tokens from its own cache; the target runs once over
    every position its cache lacks (the last token of ``tokens`` and all the proposals);
    ``accept_or_resample`` decides; both caches are cropped.

    On entry each cache holds the first positions of ``tokens`` (the target's at most all
    but the last). Returns the new tokens and the two caches. Both then hold only positions
    of ``tokens`` followed by the accepted proposals, never a rejected one; the target's
    holds all of those, the draft's perhaps all but its last proposal.
    """
    ### BEGIN SOLUTION
    # Hint: the last gamma + 1 rows of the target's logits are its distributions at the proposals and after them.
    proposals, q, draft_cache = draft_tokens(draft, tokens, draft_cache, gamma, temperature, top_k, top_p, generator)
    logits, target_cache = target(torch.cat([tokens, proposals])[None], target_cache)
    p = filtered_probs(logits[0, -(gamma + 1) :], temperature, top_k, top_p)
    new = accept_or_resample(p, q, proposals, generator)
    # Keep the positions of the tokens so far and of the accepted proposals. The last new token
    # is in neither cache: the next round's forward passes start with it.
    keep = len(tokens) + len(new) - 1
    target_cache = crop_cache(target_cache, keep)
    draft_cache = crop_cache(draft_cache, min(keep, draft_cache.seq_len))
    return new, target_cache, draft_cache
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# Checks: bad input fails early, saying what is wrong and what is allowed
# ---------------------------------------------------------------------------------------


def check_proposal_args(tokens: Tensor, gamma: int) -> None:
    if not isinstance(tokens, Tensor) or tokens.ndim != 1 or len(tokens) == 0:
        raise ValueError(f"tokens must be a non-empty 1-D tensor of token ids (seq_len,), got {tokens!r:.80}")
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")


def check_judge_args(p: Tensor, q: Tensor, proposals: Tensor) -> None:
    if proposals.ndim != 1 or p.ndim != 2 or q.ndim != 2:
        raise ValueError(
            f"expected p of shape (n_proposals + 1, d_vocab), q of shape (n_proposals, d_vocab) and proposals "
            f"of shape (n_proposals,), got {tuple(p.shape)}, {tuple(q.shape)} and {tuple(proposals.shape)}"
        )
    n = len(proposals)
    if p.shape[0] != n + 1 or q.shape[0] != n or p.shape[1] != q.shape[1]:
        raise ValueError(
            f"{n} proposals need p with {n + 1} rows (one per proposal, one after them) and q with {n} rows, "
            f"both over the same vocabulary; got p {tuple(p.shape)} and q {tuple(q.shape)}"
        )


def device_and_dtype(model) -> tuple[torch.device, torch.dtype]:
    """Where the model's parameters live and their dtype (CPU and float32 for a parameter-free model)."""
    param = next(model.parameters(), None) if hasattr(model, "parameters") else None
    return (param.device, param.dtype) if param is not None else (torch.device("cpu"), torch.float32)
