"""What part 5's test files share: tolerances, random inputs, the comparison of two filtered batches, the
oracle's functions (each runs live once through the ``oracle`` fixture, then is read back), and the
chi-square test of the statistical checks.

Seeded tests take their seed from ``SAMPLING_COURSE_TEST_SEED`` (default 0); any seed must pass. The
draws your code makes take a ``torch.Generator`` on the grading device (``pytest --device``): a generator
draws on its own device only. The tests' random inputs come from seeded CPU generators, drawn on the CPU
and moved, so every device grades on the same inputs.
"""

from __future__ import annotations

import math

import torch

from sampling_course.grading.tolerances import parity

# fp32 logits of two correct implementations agree to ~1e-5; every planted mistake moves them by far more.
# The bounds for the device graded on, float32 (grading/tolerances.py says why). They are relative as well as
# absolute (rtol with atol), so values that grow, such as a beam score times its length under length_penalty=-1,
# get a bound that grows with them, which the rounding of a learner's own model (downstream tests) needs.
TOL = parity()
# Filters only mask: kept values are the input's, up to one rounding of the temperature division.
VALUE_TOL = dict(atol=1e-6, rtol=1e-5)
# Summed over every statistical check of one test: the chance that correct code fails it.
FALSE_FAILURE = 1e-6

PROMPTS = [
    "The cat sat on the mat, and then",
    "Once",
    "When I was a kid, John and Mary went to the",
    "A short one",
]


def random_logits(seed: int, batch: int, d_vocab: int, scale: float = 2.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return scale * torch.randn(batch, d_vocab, generator=generator)


def assert_same_filter(actual: torch.Tensor, expected: torch.Tensor, what: str,
                       reference: str = "Hugging Face") -> None:
    """The same tokens removed (set to -inf) and the same values kept; ``reference`` names whose rule
    ``expected`` follows (llama.cpp's for top-n-sigma and XTC, which Hugging Face does not have)."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    kept, kept_expected = torch.isfinite(actual), torch.isfinite(expected)
    removed = ~kept
    assert torch.all(actual[removed] == float("-inf")), f"{what}: removed logits must be -inf"
    differ = (kept != kept_expected).nonzero().tolist()
    assert not differ, (
        f"{what}: kept {int(kept.sum())} tokens, {reference} keeps {int(kept_expected.sum())}; "
        f"first disagreement at (row, token) {differ[0]}"
    )
    torch.testing.assert_close(
        actual[kept], expected[kept], **VALUE_TOL, msg=lambda m: f"{what}: kept values differ from {reference}'s.\n{m}"
    )


# The oracle's functions: each runs live once through the ``oracle`` fixture, then is read back.


def hf_warpers(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0):
    """Hugging Face's warpers in the order its generate applies them, those switched on."""
    from transformers import (LogitsProcessorList, MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper,
                              TopPLogitsWarper)

    warpers = LogitsProcessorList()
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k > 0:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    if min_p > 0.0:
        warpers.append(MinPLogitsWarper(min_p))
    return warpers


def hf_warped(settings: dict, logits: torch.Tensor) -> torch.Tensor:
    """Oracle: ``logits`` after Hugging Face's warpers for ``settings`` (see ``hf_warpers``)."""
    return hf_warpers(**settings)(None, logits.clone())


def hf_processor(name: str, settings: dict | list, input_ids: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
    """Oracle: Hugging Face's logits processor ``name`` (e.g. "TopKLogitsWarper"), built with ``settings`` (keyword
    arguments, or a list of positional ones)."""
    import transformers

    cls = getattr(transformers, name)
    processor = cls(*settings) if isinstance(settings, list) else cls(**settings)
    return processor(input_ids, scores.clone())


def hf_logits_alone(reference, ids: list[int]) -> torch.Tensor:
    """Oracle: Hugging Face's logits for one unpadded sequence, (len(ids), d_vocab)."""
    return reference.hf_model(torch.tensor([ids])).logits[0]


def left_padded(token_lists: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle's own left padding (not the code under test)."""
    width = max(map(len, token_lists))
    ids = torch.tensor([[pad] * (width - len(t)) + t for t in token_lists])
    mask = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in token_lists])
    return ids, mask


def new_tokens_of(sequences: torch.Tensor, width: int) -> list[list[int]]:
    return sequences[:, width:].tolist()


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of ``counts`` to ``probs`` (over tokens with probs > 0); bins expecting
    fewer than 5 draws are pooled, so the chi-square approximation holds."""
    n = int(counts.sum())
    probs = probs.double() / probs.double().sum()
    expected = probs * n
    big = expected >= 5
    observed = counts[big].double().tolist()
    wanted = expected[big].double().tolist()
    rest_obs, rest_exp = float(counts[~big].sum()), float(expected[~big].sum())
    if rest_exp > 0:
        if rest_exp >= 5:
            observed.append(rest_obs)
            wanted.append(rest_exp)
        else:  # too small to stand alone: merge with the smallest bin
            i = min(range(len(wanted)), key=wanted.__getitem__)
            observed[i] += rest_obs
            wanted[i] += rest_exp
    if len(wanted) < 2:
        return 1.0
    total = sum(wanted)
    wanted = [w * n / total for w in wanted]
    from quantiles import chi2_sf  # tests/grading/quantiles.py (scipy.special, loaded by the statistical tests only)

    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, wanted))  # Pearson's, as scipy.stats.chisquare
    return chi2_sf(statistic, len(wanted) - 1)




# Part 5's modules in the order a learner meets them.
PART5_MODULES = ("padding", "filters", "batched_sampling", "generate", "outputs", "modern_filters", "penalties",
                 "batched_beam_search")


# Notebook 05b's functions that notebook 05's code calls when a setting switches them on: the module that calls
# each -> its names. Notebook 05 comes first, so its exercises are graded with these as the solutions write them.
LATER_HELPERS = {
    "batched_sampling": ("typical_filter", "epsilon_filter", "eta_filter", "top_n_sigma_filter", "xtc_filter",
                         "mirostat_step"),
    "penalties": ("apply_repetition_penalty", "apply_presence_and_frequency_penalty", "apply_dry_penalty",
                  "ban_bad_words"),
}
# Notebook 05's exercises whose tests switch on 05b's filters, mirostat or penalties.
BEFORE_05B = ("warp_logits", "batched_sample", "generate", "StopStringCriteria", "TextStreamer")


def with_05b_solved(request, impl, monkeypatch) -> None:
    """For a test of one of notebook 05's exercises (``BEFORE_05B``), put the solutions' 05b functions
    (``LATER_HELPERS``) where ``impl``'s 05 code calls them: a learner working in course order has not
    written them yet, and each is graded by its own exercise's tests. Other tests are left as they are. In the
    student release, which has no solutions, the learner's own 05b functions stay in place."""
    from sampling_course.implementation import Impl, has_solutions

    graded = {m.args[0] for m in request.node.iter_markers("exercise") if m.args}
    if not graded or not graded <= set(BEFORE_05B) or not has_solutions():
        return

    solutions = Impl("solutions")
    for module, names in LATER_HELPERS.items():
        for name in names:
            monkeypatch.setattr(getattr(impl, module), name, getattr(getattr(solutions, module), name))


# The modules whose functions take logits and return new ones: each call through ``Part5`` checks that
# the tensors it was given are left as they were (Hugging Face's tests assert the same of every processor).
LEAVES_INPUTS_ALONE = ("filters", "modern_filters", "penalties")


class Part5:
    """Part 5's names of one implementation, wherever they live: ``Part5(impl).top_k_filter``.

    A module is imported when a name is first looked for in it, in course order. A function of a filter or
    penalty module, and ``warp_logits``, come wrapped: every call also asserts that the tensors passed to it
    are unchanged afterwards."""

    def __init__(self, impl):
        self.impl = impl

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        for module in PART5_MODULES:
            found = getattr(getattr(self.impl, module), name, None)
            if found is not None:
                if callable(found) and not isinstance(found, type) and (
                        module in LEAVES_INPUTS_ALONE or name == "warp_logits"):
                    return leaves_its_inputs_alone(found, name)
                return found
        raise AttributeError(f"no part-5 module of {self.impl!r} defines {name}")


def leaves_its_inputs_alone(function, name: str):
    """``function``, checking after every call that no tensor argument was changed."""

    def checked(*args, **kwargs):
        given = [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]
        before = [value.clone() for value in given]
        result = function(*args, **kwargs)
        for old, new in zip(before, given):
            unchanged(old, new, name)
        return result

    return checked


def unchanged(before: torch.Tensor, after: torch.Tensor, what: str) -> None:
    """A filter, penalty or processor must leave the tensor it was given as it was (``generate`` still needs it)."""
    same = before.shape == after.shape and bool(
        ((before == after) | (before.isnan() & after.isnan()) if before.is_floating_point() else before == after).all())
    assert same, (f"{what} changed a tensor it was given (its logits or tokens); return a new tensor instead "
                  "(masked_fill, not masked_fill_; logits = logits.clone() before writing into it)")


def assert_same_tokens(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if not torch.equal(actual, expected):
        row, col = (actual != expected).nonzero()[0].tolist()
        raise AssertionError(f"{what}: row {row} differs first at column {col}: {actual[row].tolist()} vs {expected[row].tolist()}")


def llama_top_n_sigma(row: list[float], n: float) -> list[bool]:
    """llama.cpp's top-n-sigma, transcribed: over the finite logits, the max, the mean and the population standard
    deviation; a token stays unless its logit is below max - n * std."""
    finite = [x for x in row if x != float("-inf")]
    top, mean = max(finite), sum(finite) / len(finite)
    std = math.sqrt(sum((x - mean) ** 2 for x in finite) / len(finite))
    return [not (x < top - n * std) for x in row]


def llama_xtc_cut(row: list[float], threshold: float) -> list[bool]:
    """llama.cpp's XTC when its draw says yes, transcribed: softmax, sort from most to least likely, find the last
    token of the leading run with p >= threshold; if it is not the first, every token before it goes."""
    top = max(row)
    weights = [math.exp(x - top) for x in row]
    total = sum(weights)
    order = sorted(range(len(row)), key=lambda t: -weights[t])
    last = 0
    for i, t in enumerate(order):
        if weights[t] / total >= threshold:
            last = i
        else:
            break
    keep = [True] * len(row)
    for t in order[:last]:
        keep[t] = False
    return keep


def xtc_rows(seed: int) -> torch.Tensor:
    """Rows with 0, 1, 2 and 3+ tokens above a threshold of 0.1 (and a random one)."""
    rows = random_logits(seed, 5, 50, scale=0.5)
    rows[1, 7] = 6.0                                   # one token above the bar
    rows[2, 3], rows[2, 9] = 4.0, 3.5                  # two
    rows[3, 1], rows[3, 2], rows[3, 4] = 3.0, 2.8, 2.5  # three
    rows[4] *= 8.0
    return rows.double()
