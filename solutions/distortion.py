"""Part 8: masking is not conditioning. The distortion of mask-and-renormalise, computed exactly.

Sampling with the mask gives every member x of the language L the probability q(x), the
product of the *renormalised* conditionals along the way; the model's own distribution
restricted to L is p(x | x in L), proportional to the product of the unrenormalised ones.
The two differ whenever a prefix that looks likely to the model leads mostly to text outside
L: renormalisation pours that lost mass into the few allowed continuations. For a finite
language both laws can be computed exactly, member by member (``enumerate_language``,
``exact_laws``), and so can the distance between them (``kl_divergence``).
"""

from __future__ import annotations

import math
import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Float
from torch import Tensor

from .token_constraint import TokenConstraint
from .token_index import token_bytes


@dataclass
class LanguagePath:
    """One way the constrained sampler can spell a member: its tokens and, at each step, two numbers.

    ``logprobs[i]``: the model's log-probability of ``tokens[i]`` after the prompt and the
    tokens before it. ``allowed_logmass[i]``: the log of the model's total probability of
    the tokens the constraint allowed at that step (so ``logprobs[i] - allowed_logmass[i]``
    is the log-probability that mask-and-renormalise gives ``tokens[i]``).
    """

    tokens: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...]
    allowed_logmass: tuple[float, ...]


@dataclass
class Language:
    """Every path of a finite language that ``enumerate_language`` explored, and what it left out.

    ``skipped_q_mass`` bounds the probability that mask-and-renormalise ends in a path
    not listed; ``skipped_p_mass`` bounds the model's probability of the unlisted paths.
    Both are 0 when nothing was skipped. ``forward_rows``: the sequences the model ran.
    """

    paths: list[LanguagePath]
    skipped_q_mass: float = 0.0
    skipped_p_mass: float = 0.0
    forward_rows: int = 0
    members: set[str] = field(default_factory=set)

    @property
    def p_language(self) -> float:
        """The model's probability that its continuation begins with (a spelling of) a member."""
        return sum(math.exp(sum(path.logprobs)) for path in self.paths)


class NextTokenScorer:
    """The model's next-token log-probabilities after ``prompt_ids`` + each of many token suffixes.

    A DemoTransformer runs the prompt once and keeps its KV cache (part 4); each batch of
    suffixes then runs on a copy of that cache, so only the suffixes' positions cost
    anything. Any other model (a Hugging Face one, say) runs prompt and suffix in full.
    """

    def __init__(self, model, prompt_ids: list[int]):
        self.model, self.prompt_ids, self.rows = model, list(prompt_ids), 0
        param = next(model.parameters(), None) if hasattr(model, "parameters") else None
        self.device = param.device if param is not None else torch.device("cpu")
        self.prompt_cache = None
        cache_class = getattr(sys.modules.get(type(model).__module__), "KeyValueCache", None)
        if cache_class is not None and hasattr(model, "cfg"):
            with torch.inference_mode():
                empty = cache_class.new_empty(model.cfg, 1, self.device, param.dtype if param is not None else torch.float32)
                _, self.prompt_cache = model(torch.tensor([self.prompt_ids], device=self.device), empty)

    def __call__(self, suffixes: list[tuple[int, ...]]) -> Float[Tensor, "batch d_vocab"]:
        """One row of float64 log-probabilities per suffix; the suffixes must all have one length."""
        self.rows += len(suffixes)
        tokens = torch.tensor([self.prompt_ids + list(suffix) for suffix in suffixes], device=self.device)
        with torch.inference_mode():
            if self.prompt_cache is None or not suffixes[0]:
                logits = self.model(tokens)
                logits = getattr(logits, "logits", logits)  # a Hugging Face model returns an output object
            else:
                cache = self.prompt_cache.as_subclass(Tensor).expand(-1, -1, len(suffixes), -1, -1, -1)
                logits, _ = self.model(tokens, type(self.prompt_cache)(cache))
        return logits[:, -1].double().log_softmax(dim=-1).cpu()


def enumerate_language(
    model,
    tokenizer,
    prompt: str,
    constraint: TokenConstraint,
    *,
    skip_below: float = 1e-9,
    batch_size: int = 256,
    max_tokens: int = 64,
) -> Language:
    """Every token path of the constraint's (finite) language after ``prompt``, with the model's numbers.

    A member is complete when the constraint reaches a state where only the end-of-text
    token may follow: the constrained sampler's EOS is then forced, so neither law needs
    the model's own EOS probability. The language must therefore be *prefix-free* (no
    member is the beginning of another; end the pattern with a delimiter such as "."):
    then "the model's tokens begin with a spelling of x" are disjoint events, one per x,
    and the model's p(x | x in L) is their probability renormalised.

    The search is breadth-first, one batched forward pass per group of paths of the same
    length. A path whose masked probability and whose model probability (relative to a
    member found first by following the most likely allowed token) are both below
    ``skip_below`` is not explored further; the masses skipped are reported.
    """
    index = constraint.index
    prompt_ids = list(tokenizer.encode(prompt))
    if not prompt_ids:
        raise ValueError("the prompt must encode to at least one token")
    eos = index.eos_token_id
    language = Language(paths=[])
    scorer = NextTokenScorer(model, prompt_ids)

    def step(rows):
        return scorer([row[0] for row in rows])

    # A lower bound on the model's probability of the language: one member, greedily.
    state, tokens, logp = 0, (), 0.0
    while True:
        allowed = [t for t in index.transitions[state] if t != eos]
        if not allowed:
            break
        if len(tokens) >= max_tokens:
            raise ValueError(f"a member is longer than max_tokens={max_tokens}: is the language finite?")
        logprobs = step([(tokens,)])[0]
        best = max(allowed, key=lambda t: logprobs[t].item())
        state, tokens, logp = index.transitions[state][best], tokens + (best,), logp + logprobs[best].item()
    floor_q, floor_p = math.log(skip_below), math.log(skip_below) + logp

    # (tokens, state, logprobs so far, allowed log-masses so far)
    frontier = [((), 0, (), ())]
    while frontier:
        if len(frontier[0][0]) > max_tokens:
            raise ValueError(f"paths longer than max_tokens={max_tokens}: the language must be finite")
        next_frontier = []
        for start in range(0, len(frontier), batch_size):
            rows = frontier[start : start + batch_size]
            logprobs = step(rows)
            for (tokens, state, lps, masses), row_logprobs in zip(rows, logprobs):
                moves = index.transitions[state]
                ids = torch.tensor(list(moves), device=row_logprobs.device)
                mass = torch.logsumexp(row_logprobs[ids], dim=0).item()
                for token, target in moves.items():
                    if token == eos:
                        raise ValueError(
                            "the language is not prefix-free: a member can be followed by more text. "
                            "End the pattern with a delimiter (such as a full stop) that no member contains"
                        )
                    path = (tokens + (token,), target, lps + (row_logprobs[token].item(),), masses + (mass,))
                    if set(index.transitions[target]) == {eos}:  # complete: only EOS may follow
                        text = constraint.text(path[0])
                        language.paths.append(LanguagePath(path[0], text, path[2], path[3]))
                        language.members.add(text)
                        continue
                    log_p, log_q = sum(path[2]), sum(path[2]) - sum(path[3])
                    if log_q < floor_q and log_p < floor_p:
                        language.skipped_q_mass += math.exp(log_q)
                        language.skipped_p_mass += math.exp(log_p)
                        continue
                    next_frontier.append(path)
        frontier = next_frontier
    language.forward_rows = scorer.rows
    return language


def exact_laws(paths: Sequence[LanguagePath]) -> tuple[dict[str, float], dict[str, float]]:
    """The two laws over the members: the model's p(x | x in L) and mask-and-renormalise's q(x).

    A path's model probability is the product of its tokens' probabilities; its masked
    probability the product of each token's probability divided by the allowed mass at
    that step. A member spelled by several paths (different tokenizations of the same
    text) is one outcome: its probability is the sum over its paths. p is normalised to
    sum to 1 over the members; q is returned as it is (it sums to 1 when every path is
    listed). Returns two dicts text -> probability, with the same keys.
    """
    ### BEGIN SOLUTION
    # Hint: add the paths of one text in log space (logsumexp), and normalise p by the total over all texts.
    log_p: dict[str, list[float]] = defaultdict(list)
    log_q: dict[str, list[float]] = defaultdict(list)
    for path in paths:
        log_p[path.text].append(sum(path.logprobs))
        log_q[path.text].append(sum(lp - mass for lp, mass in zip(path.logprobs, path.allowed_logmass)))
    texts = list(log_p)
    p_text = torch.tensor([torch.logsumexp(torch.tensor(log_p[t], dtype=torch.float64), 0).item() for t in texts], dtype=torch.float64)
    q_text = torch.tensor([torch.logsumexp(torch.tensor(log_q[t], dtype=torch.float64), 0).item() for t in texts], dtype=torch.float64)
    p_text = (p_text - torch.logsumexp(p_text, 0)).exp()
    return dict(zip(texts, p_text.tolist())), dict(zip(texts, q_text.exp().tolist()))
    ### END SOLUTION


def kl_divergence(p: dict[str, float], q: dict[str, float]) -> float:
    """KL(p || q) = sum over x of p(x) log(p(x) / q(x)), in nats.

    Outcomes with p(x) = 0 add nothing; an outcome with p(x) > 0 and q(x) = 0 (or missing
    from q) makes it infinite.
    """
    ### BEGIN SOLUTION
    # Hint: natural logarithms; skip the terms where p(x) is 0, since p log p -> 0.
    total = 0.0
    for x, px in p.items():
        if px == 0:
            continue
        qx = q.get(x, 0.0)
        if qx == 0:
            return math.inf
        total += px * math.log(px / qx)
    return total
    ### END SOLUTION


def most_distorted(p: dict[str, float], q: dict[str, float], k: int = 5) -> list[tuple[str, float, float, float]]:
    """The ``k`` members whose masked probability is farthest from the model's, largest |log(q/p)| first.

    Each entry: (text, p(x | L), q(x), q / p).
    """
    rows = [(x, p[x], q.get(x, 0.0), q.get(x, 0.0) / p[x] if p[x] > 0 else math.inf) for x in p]
    return sorted(rows, key=lambda row: -abs(math.log(row[3])) if 0 < row[3] < math.inf else -math.inf)[:k]


def sample_by_enumeration(p: dict[str, float], n: int, generator: torch.Generator | None = None) -> list[str]:
    """``n`` members drawn from ``p`` (for example the model's exact p(x | x in L) from ``exact_laws``)."""
    texts = list(p)
    probs = torch.tensor([p[t] for t in texts], dtype=torch.float64)
    draws = torch.multinomial(probs, n, replacement=True, generator=generator)
    return [texts[i] for i in draws.tolist()]


def rejection_sample(
    model, tokenizer, prompt: str, pattern: str, n: int, max_new_tokens: int, *, batch_size: int = 64,
    max_tries: int = 100_000, seed: int = 0,
) -> tuple[list[str], int]:
    """Exact samples of p(x | x in L): sample freely, keep the samples whose tokens begin with a member.

    Each attempt is one unconstrained continuation of ``max_new_tokens`` tokens (part 5's
    ``generate``, temperature 1); it is accepted when some prefix of its tokens spells a
    member of ``pattern``'s (prefix-free) language, and that member is the sample. An
    attempt succeeds with probability p(L), so a sample costs 1 / p(L) attempts on
    average. Returns the samples found (at most ``n``) and the number of attempts made
    (stops after ``max_tries``).
    """
    from .generate import generate

    vocabulary = token_bytes(tokenizer)
    compiled = re.compile(pattern)
    samples: list[str] = []
    tries = 0
    while len(samples) < n and tries < max_tries:
        rows = min(batch_size, max_tries - tries)
        out = generate(model, tokenizer, [prompt] * rows, max_new_tokens, seed=seed + tries, eos_token_id=-1)
        tries += rows
        for row in out[:, -max_new_tokens:].tolist():
            text = b""
            for token in row:
                if vocabulary[token] is None:  # the end-of-text token (or another special one) ends the text
                    break
                text += vocabulary[token]
                try:
                    decoded = text.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                if compiled.fullmatch(decoded):
                    samples.append(decoded)
                    break
    return samples[:n], tries
