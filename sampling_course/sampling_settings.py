"""The sampling settings of parts 5 and 7, checked in one place, with Hugging Face's meanings.

Part 5's ``sample`` and ``generate``, part 7's ``filtered_probs`` and
``speculative_generate``, and the ``sampling-course generate`` command all take the same
settings, and they mean what they mean in Hugging Face's ``generate``:

* ``temperature``: a number >= 0; 0 is greedy decoding (the argmax), 1 leaves the logits as they are;
* ``top_k``: an integer >= 0; 0 turns the filter off, and more than the vocabulary keeps every token;
* ``top_p``: a number in (0, 1]; 1.0 turns the filter off;
* ``min_p``: a number in [0, 1]; 0.0 turns the filter off.

Part 2's classic sampler keeps the classic contract instead: there ``top_p=0.0`` (its
default) turns nucleus sampling off. So ``top_p=0.0`` is refused here rather than given a
meaning of its own: whoever passes it meaning "off" learns that off is 1.0 in this engine.
"""

from __future__ import annotations

__all__ = ["check_sampling_settings"]


def _is_number(value: object) -> bool:
    # bool is an int to Python, but True is no temperature.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_sampling_settings(
    temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> None:
    """Raise a ValueError saying what is allowed when a sampling setting is out of range (see the module)."""
    if not _is_number(temperature) or not temperature >= 0:  # `not >=` also refuses NaN
        raise ValueError(f"temperature must be a number >= 0 (0 means greedy), got {temperature!r}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 turns it off), got {top_k!r}")
    if not _is_number(top_p) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1.0 turns it off), got {top_p!r}")
    if not _is_number(min_p) or not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1] (0.0 turns it off), got {min_p!r}")
