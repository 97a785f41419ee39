"""Part 5: the generation engine, many prompts at once.

Parts 2-4 continue one prompt with a loop written for teaching. This module is the engine
you meet in Hugging Face's ``generate``, in vLLM and in llama.cpp:

    prompts -> left padding -> prefill (one pass over every prompt, filling a KV cache)
            -> per step: processors (logit bias, penalties, DRY, banned words, a minimum length)
                      -> the chain (temperature, top-k, top-p, min-p, typical, epsilon, eta,
                         top-n-sigma, XTC; in an order you can choose)
                      -> draw (one multinomial draw per row, or mirostat)
            -> append the token (a pad for rows already finished) -> stopping criteria

Everything works on a whole batch, ``(batch, d_vocab)`` logits at a time:

* ``sample`` is the primitive: temperature 0 is argmax, otherwise ``warp_logits`` applies
  the temperature and the filters (Hugging Face's order unless ``samplers`` says otherwise,
  as llama.cpp's ``--samplers`` does) and one ``torch.multinomial`` draw is made per row.
  Each filter is its own function that sets removed logits to -inf. The settings mean what
  they mean in Hugging Face: ``top_k=0``, ``top_p=1.0`` and ``min_p=0.0`` are off,
  temperature 0 is greedy (``sampling_course.sampling_settings`` checks them, for part 7
  too). Part 2's classic sampler used ``top_p=0.0`` for off.
* Processors see each row's tokens so far: ``apply_repetition_penalty`` (Hugging Face's
  rule, over the prompt and the generated tokens), ``apply_presence_and_frequency_penalty``
  (OpenAI's rules, over the generated tokens only, as OpenAI and vLLM define them),
  ``apply_dry_penalty`` (llama.cpp's DRY, over the prompt and the generated tokens),
  ``ban_bad_words`` (Hugging Face's ``bad_words_ids``). They run before the temperature, as
  in Hugging Face. (Part 2's sampler applies its frequency penalty after the temperature
  and counts the prompt too; the order matters whenever the temperature is not 1.)
* ``generate`` runs the loop with per-row stopping; ``StoppingCriteria`` and the
  streamer protocol have Hugging Face's shapes, so your own criteria and streamers plug in.
  With ``num_beams > 1`` it runs Hugging Face's beam search instead (``beam_generate``),
  with ``length_penalty`` and ``early_stopping``.

Settings carry Hugging Face's keyword names where Hugging Face has the setting
(``typical_p``, ``epsilon_cutoff``, ``eta_cutoff``, ``min_new_tokens``,
``num_return_sequences``, ``bad_words_ids``, ``length_penalty``, ``early_stopping``) and
vLLM's or llama.cpp's names otherwise (``logit_bias``, ``logprobs``, ``top_n_sigma``,
``xtc_probability``, ``mirostat``, ``dry_multiplier``, ``samplers``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TextIO, runtime_checkable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sampling_course.devices import check_generator
from sampling_course.sampling_settings import check_sampling_settings

from .beams import BeamHypotheses
from .transformer import DemoTransformer, KeyValueCache

# ---------------------------------------------------------------------------------------
# Filters: each takes (batch, d_vocab) logits and sets the logits it removes to -inf
# ---------------------------------------------------------------------------------------


def top_k_filter(logits: Float[Tensor, "batch d_vocab"], top_k: int) -> Float[Tensor, "batch d_vocab"]:
    """Keep the ``top_k`` largest logits of each row; set the others to -inf.

    Ties at the k-th largest value are all kept (as Hugging Face does), so a row can keep
    more than ``top_k`` tokens when several share that value. ``top_k`` larger than the
    vocabulary keeps everything.
    """
    check_logits(logits)
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1 here (0 means no top-k: do not call the filter), got {top_k!r}")
    top_k = min(top_k, logits.shape[-1])
    ### BEGIN SOLUTION
    # Hint: find each row's k-th largest value, then remove everything strictly below it.
    kth_largest = logits.topk(top_k, dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth_largest, float("-inf"))
    ### END SOLUTION


def top_p_filter(logits: Float[Tensor, "batch d_vocab"], top_p: float) -> Float[Tensor, "batch d_vocab"]:
    """Nucleus filter: keep the smallest set of most likely tokens whose probability is >= ``top_p``.

    Inclusive: the token that takes the running total to ``top_p`` or past it is kept, and
    the most likely token is always kept. Probabilities come from the logits as they are
    (after the temperature, when ``warp_logits`` calls it).
    """
    check_logits(logits)
    if not isinstance(top_p, (int, float)) or not 0.0 <= top_p <= 1.0:
        raise ValueError(f"top_p must be in [0, 1] (1 keeps everything), got {top_p!r}")
    ### BEGIN SOLUTION
    # Hint: sort each row, and keep a token while the probability of the tokens ranked above it is < top_p.
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs
    remove_sorted = mass_above >= top_p
    remove_sorted[:, 0] = False
    # Put the decisions back in vocabulary order.
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))
    ### END SOLUTION


def min_p_filter(logits: Float[Tensor, "batch d_vocab"], min_p: float) -> Float[Tensor, "batch d_vocab"]:
    """Keep the tokens whose probability is at least ``min_p`` times the row's top probability.

    The bar moves with the model's confidence: a peaked row keeps few tokens, a flat row
    many. The most likely token always stays.
    """
    check_logits(logits)
    if not isinstance(min_p, (int, float)) or not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1] (0 keeps everything), got {min_p!r}")
    ### BEGIN SOLUTION
    # Hint: compare each probability with min_p times the largest probability of the same row.
    probs = logits.softmax(dim=-1)
    bar = min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < bar, float("-inf"))
    ### END SOLUTION


def typical_filter(logits: Float[Tensor, "batch d_vocab"], typical_p: float) -> Float[Tensor, "batch d_vocab"]:
    """Typical sampling: keep the tokens whose surprise is closest to the row's average surprise.

    A token's surprise is -log p; the row's average surprise is its entropy H. Rank the
    tokens by |-log p - H| (most typical first) and keep the smallest such prefix whose
    probability is >= ``typical_p`` (inclusive, like top-p; the most typical token always
    stays). Unlike top-p, a very likely token can go: on a flat row its surprise is far
    below the average. Hugging Face's ``TypicalLogitsWarper`` (``typical_p``).
    """
    check_logits(logits)
    if isinstance(typical_p, bool) or not isinstance(typical_p, (int, float)) or not 0.0 < typical_p <= 1.0:
        raise ValueError(f"typical_p must be in (0, 1] (1.0 keeps everything), got {typical_p!r}")
    ### BEGIN SOLUTION
    # Hint: entropy = -(p * log p) summed (nansum: removed tokens give 0 * -inf); then sort by the gap, as top-p sorts by probability.
    logprobs = logits.log_softmax(dim=-1)
    probs = logprobs.exp()
    entropy = -(probs * logprobs).nansum(dim=-1, keepdim=True)
    gap = (-logprobs - entropy).abs()
    sorted_gap, order = gap.sort(dim=-1)
    sorted_probs = probs.gather(-1, order)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    remove_sorted = mass_before >= typical_p
    remove_sorted[:, 0] = False
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))
    ### END SOLUTION


def epsilon_filter(logits: Float[Tensor, "batch d_vocab"], epsilon: float) -> Float[Tensor, "batch d_vocab"]:
    """Epsilon sampling: remove the tokens whose probability is below ``epsilon``, a fixed bar.

    The most likely token of a row always stays (every token tied with it too), so a flat
    row whose every token is below the bar keeps its best. Hugging Face's
    ``EpsilonLogitsWarper`` (``epsilon_cutoff``).
    """
    check_logits(logits)
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon_cutoff must be in [0, 1) (0 keeps everything), got {epsilon!r}")
    ### BEGIN SOLUTION
    # Hint: compare probabilities (not logits) with the bar, and never remove a row's top token.
    probs = logits.softmax(dim=-1)
    top = logits.max(dim=-1, keepdim=True).values
    return logits.masked_fill((probs < epsilon) & (logits < top), float("-inf"))
    ### END SOLUTION


def eta_filter(logits: Float[Tensor, "batch d_vocab"], eta: float) -> Float[Tensor, "batch d_vocab"]:
    """Eta sampling: epsilon sampling with a bar that falls as the row grows uncertain.

    The bar is min(eta, sqrt(eta) * exp(-H)), with H the row's entropy in nats: a peaked
    row (small H) gets the full bar ``eta``, a flat row a much lower one, so it keeps more
    of its many plausible tokens. The top token always stays. Hugging Face's
    ``EtaLogitsWarper`` (``eta_cutoff``).
    """
    check_logits(logits)
    if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not 0.0 <= eta < 1.0:
        raise ValueError(f"eta_cutoff must be in [0, 1) (0 keeps everything), got {eta!r}")
    ### BEGIN SOLUTION
    # Hint: one bar per row (keepdim=True); the entropy uses nansum, as in typical_filter.
    logprobs = logits.log_softmax(dim=-1)
    probs = logprobs.exp()
    entropy = -(probs * logprobs).nansum(dim=-1, keepdim=True)
    bar = torch.minimum(torch.full_like(entropy, eta), math.sqrt(eta) * torch.exp(-entropy))
    top = logits.max(dim=-1, keepdim=True).values
    return logits.masked_fill((probs < bar) & (logits < top), float("-inf"))
    ### END SOLUTION


def top_n_sigma_filter(logits: Float[Tensor, "batch d_vocab"], n: float) -> Float[Tensor, "batch d_vocab"]:
    """Top-n-sigma: keep the tokens whose logit is within ``n`` standard deviations of the row's best.

    As llama.cpp's ``top_n_sigma`` sampler computes it: over the tokens still in the row
    (logits that are not -inf), the largest logit and the standard deviation of those
    logits (the population one: divide by their count, not count - 1); a token goes when
    its logit is below max - n * std. Dividing every logit by a temperature divides max and
    std alike, so the kept set does not depend on the temperature.
    """
    check_logits(logits)
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not n > 0:
        raise ValueError(f"top_n_sigma must be a number > 0 (0 turns it off: do not call the filter), got {n!r}")
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
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 < threshold <= 1.0:
        raise ValueError(f"xtc_threshold must be in (0, 1], got {threshold!r}")
    if isinstance(probability, bool) or not isinstance(probability, (int, float)) or not 0.0 <= probability <= 1.0:
        raise ValueError(f"xtc_probability must be in [0, 1] (0 turns it off), got {probability!r}")
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
# The chain: the temperature and the filters, in an order you can choose
# ---------------------------------------------------------------------------------------

# The steps of the chain, by the name of their setting. Hugging Face's order comes first:
# temperature, top-k, top-p, min-p, typical, epsilon, eta; it has no top-n-sigma or XTC,
# which come last here. llama.cpp's default order puts the temperature last
# (its penalties and DRY run first; here they always run before the chain, see process_logits).
HF_ORDER = ("temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_n_sigma", "xtc")
LLAMA_CPP_ORDER = ("top_n_sigma", "top_k", "typical_p", "top_p", "min_p", "xtc", "temperature")
# llama.cpp's and other short names for the same steps.
STEP_ALIASES = {"temp": "temperature", "typ_p": "typical_p", "typical": "typical_p", "epsilon": "epsilon_cutoff",
                "eta": "eta_cutoff", "xtc_probability": "xtc"}
# llama.cpp lists these in --samplers too; here they always run before the chain.
PROCESSOR_STEPS = ("penalties", "dry", "logit_bias")
CHAIN_DEFAULTS = dict(typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0, top_n_sigma=0.0, xtc_probability=0.0,
                      xtc_threshold=0.1, samplers=None)


def step_is_on(name: str, settings: dict) -> bool:
    """Whether the chain step ``name`` changes anything with these settings (its "off" value does not)."""
    off = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "epsilon_cutoff": 0.0,
           "eta_cutoff": 0.0, "top_n_sigma": 0.0, "xtc": 0.0}
    key = "xtc_probability" if name == "xtc" else name
    return settings.get(key, off[name]) != off[name]


def chain_order(samplers: str | Sequence[str] | None, **settings) -> list[str]:
    """The steps ``warp_logits`` runs, in order: those of ``samplers`` that are switched on.

    ``samplers`` is a list of step names (see ``HF_ORDER``) or one string of them
    separated by ";" (llama.cpp's ``--samplers`` format; its names ``temp`` and ``typ_p``
    work too, and ``penalties``/``dry`` are accepted and skipped, since they always run
    first here). None means Hugging Face's order. A setting that is switched on must have
    its step in the list.
    """
    if samplers is None:
        names = list(HF_ORDER)
    else:
        if isinstance(samplers, str):
            samplers = [part for part in samplers.replace(",", ";").split(";") if part.strip()]
        if not isinstance(samplers, (list, tuple)) or not all(isinstance(n, str) for n in samplers):
            raise TypeError(f"samplers must be a list of step names or a ';'-separated string, got {samplers!r}")
        names = []
        for raw in samplers:
            name = STEP_ALIASES.get(raw.strip(), raw.strip())
            if name in PROCESSOR_STEPS:
                continue
            if name not in HF_ORDER:
                raise ValueError(f"unknown sampler {raw!r} in samplers; the steps are {', '.join(HF_ORDER)}")
            if name in names:
                raise ValueError(f"sampler {name!r} appears twice in samplers")
            names.append(name)
        missing = [n for n in HF_ORDER if n not in names and step_is_on(n, settings)]
        if missing:
            raise ValueError(
                f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} switched on but not in samplers "
                f"({';'.join(names)}): add {'it' if len(missing) == 1 else 'them'} to the order, or switch "
                f"{'it' if len(missing) == 1 else 'them'} off"
            )
    return [name for name in names if step_is_on(name, settings)]


def warp_logits(
    logits: Float[Tensor, "batch d_vocab"],
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    *,
    typical_p: float = 1.0,
    epsilon_cutoff: float = 0.0,
    eta_cutoff: float = 0.0,
    top_n_sigma: float = 0.0,
    xtc_probability: float = 0.0,
    xtc_threshold: float = 0.1,
    samplers: str | Sequence[str] | None = None,
    generator: torch.Generator | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """The logits ``sample`` draws from: the temperature and the filters that are switched on, in order.

    The order is Hugging Face's (temperature, top-k, top-p, min-p, typical, epsilon, eta,
    then top-n-sigma and XTC) unless ``samplers`` gives another (see ``chain_order``; e.g.
    ``LLAMA_CPP_ORDER`` applies the temperature last). Each step's "off" value switches it
    off: ``temperature=1.0``, ``top_k=0``, ``top_p=1.0``, ``min_p=0.0``, ``typical_p=1.0``,
    ``epsilon_cutoff=0.0``, ``eta_cutoff=0.0``, ``top_n_sigma=0.0``, ``xtc_probability=0.0``.
    The temperature must be > 0 here (``sample`` handles 0 as argmax). XTC draws from
    ``generator``.
    """
    check_sampling_settings(temperature, top_k, top_p, min_p)
    check_chain_args(typical_p, epsilon_cutoff, eta_cutoff, top_n_sigma, xtc_probability, xtc_threshold)
    if temperature == 0:
        raise ValueError("warp_logits needs temperature > 0; temperature 0 is greedy decoding (see sample)")
    order = chain_order(samplers, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                        epsilon_cutoff=epsilon_cutoff, eta_cutoff=eta_cutoff, top_n_sigma=top_n_sigma,
                        xtc_probability=xtc_probability)
    ### BEGIN SOLUTION
    # Hint: one step per name of `order`; each step gets the output of the one before.
    for name in order:
        if name == "temperature":
            logits = logits / temperature
        elif name == "top_k":
            logits = top_k_filter(logits, top_k)
        elif name == "top_p":
            logits = top_p_filter(logits, top_p)
        elif name == "min_p":
            logits = min_p_filter(logits, min_p)
        elif name == "typical_p":
            logits = typical_filter(logits, typical_p)
        elif name == "epsilon_cutoff":
            logits = epsilon_filter(logits, epsilon_cutoff)
        elif name == "eta_cutoff":
            logits = eta_filter(logits, eta_cutoff)
        elif name == "top_n_sigma":
            logits = top_n_sigma_filter(logits, top_n_sigma)
        elif name == "xtc":
            logits = xtc_filter(logits, xtc_threshold, xtc_probability, generator)
    return logits
    ### END SOLUTION


def sample(
    logits: Float[Tensor, "batch d_vocab"],
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    generator: torch.Generator | None = None,
    **chain,
) -> Int[Tensor, "batch"]:
    """One token per row: argmax at temperature 0, otherwise a draw from ``warp_logits``.

    At temperature 0 no filter runs. Otherwise each row is drawn independently from
    softmax of its warped logits, with randomness from ``generator`` (torch's global
    generator when None), so the same seeded generator gives the same tokens. ``chain``
    holds the other settings of ``warp_logits`` (``typical_p``, ``epsilon_cutoff``,
    ``eta_cutoff``, ``top_n_sigma``, ``xtc_probability``, ``xtc_threshold``, ``samplers``);
    pass them on with ``**chain``.
    """
    check_logits(logits)
    check_sampling_settings(temperature, top_k, top_p, min_p)
    check_generator(generator, logits.device)  # a generator draws on its own device only
    check_chain_names(chain)
    ### BEGIN SOLUTION
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = warp_logits(logits, temperature, top_k, top_p, min_p, generator=generator, **chain).softmax(dim=-1)
    # The draw Hugging Face makes: with the same seed, the same tokens.
    return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]
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
    """One draw of mirostat version 2, as llama.cpp's ``mirostat-v2`` sampler makes it; each row has its own state ``mu``.

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
    for name, value in (("mirostat_tau", tau), ("mirostat_eta", eta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
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


# ---------------------------------------------------------------------------------------
# Penalties: from each row's tokens so far, before the temperature
# ---------------------------------------------------------------------------------------


def token_counts(
    input_ids: Int[Tensor, "batch seq"], d_vocab: int, attention_mask: Int[Tensor, "batch seq"] | None = None
) -> Int[Tensor, "batch d_vocab"]:
    """How many times each token occurs in each row, counting only positions where the mask is 1."""
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must have shape (batch, seq), got {tuple(input_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(attention_mask.shape)}"
        )
    counts = torch.zeros(input_ids.shape[0], d_vocab, dtype=torch.long, device=input_ids.device)
    return counts.scatter_add_(1, input_ids, attention_mask.long())


def apply_repetition_penalty(
    logits: Float[Tensor, "batch d_vocab"],
    input_ids: Int[Tensor, "batch seq"],
    penalty: float,
    attention_mask: Int[Tensor, "batch seq"] | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """Hugging Face's repetition penalty: make every token already in the row less likely.

    A seen token's logit is divided by ``penalty`` when positive and multiplied by it when
    negative (dividing a negative logit would raise it). Once per distinct token, however
    often it occurs. Positions where ``attention_mask`` is 0 (padding) do not count, so a
    padded row is penalised as it would be alone. (Hugging Face's generate counts left
    padding as seen, which also penalises the pad token of padded rows.)
    ``penalty`` 1.0 changes nothing; above 1 discourages repeats.
    """
    check_logits(logits)
    if not isinstance(penalty, (int, float)) or not penalty > 0:
        raise ValueError(f"repetition_penalty must be > 0 (1.0 is off), got {penalty!r}")
    seen = token_counts(input_ids, logits.shape[-1], attention_mask) > 0
    ### BEGIN SOLUTION
    # Hint: both cases must move the logit down: shrink a positive one, stretch a negative one.
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)
    ### END SOLUTION


def apply_presence_and_frequency_penalty(
    logits: Float[Tensor, "batch d_vocab"],
    input_ids: Int[Tensor, "batch seq"],
    presence_penalty: float,
    frequency_penalty: float,
    attention_mask: Int[Tensor, "batch seq"] | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """OpenAI's penalties: subtract ``presence_penalty`` once from every token that occurs in
    ``input_ids``, and ``frequency_penalty`` once per occurrence. Padding (mask 0) does not count.

    OpenAI and vLLM count the tokens generated so far, not the prompt's: pass only the
    generated columns (``generate`` does, through ``process_logits``).
    """
    check_logits(logits)
    for name, value in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty)):
        if not isinstance(value, (int, float)) or math.isnan(value):
            raise ValueError(f"{name} must be a number (0 is off), got {value!r}")
    counts = token_counts(input_ids, logits.shape[-1], attention_mask)
    ### BEGIN SOLUTION
    # Hint: presence uses whether a token occurred (counts > 0), frequency how often (counts).
    present = (counts > 0).to(logits.dtype)
    return logits - presence_penalty * present - frequency_penalty * counts.to(logits.dtype)
    ### END SOLUTION


# llama.cpp's default sequence breakers: a repeat never reaches back across one of these.
DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")
# Above this exponent base ** exponent overflows float32 (llama.cpp clamps it the same way).
FLOAT32_MAX_LOG = 88.7228391


def apply_dry_penalty(
    logits: Float[Tensor, "batch d_vocab"],
    input_ids: Int[Tensor, "batch seq"],
    multiplier: float,
    base: float = 1.75,
    allowed_length: int = 2,
    breakers: Bool[Tensor, "d_vocab"] | None = None,
    penalty_last_n: int = -1,
    attention_mask: Int[Tensor, "batch seq"] | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """DRY ("don't repeat yourself"), as llama.cpp's ``dry`` sampler defines it: penalise the token that would extend a repeat.

    Look at a row's tokens (the last ``penalty_last_n`` of them, or all with -1; padding
    does not count). For every earlier position j, let n_j be how many tokens ending at j
    equal the tokens ending at the last position (the length of the common suffix; it may
    overlap the end). Emitting token x = (the token after j) would make that repeat one
    longer. So every such x with n_j >= ``allowed_length`` gets its logit lowered by
    ``multiplier * base ** (n - allowed_length)``, with n the largest n_j that points at
    it: the penalty grows exponentially with the length of the repeat.

    Sequence breakers (``breakers``: a boolean per token, True for tokens such as a newline
    or a quote) stop a repeat from reaching back across them: every n_j is capped at the
    number of tokens after the most recent breaker, and a breaker token itself is never
    penalised. Nothing happens when the row has at most ``allowed_length`` tokens, or when
    fewer than ``allowed_length`` tokens follow its last breaker. The exponent is capped
    where base ** exponent would overflow float32.
    """
    check_logits(logits)
    if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)) or not multiplier >= 0:
        raise ValueError(f"dry_multiplier must be a number >= 0 (0 turns DRY off), got {multiplier!r}")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base >= 1:
        raise ValueError(f"dry_base must be a number >= 1, got {base!r}")
    if isinstance(allowed_length, bool) or not isinstance(allowed_length, int) or allowed_length < 1:
        raise ValueError(f"dry_allowed_length must be an integer >= 1, got {allowed_length!r}")
    if isinstance(penalty_last_n, bool) or not isinstance(penalty_last_n, int) or penalty_last_n < -1:
        raise ValueError(f"dry_penalty_last_n must be -1 (every token), 0 (off) or a positive integer, got {penalty_last_n!r}")
    if input_ids.ndim != 2 or input_ids.shape[0] != logits.shape[0]:
        raise ValueError(f"input_ids must have shape (batch={logits.shape[0]}, seq), got {tuple(input_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if breakers is None:
        breakers = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    if multiplier == 0 or penalty_last_n == 0:
        return logits
    max_exponent = int(FLOAT32_MAX_LOG / math.log(base)) if base > 1.000001 else None
    logits = logits.clone()
    for row in range(logits.shape[0]):
        ids = input_ids[row][attention_mask[row].bool()]
        if penalty_last_n > 0:
            ids = ids[-penalty_last_n:]
        ### BEGIN SOLUTION
        # Hint: reverse the row; for a shift k, the repeat length is the run of rev[i] == rev[i + k] from i = 0.
        n = len(ids)
        if n <= allowed_length:
            continue
        # How far back a repeat may reach: the tokens after the most recent breaker.
        behind = breakers[ids].flip(0).nonzero()
        limit = int(behind[0]) if len(behind) else n
        if limit < allowed_length:
            continue
        rev = ids.flip(0)
        shifts = torch.arange(1, n, device=ids.device)
        index = torch.arange(n, device=ids.device)[None, :] + shifts[:, None]
        same = (index < n) & (rev[index.clamp(max=n - 1)] == rev[None, :])
        lengths = same.long().cumprod(dim=-1).sum(dim=-1).clamp(max=limit)
        # Shift k: the repeat ends k tokens before the last one; the token after it is ids[n - k].
        counts = lengths >= allowed_length
        if not counts.any():
            continue
        longest = torch.zeros(logits.shape[-1], dtype=torch.long, device=ids.device)
        longest.scatter_reduce_(0, ids[n - shifts[counts]], lengths[counts], reduce="amax")
        penalised = (longest >= allowed_length) & ~breakers
        exponent = (longest - allowed_length).clamp(min=0)
        if max_exponent is not None:
            exponent = exponent.clamp(max=max_exponent)
        penalty = multiplier * torch.pow(torch.tensor(float(base), device=logits.device), exponent.to(logits.dtype))
        logits[row] = logits[row] - torch.where(penalised, penalty, torch.zeros_like(penalty))
        ### END SOLUTION
    return logits


def dry_breaker_ids(tokenizer, sequence_breakers: Sequence[str], d_vocab: int) -> Bool[Tensor, "d_vocab"]:
    """Which tokens are sequence breakers: those whose text contains one of ``sequence_breakers``.

    llama.cpp also counts a token whose text ends in the start of a longer breaker string
    when the next tokens spell the rest of it; for breakers of one character, like the
    defaults, the two rules are the same.
    """
    if isinstance(sequence_breakers, str) or not all(isinstance(b, str) and b for b in sequence_breakers):
        raise ValueError(f"dry_sequence_breakers must be a list of non-empty strings, got {sequence_breakers!r}")
    n = min(len(tokenizer), d_vocab) if hasattr(tokenizer, "__len__") else d_vocab
    texts = tokenizer.batch_decode([[i] for i in range(n)]) if hasattr(tokenizer, "batch_decode") else [
        tokenizer.decode([i]) for i in range(n)
    ]
    flags = [any(b in text for b in sequence_breakers) for text in texts] + [False] * (d_vocab - n)
    return torch.tensor(flags, dtype=torch.bool)


# ---------------------------------------------------------------------------------------
# Biases and bans
# ---------------------------------------------------------------------------------------


def apply_logit_bias(logits: Float[Tensor, "batch d_vocab"], logit_bias: dict[int, float]) -> Float[Tensor, "batch d_vocab"]:
    """Add ``logit_bias[token]`` to that token's logit in every row (OpenAI's and vLLM's ``logit_bias``).

    A large negative bias all but bans a token, -inf bans it, a positive one favours it.
    Hugging Face's ``sequence_bias`` with one-token sequences does the same.
    """
    check_logits(logits)
    if not isinstance(logit_bias, dict):
        raise TypeError(f"logit_bias must be a dict {{token_id: bias}}, got {type(logit_bias).__name__}")
    bias = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
    for token, value in logit_bias.items():
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < logits.shape[-1]:
            raise ValueError(f"logit_bias keys must be token ids in [0, {logits.shape[-1]}), got {token!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ValueError(f"logit_bias values must be numbers, got {value!r} for token {token}")
        bias[token] = value
    return logits + bias


def ban_bad_words(
    logits: Float[Tensor, "batch d_vocab"],
    input_ids: Int[Tensor, "batch seq"],
    bad_words_ids: list[list[int]],
    attention_mask: Int[Tensor, "batch seq"] | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """Hugging Face's ``bad_words_ids``: never complete one of these token sequences.

    A banned sequence of one token bans that token everywhere. A longer one bans its last
    token in the rows whose last tokens are the rest of it (all but its last token), so
    the sequence can never appear whole. Padding (mask 0) never counts as a token.
    """
    check_logits(logits)
    check_bad_words(bad_words_ids, logits.shape[-1])
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    ### BEGIN SOLUTION
    # Hint: compare the last len(banned) - 1 tokens of every row with the banned sequence's start, all rows at once.
    ban = torch.zeros_like(logits, dtype=torch.bool)
    for banned in bad_words_ids:
        *start, last = banned
        if not start:
            ban[:, last] = True
            continue
        if input_ids.shape[1] < len(start):
            continue
        tail = input_ids[:, -len(start) :]
        real = attention_mask[:, -len(start) :].bool().all(dim=-1)
        matches = (tail == torch.tensor(start, device=input_ids.device)).all(dim=-1) & real
        ban[matches, last] = True
    return logits.masked_fill(ban, float("-inf"))
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# The settings of one generation, the processors, and the draw
# ---------------------------------------------------------------------------------------


@dataclass
class SamplerSettings:
    """Every setting of one ``generate`` call that shapes the choice of the next token, checked once.

    The processors (``process_logits``) run first, on the raw logits: ``logit_bias``, the
    repetition, presence and frequency penalties, DRY, ``bad_words_ids`` and
    ``min_new_tokens``. Then the chain (``warp_logits``), then the draw: one multinomial
    draw per row, or mirostat (``mirostat=2``). Temperature 0 is greedy decoding: no chain,
    no draw, the argmax of the processed logits.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    epsilon_cutoff: float = 0.0
    eta_cutoff: float = 0.0
    top_n_sigma: float = 0.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    samplers: str | Sequence[str] | None = None
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    logit_bias: dict[int, float] | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: Sequence[str] = DRY_SEQUENCE_BREAKERS
    bad_words_ids: list[list[int]] | None = None
    min_new_tokens: int = 0
    eos_token_id: int | None = None
    # Which tokens break a DRY repeat: filled in from the tokenizer (dry_breaker_ids) when DRY is on.
    dry_breakers: Tensor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_sampling_settings(self.temperature, self.top_k, self.top_p, self.min_p)
        check_chain_args(**self.chain())
        chain_order(self.samplers, **self.switches())
        if isinstance(self.mirostat, bool) or self.mirostat not in (0, 2):
            raise ValueError(f"mirostat must be 0 (off) or 2 (mirostat v2; version 1 is not implemented), got {self.mirostat!r}")
        for name in ("mirostat_tau", "mirostat_eta", "dry_multiplier"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if isinstance(self.repetition_penalty, bool) or not isinstance(self.repetition_penalty, (int, float)) or not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0 (1.0 is off), got {self.repetition_penalty!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise ValueError(f"{name} must be a number (0 is off), got {value!r}")
        if self.dry_multiplier:  # its other settings are checked by the penalty itself, on an empty row
            apply_dry_penalty(torch.zeros(1, 2), torch.zeros(1, 1, dtype=torch.long), self.dry_multiplier, self.dry_base,
                              self.dry_allowed_length, None, self.dry_penalty_last_n)
        if self.logit_bias is not None and not isinstance(self.logit_bias, dict):
            raise TypeError(f"logit_bias must be a dict {{token_id: bias}}, got {type(self.logit_bias).__name__}")
        if self.bad_words_ids is not None:
            check_bad_words(self.bad_words_ids, None)
        if isinstance(self.min_new_tokens, bool) or not isinstance(self.min_new_tokens, int) or self.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be an integer >= 0, got {self.min_new_tokens!r}")

    def chain(self) -> dict:
        """The settings ``warp_logits`` and ``sample`` take beyond temperature, top_k, top_p and min_p."""
        return dict(typical_p=self.typical_p, epsilon_cutoff=self.epsilon_cutoff, eta_cutoff=self.eta_cutoff,
                    top_n_sigma=self.top_n_sigma, xtc_probability=self.xtc_probability,
                    xtc_threshold=self.xtc_threshold, samplers=self.samplers)

    def switches(self) -> dict:
        """The settings that switch the chain's steps on, by name (what ``chain_order`` reads)."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                    typical_p=self.typical_p, epsilon_cutoff=self.epsilon_cutoff, eta_cutoff=self.eta_cutoff,
                    top_n_sigma=self.top_n_sigma, xtc_probability=self.xtc_probability)

    @property
    def is_sampling(self) -> bool:
        """Whether a setting of the chain or the draw is switched on (beam search takes none of them)."""
        switches = self.switches()
        steps_on = any(step_is_on(name, switches) for name in HF_ORDER if name != "temperature")
        return self.temperature not in (0, 1) or steps_on or self.mirostat != 0


def process_logits(
    logits: Float[Tensor, "batch d_vocab"],
    input_ids: Int[Tensor, "batch seq"],
    attention_mask: Int[Tensor, "batch seq"],
    n_new: int,
    settings: SamplerSettings,
) -> Float[Tensor, "batch d_vocab"]:
    """The processors that are switched on, in Hugging Face's order, before the chain.

    ``logit_bias``, then the repetition penalty, the presence and frequency penalties,
    DRY, the banned sequences, and, while fewer than ``min_new_tokens`` tokens are new,
    the end-of-text token removed. The last ``n_new`` columns of ``input_ids`` are the
    generated tokens, the ones before them the (left-padded) prompts: the repetition
    penalty and DRY count both, as Hugging Face and llama.cpp do; the presence and
    frequency penalties count the generated tokens only, as OpenAI and vLLM do.
    """
    if settings.logit_bias:
        logits = apply_logit_bias(logits, settings.logit_bias)
    if settings.repetition_penalty != 1.0:
        logits = apply_repetition_penalty(logits, input_ids, settings.repetition_penalty, attention_mask)
    if settings.presence_penalty != 0.0 or settings.frequency_penalty != 0.0:
        n_prompt = input_ids.shape[1] - n_new
        logits = apply_presence_and_frequency_penalty(
            logits, input_ids[:, n_prompt:], settings.presence_penalty, settings.frequency_penalty,
            attention_mask[:, n_prompt:],
        )
    if settings.dry_multiplier > 0:
        logits = apply_dry_penalty(logits, input_ids, settings.dry_multiplier, settings.dry_base,
                                   settings.dry_allowed_length, settings.dry_breakers, settings.dry_penalty_last_n,
                                   attention_mask)
    if settings.bad_words_ids:
        logits = ban_bad_words(logits, input_ids, settings.bad_words_ids, attention_mask)
    eos = settings.eos_token_id
    if n_new < settings.min_new_tokens and eos is not None and 0 <= eos < logits.shape[-1]:
        logits = logits.clone()
        logits[:, eos] = float("-inf")
    return logits


def choose_tokens(
    processed: Float[Tensor, "batch d_vocab"],
    settings: SamplerSettings,
    generator: torch.Generator | None,
    mu: Float[Tensor, "batch"] | None = None,
) -> tuple[Int[Tensor, "batch"], Float[Tensor, "batch d_vocab"], Float[Tensor, "batch"] | None]:
    """The next token of every row, the logits it was drawn from, and mirostat's new state.

    Temperature 0: the argmax of ``processed``. Otherwise the chain (``warp_logits``),
    then either ``mirostat_step`` (with ``mirostat=2``; ``mu`` is each row's state) or
    ``sample`` on the warped logits, which with nothing left to warp is one multinomial
    draw per row, the draw Hugging Face makes.
    """
    if settings.temperature == 0:
        return processed.argmax(dim=-1), processed, mu
    warped = warp_logits(processed, settings.temperature, settings.top_k, settings.top_p, settings.min_p,
                         generator=generator, **settings.chain())
    if settings.mirostat:
        tokens, mu, drawn_from = mirostat_step(warped, mu, settings.mirostat_tau, settings.mirostat_eta, generator)
        return tokens, drawn_from, mu
    return sample(warped, generator=generator), warped, mu


# ---------------------------------------------------------------------------------------
# Stopping criteria: Hugging Face's shape, one verdict per row
# ---------------------------------------------------------------------------------------


@runtime_checkable
class StoppingCriteria(Protocol):
    """Called after every step with all tokens so far (``(batch, seq)``, left padding
    included) and that step's processed logits; returns True for each row that should stop.

    A row that a criterion stops is finished for good: ``generate`` pads it from then on.
    """

    def __call__(self, input_ids: Int[Tensor, "batch seq"], scores: Float[Tensor, "batch d_vocab"]) -> Bool[Tensor, "batch"]: ...


class MaxLengthCriteria:
    """Stop every row once the sequences (padding included) have ``max_length`` tokens."""

    def __init__(self, max_length: int):
        if not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"max_length must be an integer >= 1, got {max_length!r}")
        self.max_length = max_length

    def __call__(self, input_ids: Int[Tensor, "batch seq"], scores: Float[Tensor, "batch d_vocab"]) -> Bool[Tensor, "batch"]:
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.max_length, device=input_ids.device)


class EosTokenCriteria:
    """Stop each row whose newest token is the end-of-text token."""

    def __init__(self, eos_token_id: int):
        if not isinstance(eos_token_id, int):
            raise TypeError(f"eos_token_id must be an int, got {type(eos_token_id).__name__}")
        self.eos_token_id = eos_token_id

    def __call__(self, input_ids: Int[Tensor, "batch seq"], scores: Float[Tensor, "batch d_vocab"]) -> Bool[Tensor, "batch"]:
        return input_ids[:, -1] == self.eos_token_id


class StopStringCriteria:
    """Stop a row when its text ends with one of ``stop_strings``, even one spread over several tokens.

    As with Hugging Face's criterion of the same name, the stop string must reach into the
    newest token: text that completed a stop string earlier is not looked at again, and
    the newest token may run past the stop string's end ("stop" matches tokens "st" +
    "opped"). The tokens that completed it stay in the output. The last few tokens are
    decoded together, so a stop string that ends in a character whose bytes are split over
    tokens matches too (Hugging Face's criterion compares each token's own text, and misses it).
    """

    def __init__(self, tokenizer, stop_strings: str | list[str]):
        if isinstance(stop_strings, str):
            stop_strings = [stop_strings]
        if not stop_strings or not all(isinstance(s, str) and s for s in stop_strings):
            raise ValueError(f"stop_strings must be a non-empty string or a list of them, got {stop_strings!r}")
        self.tokenizer = tokenizer
        self.stop_strings = list(stop_strings)
        # Every token decodes to at least one byte, so a stop string of n bytes ends within
        # the last n tokens; one more token keeps the character before it intact.
        self.tail_tokens = max(len(s.encode("utf-8")) for s in self.stop_strings) + 1

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def __call__(self, input_ids: Int[Tensor, "batch seq"], scores: Float[Tensor, "batch d_vocab"]) -> Bool[Tensor, "batch"]:
        return torch.tensor([self.row_stops(row) for row in input_ids.tolist()], device=input_ids.device)

    def row_stops(self, ids: list[int]) -> bool:
        """Whether a stop string ends inside the text that the last of ``ids`` added."""
        ### BEGIN SOLUTION
        # Hint: decode the last few tokens together (a stop string can span several), and compare with the text without the newest.
        tail = ids[-self.tail_tokens :]
        before, text = self.decode(tail[:-1]), self.decode(tail)
        # Where the newest token's text starts: past the text both share. (A character split
        # across tokens shows as "\ufffd" in `before` and as itself in `text`.)
        start = 0
        while start < min(len(before), len(text)) and before[start] == text[start]:
            start += 1
        # A stop string that ends at or after `start` reaches into the newest token.
        return any(s in text[max(0, start - len(s) + 1) :] for s in self.stop_strings)
        ### END SOLUTION


# ---------------------------------------------------------------------------------------
# Streaming: Hugging Face's streamer shape, put(token_ids) then end()
# ---------------------------------------------------------------------------------------


@runtime_checkable
class Streamer(Protocol):
    """Receives the prompt's token ids, then each new token as it is chosen, then ``end()``."""

    def put(self, token_ids: Int[Tensor, "..."]) -> None: ...

    def end(self) -> None: ...


class TextStreamer:
    """Print text as it is generated, a word at a time.

    The text after the last space or newline is held back, because the next token may
    still extend that word, and because a character whose bytes are split over several
    tokens decodes as "\ufffd" until its last byte arrives. ``end()`` prints the rest.
    What it prints, put together, is exactly the decode of every token it was given.
    ``skip_prompt`` leaves out the first ``put`` (``generate`` sends the prompt first).
    Other keyword arguments go to ``tokenizer.decode`` (e.g. ``skip_special_tokens=True``).
    """

    def __init__(self, tokenizer, skip_prompt: bool = False, file: TextIO | None = None, **decode_kwargs):
        self.tokenizer = tokenizer
        self.skip_prompt = skip_prompt
        self.file = file
        self.decode_kwargs = {"clean_up_tokenization_spaces": False, **decode_kwargs}
        self.token_ids: list[int] = []
        self.printed = 0  # characters of the decoded text already printed
        self.waiting_for_prompt = True

    def decode(self) -> str:
        return self.tokenizer.decode(self.token_ids, **self.decode_kwargs)

    def emit(self, text: str) -> None:
        """Write ``text`` out at once (a subclass may send it elsewhere)."""
        if text:
            print(text, end="", flush=True, file=self.file if self.file is not None else sys.stdout)

    def put(self, token_ids: Int[Tensor, "..."]) -> None:
        if isinstance(token_ids, Tensor):
            if token_ids.ndim > 1 and token_ids.shape[0] > 1:
                raise ValueError(f"TextStreamer streams one sequence (batch size 1), got shape {tuple(token_ids.shape)}")
            token_ids = token_ids.reshape(-1).tolist()
        is_prompt, self.waiting_for_prompt = self.waiting_for_prompt, False
        if is_prompt and self.skip_prompt:
            return
        ### BEGIN SOLUTION
        # Hint: decode everything so far; print only up to the last space or newline, and only what is new.
        self.token_ids.extend(int(t) for t in token_ids)
        text = self.decode()
        safe_end = max(text.rfind(" "), text.rfind("\n")) + 1
        if safe_end > self.printed:
            self.emit(text[self.printed : safe_end])
            self.printed = safe_end
        ### END SOLUTION

    def end(self) -> None:
        """Print whatever is held back and start afresh."""
        ### BEGIN SOLUTION
        self.emit(self.decode()[self.printed :])
        ### END SOLUTION
        self.token_ids, self.printed, self.waiting_for_prompt = [], 0, True


# ---------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------


@dataclass
class GenerateOutput:
    """What ``generate(..., return_dict_in_generate=True)`` returns.

    ``sequences``: the left-padded prompts and the new tokens, ``(batch, prompt + new)``.
    ``scores``: each chosen token's log-probability under the distribution it was drawn
    from (after the processors and the chain; at temperature 0, after the processors).
    ``logprobs``: its log-probability under the raw model (temperature 1, nothing filtered).
    Both are ``(batch, new)``; a row's steps after it finished hold NaN (its pad tokens
    were not chosen by anyone), so sum a row's values with ``torch.nansum``.
    ``top_tokens`` and ``top_logprobs`` (with ``logprobs=k``, vLLM's setting): at every
    step the raw model's k most likely tokens and their log-probabilities,
    ``(batch, new, k)``, best first (-1 and NaN after a row finished).
    ``sequences_scores`` (beam search only): each returned sequence's score, its summed
    log-probability divided by its new tokens ** ``length_penalty``.
    """

    sequences: Int[Tensor, "batch seq"]
    scores: Float[Tensor, "batch new"]
    logprobs: Float[Tensor, "batch new"]
    top_tokens: Int[Tensor, "batch new k"] | None = None
    top_logprobs: Float[Tensor, "batch new k"] | None = None
    sequences_scores: Float[Tensor, "batch"] | None = None


class Record:
    """What ``return_dict_in_generate`` collects, one step at a time."""

    def __init__(self, top: int | None = None):
        self.top = top
        self.scores: list[Tensor] = []
        self.logprobs: list[Tensor] = []
        self.top_tokens: list[Tensor] = []
        self.top_logprobs: list[Tensor] = []

    def step(self, logits: Tensor, drawn_from: Tensor, tokens: Tensor, finished: Tensor) -> None:
        """Record one step: the raw logits, the logits the tokens were drawn from, the tokens, the finished rows."""
        raw = logits.log_softmax(dim=-1)
        self.scores.append(chosen_logprobs(drawn_from, tokens).masked_fill(finished, float("nan")))
        self.logprobs.append(raw.gather(-1, tokens[:, None])[:, 0].masked_fill(finished, float("nan")))
        if self.top:
            values, ids = raw.topk(self.top, dim=-1)
            self.top_logprobs.append(values.masked_fill(finished[:, None], float("nan")))
            self.top_tokens.append(ids.masked_fill(finished[:, None], -1))

    def output(self, sequences: Tensor) -> GenerateOutput:
        empty = torch.empty(sequences.shape[0], 0, device=sequences.device)

        def stack(steps: list[Tensor], fallback: Tensor) -> Tensor:
            return torch.stack(steps, dim=1) if steps else fallback

        top_empty = torch.empty(sequences.shape[0], 0, self.top or 0, device=sequences.device)
        return GenerateOutput(
            sequences=sequences,
            scores=stack(self.scores, empty),
            logprobs=stack(self.logprobs, empty),
            top_tokens=stack(self.top_tokens, top_empty.long()) if self.top else None,
            top_logprobs=stack(self.top_logprobs, top_empty) if self.top else None,
        )


def left_pad(token_lists: list[list[int]], pad_token_id: int) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Stack prompts of different lengths into ``(input_ids, attention_mask)``, padding on the left.

    Left, so that every row's last real token sits in the last column: the logits of the
    next token are then ``logits[:, -1]`` for every row, and new tokens follow directly.
    """
    ### BEGIN SOLUTION
    # Hint: pad each row at its start up to the longest prompt; the mask is 0 at pads, 1 at tokens.
    width = max(len(ids) for ids in token_lists)
    input_ids = [[pad_token_id] * (width - len(ids)) + list(ids) for ids in token_lists]
    attention_mask = [[0] * (width - len(ids)) + [1] * len(ids) for ids in token_lists]
    return torch.tensor(input_ids), torch.tensor(attention_mask)
    ### END SOLUTION


def prefill(
    model: DemoTransformer,
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"],
    cache: KeyValueCache | None = None,
) -> tuple[Float[Tensor, "batch d_vocab"], KeyValueCache]:
    """Run every prompt at once, filling ``cache`` (a fresh ``KeyValueCache`` when None); the logits of each row's next token."""
    if cache is None:
        param = next(model.parameters(), None)
        cache = KeyValueCache.new_empty(
            model.cfg, input_ids.shape[0], input_ids.device, param.dtype if param is not None else torch.float32
        )
    logits, cache = model(input_ids, cache, attention_mask=attention_mask)
    return logits[:, -1], cache


def decode_step(
    model: DemoTransformer,
    input_ids: Int[Tensor, "batch seq"],
    attention_mask: Int[Tensor, "batch seq"],
    cache: KeyValueCache,
) -> tuple[Float[Tensor, "batch d_vocab"], KeyValueCache]:
    """Run only the newest token of every row on top of the cache."""
    logits, cache = model(input_ids, cache, attention_mask=attention_mask)
    return logits[:, -1], cache


def chosen_logprobs(logits: Float[Tensor, "batch d_vocab"], tokens: Int[Tensor, "batch"]) -> Float[Tensor, "batch"]:
    """log softmax(logits) at each row's chosen token."""
    return logits.log_softmax(dim=-1).gather(-1, tokens[:, None])[:, 0]


def stopped_rows(criteria: list, input_ids: Int[Tensor, "batch seq"], scores: Float[Tensor, "batch d_vocab"]) -> Bool[Tensor, "batch"]:
    """The rows that any of ``criteria`` stops after this step."""
    stop = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    for criterion in criteria:
        stop |= criterion(input_ids, scores).to(device=stop.device, dtype=torch.bool)
    return stop


@torch.inference_mode()
def generate(
    model: DemoTransformer,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    typical_p: float = 1.0,
    epsilon_cutoff: float = 0.0,
    eta_cutoff: float = 0.0,
    top_n_sigma: float = 0.0,
    xtc_probability: float = 0.0,
    xtc_threshold: float = 0.1,
    samplers: str | Sequence[str] | None = None,
    mirostat: int = 0,
    mirostat_tau: float = 5.0,
    mirostat_eta: float = 0.1,
    logit_bias: dict[int, float] | None = None,
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    dry_multiplier: float = 0.0,
    dry_base: float = 1.75,
    dry_allowed_length: int = 2,
    dry_penalty_last_n: int = -1,
    dry_sequence_breakers: Sequence[str] = DRY_SEQUENCE_BREAKERS,
    bad_words_ids: list[list[int]] | None = None,
    min_new_tokens: int = 0,
    num_return_sequences: int = 1,
    logprobs: int | None = None,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    eos_token_id: int | None = None,
    stopping_criteria: list | None = None,
    stop_strings: str | list[str] | None = None,
    streamer: Streamer | None = None,
    seed: int | None = None,
    return_dict_in_generate: bool = False,
    kv_cache=None,
    constraint=None,
) -> Int[Tensor, "batch seq"] | GenerateOutput:
    """Continue every prompt at once, each row stopping on its own.

    The prompts are left-padded into one batch with one KV cache: a prefill runs them all,
    then each step runs one new token per row. Each step runs the processors
    (``process_logits``: ``logit_bias``, the penalties, DRY, ``bad_words_ids``,
    ``min_new_tokens``) and then the draw (``choose_tokens``: the chain of ``warp_logits``
    and ``sample``, or mirostat) for the whole batch, once, finished rows included, so a
    seed gives the same tokens however the rows end. ``num_return_sequences`` continues
    every prompt that many times (rows grouped by prompt, as Hugging Face orders them).

    A row that emits ``eos_token_id`` (the tokenizer's by default; an id outside the
    vocabulary turns it off), or that a criterion of ``stopping_criteria`` or
    ``stop_strings`` stops, is finished: from the next step on it receives the pad token
    (the tokenizer's, else the EOS id) and never changes again. Those pads are masked out
    (attention mask 0) like the left padding. The loop ends when every row is finished or
    after ``max_new_tokens`` steps.

    ``num_beams > 1`` runs Hugging Face's beam search instead (``beam_generate``), ranked by
    ``length_penalty`` and stopped by ``early_stopping``; the chain and the draw do not
    apply there (leave them at their defaults), the processors do.

    Returns the sequences ``(batch, prompt + new)``, left padding included, or with
    ``return_dict_in_generate=True`` (or ``logprobs=k``) a ``GenerateOutput``.
    ``streamer`` (one sequence only) gets the prompt's ids, then every new token, then ``end()``.
    ``seed`` seeds a private ``torch.Generator``, which draws exactly what torch's global
    generator would after ``torch.manual_seed(seed)``. ``kv_cache`` is an empty cache to
    fill, one row per sequence (part 6's ``StaticKeyValueCache`` takes the fast path); None
    starts a ``KeyValueCache``.

    ``constraint`` (part 8's ``TokenConstraint``) keeps each row inside a language: every
    row starts at ``constraint.start``; each step, after the penalties and before the
    temperature and filters, ``constraint.mask_logits`` sets the tokens its state forbids
    to -inf, and ``constraint.advance`` moves each row's state along the token it got. A
    row whose state reads the end-of-text token (``constraint.finished``) is finished, even
    when ``eos_token_id`` is switched off; a row finished otherwise is done for the
    constraint too (its state becomes ``constraint.DONE``).
    """
    check_generate_args(prompts, max_new_tokens, streamer, stopping_criteria)
    check_counts(num_return_sequences, logprobs, num_beams, length_penalty, early_stopping)
    if kv_cache is not None and kv_cache.seq_len != 0:
        raise ValueError(f"kv_cache must be empty (seq_len 0): generate fills it from the prompts, got seq_len={kv_cache.seq_len}")
    cfg = model.cfg
    device = next(model.parameters(), torch.empty(0)).device
    if eos_token_id is None:
        eos_token_id = tokenizer.eos_token_id
    pad_token_id = choose_pad_token_id(tokenizer, eos_token_id, cfg.d_vocab)
    settings = SamplerSettings(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
        epsilon_cutoff=epsilon_cutoff, eta_cutoff=eta_cutoff, top_n_sigma=top_n_sigma,
        xtc_probability=xtc_probability, xtc_threshold=xtc_threshold, samplers=samplers, mirostat=mirostat,
        mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, logit_bias=logit_bias,
        repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty, dry_multiplier=dry_multiplier, dry_base=dry_base,
        dry_allowed_length=dry_allowed_length, dry_penalty_last_n=dry_penalty_last_n,
        dry_sequence_breakers=tuple(dry_sequence_breakers), bad_words_ids=bad_words_ids,
        min_new_tokens=min_new_tokens,
        eos_token_id=eos_token_id if eos_token_id is not None and 0 <= eos_token_id < cfg.d_vocab else None,
    )
    if settings.dry_multiplier > 0:
        settings.dry_breakers = dry_breaker_ids(tokenizer, settings.dry_sequence_breakers, cfg.d_vocab).to(device)
    if bad_words_ids:
        check_bad_words(bad_words_ids, cfg.d_vocab)

    prompt_ids = [list(tokenizer.encode(prompt)) for prompt in prompts]
    if not all(prompt_ids):
        raise ValueError("every prompt must encode to at least one token; got an empty prompt")
    if num_beams == 1:
        # Every prompt num_return_sequences times, its copies next to each other.
        prompt_ids = [ids for ids in prompt_ids for _ in range(num_return_sequences)]
    input_ids, attention_mask = left_pad(prompt_ids, pad_token_id)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    if input_ids.shape[1] + max_new_tokens > cfg.n_ctx:
        raise ValueError(
            f"the longest prompt ({input_ids.shape[1]} tokens) plus max_new_tokens={max_new_tokens} is more than "
            f"the model's n_ctx={cfg.n_ctx}; shorten the prompt or ask for fewer new tokens"
        )
    if num_beams > 1:
        if settings.is_sampling:
            raise ValueError(
                "num_beams > 1 is beam search: it ranks beams by their log-probabilities and draws nothing, so "
                "temperature, the filters and mirostat do not apply; leave them at their defaults (or use num_beams=1)"
            )
        if stopping_criteria or stop_strings or streamer is not None or kv_cache is not None or constraint is not None:
            raise ValueError("beam search here takes no stopping_criteria, stop_strings, streamer, kv_cache or constraint")
        return beam_generate(model, input_ids, attention_mask, max_new_tokens, settings, num_beams,
                             num_return_sequences, length_penalty, early_stopping, pad_token_id,
                             return_dict_in_generate or logprobs is not None)
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError(f"streaming prints one text: ask for one sequence with a streamer, got {input_ids.shape[0]}")
    criteria = list(stopping_criteria or [])
    if settings.eos_token_id is not None:
        criteria.append(EosTokenCriteria(eos_token_id))
    if stop_strings:
        criteria.append(StopStringCriteria(tokenizer, stop_strings))
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    if streamer is not None:
        streamer.put(input_ids[0].cpu())
    check_constraint(constraint)
    states = constraint.start(input_ids.shape[0], device) if constraint is not None else None

    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=device)
    record = Record(logprobs) if return_dict_in_generate or logprobs is not None else None
    # Mirostat's state: each row starts at twice the target surprise, as llama.cpp does.
    mu = torch.full((input_ids.shape[0],), 2.0 * mirostat_tau, device=device) if mirostat else None
    cache = None
    ### BEGIN SOLUTION
    # Hint: the first step is the prefill (every prompt at once); every later one runs only the newest tokens.
    # Hint: (part 8) with a constraint, mask the processed logits before choose_tokens, then advance every row's state along its token.
    for step in range(max_new_tokens):
        if cache is None:
            logits, cache = prefill(model, input_ids, attention_mask, kv_cache)
        else:
            logits, cache = decode_step(model, input_ids, attention_mask, cache)
        processed = process_logits(logits, input_ids, attention_mask, step, settings)
        if constraint is not None:
            # Before the temperature and the filters, so that they choose among allowed tokens only.
            processed = constraint.mask_logits(processed, states)
        next_tokens, drawn_from, mu = choose_tokens(processed, settings, generator, mu)
        # A finished row gets a pad, masked out like the left padding: it never changes again.
        next_tokens = next_tokens.masked_fill(finished, pad_token_id)
        if constraint is not None:
            states = constraint.advance(states, next_tokens)
        input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=1)
        attention_mask = torch.cat([attention_mask, (~finished).long()[:, None]], dim=1)
        if record is not None:
            record.step(logits, drawn_from, next_tokens, finished)
        if streamer is not None:
            streamer.put(next_tokens.cpu())
        # Each criterion stops only the rows it names; the batch ends when every row is done.
        finished |= stopped_rows(criteria, input_ids, processed)
        if constraint is not None:
            finished |= constraint.finished(states)
            states = states.masked_fill(finished, constraint.DONE)
        if finished.all():
            break
    ### END SOLUTION
    if streamer is not None:
        streamer.end()
    return input_ids if record is None else record.output(input_ids)


# ---------------------------------------------------------------------------------------
# Beam search in the engine: Hugging Face's algorithm over a padded batch
# ---------------------------------------------------------------------------------------


def beam_generate(
    model: DemoTransformer,
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"],
    max_new_tokens: int,
    settings: SamplerSettings,
    num_beams: int,
    num_return_sequences: int,
    length_penalty: float,
    early_stopping: bool | str,
    pad_token_id: int,
    return_dict: bool,
) -> Int[Tensor, "rows seq"] | GenerateOutput:
    """Hugging Face's beam search for every prompt of a left-padded batch at once.

    Each prompt runs ``num_beams`` beams (rows of one batch and one KV cache). Every step
    scores each beam's next tokens with log-probabilities after the processors (the
    penalties, banned words, ``min_new_tokens``; no chain), adds them to the beam's sum and
    takes the ``2 * num_beams`` best candidates of each prompt. Candidates ending in EOS
    among its ``num_beams`` best are finished: part 3's ``BeamHypotheses`` keeps the best
    ``num_beams`` of them by length-normalised score and says when the search may stop
    (``early_stopping``). The best ``num_beams`` candidates that did not end run on (the
    beams are refilled). At ``max_new_tokens`` the best ``num_beams`` candidates all
    finish. Returns every prompt's ``num_return_sequences`` best sequences (rows grouped
    by prompt, best first), padded at the end with the pad token.
    """
    batch, width = input_ids.shape
    device = input_ids.device
    eos = settings.eos_token_id
    rows = input_ids.repeat_interleave(num_beams, dim=0)
    mask = attention_mask.repeat_interleave(num_beams, dim=0)
    # At the first step every beam of a prompt is the prompt: only the first may propose, or
    # the best candidate would come num_beams times.
    sums = torch.zeros(batch, num_beams, device=device)
    sums[:, 1:] = -1e9
    # Each beam's tokens so far, and the processed and raw log-probability of each.
    history = torch.empty(batch * num_beams, 0, dtype=torch.long, device=device)
    scores = torch.empty(batch * num_beams, 0, device=device)
    raw_scores = torch.empty(batch * num_beams, 0, device=device)
    finished = [BeamHypotheses(num_beams, length_penalty, early_stopping, max_new_tokens) for _ in range(batch)]
    done = [max_new_tokens == 0] * batch
    cache = None
    for step in range(max_new_tokens):
        length = step + 1
        if cache is None:
            logits, cache = prefill(model, rows, mask)
        else:
            logits, cache = decode_step(model, rows, mask, cache)
        raw = logits.log_softmax(dim=-1)
        processed = process_logits(raw, rows, mask, step, settings)
        d_vocab = processed.shape[-1]
        totals = (sums.reshape(-1, 1) + processed).reshape(batch, num_beams * d_vocab)
        top_sums, top_index = totals.topk(2 * num_beams, dim=-1)
        parents = top_index // d_vocab + torch.arange(batch, device=device)[:, None] * num_beams
        tokens = top_index % d_vocab
        ended = tokens == eos if eos is not None else torch.zeros_like(tokens, dtype=torch.bool)
        if length == max_new_tokens:
            ended[:] = True  # at the last step every candidate ends
        keep_rows, keep_tokens, keep_sums = [], [], []
        for b in range(batch):
            live = []
            for rank in range(2 * num_beams):
                parent, token = int(parents[b, rank]), int(tokens[b, rank])
                if bool(ended[b, rank]):
                    if rank < num_beams and not done[b]:
                        new = (
                            torch.cat([history[parent], tokens.new_tensor([token])]),
                            torch.cat([scores[parent], processed[parent, token : token + 1]]),
                            torch.cat([raw_scores[parent], raw[parent, token : token + 1]]),
                        )
                        finished[b].add(float(top_sums[b, rank]), length, new)
                elif len(live) < num_beams:
                    live.append(rank)
            if len(live) < num_beams:  # only at the last step, when nothing runs on
                live += [r for r in range(2 * num_beams) if r not in live][: num_beams - len(live)]
            keep_rows.append(parents[b, live])
            keep_tokens.append(tokens[b, live])
            keep_sums.append(top_sums[b, live])
        chosen, new_tokens = torch.cat(keep_rows), torch.cat(keep_tokens)
        sums = torch.stack(keep_sums)
        history = torch.cat([history[chosen], new_tokens[:, None]], dim=1)
        scores = torch.cat([scores[chosen], processed[chosen, new_tokens][:, None]], dim=1)
        raw_scores = torch.cat([raw_scores[chosen], raw[chosen, new_tokens][:, None]], dim=1)
        rows = torch.cat([rows[chosen], new_tokens[:, None]], dim=1)
        mask = torch.cat([mask[chosen], torch.ones_like(mask[:, :1])], dim=1)
        cache = cache[:, :, chosen]
        for b in range(batch):
            done[b] = done[b] or finished[b].is_done(float(sums[b, 0]), length)
        if all(done):
            break

    best = [h for b in range(batch) for h in finished[b].hypotheses[:num_return_sequences]]
    longest = max((len(tokens) for _, _, (tokens, _, _) in best), default=0)
    out = torch.full((len(best), width + longest), pad_token_id, dtype=torch.long, device=device)
    token_scores = torch.full((len(best), longest), float("nan"), device=device)
    token_logprobs = torch.full((len(best), longest), float("nan"), device=device)
    for i, (_, _, (tokens, processed_lp, raw_lp)) in enumerate(best):
        out[i, :width] = input_ids[i // num_return_sequences]
        out[i, width : width + len(tokens)] = tokens
        token_scores[i, : len(tokens)] = processed_lp
        token_logprobs[i, : len(tokens)] = raw_lp
    if not return_dict:
        return out
    return GenerateOutput(out, token_scores, token_logprobs,
                          sequences_scores=torch.tensor([score for score, _, _ in best], device=device))


# ---------------------------------------------------------------------------------------
# Checks that fail loudly, saying what is allowed
# ---------------------------------------------------------------------------------------


def check_logits(logits: Tensor) -> None:
    if not isinstance(logits, Tensor) or logits.ndim != 2 or not logits.is_floating_point():
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a float tensor of shape (batch, d_vocab), got {shape}")


def check_chain_args(
    typical_p: float = 1.0,
    epsilon_cutoff: float = 0.0,
    eta_cutoff: float = 0.0,
    top_n_sigma: float = 0.0,
    xtc_probability: float = 0.0,
    xtc_threshold: float = 0.1,
    samplers=None,
) -> None:
    """Each setting of the chain beyond the classic four in its range, or a ValueError saying what is allowed."""

    def number(value) -> bool:
        return not isinstance(value, bool) and isinstance(value, (int, float))

    if not number(typical_p) or not 0.0 < typical_p <= 1.0:
        raise ValueError(f"typical_p must be in (0, 1] (1.0 turns it off), got {typical_p!r}")
    for name, value in (("epsilon_cutoff", epsilon_cutoff), ("eta_cutoff", eta_cutoff)):
        if not number(value) or not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be in [0, 1) (0 turns it off), got {value!r}")
    if not number(top_n_sigma) or not top_n_sigma >= 0:
        raise ValueError(f"top_n_sigma must be a number >= 0 (0 turns it off), got {top_n_sigma!r}")
    if not number(xtc_probability) or not 0.0 <= xtc_probability <= 1.0:
        raise ValueError(f"xtc_probability must be in [0, 1] (0 turns it off), got {xtc_probability!r}")
    if not number(xtc_threshold) or not 0.0 < xtc_threshold <= 1.0:
        raise ValueError(f"xtc_threshold must be in (0, 1], got {xtc_threshold!r}")


def check_chain_names(chain: dict) -> None:
    """``sample``'s extra keyword arguments: only the chain's settings, each in its range."""
    unknown = sorted(set(chain) - set(CHAIN_DEFAULTS))
    if unknown:
        raise TypeError(f"unexpected setting(s) {', '.join(unknown)}; the chain's settings are {', '.join(CHAIN_DEFAULTS)}")
    check_chain_args(**chain)


def check_bad_words(bad_words_ids, d_vocab: int | None) -> None:
    if not isinstance(bad_words_ids, (list, tuple)) or not all(
        isinstance(seq, (list, tuple)) and seq and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in seq)
        for seq in bad_words_ids
    ):
        raise ValueError(f"bad_words_ids must be a list of non-empty lists of token ids, got {bad_words_ids!r:.80}")
    if d_vocab is not None and any(t >= d_vocab for seq in bad_words_ids for t in seq):
        raise ValueError(f"bad_words_ids holds a token id outside the vocabulary [0, {d_vocab})")


def check_counts(num_return_sequences, logprobs, num_beams, length_penalty, early_stopping) -> None:
    if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams must be an integer >= 1 (1 samples instead of beam search), got {num_beams!r}")
    limit = num_beams if num_beams > 1 else None
    if isinstance(num_return_sequences, bool) or not isinstance(num_return_sequences, int) or num_return_sequences < 1 or (
        limit is not None and num_return_sequences > limit
    ):
        allowed = f"between 1 and num_beams={num_beams}" if limit else "an integer >= 1"
        raise ValueError(f"num_return_sequences must be {allowed}, got {num_return_sequences!r}")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 1):
        raise ValueError(f"logprobs (how many top log-probabilities to return per step) must be None or an integer >= 1, got {logprobs!r}")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) or math.isnan(length_penalty):
        raise ValueError(f"length_penalty must be a number, got {length_penalty!r}")
    if early_stopping not in (True, False, "never") or not isinstance(early_stopping, (bool, str)):
        raise ValueError(f"early_stopping must be True, False or \"never\", got {early_stopping!r}")


def check_generate_args(prompts, max_new_tokens, streamer, stopping_criteria) -> None:
    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError(f"prompts must be a non-empty list of strings (one per row), got {type(prompts).__name__}")
    if not all(isinstance(p, str) and p for p in prompts):
        raise ValueError("every prompt must be a non-empty string")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if streamer is not None and len(prompts) != 1:
        raise ValueError(f"streaming prints one text: pass one prompt with a streamer, got {len(prompts)}")
    for criterion in stopping_criteria or []:
        if not callable(criterion):
            raise TypeError(
                f"each stopping criterion must be callable as criterion(input_ids, scores), got {type(criterion).__name__}"
            )


def check_constraint(constraint) -> None:
    if constraint is None:
        return
    missing = [name for name in ("start", "mask_logits", "advance", "finished", "DONE") if not hasattr(constraint, name)]
    if missing:
        raise TypeError(
            f"constraint must be a TokenConstraint (part 8: regex_constraint or json_schema_constraint), "
            f"got {type(constraint).__name__}, which lacks {', '.join(missing)}"
        )


def choose_pad_token_id(tokenizer, eos_token_id: int | None, d_vocab: int) -> int:
    """The tokenizer's pad token, else the EOS token (GPT-2 has no pad), else 0.

    Pads are never attended, so any id in the vocabulary works; it only has to be one.
    """
    for candidate in (getattr(tokenizer, "pad_token_id", None), eos_token_id):
        if isinstance(candidate, int) and 0 <= candidate < d_vocab:
            return candidate
    return 0
