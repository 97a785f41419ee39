"""Parts 5 and 7 and the ``generate`` command agree on the sampling settings: one check, Hugging Face's "off".

``top_k=0``, ``top_p=1.0`` and ``min_p=0.0`` are off and temperature 0 is greedy, in part 5's
``sample``, part 7's ``filtered_probs`` and the command's flags alike: each accepts the same
values and refuses the same values with the same message (the given code of both parts, run
from solutions/). Part 2 keeps the classic contract, where ``top_p=0.0`` is off.
"""

from __future__ import annotations

import pytest
import torch

from sampling_course.apps.generate import SETTINGS
from sampling_course.implementation import impl_module
from sampling_course.sampling_settings import check_sampling_settings

LOGITS = torch.tensor([0.3, -0.6, 2.0, 0.9, -0.4, 1.5, -1.9, 0.88])

REFUSED = [
    dict(temperature=-0.5),
    dict(temperature=float("nan")),
    dict(temperature=float("inf")),
    dict(temperature=True),
    dict(top_k=-1),
    dict(top_k=2.5),
    dict(top_k=True),
    dict(top_p=0.0),  # off in part 2's classic contract; refused here, where 1.0 is off
    dict(top_p=-0.1),
    dict(top_p=1.5),
    dict(top_p=float("nan")),
    dict(top_p="0.9"),
    dict(min_p=-0.1),
    dict(min_p=1.5),
]
ACCEPTED = [
    dict(),
    dict(temperature=0.0),
    dict(temperature=0.7, top_k=3),
    dict(top_k=0, top_p=1.0, min_p=0.0),
    dict(top_p=0.5),
    dict(top_k=len(LOGITS) + 1),  # more than the vocabulary keeps every token
    dict(temperature=1.3, top_k=5, top_p=0.9, min_p=0.05),
]


def message(settings: dict) -> str:
    """What the one check says about ``settings``."""
    with pytest.raises(ValueError) as refused:
        check_sampling_settings(**settings)
    return str(refused.value)


def part5(settings: dict):
    """Part 5's ``sample`` on a batch of one row."""
    return impl_module("batched_sampling", "solutions").sample(LOGITS[None], **settings)


def part7(settings: dict):
    """Part 7's ``filtered_probs`` (it has no min-p filter)."""
    return impl_module("speculative", "solutions").filtered_probs(LOGITS, **settings)


@pytest.mark.parametrize("settings", REFUSED, ids=str)
def test_both_parts_refuse_the_same_settings_with_the_same_message(settings):
    expected = message(settings)
    runs = [part5] + ([part7] if "min_p" not in settings else [])
    for run in runs:
        with pytest.raises(ValueError) as refused:
            run(settings)
        assert str(refused.value) == expected, f"{run.__name__}({settings})"


@pytest.mark.parametrize("settings", REFUSED, ids=str)
def test_the_command_refuses_them_with_the_same_words(settings):
    """The flags (and the REPL's /set) read text; what they say up to "got ..." is the check's message."""
    ((name, value),) = settings.items()
    if isinstance(value, (bool, str)):
        pytest.skip("a flag is text: True and a number already written as text are the library's mistakes only")
    parse = SETTINGS[name][0]
    with pytest.raises(ValueError) as refused:
        parse(str(value))
    assert str(refused.value).split(", got")[0] == message(settings).split(", got")[0]


@pytest.mark.parametrize("settings", ACCEPTED, ids=str)
def test_both_parts_accept_the_same_settings(settings):
    check_sampling_settings(**settings)
    assert part5(settings).shape == (1,)
    if "min_p" not in settings:
        probs = part7(settings)
        assert torch.isclose(probs.sum(), torch.tensor(1.0))
    for name, value in settings.items():
        assert SETTINGS[name][0](str(value)) == value


def test_top_k_beyond_the_vocabulary_filters_nothing():
    """As in Hugging Face: more than the vocabulary keeps every token, in both parts."""
    sampling = impl_module("batched_sampling", "solutions")
    everything = dict(top_k=len(LOGITS) + 1)
    torch.testing.assert_close(sampling.warp_logits(LOGITS[None], **everything), sampling.warp_logits(LOGITS[None]))
    torch.testing.assert_close(part7(everything), part7({}))


def test_part_2_keeps_the_classic_contract():
    """Part 2's sampler takes top_p=0.0 as off (its default) and refuses top_k with top_p both set."""
    sampling = impl_module("sampling", "solutions")
    sampling.check_sampling_args(len(LOGITS), top_p=0.0)
    with pytest.raises(ValueError, match="not both"):
        sampling.check_sampling_args(len(LOGITS), top_k=2, top_p=0.5)
