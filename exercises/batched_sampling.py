# GENERATED from solutions/batched_sampling.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: 75d707d4c4f88c6dcdfc9b1ffd001c333a1b36f8dfa6467c552336ad84b617e1
"""Part 5: sampling a whole batch at once: the chain of filters, then one draw per row.

``warp_logits`` applies the temperature and the filters that are switched on, in Hugging
Face's order (temperature, top-k, top-p, min-p, then part 5b's typical, epsilon, eta,
top-n-sigma and XTC) unless ``samplers`` gives another, as llama.cpp's ``--samplers``
does. ``sample`` draws one token per row from what is left: the argmax at temperature 0,
otherwise one ``torch.multinomial`` draw per row, the draw Hugging Face makes. (Part 2's
``sample`` takes one position's logits and returns an int; this one takes a batch, and is
checked as ``check("batched_sample")``.)

Both take their settings as one ``SamplerSettings`` (``sampling_course.sampling_settings``,
checked once when it is made) or as keywords: ``sample(logits, temperature=0.7, top_p=0.9)``.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sampling_course.devices import check_generator
from sampling_course.sampling_settings import SamplerSettings

from .filters import check_logits, min_p_filter, top_k_filter, top_p_filter
from .modern_filters import epsilon_filter, eta_filter, mirostat_step, top_n_sigma_filter, typical_filter, xtc_filter


def warp_logits(
    logits: Float[Tensor, "batch d_vocab"],
    settings: SamplerSettings | None = None,
    generator: torch.Generator | None = None,
    **changes,
) -> Float[Tensor, "batch d_vocab"]:
    """The logits ``sample`` draws from: the temperature and the filters that are switched on, in order.

    ``settings.steps()`` lists the steps to run, in Hugging Face's order or ``samplers``'
    (e.g. ``LLAMA_CPP_ORDER`` applies the temperature last); a step whose setting is at its
    default ("off") is not in it. The temperature must be > 0 here (``sample`` handles 0
    as argmax). XTC draws from ``generator``. ``changes`` are settings given as keywords.
    """
    check_logits(logits)
    settings = SamplerSettings.of(settings, **changes)
    if settings.temperature == 0:
        raise ValueError("warp_logits needs temperature > 0; temperature 0 is greedy decoding (see sample)")
    order = settings.steps()
    keep = settings.min_tokens_to_keep
    # Hint: one step per name of `order`; each step gets the output of the one before.
    raise NotImplementedError()


def sample(
    logits: Float[Tensor, "batch d_vocab"],
    settings: SamplerSettings | None = None,
    generator: torch.Generator | None = None,
    **changes,
) -> Int[Tensor, "batch"]:
    """One token per row: argmax at temperature 0, otherwise a draw from ``warp_logits``.

    At temperature 0 no filter runs. Otherwise each row is drawn independently from
    softmax of its warped logits, with randomness from ``generator`` (torch's global
    generator when None), so the same seeded generator gives the same tokens. The settings
    come as a ``SamplerSettings`` or as keywords (``sample(logits, temperature=0.7)``).
    """
    check_logits(logits)
    settings = SamplerSettings.of(settings, **changes)
    check_generator(generator, logits.device)  # a generator draws on its own device only
    raise NotImplementedError()


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
    warped = warp_logits(processed, settings, generator)
    if settings.mirostat:
        tokens, mu, drawn_from = mirostat_step(warped, mu, settings.mirostat_tau, settings.mirostat_eta, generator)
        return tokens, drawn_from, mu
    return sample(warped, generator=generator), warped, mu
