"""The sampler settings of parts 5 and 7 and the ``generate`` command: each declared once, with its default and its check.

``SamplerSettings`` holds every setting that shapes the choice of the next token. Each field
says its default and what is allowed; the object checks all of them once, when it is made,
and is what part 5's ``generate``, ``warp_logits`` and ``sample``, the command's flags and
its REPL pass around. A filter called on its own checks its argument with the same rule
(``check_setting``), so a value is refused, or accepted, everywhere alike.

The settings mean what they mean in Hugging Face's ``generate``:

* ``temperature``: a finite number >= 0; 0 is greedy decoding (the argmax), 1 leaves the logits as
  they are (an infinite one would divide every logit to 0: not a temperature but a uniform draw);
* ``top_k``: an integer >= 0; 0 turns the filter off, and more than the vocabulary keeps every token;
* ``top_p``: a number in (0, 1]; 1.0 turns the filter off;
* ``min_p``: a number in [0, 1]; 0.0 turns the filter off;
* ``min_tokens_to_keep``: the fewest tokens top-p, min-p, typical, epsilon and eta leave in a row.

Part 2's classic sampler keeps the classic contract instead: there ``top_p=0.0`` (its
default) turns nucleus sampling off. So ``top_p=0.0`` is refused here rather than given a
meaning of its own: whoever passes it meaning "off" learns that off is 1.0 in this engine.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = [
    "DRY_SEQUENCE_BREAKERS", "HF_ORDER", "LLAMA_CPP_ORDER", "SamplerSettings", "check_sampling_settings",
    "check_setting", "check_bad_words", "describe",
]


def is_number(value: object) -> bool:
    """A real number that is not a bool (True is an int to Python, but no temperature)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def interval(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Callable[[Any], bool]:
    """A check: a number between ``low`` and ``high``, each end open or closed (NaN is never inside)."""

    def inside(value) -> bool:
        return is_number(value) and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)

    return inside


def at_least(low: float, open_: bool = False, integer: bool = False) -> Callable[[Any], bool]:
    def inside(value) -> bool:
        return (is_integer(value) if integer else is_number(value)) and (value > low if open_ else value >= low)

    return inside


def any_number(value) -> bool:
    return is_number(value) and not math.isnan(value)


def setting(default: Any, allowed: str, check: Callable[[Any], bool], error: type[Exception] = ValueError,
            about: str = ""):
    """A field of ``SamplerSettings``: its default, the sentence saying what is allowed, the check, and what
    it does in a few words (the command's ``--help`` shows it)."""
    return field(default=default, metadata={"allowed": allowed, "check": check, "error": error, "about": about})


def check_bad_words(bad_words_ids, d_vocab: int | None = None) -> None:
    """``bad_words_ids``: a list of non-empty lists of token ids (inside the vocabulary when ``d_vocab`` is known)."""
    if not isinstance(bad_words_ids, (list, tuple)) or not all(
        isinstance(seq, (list, tuple)) and seq and all(is_integer(t) and t >= 0 for t in seq) for seq in bad_words_ids
    ):
        raise ValueError(f"bad_words_ids must be a list of non-empty lists of token ids, got {bad_words_ids!r:.80}")
    if d_vocab is not None and any(t >= d_vocab for seq in bad_words_ids for t in seq):
        raise ValueError(f"bad_words_ids holds a token id outside the vocabulary [0, {d_vocab})")


def bad_words_ok(value) -> bool:
    if value is None:
        return True
    try:
        check_bad_words(value)
    except ValueError:
        return False
    return True


def logit_bias_ok(value) -> bool:
    return value is None or (
        isinstance(value, dict) and all(is_integer(k) and k >= 0 and any_number(v) for k, v in value.items())
    )


def breakers_ok(value) -> bool:
    return not isinstance(value, str) and isinstance(value, (list, tuple)) and all(isinstance(b, str) and b for b in value)


# The steps of the chain, by the name of their setting. Hugging Face's order comes first:
# temperature, top-k, top-p, min-p, typical, epsilon, eta; it has no top-n-sigma or XTC,
# which come last here. llama.cpp's default order puts the temperature last (its penalties
# and DRY run first; here they always run before the chain, as processors).
HF_ORDER = ("temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_n_sigma", "xtc")
LLAMA_CPP_ORDER = ("top_n_sigma", "top_k", "typical_p", "top_p", "min_p", "xtc", "temperature")
# llama.cpp's and other short names for the same steps.
STEP_ALIASES = {"temp": "temperature", "typ_p": "typical_p", "typical": "typical_p", "epsilon": "epsilon_cutoff",
                "eta": "eta_cutoff", "xtc_probability": "xtc"}
# llama.cpp lists these in --samplers too; here they always run before the chain.
PROCESSOR_STEPS = ("penalties", "dry", "logit_bias")
# llama.cpp's default sequence breakers: a repeat never reaches back across one of these.
DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")


def samplers_ok(value) -> bool:
    return value is None or isinstance(value, str) or (
        isinstance(value, (list, tuple)) and all(isinstance(name, str) for name in value)
    )


@dataclass(frozen=True)
class SamplerSettings:
    """Every setting of one generation that shapes the choice of the next token, each checked once, here.

    The processors run first, on the raw logits: ``logit_bias``, the repetition, presence
    and frequency penalties, DRY, ``bad_words_ids`` and ``min_new_tokens``. Then the chain
    (``warp_logits``: the temperature and the filters, in ``samplers``' order or Hugging
    Face's), then the draw: one multinomial draw per row, or mirostat (``mirostat=2``).
    Temperature 0 is greedy decoding: no chain, no draw, the argmax of the processed logits.
    Each default switches its step off. ``SamplerSettings.of(settings, **changes)`` is how a
    function takes either an object or keywords.
    """

    temperature: float = setting(1.0, "a finite number >= 0 (0 means greedy)", interval(0, math.inf, high_open=True),
        about='0 is greedy')
    top_k: int = setting(0, "an integer >= 0 (0 turns it off)", at_least(0, integer=True),
        about='keep the k most likely tokens (0 is off)')
    top_p: float = setting(1.0, "in (0, 1] (1.0 turns it off)", interval(0, 1, low_open=True),
        about='nucleus: smallest set with this mass, in (0, 1] (1 is off)')
    min_p: float = setting(0.0, "in [0, 1] (0.0 turns it off)", interval(0, 1),
        about='drop tokens below min_p x the top probability (0 is off)')
    typical_p: float = setting(1.0, "in (0, 1] (1.0 turns it off)", interval(0, 1, low_open=True),
        about='typical sampling: the most typical tokens with this mass (1 is off)')
    epsilon_cutoff: float = setting(0.0, "in [0, 1) (0 turns it off)", interval(0, 1, high_open=True),
        about='drop tokens below this probability (0 is off)')
    eta_cutoff: float = setting(0.0, "in [0, 1) (0 turns it off)", interval(0, 1, high_open=True),
        about='eta sampling: a bar that falls with the entropy (0 is off)')
    top_n_sigma: float = setting(0.0, "a number >= 0 (0 turns it off)", at_least(0),
        about='keep logits within n standard deviations of the top (0 is off)')
    xtc_probability: float = setting(0.0, "in [0, 1] (0 turns it off)", interval(0, 1),
        about='XTC: how often to remove the top choices (0 is off)')
    xtc_threshold: float = setting(0.1, "in (0, 1]", interval(0, 1, low_open=True),
        about='XTC: tokens at or above this probability are top choices')
    min_tokens_to_keep: int = setting(1, "an integer >= 1", at_least(1, integer=True),
        about='top-p, min-p, typical, epsilon and eta keep at least this many tokens')
    samplers: str | Sequence[str] | None = setting(
        None, "None, a list of step names or a ';'-separated string", samplers_ok, TypeError,
        about="the chain's order, e.g. top_k;top_p;min_p;temperature (none: Hugging Face's)")
    mirostat: int = setting(0, "0 (off) or 2 (mirostat v2; version 1 is not implemented)",
                            lambda v: is_integer(v) and v in (0, 2),
        about='2: mirostat v2 steers the surprise towards mirostat_tau (0 is off)')
    mirostat_tau: float = setting(5.0, "a number >= 0", at_least(0),
        about="mirostat's target surprise, in bits")
    mirostat_eta: float = setting(0.1, "a number >= 0", at_least(0),
        about="mirostat's learning rate")
    logit_bias: dict[int, float] | None = setting(
        None, "None or a dict {token_id: bias} of numbers", logit_bias_ok, TypeError,
        about="add BIAS to TOKEN's logit: TOKEN:BIAS pairs (repeatable flag)")
    repetition_penalty: float = setting(1.0, "> 0 (1.0 is off)", at_least(0, open_=True),
        about='above 1 discourages repeats (1 is off)')
    presence_penalty: float = setting(0.0, "a number (0 is off)", any_number,
        about='subtracted once from every token generated so far (0 is off)')
    frequency_penalty: float = setting(0.0, "a number (0 is off)", any_number,
        about='subtracted per occurrence in the generated text (0 is off)')
    dry_multiplier: float = setting(0.0, "a number >= 0 (0 turns DRY off)", at_least(0),
        about='DRY: penalise tokens that extend a repeat (0 is off)')
    dry_base: float = setting(1.75, "a number >= 1", at_least(1),
        about='DRY: the penalty grows as base ** (repeat - allowed length)')
    dry_allowed_length: int = setting(2, "an integer >= 1", at_least(1, integer=True),
        about='DRY: repeats this long go unpunished')
    dry_penalty_last_n: int = setting(-1, "-1 (every token), 0 (off) or a positive integer", at_least(-1, integer=True),
        about='DRY: look at the last n tokens (-1: all)')
    dry_sequence_breakers: Sequence[str] = setting(
        DRY_SEQUENCE_BREAKERS, "a list of non-empty strings", breakers_ok,
        about='DRY: a repeat never reaches back across these texts')
    bad_words_ids: list[list[int]] | None = setting(
        None, "None or a list of non-empty lists of token ids", bad_words_ok,
        about='token sequences never to complete')
    min_new_tokens: int = setting(0, "an integer >= 0", at_least(0, integer=True),
        about='no end-of-text token before this many new tokens')

    def __post_init__(self) -> None:
        for spec in fields(self):
            check_setting(spec.name, getattr(self, spec.name))
        # Frozen: the normal forms are set once, here.
        object.__setattr__(self, "dry_sequence_breakers", tuple(self.dry_sequence_breakers))
        object.__setattr__(self, "samplers", None if self.samplers is None else tuple(self.parse_samplers(self.samplers)))
        self.steps()  # every step that is switched on must be in samplers

    @classmethod
    def of(cls, settings: SamplerSettings | None = None, **changes) -> SamplerSettings:
        """``settings`` (the defaults when None) with ``changes``; an unknown name is a TypeError listing the settings."""
        if settings is not None and not isinstance(settings, cls):
            raise TypeError(f"settings must be a SamplerSettings (or pass the settings as keywords), got {type(settings).__name__}")
        unknown = sorted(set(changes) - set(cls.names()))
        if unknown:
            raise TypeError(f"unexpected setting(s) {', '.join(unknown)}; the sampler's settings are {', '.join(cls.names())}")
        if settings is None:
            return cls(**changes)
        return dataclasses.replace(settings, **changes) if changes else settings

    @classmethod
    def names(cls) -> list[str]:
        return [spec.name for spec in fields(cls)]

    @staticmethod
    def parse_samplers(samplers: str | Sequence[str]) -> list[str]:
        """The chain's step names in ``samplers`` (llama.cpp's ``--samplers``: names separated by ";"), checked."""
        if isinstance(samplers, str):
            samplers = [part for part in samplers.replace(",", ";").split(";") if part.strip()]
        names: list[str] = []
        for raw in samplers:
            name = STEP_ALIASES.get(raw.strip(), raw.strip())
            if name in PROCESSOR_STEPS:
                continue  # they always run first here
            if name not in HF_ORDER:
                raise ValueError(f"unknown sampler {raw!r} in samplers; the steps are {', '.join(HF_ORDER)}")
            if name in names:
                raise ValueError(f"sampler {name!r} appears twice in samplers")
            names.append(name)
        return names

    def step_is_on(self, name: str) -> bool:
        """Whether the chain step ``name`` changes anything with these settings (its default does not)."""
        key = "xtc_probability" if name == "xtc" else name
        return getattr(self, key) != DEFAULTS[key]

    def steps(self) -> list[str]:
        """The steps ``warp_logits`` runs, in order: those of ``samplers`` (Hugging Face's order when None) that are on.

        A step that is switched on must be in ``samplers``, or a ValueError says to add it or switch it off.
        """
        names = list(HF_ORDER if self.samplers is None else self.samplers)
        missing = [n for n in HF_ORDER if n not in names and self.step_is_on(n)]
        if missing:
            one = len(missing) == 1
            raise ValueError(
                f"{', '.join(missing)} {'is' if one else 'are'} switched on but not in samplers ({';'.join(names)}): "
                f"add {'it' if one else 'them'} to the order, or switch {'it' if one else 'them'} off"
            )
        return [name for name in names if self.step_is_on(name)]

    @property
    def is_sampling(self) -> bool:
        """Whether a setting of the chain or the draw is switched on (beam search takes none of them)."""
        steps_on = any(self.step_is_on(name) for name in HF_ORDER if name != "temperature")
        return self.temperature not in (0, 1) or steps_on or self.mirostat != 0


DEFAULTS = {spec.name: spec.default for spec in fields(SamplerSettings)}
SPECS = {spec.name: spec for spec in fields(SamplerSettings)}


def describe(name: str) -> tuple[Any, str, str]:
    """A setting's default, what it allows and what it does, as ``SamplerSettings`` declares them."""
    spec = SPECS[name]
    return spec.default, spec.metadata["allowed"], spec.metadata["about"]


def check_setting(name: str, value: Any) -> None:
    """Raise a ValueError (TypeError for a wrong kind of object) saying what ``name`` allows, unless ``value`` is allowed."""
    spec = SPECS[name]
    if not spec.metadata["check"](value):
        raise spec.metadata["error"](f"{name} must be {spec.metadata['allowed']}, got {value!r}")


def check_sampling_settings(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> None:
    """The four classic settings (part 7 takes these only), by the same rule as ``SamplerSettings``."""
    for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("min_p", min_p)):
        check_setting(name, value)
