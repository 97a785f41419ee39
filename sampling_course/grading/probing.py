"""What the parts' probes are made of: the probe registry and small deterministic inputs.

A probe takes the modules of one implementation (``Impl``: ``impl.transformer``,
``impl.sampling``, ... of some package) and returns its output on a small, fixed input. The
diagnosis runs the learner's code and every planted mistake of the exercise through the same
probe and names the mistake whose output the learner's reproduces (``grading/diagnosis.py``).

Each part keeps its probes in ``grading/parts/<part>/probes.py``; this module holds what they
share: small random ``Config``s with perturbed weights (LayerNorm's w = 1 and b = 0 could not
tell a model that drops them from one that keeps them), and a toy language model whose
next-token logits are a lookup table over words of the offline tiny tokenizer. Probes never
load a reference model.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch

from sampling_course.config import Config
from sampling_course.grading.course import PART_MODULES, get_exercise
from sampling_course.implementation import Impl

__all__ = [
    "PROBES", "CachedToyLM", "Impl", "Probe", "ToyLM", "attn_params", "demo_params", "generator", "ln_params", "load_probes",
    "loaded", "mlp_params", "probe", "randn", "small_config", "tokenizer", "unembed_params", "word_ids", "word_table",
]


Probe = Callable[[Impl], Any]
# exercise name -> its probe; filled when the parts' ``probes`` modules are imported (``load_probes``).
PROBES: dict[str, Probe] = {}


def probe(name: str) -> Callable[[Probe], Probe]:
    """Register the decorated function as the probe of exercise ``name``."""

    def register(fn: Probe) -> Probe:
        get_exercise(name)  # a typo fails at import
        PROBES[name] = fn
        return fn

    return register


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def small_config(**changes: Any) -> Config:
    """A small GPT-2-shaped config; d_head != d_model so the two scalings differ."""
    fields = dict(d_model=16, debug=False, layer_norm_eps=1e-5, d_vocab=40, init_range=0.02,
                  n_ctx=12, d_head=8, d_mlp=32, n_heads=2, n_layers=2)
    fields.update(changes)
    return Config(**fields)


def randn(g: torch.Generator, *shape: int, std: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * std


def ln_params(cfg: Config, g: torch.Generator) -> dict[str, torch.Tensor]:
    # Perturbed: w = 1 and b = 0 could not tell a LayerNorm that drops them from one that does not.
    return {"w": 1 + randn(g, cfg.d_model, std=0.3), "b": randn(g, cfg.d_model, std=0.3)}


def attn_params(cfg: Config, g: torch.Generator) -> dict[str, torch.Tensor]:
    n, d, h = cfg.n_heads, cfg.d_model, cfg.d_head
    return {
        "W_Q": randn(g, n, d, h, std=d**-0.5), "W_K": randn(g, n, d, h, std=d**-0.5),
        "W_V": randn(g, n, d, h, std=d**-0.5), "W_O": randn(g, n, h, d, std=(n * h) ** -0.5),
        "b_Q": randn(g, n, h, std=0.5), "b_K": randn(g, n, h, std=0.5),
        "b_V": randn(g, n, h, std=0.5), "b_O": randn(g, d, std=0.3),
    }


def mlp_params(cfg: Config, g: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "W_in": randn(g, cfg.d_model, cfg.d_mlp, std=1.5 * cfg.d_model**-0.5), "b_in": randn(g, cfg.d_mlp, std=0.5),
        "W_out": randn(g, cfg.d_mlp, cfg.d_model, std=cfg.d_mlp**-0.5), "b_out": randn(g, cfg.d_model, std=0.3),
    }


def unembed_params(cfg: Config, g: torch.Generator) -> dict[str, torch.Tensor]:
    return {"W_U": randn(g, cfg.d_model, cfg.d_vocab, std=cfg.d_model**-0.5), "b_U": randn(g, cfg.d_vocab, std=0.5)}


def demo_params(cfg: Config, g: torch.Generator) -> dict[str, torch.Tensor]:
    params = {"embed.W_E": randn(g, cfg.d_vocab, cfg.d_model), "pos_embed.W_pos": randn(g, cfg.n_ctx, cfg.d_model, std=0.5)}
    for i in range(cfg.n_layers):
        for sub, make in (("ln1", ln_params), ("attn", attn_params), ("ln2", ln_params), ("mlp", mlp_params)):
            params.update({f"blocks.{i}.{sub}.{k}": v for k, v in make(cfg, g).items()})
    params.update({f"ln_final.{k}": v for k, v in ln_params(cfg, g).items()})
    params.update({f"unembed.{k}": v for k, v in unembed_params(cfg, g).items()})
    return params


def loaded(module: torch.nn.Module, params: dict[str, torch.Tensor]) -> torch.nn.Module:
    """``module`` with ``params`` loaded: every parameter must be there; buffers it makes itself need not."""
    missing, unexpected = module.load_state_dict(params, strict=False)
    parameters = {name for name, _ in module.named_parameters()}
    if unexpected or any(key in parameters for key in missing):
        raise LookupError(f"parameters do not match: missing {missing}, unexpected {unexpected}")
    return module.eval()


@lru_cache(maxsize=1)
def tokenizer():
    from sampling_course.tokenizer import load_tiny_tokenizer

    return load_tiny_tokenizer()


@lru_cache(maxsize=1)
def word_ids() -> tuple[int, ...]:
    """Token ids that decode to a space and a word: sequences of them decode unambiguously."""
    tok = tokenizer()
    words = []
    for i in range(256, len(tok)):
        text = tok.decode([i])
        if text.startswith(" ") and len(text) >= 4 and text[1:].isalpha() and text.isascii():
            words.append(i)
        if len(words) == 24:
            break
    return tuple(words)


class ToyLM(torch.nn.Module):
    """A toy language model: logits = table[row_of[last token]] + by_position[position].

    The next token depends on the token before it and on where it sits, so feeding the
    model the wrong window shows. It records the longest input it was given.
    """

    def __init__(self, cfg: Config, table: torch.Tensor, row_of: torch.Tensor, by_position: torch.Tensor | None = None):
        super().__init__()
        self.cfg = cfg
        self.register_buffer("table", table)
        self.register_buffer("row_of", row_of)
        self.register_buffer("by_position", by_position if by_position is not None else torch.zeros(64, table.shape[1]))
        self.longest_input = 0

    def forward(self, tokens: torch.Tensor, kv_cache: Any = None) -> torch.Tensor:
        if kv_cache is not None:
            raise TypeError("the probe's toy model runs without a cache")
        self.longest_input = max(self.longest_input, tokens.shape[1])
        rows = self.row_of.index_select(0, tokens.flatten()).view_as(tokens)
        return torch.nn.functional.embedding(rows, self.table) + self.by_position[: tokens.shape[1]]


class CachedToyLM(ToyLM):
    """A ``ToyLM`` that also runs as a cached model, the way parts 5 and 7 call one.

    ``model(tokens, kv_cache, attention_mask=...)`` returns the logits of the positions the
    cache does not hold yet and the cache grown by them (zeros of the cache's own class: only
    its length matters here); without a cache, the logits of every position. With an
    attention mask, a token's position counts the real tokens before it (pads: 0), as in
    part 5's padded model, so left padding changes nothing and right padding shows. It
    records every call as (positions passed, positions already cached or None).
    """

    def __init__(self, cfg: Config, table: torch.Tensor, row_of: torch.Tensor, by_position: torch.Tensor | None = None):
        super().__init__(cfg, table, row_of, by_position)
        self.calls: list[tuple[int, int | None]] = []

    def forward(self, tokens: torch.Tensor, kv_cache: Any = None, *, attention_mask: torch.Tensor | None = None) -> Any:
        past = 0 if kv_cache is None else int(kv_cache.shape[3])
        self.calls.append((tokens.shape[1], None if kv_cache is None else past))
        self.longest_input = max(self.longest_input, tokens.shape[1])
        if attention_mask is None:
            positions = torch.arange(tokens.shape[1]).expand(tokens.shape)
        else:
            positions = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)
        rows = self.row_of.index_select(0, tokens[:, past:].flatten()).view(tokens.shape[0], -1)
        logits = torch.nn.functional.embedding(rows, self.table) + self.by_position[positions[:, past:]]
        if kv_cache is None:
            return logits
        n_layers, two, batch, _, n_heads, d_head = kv_cache.shape
        room = torch.zeros(n_layers, two, batch, tokens.shape[1] - past, n_heads, d_head, dtype=kv_cache.dtype)
        return logits, type(kv_cache)(torch.cat([kv_cache.as_subclass(torch.Tensor), room], dim=3))


def word_table(g: torch.Generator, std: float = 2.0,
                rows: dict[int, dict[int, float]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(table, row_of)`` for a ``ToyLM``: a row for every word, one for end-of-text and one
    for any other token, each random over the words (so no ties) and -40 elsewhere; ``rows``
    gives some rows as explicit probabilities instead."""
    tok, words = tokenizer(), word_ids()
    ids = list(words) + [tok.eos_token_id]
    row_of = torch.full((len(tok),), len(ids), dtype=torch.long)
    row_of[ids] = torch.arange(len(ids))
    table = torch.full((len(ids) + 1, len(tok)), -40.0)
    table[:, list(words)] = randn(g, len(ids) + 1, len(words), std=std)
    for last, row in (rows or {}).items():
        table[row_of[last]] = -40.0
        for nxt, p in row.items():
            table[row_of[last], nxt] = math.log(p)
    return table, row_of


def load_probes() -> dict[str, Probe]:
    """Import every part's ``probes`` module (registering its probes); return the registry."""
    for module in PART_MODULES:
        try:
            importlib.import_module(f"{module.__name__}.probes")
        except ModuleNotFoundError as error:
            if error.name != f"{module.__name__}.probes":
                raise
    return PROBES
