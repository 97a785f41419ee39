"""What quantised weights cost in quality, measured against ground truth (part 11's bench).

The story models are scored on held-out stories of the course's grammar
(``sampling_course.stories.heldout_stories``): each story is read as ``<|endoftext|>``, the
story, ``<|endoftext|>``, and every token after the first is predicted (the story's tokens and
the closing ``<|endoftext|>``), exactly as the models' ``training.json`` counts its held-out
loss. The grammar knows each story's probability, so the **entropy floor** (the loss no model
can beat on the same stories) is known too, and a configuration's loss reads as a gap above
that floor, not only as a difference from fp32.

Per configuration and per story the bench keeps two sums:

* the **NLL**: the nats the model gives the true next tokens;
* the **KL to fp32**: at every position, KL(p_fp32 || p_config) of the next-token
  distributions, so 0 means the same distribution as the unquantised model.

Means are sums over all stories divided by their token count. Every interval is a 95% bootstrap
over the stories (stories drawn with replacement, each keeping all its sums, so differences
between two configurations are paired: both read the same stories); a difference is called
*separated* only when its interval leaves out zero. A percentile bootstrap is approximate: over few
stories (the notebook's 18) it covers less often than 95%, for the reason ``sign_flip``'s docstring
gives at 8 units. That module's exact interval enumerates every subset of the units and stops at 16,
fewer than the stories here, so the bench keeps the bootstrap and reads its intervals as approximate.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor

# The configurations the bench scores, in the order of its table. "fp32" is the baseline
# every KL and difference is taken against. "bf16" is the whole model cast to bfloat16: its
# weights and its computation (activations, attention, logits), unlike the weight-only schemes,
# which dequantise to fp32 and compute in fp32.
BASELINES = ("fp32", "bf16")
SCHEMES = ("int8", "int4-g32", "int4-g64", "int4-g128", "nf4-g64", "nf4-g64-dq")


@dataclass
class Heldout:
    """Held-out stories of one model's tokenizer, padded into one batch of rows."""

    model_name: str
    tokens: Int[Tensor, "story pos"]  # <|endoftext|> story <|endoftext|>, then padding
    lengths: Int[Tensor, "story"]  # real tokens per row, both <|endoftext|> included
    floor_nats: Float[Tensor, "story"]  # -log P(story) under the grammar

    @property
    def counts(self) -> Int[Tensor, "story"]:
        """Predicted tokens per story: every token after the first."""
        return self.lengths - 1

    @property
    def floor(self) -> float:
        """The entropy floor, nats per token, on exactly these stories and tokens."""
        return (self.floor_nats.sum() / self.counts.sum()).item()


def heldout_set(model_name: str, tokenizer, n_ctx: int, n_tokens: int = 20_000) -> Heldout:
    """About ``n_tokens`` tokens of held-out stories, each whole within ``n_ctx``."""
    from sampling_course.stories import heldout_stories

    stories = heldout_stories(tokenizer, n_ctx, n_tokens=n_tokens)
    eos = tokenizer.eos_token_id
    rows = [[eos, *tokenizer(story.text).input_ids, eos] for story in stories]
    width = max(map(len, rows))
    tokens = torch.full((len(rows), width), eos, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row)
    return Heldout(model_name, tokens, torch.tensor([len(r) for r in rows]),
                   torch.tensor([-story.logprob for story in stories], dtype=torch.float64))


@dataclass
class Scores:
    """One configuration's per-story sums over the held-out set."""

    nll: Float[Tensor, "story"]
    kl: Float[Tensor, "story"]
    note: str = ""


@dataclass
class QualityRun:
    """Every configuration of one model, scored on one held-out set (fp32 first)."""

    heldout: Heldout
    scores: dict[str, Scores] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # configuration -> why it did not run

    def mean(self, name: str, what: str = "nll") -> float:
        return (getattr(self.scores[name], what).sum() / self.heldout.counts.sum()).item()


def _logprobs(model: torch.nn.Module, tokens: Tensor) -> Tensor:
    with torch.no_grad():
        logits = model(tokens)
    return torch.log_softmax(logits.float(), dim=-1)


def score_models(models: dict[str, torch.nn.Module], heldout: Heldout, baseline: str = "fp32",
                 batch_size: int = 16) -> dict[str, Scores]:
    """Per-story NLL and KL to ``baseline`` of every model in ``models`` (which must include ``baseline``).

    Right padding is harmless: attention is causal, so a story's positions never see the
    padding after it, and positions past each story's end are left out of the sums.
    """
    if baseline not in models:
        raise ValueError(f"the models must include the baseline {baseline!r}, got {list(models)}")
    n = len(heldout.lengths)
    sums = {name: (torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)) for name in models}
    order = torch.argsort(heldout.lengths)  # similar lengths together: less padding per batch
    for start in range(0, n, batch_size):
        rows = order[start : start + batch_size]
        width = int(heldout.lengths[rows].max())
        tokens = heldout.tokens[rows, :width]
        targets = tokens[:, 1:]
        real = torch.arange(width - 1)[None, :] < (heldout.lengths[rows] - 1)[:, None]
        reference = _logprobs(models[baseline], tokens)[:, :-1]
        p_reference = reference.exp()
        for name, model in models.items():
            logp = reference if name == baseline else _logprobs(model, tokens)[:, :-1]
            nll = -logp.gather(-1, targets[..., None])[..., 0]
            kl = (p_reference * (reference - logp)).sum(-1)
            sums[name][0][rows] = (nll * real).sum(-1).double()
            sums[name][1][rows] = (kl * real).sum(-1).double()
    return {name: Scores(nll, kl) for name, (nll, kl) in sums.items()}


def bootstrap(a: Tensor, counts: Tensor, b: Tensor | None = None, n_resamples: int = 10_000,
              seed: int = 0) -> tuple[float, float, float]:
    """``(sum(a) - sum(b)) / sum(counts)`` with a 95% bootstrap interval over the stories (``b`` 0 when None)."""
    diff = (a - (0 if b is None else b)).double()
    counts = counts.double()
    value = (diff.sum() / counts.sum()).item()
    g = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, len(counts), (n_resamples, len(counts)), generator=g)
    resampled = diff[draws].sum(1) / counts[draws].sum(1)
    low, high = torch.quantile(resampled, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return value, low, high


def separated(low: float, high: float) -> str:
    """How an interval of a difference a - b reads: a lower, a higher, or not separated."""
    return "lower" if high < 0 else "higher" if low > 0 else "not separated"


def build_models(fp32: torch.nn.Module, quantise: Callable[[torch.nn.Module, str], torch.nn.Module],
                 schemes: Iterable[str] = SCHEMES, baselines: Iterable[str] = BASELINES
                 ) -> tuple[dict[str, torch.nn.Module], dict[str, str]]:
    """fp32 itself, a bf16 copy, and one quantised copy per scheme (``quantise(copy, scheme)``).

    A scheme the model's shapes do not allow (a group size that does not divide a matrix's
    inputs) is skipped with the quantiser's own message.
    """
    models: dict[str, torch.nn.Module] = {"fp32": fp32.eval()}
    skipped: dict[str, str] = {}
    if "bf16" in baselines:
        models["bf16"] = copy.deepcopy(fp32).to(torch.bfloat16).eval()
    for scheme in schemes:
        try:
            models[scheme] = quantise(copy.deepcopy(fp32), scheme).eval()
        except ValueError as exc:
            skipped[scheme] = str(exc).splitlines()[0]
    return models, skipped


def run_quality(fp32: torch.nn.Module, heldout: Heldout, quantise, schemes: Iterable[str] = SCHEMES,
                extra: dict[str, torch.nn.Module] | None = None) -> tuple[QualityRun, dict[str, torch.nn.Module]]:
    """Build every configuration of ``fp32``, add ``extra`` models (the peers), and score them all at once."""
    models, skipped = build_models(fp32, quantise, schemes)
    models.update(extra or {})
    run = QualityRun(heldout, score_models(models, heldout), skipped)
    return run, models


def quality_rows(run: QualityRun, names: Iterable[str] | None = None) -> list[dict]:
    """One row per configuration: mean NLL, its gap above the floor, its difference from fp32 and its KL to
    fp32, each with its interval."""
    h = run.heldout
    rows = []
    for name in names or run.scores:
        if name not in run.scores:
            continue
        s = run.scores[name]
        rows.append(dict(
            name=name, nll=run.mean(name), gap=bootstrap(s.nll, h.counts, h.floor_nats),
            delta=bootstrap(s.nll, h.counts, run.scores["fp32"].nll), kl=bootstrap(s.kl, h.counts),
        ))
    return rows


def difference(run: QualityRun, a: str, b: str) -> tuple[float, float, float]:
    """Configuration ``a``'s mean NLL minus ``b``'s on the same stories, with its paired interval."""
    return bootstrap(run.scores[a].nll, run.heldout.counts, run.scores[b].nll)


# ---------------------------------------------------------------------------------------
# What the distortion does to sampled stories
# ---------------------------------------------------------------------------------------

# Part 5's samplers the bench draws with: pure sampling, where every distortion of the distribution
# shows, and top-p 0.9, which cuts the tail where a quantised model's stray mass would go.
SAMPLERS = {"sampling, T = 1": dict(temperature=1.0), "top-p 0.9": dict(temperature=1.0, top_p=0.9)}


def validity_rows(models: dict[str, torch.nn.Module], tokenizer, generate, n_stories: int = 32,
                  new_tokens: int = 96, seed: int = 0) -> list[dict]:
    """Per model and sampler: stories drawn from ``<|endoftext|>`` with part 5's ``generate`` (the same seed for
    every model), and the share of their complete sentences the grammar can write (``stories.sentence_is_valid``),
    with a 95% bootstrap interval over the stories. Where every sentence is valid or none is, the bootstrap's
    interval has no width and the rule of three widens it by ``3 / stories``, counting the stories that hold a
    sentence: the stories are the independent draws, the sentences of one story are not. A model that writes no
    complete sentence at all is a ``ValueError``, not a row of NaN."""
    from sampling_course.sampling_settings import SamplerSettings
    from sampling_course.stories import EOS_TOKEN, sentence_is_valid, split_sentences

    rows = []
    for sampler, keywords in SAMPLERS.items():
        for name, model in models.items():
            with torch.no_grad():
                out = generate(model, tokenizer, [EOS_TOKEN] * n_stories, new_tokens,
                               settings=SamplerSettings(**keywords), seed=seed, eos_token_id=tokenizer.eos_token_id)
            valid, sentences = [], []
            for row in out[:, 1:].tolist():
                text = tokenizer.decode(row).split(EOS_TOKEN)[0]
                said = split_sentences(text)
                valid.append(sum(map(sentence_is_valid, said)))
                sentences.append(len(said))
            if not sum(sentences):
                raise ValueError(f"{name!r} wrote no complete sentence in {n_stories} stories of {new_tokens} tokens "
                                 f"with {sampler}: there is no share of valid sentences to report (allow more "
                                 "new_tokens, or check that the model ends its sentences)")
            share, low, high = bootstrap(torch.tensor(valid, dtype=torch.float64), torch.tensor(sentences))
            if low == high and share in (0.0, 1.0):
                # Every sentence valid (or none): the bootstrap has no width; the rule of three does. Its n is the
                # number of independent draws that say something, the stories with a sentence (the sentences of one
                # story are not independent).
                draws = sum(1 for count in sentences if count)
                low, high = (max(0.0, 1 - 3 / draws), 1.0) if share == 1.0 else (0.0, min(1.0, 3 / draws))
            rows.append(dict(sampler=sampler, name=name, sentences=sum(sentences), valid=(share, low, high)))
    return rows
