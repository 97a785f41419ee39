"""Part 5b: the rest of the sampler chain, the filters libraries carry beyond top-k, top-p and min-p.

Each has the shape of part 5's classic filters: ``(batch, d_vocab)`` logits in, new logits
out with the removed tokens at -inf, the input never changed, the setting checked by the
rule of ``sampling_course.sampling_settings``. Typical, epsilon and eta come from Hugging
Face (``typical_p``, ``epsilon_cutoff``, ``eta_cutoff``, each with ``min_tokens_to_keep``),
top-n-sigma and XTC from llama.cpp. Mirostat is a draw rather than a filter: it keeps a
state per row and steers the surprise of the text towards a target.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sampling_course.sampling_settings import check_setting

from .filters import check_logits, spare_the_best


def typical_filter(
    logits: Float[Tensor, "batch d_vocab"], typical_p: float, min_tokens_to_keep: int = 1
) -> Float[Tensor, "batch d_vocab"]:
    """Typical sampling (Meister et al. 2023, "Locally Typical Sampling"): keep the tokens whose surprise is closest to the row's average surprise.

    A token's surprise is -log p; the row's average surprise is its entropy H. Rank the
    tokens by |-log p - H| (most typical first) and find the first token at which the
    running total of probability reaches ``typical_p`` (inclusive, like top-p). That
    token stays, and so does every token at least as typical as it: a token whose gap
    equals the cut token's is kept, as Hugging Face's ``TypicalLogitsWarper``
    (``typical_p``) keeps it. The ``min_tokens_to_keep`` most typical tokens always stay.
    Unlike top-p, a very likely token can go: on a flat row its surprise is far below the
    average.
    """
    check_logits(logits)
    check_setting("typical_p", typical_p)
    check_setting("min_tokens_to_keep", min_tokens_to_keep)
    ### BEGIN SOLUTION
    # Hint: entropy = -(p * log p) summed (nansum: removed tokens give 0 * -inf); sort by the gap, find the cut token, remove the gaps above its gap.
    logprobs = logits.log_softmax(dim=-1)
    probs = logprobs.exp()
    entropy = -(probs * logprobs).nansum(dim=-1, keepdim=True)
    gap = (-logprobs - entropy).abs()
    sorted_gap, order = gap.sort(dim=-1)
    running = probs.gather(-1, order).cumsum(dim=-1)
    # The cut token: the first whose running total reaches typical_p (the last one if rounding never gets there).
    cut = (running < typical_p).sum(dim=-1, keepdim=True).clamp(max=logits.shape[-1] - 1)
    remove_sorted = sorted_gap > sorted_gap.gather(-1, cut)
    remove_sorted[:, :min_tokens_to_keep] = False
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))
    ### END SOLUTION


def epsilon_filter(
    logits: Float[Tensor, "batch d_vocab"], epsilon: float, min_tokens_to_keep: int = 1
) -> Float[Tensor, "batch d_vocab"]:
    """Epsilon sampling: remove the tokens whose probability is below ``epsilon``, a fixed bar.

    The ``min_tokens_to_keep`` most likely tokens of a row always stay (every token tied
    with the last of them too), so a flat row whose every token is below the bar keeps its
    best. Hewitt et al. 2022 ("Truncation Sampling as Language Model Desmoothing");
    Hugging Face's ``EpsilonLogitsWarper`` (``epsilon_cutoff``).
    """
    check_logits(logits)
    check_setting("epsilon_cutoff", epsilon)
    check_setting("min_tokens_to_keep", min_tokens_to_keep)
    ### BEGIN SOLUTION
    # Hint: compare probabilities (not logits) with the bar; spare_the_best keeps a row's best tokens.
    probs = logits.softmax(dim=-1)
    return logits.masked_fill(spare_the_best(probs < epsilon, logits, min_tokens_to_keep), float("-inf"))
    ### END SOLUTION


def eta_filter(
    logits: Float[Tensor, "batch d_vocab"], eta: float, min_tokens_to_keep: int = 1
) -> Float[Tensor, "batch d_vocab"]:
    """Eta sampling: epsilon sampling with a bar that falls as the row grows uncertain.

    The bar is min(eta, sqrt(eta) * exp(-H)), with H the row's entropy in nats: a peaked
    row (small H) gets the full bar ``eta``, a flat row a much lower one, so it keeps more
    of its many plausible tokens: sqrt(eta) * exp(-H) is eta's bar scaled by how spread the
    row is (exp(-H) is 1 for a certain row, 1/d_vocab for a uniform one). The
    ``min_tokens_to_keep`` most likely tokens always stay. Hewitt et al. 2022; Hugging
    Face's ``EtaLogitsWarper`` (``eta_cutoff``).
    """
    check_logits(logits)
    check_setting("eta_cutoff", eta)
    check_setting("min_tokens_to_keep", min_tokens_to_keep)
    ### BEGIN SOLUTION
    # Hint: one bar per row (keepdim=True); the entropy uses nansum, as in typical_filter.
    logprobs = logits.log_softmax(dim=-1)
    probs = logprobs.exp()
    entropy = -(probs * logprobs).nansum(dim=-1, keepdim=True)
    bar = torch.minimum(torch.full_like(entropy, eta), math.sqrt(eta) * torch.exp(-entropy))
    return logits.masked_fill(spare_the_best(probs < bar, logits, min_tokens_to_keep), float("-inf"))
    ### END SOLUTION


def top_n_sigma_filter(logits: Float[Tensor, "batch d_vocab"], n: float) -> Float[Tensor, "batch d_vocab"]:
    """Top-n-sigma: keep the tokens whose logit is within ``n`` standard deviations of the row's best.

    Tang et al. 2024 ("Top-nσ: Not All Logits Are You Need"), as llama.cpp's ``top_n_sigma`` sampler computes it: over the tokens still in the row
    (logits that are not -inf), the largest logit and the standard deviation of those
    logits (the population one: divide by their count, not count - 1); a token goes when
    its logit is below max - n * std. Dividing every logit by a temperature divides max and
    std alike, so the kept set does not depend on the temperature.
    """
    check_logits(logits)
    check_setting("top_n_sigma", n)
    if n == 0:
        return logits  # off
    ### BEGIN SOLUTION
    # Hint: average only over the finite logits (a removed token's -inf would make every statistic -inf or nan).
    finite = torch.isfinite(logits)
    count = finite.sum(dim=-1, keepdim=True)
    values = torch.where(finite, logits, torch.zeros_like(logits))
    mean = values.sum(dim=-1, keepdim=True) / count
    variance = torch.where(finite, (logits - mean) ** 2, torch.zeros_like(logits)).sum(dim=-1, keepdim=True) / count
    top = logits.max(dim=-1, keepdim=True).values
    return logits.masked_fill(logits < top - n * variance.sqrt(), float("-inf"))
    ### END SOLUTION


def xtc_filter(
    logits: Float[Tensor, "batch d_vocab"],
    threshold: float,
    probability: float,
    generator: torch.Generator | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """XTC ("exclude top choices"), as llama.cpp's ``xtc`` sampler: sometimes remove the most likely tokens.

    Each row, with probability ``probability`` (one uniform draw per row from
    ``generator``), looks at its tokens whose probability is >= ``threshold``. When there
    are at least two, all of them go except the least likely one: the text leaves the
    obvious choices but stays on a token the model still finds plausible. With fewer than
    two such tokens, or when the draw says no, the row is left as it is. A threshold above
    0.5 can therefore never remove anything.
    """
    check_logits(logits)
    check_setting("xtc_threshold", threshold)
    check_setting("xtc_probability", probability)
    ### BEGIN SOLUTION
    # Hint: draw one uniform per row first; keep the least likely of the tokens above the threshold.
    applies = torch.rand(logits.shape[0], generator=generator, device=logits.device) < probability
    probs = logits.softmax(dim=-1)
    above = probs >= threshold
    least_above = torch.where(above, probs, torch.full_like(probs, 2.0)).min(dim=-1, keepdim=True).values
    remove = above & (probs > least_above) & applies[:, None]
    return logits.masked_fill(remove, float("-inf"))
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# Mirostat: a draw that steers the surprise of the text towards a target
# ---------------------------------------------------------------------------------------


def mirostat_step(
    logits: Float[Tensor, "batch d_vocab"],
    mu: Float[Tensor, "batch"],
    tau: float,
    eta: float,
    generator: torch.Generator | None = None,
) -> tuple[Int[Tensor, "batch"], Float[Tensor, "batch"], Float[Tensor, "batch d_vocab"]]:
    """One draw of mirostat version 2 (Basu et al. 2021, "Mirostat"), as llama.cpp's ``mirostat-v2`` sampler makes it; each row has its own state ``mu``.

    The surprise of a token is -log2 p (in bits). Each row keeps the tokens whose surprise
    is at most its ``mu`` (its most likely token in any case), renormalises, and draws one.
    Then it moves its ``mu`` against the error: mu - eta * (surprise of the drawn token
    under the renormalised distribution - tau). A row whose text was more surprising than
    the target ``tau`` cuts harder at its next step, a row that was duller cuts less, so
    the text's average surprise settles near ``tau``. (llama.cpp starts at mu = 2 tau and
    runs only the temperature before it; ``generate`` does the same, plus the steps of
    the chain you switch on.)

    Returns the tokens, the new ``mu`` and the logits the tokens were drawn from (-inf
    where cut).
    """
    check_logits(logits)
    if not isinstance(mu, Tensor) or mu.shape != logits.shape[:1]:
        raise ValueError(f"mu must be a tensor with one value per row, shape ({logits.shape[0]},), got {mu!r:.60}")
    check_setting("mirostat_tau", tau)
    check_setting("mirostat_eta", eta)
    ### BEGIN SOLUTION
    # Hint: surprise in bits is -log2(p); compare it with each row's own mu (mu[:, None]).
    surprise = -logits.log_softmax(dim=-1) / math.log(2)
    top = logits.max(dim=-1, keepdim=True).values
    keep = (surprise <= mu[:, None]) | (logits == top)
    kept = logits.masked_fill(~keep, float("-inf"))
    probs = kept.softmax(dim=-1)
    tokens = torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]
    observed = -torch.log2(probs.gather(-1, tokens[:, None])[:, 0])
    return tokens, mu - eta * (observed - tau), kept
    ### END SOLUTION
