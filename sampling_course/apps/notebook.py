"""Small helpers for the course notebooks: plots and measurements, never exercise code.

Everything here calls the learner's own objects (a model, a sampling function, a cache
class) and only draws or times what they produce, so the notebooks stay short without
hiding any part of an exercise. ``load_demo`` builds your DemoTransformer (or the
solution's), gives it a reference checkpoint's weights and sets torch's threads by the
course's policy for that model (``sampling_course.apps.threads``: one thread for the
course's small models, so a notebook does not crawl while another program uses a core;
``$OMP_NUM_THREADS`` overrides it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from sampling_course.apps.threads import use_course_threads
from sampling_course.devices import synchronize
from sampling_course.implementation import load_demo as _load_demo

__all__ = [
    "attention_pattern",
    "earlier_parts",
    "empirical_probs",
    "load_demo",
    "plot_attention",
    "plot_top_tokens",
    "time_per_token",
    "token_labels",
]


def earlier_parts(part: str | int, impl: str, earlier_impl: str) -> tuple[str, ...]:
    """The setup cell's ``EARLIER_IMPL`` switch for notebook ``part``: every file of the exercises before it
    (from the course's catalogue, ``grading.start_at.files_before``) comes from ``earlier_impl``, also
    where this part's own code imports it (the engine of part 10 imports part 5's sampler chain).

    Call it before importing this part's modules; it returns the files it switched (none when
    ``earlier_impl`` is ``impl``). The checks still grade your files. See
    ``sampling_course.implementation.use_earlier``.
    """
    from sampling_course.grading.start_at import files_before
    from sampling_course.implementation import use_earlier

    return use_earlier(impl, earlier_impl, files_before(part))


def load_demo(reference, transformer_module=None, *, device=None, dtype=None) -> torch.nn.Module:
    """``sampling_course.implementation.load_demo``, after setting torch's threads by the course's policy.

    ``device`` and ``dtype`` are passed on: None keeps the reference's own, ``"auto"`` is the
    course's device rule.
    """
    use_course_threads(reference.cfg.d_model)
    return _load_demo(reference, transformer_module, device=device, dtype=dtype)


def token_labels(tokenizer, ids: Sequence[int] | Tensor) -> list[str]:
    """Readable labels for token ids: repr() shows leading spaces and odd bytes."""
    return [repr(tokenizer.decode([int(i)])) for i in ids]


def plot_top_tokens(ax, probs: Tensor, tokenizer, ids: Tensor | None = None, top: int = 20, title: str = "") -> Tensor:
    """Bar chart of ``probs`` (shape ``(d_vocab,)``) over ``ids``, or over the ``top`` most likely tokens.

    Returns the ids plotted, so several panels can share the same tokens in the same order.
    """
    probs = probs.detach().float().cpu()
    if ids is None:
        ids = probs.topk(top).indices
    ax.bar(range(len(ids)), probs[ids].numpy(), color="tab:blue")
    ax.set_xticks(range(len(ids)))
    ax.set_xticklabels(token_labels(tokenizer, ids), rotation=90, fontsize=8)
    ax.set_ylabel("probability")
    ax.set_title(title, fontsize=10)
    return ids


@torch.inference_mode()
def empirical_probs(draw: Callable[[Tensor], int], logits: Tensor, n: int = 4000) -> Tensor:
    """How often each token comes out of ``draw`` in ``n`` draws from the same ``logits``.

    ``draw`` takes one position's ``(d_vocab,)`` logits and returns one token id (an int),
    e.g. ``lambda l: TransformerSampler.sample_top_k(l, 5)``; it gets a fresh copy each
    time, so a draw that edits its input in place does not disturb the next one.
    """
    drawn = torch.tensor([int(draw(logits.clone())) for _ in range(n)])
    return torch.bincount(drawn, minlength=logits.shape[-1]).float() / n


@torch.inference_mode()
def attention_pattern(attn: torch.nn.Module, normalized_resid_pre: Tensor) -> Tensor:
    """The attention pattern ``(batch, n_heads, query_pos, key_pos)`` that ``attn`` computes on its input.

    It listens in on the module's own ``apply_causal_mask`` (the masked scores go straight
    into a softmax), so the pattern is the one your Attention produced, not a recomputation.
    """
    original = attn.apply_causal_mask
    captured: list[Tensor] = []

    def listen(scores: Tensor) -> Tensor:
        masked = original(scores)
        captured.append(masked.softmax(dim=-1))
        return masked

    attn.apply_causal_mask = listen  # an instance attribute shadows the method...
    try:
        attn(normalized_resid_pre)
    finally:
        del attn.apply_causal_mask  # ...and deleting it brings the method back
    if not captured:
        raise RuntimeError(
            "Attention.forward never called self.apply_causal_mask; call it on the scores "
            "(before the softmax) so that the pattern can be read"
        )
    return captured[-1]


def plot_attention(axes, pattern: Tensor, labels: Sequence[str], title: str = "") -> None:
    """One heat map per head of a ``(n_heads, query_pos, key_pos)`` pattern."""
    for head, ax in enumerate(axes):
        ax.imshow(pattern[head].detach().cpu().numpy(), cmap="Blues", vmin=0.0, vmax=1.0)
        ax.set_title(f"{title}head {head}", fontsize=9)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=90, fontsize=7)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels if head == 0 else [], fontsize=7)
        ax.set_xlabel("key (attended to)", fontsize=8)
    axes[0].set_ylabel("query (attending)", fontsize=8)


def _best_seconds(fn: Callable[[], object], repeats: int, device: torch.device | str = "cpu") -> float:
    """The fastest of ``repeats`` runs after a warm-up: the usual way to time short code on a busy machine.
    Each run is timed from an idle ``device`` to a finished one (a GPU only queues the work a call asks for)."""
    fn()  # warm-up: the first call pays for allocations
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times)


@torch.inference_mode()
def time_per_token(model: torch.nn.Module, cache_cls, lengths: Sequence[int], repeats: int = 5, seed: int = 0) -> dict[str, list[float]]:
    """Seconds to produce the logits of one new token when the sequence has each length in ``lengths``.

    ``uncached``: a full forward pass over all ``length`` positions (what ``sample`` does
    without a cache). ``cached``: a forward pass over the last position only, with a
    ``cache_cls`` already holding the ``length - 1`` before it. Best of ``repeats`` runs.
    """
    if min(lengths) < 2 or max(lengths) > model.cfg.n_ctx:
        raise ValueError(f"lengths must lie in [2, n_ctx={model.cfg.n_ctx}], got {list(lengths)}")
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(model.cfg.d_vocab, (1, max(lengths)), generator=generator, device="cpu").to(device)
    out: dict[str, list[float]] = {"uncached": [], "cached": []}
    for length in lengths:
        prefix = tokens[:, :length]
        _, cache = model(prefix[:, :-1], cache_cls.new_empty(model.cfg, batch=1, device=device))
        out["uncached"].append(_best_seconds(lambda: model(prefix), repeats, device))
        out["cached"].append(_best_seconds(lambda: model(prefix, cache), repeats, device))
    return out
