"""Code in other styles than the solutions': the checker names correct code as nothing and
mistakes as themselves, whatever the style.

The planted mistakes and variants (``grading/parts``) are rewrites of the solutions' own lines;
a learner writes the same idea in other ways. Parts 1 and 2: torch's own ``layer_norm``, a
``tril`` mask, ``torch.distributions.Categorical`` and ``searchsorted`` draws. Parts 5-7: the
classic mistakes written without the solutions' helpers. The random exercises take the
statistical path (false-match probability at most 1e-6 per setting, see ``grading/matching.py``).
"""

from __future__ import annotations

import importlib

import pytest
import torch

from sampling_course.grading.catalogue import Mistake
from sampling_course.grading.course import MISTAKES
from sampling_course.grading.diagnosis import name_mistake


def _mistake(name: str) -> Mistake:
    return next(m for m in MISTAKES if m.name == name)


class FunctionalLayerNorm(torch.nn.Module):
    """A correct LayerNorm in another style: torch's own layer_norm."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.w = torch.nn.Parameter(torch.ones(cfg.d_model))
        self.b = torch.nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, residual):
        return torch.nn.functional.layer_norm(residual, (self.cfg.d_model,), self.w, self.b, self.cfg.layer_norm_eps)


def mask_with_tril(self, attn_scores):
    """A correct causal mask in another style: tril (shifted past the cached keys) and -inf."""
    q, k = attn_scores.shape[-2:]
    visible = torch.ones(q, k, dtype=torch.bool).tril(diagonal=k - q)
    return attn_scores.masked_fill(~visible, float("-inf"))


def sample_basic_categorical(logits):
    return torch.distributions.Categorical(logits=logits).sample().item()


def sample_basic_uniform_categorical(logits):
    """The "draws uniformly" mistake, drawn in another style than the planted one."""
    return torch.distributions.Categorical(logits=torch.zeros_like(logits)).sample().item()


def sample_top_p_searchsorted(logits, top_p, min_tokens_to_keep=1):
    """A correct top-p in another style: searchsorted on the cumulative probabilities, inverse-CDF draw."""
    probs, order = logits.softmax(-1).sort(descending=True)
    n_kept = max(int(torch.searchsorted(probs.cumsum(-1), torch.tensor(top_p))) + 1, min_tokens_to_keep)
    kept = probs[:n_kept] / probs[:n_kept].sum()
    return int(order[min(int(torch.searchsorted(kept.cumsum(-1), torch.rand(()))), n_kept - 1)])


def sample_top_p_exclusive_inverse_cdf(logits, top_p, min_tokens_to_keep=1):
    """The "exclusive cutoff" mistake, with an inverse-CDF draw instead of torch.multinomial."""
    probs, order = logits.softmax(-1).sort(descending=True)
    n_kept = max(int((probs.cumsum(-1) < top_p).sum()), min_tokens_to_keep)
    kept = probs[:n_kept] / probs[:n_kept].sum()
    return int(order[min(int(torch.searchsorted(kept.cumsum(-1), torch.rand(()))), n_kept - 1)])


@pytest.mark.parametrize("exercise, obj", [
    ("LayerNorm", FunctionalLayerNorm),
    ("apply_causal_mask", mask_with_tril),
    ("Attention", None),
    ("sample_basic", sample_basic_categorical),
    ("sample_top_p", sample_top_p_searchsorted),
], ids=["layer_norm", "tril-mask", "attention", "categorical", "searchsorted-top-p"])
def test_correct_alternatives_are_named_nothing(exercise, obj):
    if exercise == "Attention":  # the tril mask inside the solutions' Attention
        obj = type("TrilAttention", (importlib.import_module("solutions.transformer").Attention,),
                   {"apply_causal_mask": mask_with_tril})
    assert name_mistake(exercise, "solutions", obj) is None


def test_mistakes_drawn_in_another_style_are_named_statistically():
    assert name_mistake("sample_basic", "solutions", sample_basic_uniform_categorical) == _mistake(
        "sample_basic draws uniformly")
    assert name_mistake("sample_top_p", "solutions", sample_top_p_exclusive_inverse_cdf) == _mistake(
        "top-p cutoff exclusive instead of inclusive")
    assert name_mistake("accept_or_resample", "solutions", accept_or_resample_from_p) == _mistake(
        "replacement drawn from p instead of max(0, p - q)")
    assert name_mistake("batched_sample", "solutions", sample_gumbel_ignoring_the_generator) == _mistake(
        "sample ignores its generator")
    assert name_mistake("batched_sample", "solutions", sample_gumbel) is None


def test_mistakes_are_named_when_torchs_default_device_is_another():
    """A notebook on a GPU makes the GPU torch's default device; the probes still run on the CPU (here the
    default device is "meta", whose tensors hold no values) and the mistake is still named."""
    with torch.device("meta"):
        assert name_mistake("accept_or_resample", "solutions", accept_or_resample_from_p) == _mistake(
            "replacement drawn from p instead of max(0, p - q)")


# Parts 5-7: mistakes written in other styles than the planted ones, and correct code in other styles.


def top_p_filter_exclusive(logits, top_p, min_tokens_to_keep=1):
    """The exclusive cutoff, spelled as "keep while the running total, this token included, is <= top_p"."""
    probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True)
    keep = probs.cumsum(dim=-1) <= top_p
    keep[:, :min_tokens_to_keep] = True
    return logits.masked_fill(~keep.gather(1, order.argsort(dim=1)), -1e10)


def min_p_filter_unscaled(logits, min_p, min_tokens_to_keep=1):
    return torch.where(logits.softmax(dim=-1) >= min_p, logits, torch.finfo(logits.dtype).min)


def residual_probs_unnormalised(p, q):
    residual = torch.relu(p - q)
    return torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p)


def _draw(probs, generator=None):
    """One token from ``probs`` by the inverse CDF (no torch.multinomial)."""
    cdf = probs.cumsum(dim=-1)
    u = torch.rand((), generator=generator) * cdf[-1]
    return torch.searchsorted(cdf, u[None], right=True).clamp(max=len(cdf) - 1)


def accept_or_resample_from_p(p, q, proposals, generator=None):
    """The replacement drawn from p instead of the residual, with other draws than the planted code's."""
    for i, x in enumerate(proposals.tolist()):
        if torch.rand((), generator=generator) * q[i, x] < p[i, x]:
            continue
        return torch.cat([proposals[:i], _draw(p[i], generator)])
    return torch.cat([proposals, _draw(p[-1], generator)])


def sample_gumbel(logits, settings=None, generator=None, use_generator=True, **changes):
    """A correct sample in another style: the Gumbel-max trick on the warped logits."""
    sampling = importlib.import_module("solutions.batched_sampling")
    settings = sampling.SamplerSettings.of(settings, **changes)
    if settings.temperature == 0:
        return logits.argmax(dim=-1)
    generator = generator if use_generator else None
    warped = sampling.warp_logits(logits, settings, generator)
    u = torch.rand(warped.shape, generator=generator)
    return (warped - torch.log(-torch.log(u.clamp_min(1e-20)))).argmax(dim=-1)


def sample_gumbel_ignoring_the_generator(logits, settings=None, generator=None, **changes):
    return sample_gumbel(logits, settings, generator, use_generator=False, **changes)


@pytest.mark.parametrize("exercise, obj, mistake", [
    ("top_p_filter", top_p_filter_exclusive, "top-p cutoff exclusive"),
    ("min_p_filter", min_p_filter_unscaled, "min-p bar not scaled by the top probability"),
    ("residual_probs", residual_probs_unnormalised, "residual not normalised"),
], ids=["exclusive-top-p", "unscaled-min-p", "unnormalised-residual"])
def test_mistakes_written_in_another_style_are_named(exercise, obj, mistake):
    assert name_mistake(exercise, "solutions", obj) == _mistake(mistake)
