"""``compare``: your sampler next to the solution's, on the same weights, prompt and seed."""

from __future__ import annotations

import importlib
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

from sampling_course.implementation import IMPLS, has_solutions, load_demo, resolve_impl
from sampling_course.grading.sandbox import isolated_package


@dataclass
class Side:
    """One column of a comparison: what one implementation produced, or why it did not."""

    label: str
    status: Literal["ok", "not implemented yet", "error"]
    output: str | list[tuple[float, str]] | None = None
    message: str = ""


@dataclass
class Comparison:
    """The learner's output next to the solution's on the same weights, prompt and seed."""

    method: str
    prompt: str
    reference: str
    seed: int
    learner: Side
    solution: Side
    match: bool | None  # None when the learner's side did not run (or, in the student release, there is no other)
    first_difference: str | None = None  # e.g. "generated token 3" or "sequence 2, generated token 5"

    def __bool__(self) -> bool:
        return bool(self.match)

    def __repr__(self) -> str:
        verdict = {True: "match", False: f"differ at {self.first_difference}", None: self.learner.status}[self.match]
        return f"<Comparison {self.method} on {self.reference}: {verdict}>"


# The student release has no solutions: there, ``compare`` shows the learner's side alone.
ABSENT = Side("solutions/", "error", message="not in the student release: your output is shown alone")


def _run_sampler(package: str, transformer_package: str, reference: Any, method: str, prompt: str,
                 seed: int, max_tokens_generated: int, kwargs: dict[str, Any]) -> Side:
    """Run ``package``'s TransformerSampler on a DemoTransformer from ``transformer_package``."""
    import torch

    label = f"{package}/" if package == transformer_package else f"{package}/ (model from {transformer_package}/)"
    isolate = isolated_package(package) if package != "solutions" else nullcontext()
    with isolate:
        try:
            transformer = importlib.import_module(f"{transformer_package}.transformer")
            sampling = importlib.import_module(f"{package}.sampling")
            model = load_demo(reference, transformer)
            sampler = sampling.TransformerSampler(model, reference.tokenizer)
            torch.manual_seed(seed)
            if method == "sample":
                output = sampler.sample(prompt, max_tokens_generated=max_tokens_generated, **kwargs)
            else:
                output = [(float(lp), str(text)) for lp, text in sampler.beam_search(prompt, **kwargs)]
        except NotImplementedError as exc:
            tb = exc.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            code = tb.tb_frame.f_code if tb is not None else None
            stub = getattr(code, "co_qualname", getattr(code, "co_name", "")) if code is not None else ""
            return Side(label, "not implemented yet", message=stub)
        except Exception as exc:  # the learner's code may fail in any way; show it, do not crash
            return Side(label, "error", message=f"{type(exc).__name__}: {exc}")
    return Side(label, "ok", output)


def _first_token_difference(tokenizer: Any, a: str, b: str, prompt_len: int) -> str:
    ids_a, ids_b = tokenizer.encode(a), tokenizer.encode(b)
    i = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y), min(len(ids_a), len(ids_b)))
    return f"generated token {i - prompt_len}" if i >= prompt_len else f"token {i} (inside the prompt)"


def compare(
    prompt: str = "When I was a kid,",
    reference: str = "auto",
    seed: int = 0,
    max_tokens_generated: int = 20,
    method: Literal["sample", "beam_search"] = "sample",
    *,
    impl: str | None = None,
    transformer: str | None = None,
    device: str | None = None,
    display: bool = True,
    console: Console | None = None,
    **kwargs: Any,
) -> Comparison:
    """Run your ``TransformerSampler`` and the solution's side by side and show both outputs.

    Same reference weights (``reference``: "auto", "tiny" or "gpt2"), prompt and seed.
    ``method="sample"`` passes ``kwargs`` (temperature, top_k, top_p, frequency_penalty)
    to ``sample``; ``method="beam_search"`` passes ``num_beams``, ``num_return_sequences``,
    ``max_new_tokens`` (default ``max_tokens_generated``) and ``no_repeat_ngram_size``.
    Your sampler runs on your ``DemoTransformer``; pass ``transformer="solutions"`` to
    run it on the solution's model instead (handy before part 1 is done).
    ``device``: where both run (the course's device when None: a GPU when there is one);
    the same seed draws the same tokens on the same device.
    """
    from sampling_course.devices import fork_rng
    from sampling_course.reference import load_reference

    if method not in ("sample", "beam_search"):
        raise ValueError(f'method must be "sample" or "beam_search", got {method!r}')
    impl = resolve_impl(impl)
    if transformer is not None and transformer not in IMPLS:
        raise ValueError(f"transformer must be one of {', '.join(IMPLS)}, got {transformer!r}")
    if method == "beam_search":
        kwargs.setdefault("num_beams", 3)
        kwargs.setdefault("num_return_sequences", kwargs["num_beams"])
        kwargs.setdefault("max_new_tokens", max_tokens_generated)
    ref = load_reference(reference, device)  # type: ignore[arg-type]
    args = (ref, method, prompt, seed, max_tokens_generated, kwargs)
    # fork_rng: building the models and sampling draw random numbers (on the CPU and on the
    # models' device); the caller's random state is the same before and after compare().
    with fork_rng(ref.device):
        learner = _run_sampler(impl, transformer or impl, *args)
        solution = _run_sampler("solutions", "solutions", *args) if has_solutions() else ABSENT
    if solution.status != "ok" and solution is not ABSENT:
        raise RuntimeError(f"the solutions themselves failed to run: {solution.message}")

    match: bool | None = None
    first_difference = None
    if learner.status == "ok" and solution is not ABSENT:
        prompt_len = len(ref.tokenizer.encode(prompt))
        if method == "sample":
            match = learner.output == solution.output
            if not match:
                first_difference = _first_token_difference(ref.tokenizer, str(learner.output), str(solution.output), prompt_len)
        else:
            mine, theirs = list(learner.output or []), list(solution.output or [])
            match = len(mine) == len(theirs)
            for i, ((lp_a, a), (lp_b, b)) in enumerate(zip(mine, theirs)):
                if a != b:
                    first_difference = f"sequence {i + 1}, " + _first_token_difference(ref.tokenizer, a, b, prompt_len)
                    match = False
                    break
                if abs(lp_a - lp_b) > 1e-3 * max(1.0, abs(lp_b)):
                    first_difference = f"sequence {i + 1}, log-prob {lp_a:.4f} vs {lp_b:.4f}"
                    match = False
                    break
            else:
                if not match:
                    first_difference = f"{len(mine)} sequences vs {len(theirs)}"
    comparison = Comparison(method, prompt, ref.name, seed, learner, solution, match, first_difference)
    if display:
        (console or Console()).print(render_comparison(comparison, kwargs))
    return comparison


def _common_prefix_len(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _highlight(text: str, prompt: str, diverge_at: int | None, style: str) -> Text:
    """The prompt dim, the continuation plain, and everything from the first difference in ``style``."""
    out = Text()
    cut = len(prompt) if text.startswith(prompt) else 0
    diverge = len(text) if diverge_at is None else max(diverge_at, cut)
    out.append(text[:cut], style="dim")
    out.append(text[cut:diverge])
    out.append(text[diverge:], style=style)
    return out


def _side_cell(side: Side, other: Side, prompt: str, style: str) -> Text:
    if side.status == "not implemented yet":
        return Text(f"… not implemented yet" + (f" ({side.message})" if side.message else ""), style="yellow")
    if side.status == "error":
        return Text(f"✗ {side.message}", style="red")
    if isinstance(side.output, str):
        diverge = _common_prefix_len(side.output, other.output) if isinstance(other.output, str) else None
        return _highlight(side.output, prompt, diverge if other.status == "ok" else None, style)
    lines = Text()
    others = other.output if isinstance(other.output, list) else []
    for i, (logprob, text) in enumerate(side.output or []):
        diverge = _common_prefix_len(text, others[i][1]) if i < len(others) else 0
        lines.append(f"{logprob:8.3f}  ", style="cyan")
        lines.append_text(_highlight(text, prompt, diverge if other.status == "ok" else None, style))
        lines.append("\n")
    lines.rstrip()
    return lines


def render_comparison(comparison: Comparison, kwargs: dict[str, Any] | None = None) -> Table:
    """Both outputs side by side, the prompt dimmed and the first difference onwards highlighted."""
    settings = ", ".join(f"{k}={v!r}" for k, v in (kwargs or {}).items())
    title = f"{comparison.method}({settings}) on {comparison.reference!r}, seed {comparison.seed}"
    table = Table(title=title, title_justify="left", show_lines=True, expand=False)
    table.add_column(f"yours: {comparison.learner.label}", ratio=1)
    table.add_column(comparison.solution.label, ratio=1)
    table.add_row(
        _side_cell(comparison.learner, comparison.solution, comparison.prompt, "bold red"),
        _side_cell(comparison.solution, comparison.learner, comparison.prompt, "bold green"),
    )
    if comparison.match is True:
        table.caption = Text("✓ identical", style="bold green")
    elif comparison.match is False:
        table.caption = Text(f"✗ they differ, first at {comparison.first_difference}", style="bold red")
    else:
        table.caption = Text(f"your side did not run: {comparison.learner.status}", style="yellow")
    table.caption_justify = "left"
    return table
