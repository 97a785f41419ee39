"""Part 6's probes: the caches' methods driven by hand on buffers of known numbers, and the fast
path on a small random DemoTransformer.

Each probe runs only its own exercise's code: the cache methods are called the way
``forward`` calls them (the probe does the bookkeeping ``forward`` does between calls), and
the fast path gets fused weights and a cache made here, so a mistake in ``fuse_qkv`` or
``update`` shows in their own probes, not in this one's.
"""

from __future__ import annotations

import math
from typing import Any

import einops
import torch

from sampling_course.grading.matching import FALSE_MATCH, Distribution, Frequencies, attempt, draws_for, enumerating, plain
from sampling_course.grading.probing import (
    Impl, attn_params, demo_params, generator, loaded, probe, randn, small_config,
)
from sampling_course.op_recorder import OpRecorder


@probe("fuse_qkv")
def _probe_fuse_qkv(impl: Impl) -> Any:
    cfg = small_config()
    attn = loaded(impl.transformer.Attention(cfg), attn_params(cfg, generator(90)))
    fused = impl.fast_path.fuse_qkv(attn)
    return [plain(fused.W_QKV), plain(fused.b_QKV), plain(fused.W_O), plain(fused.b_O)]


@probe("StaticKeyValueCache.update")
def _probe_static_update(impl: Impl) -> Any:
    g = generator(91)
    # Three rows of room, two in use; the buffer starts with known numbers in every slot.
    cache = impl.caches.StaticKeyValueCache(randn(g, 2, 2, 3, 6, 2, 4))
    cache.batch = 2
    returned = []
    for new_pos in (3, 1):  # a prompt of three, then one token
        for layer in range(2):
            k, v = randn(g, 2, new_pos, 2, 4), randn(g, 2, new_pos, 2, 4)
            keys, values = cache.update(layer, k, v)
            returned.append((plain(keys), plain(values)))
        cache.seq_len += new_pos  # as forward does, once every layer has written
    return [returned, plain(cache.buffer)]


@probe("StaticKeyValueCache.reorder")
def _probe_static_reorder(impl: Impl) -> Any:
    cache = impl.caches.StaticKeyValueCache(randn(generator(92), 2, 2, 3, 5, 2, 4))
    cache.seq_len = 4

    def reorder(rows: list[int]) -> Any:
        cache.reorder(torch.tensor(rows))
        return int(cache.batch), plain(cache.buffer[:, :, : cache.batch, : cache.seq_len])

    # A permutation that reads rows already written, beams that grow past the buffer's rows,
    # then the new fourth row alone (a cache that kept three rows refuses row 3).
    return [attempt(lambda rows=rows: reorder(rows)) for rows in ([1, 0, 0], [2, 1, 0, 0], [3])]


@probe("fast_forward")
def _probe_fast_forward(impl: Impl) -> Any:
    cfg, g = small_config(), generator(93)
    params = demo_params(cfg, g)
    for i in range(cfg.n_layers):
        # A loud MLP: the exact GELU and GPT-2's tanh approximation differ by 5e-4 at most, and
        # that must show in the logits well past the matching tolerance.
        params[f"blocks.{i}.mlp.W_out"] = params[f"blocks.{i}.mlp.W_out"] * 3.0
    model = impl.fast_path.fuse_at_load(loaded(impl.transformer.DemoTransformer(cfg), params))
    cache = impl.caches.StaticKeyValueCache.new_empty(cfg, batch=2, max_len=8, device="cpu", dtype=torch.float32)
    tokens = torch.randint(0, cfg.d_vocab, (2, 6), generator=g)
    # Three tokens at once, then one, then two on top of those four (each seeing the cached keys, and the
    # second also the first: a mask aligned to the bottom right, which SDPA's is_causal=True is not).
    first, cache = model(tokens[:, :3], cache)
    last, cache = model(tokens[:, :4], cache)
    two, cache = model(tokens, cache)
    # A left-padded batch: only the real tokens' logits.
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    padded, _ = model(tokens[:, :4], impl.caches.StaticKeyValueCache.new_empty(cfg, batch=2, max_len=6, device="cpu"),
                      attention_mask=mask)
    return [plain(first), plain(last), plain(two), plain(padded)[mask.bool()]]


def _sink_cache(impl: Impl, buffer: torch.Tensor, num_sink_tokens: int, position_rule: str, n_ctx: int) -> Any:
    return impl.sink_cache.SinkCache(buffer, num_sink_tokens, position_rule, n_ctx)


@probe("SinkCache.positions")
def _probe_sink_positions(impl: Impl) -> Any:
    out = []
    for rule in ("cache", "absolute"):
        # A window of 5 slots, 2 of them sinks, on a model with n_ctx = 8.
        cache = _sink_cache(impl, torch.zeros(1, 2, 1, 5, 1, 1), 2, rule, 8)
        for seen, new_pos in ((0, 3), (3, 1), (4, 1), (5, 1), (7, 1), (12, 1)):
            cache.seen = seen
            out.append(plain(cache.positions(new_pos)))
    return out


@probe("SinkCache.update")
def _probe_sink_update(impl: Impl) -> Any:
    g = generator(94)
    # Two layers, two rows, a window of 4 slots with 1 sink; known numbers in every slot.
    cache = _sink_cache(impl, randn(g, 2, 2, 2, 4, 2, 3), 1, "cache", 12)
    window, recent = 4, 3
    returned = []
    # A prompt of three tokens, then one token per step (the fourth fills the window; each
    # later one evicts the oldest recent token): the steps the learner's update is given.
    for total in range(3, 9):
        while cache.seen < total:
            free = window - min(cache.seen, window)
            new_pos = min(total - cache.seen, free) if free else 1
            for layer in range(2):
                keys, values = cache.update(layer, randn(g, 2, new_pos, 2, 3), randn(g, 2, new_pos, 2, 3))
                returned.append((plain(keys), plain(values)))
            if not free:
                cache.ring = (cache.ring + 1) % recent
            cache.seen += new_pos
    return [returned, plain(cache.buffer)]


# ---------------------------------------------------------------------------------------
# Fast decoding on a GPU (notebook 06b)
# ---------------------------------------------------------------------------------------

@probe("fixed_shape_step")
def _probe_fixed_shape_step(impl: Impl) -> Any:
    cfg, g = small_config(), generator(95)
    model = loaded(impl.transformer.DemoTransformer(cfg), demo_params(cfg, g))
    # Known numbers in every slot of a buffer of 8 positions, two rows; one new token per row at positions 3 then 4.
    buffer = randn(g, cfg.n_layers, 2, 2, 8, cfg.n_heads, cfg.d_head)
    tokens = torch.randint(0, cfg.d_vocab, (2,), generator=g)
    logits, recorded = [], []
    for position in (3, 4):
        with OpRecorder() as reads:
            logits.append(plain(impl.gpu_decoding.fixed_shape_step(model, buffer, tokens, torch.tensor(position))))
        recorded.append(reads)
    # Whether it read anything back to the host, and whether both positions ran the same operations on the same shapes.
    return [logits, plain(buffer), any(r.host_reads() for r in recorded), recorded[0].ops == recorded[1].ops]


# Five tokens whose laws under the race's classic mistakes lie at least 0.07 apart from each other and
# from softmax's (measured over 10^6 draws each: softmax ~[.072 .037 .037 .233 .621]; the clocks
# multiplied ~[.037 .009 .008 .246 .699]; uniform clocks ~[.049 .025 .024 .172 .731]; the last clock
# ~[.167 .407 .408 .017 .001]; the logits raced ~[0 0 0 .131 .869]).
_RACE_LOGITS = torch.tensor([-0.996, -1.657, -1.660, 0.175, 1.162])
_RACE_GAP = 0.06
_PLANTED_DRAWS = 10**6


def _race_law(race, seed: int) -> Any:
    """The law of one row's token, from one call on many rows of ``_RACE_LOGITS`` (rows drawn independently).

    Planted code: estimated from 10^6 rows, within ``err`` of its law for every token with
    probability 1 - 1e-6 (Hoeffding). The learner's: ``draws_for(gap)`` rows, each frequency
    within gap / 2 with probability 1 - 1e-6; it matches a planted law within gap / 2 + err.
    Laws at least 0.07 > gap + 2 err apart are then never confused.
    """
    k = _RACE_LOGITS.numel()
    err = math.sqrt(math.log(2 * k / FALSE_MATCH) / (2 * _PLANTED_DRAWS))
    n = _PLANTED_DRAWS if enumerating() else draws_for(_RACE_GAP, k)
    draws = race(_RACE_LOGITS.expand(n, k), generator=torch.Generator().manual_seed(seed))
    counts = torch.bincount(torch.as_tensor(draws).flatten().long(), minlength=k)
    if enumerating():
        return Distribution(tuple((counts.double() / n).tolist()), _RACE_GAP / 2 + err)
    return Frequencies(tuple(counts.tolist()), n, _RACE_GAP / 2 + err)


@probe("race_sample")
def _probe_race_sample(impl: Impl) -> Any:
    race = impl.gpu_decoding.race_sample
    rows = _RACE_LOGITS.expand(64, -1)
    generator_ = torch.Generator()
    with OpRecorder() as reads:
        first = torch.as_tensor(race(rows, generator=generator_.manual_seed(5)))
    # Rows of one call drawn independently (64 equal draws: probability about 1e-13 if they are)?
    same_rows = bool((first == first[0]).all())
    torch.rand(8)  # the global generator moves on; the seeded one must give the same draws again
    reproducible = torch.equal(first, torch.as_tensor(race(rows, generator=generator_.manual_seed(5))))
    # The law is compared only where rows are drawn independently: it is estimated from the rows of one call.
    law = None if same_rows else _race_law(race, 6)
    return [same_rows, reproducible, len(reads.host_reads()) > 0, law]


class _ScriptedStep:
    """Rows that end at known calls: at call i, row r gives 99 (the end token) when ``ends[r] == i``, 0 (a pad)
    after that, and 100 (r + 1) + i before; written into the same tensor each time, ``finished`` updated in place."""

    def __init__(self, ends: list[int]):
        self.ends, self.done, self.calls = ends, [False] * len(ends), 0
        self.out = torch.zeros(len(ends), dtype=torch.long)
        self.finished = torch.zeros(len(ends), dtype=torch.bool)

    def __call__(self) -> torch.Tensor:
        i, self.calls = self.calls, self.calls + 1
        values = []
        for r, end in enumerate(self.ends):
            values.append(0 if self.done[r] else 99 if end == i else 100 * (r + 1) + i)
            self.done[r] = self.done[r] or end == i
        self.out.copy_(torch.tensor(values))
        self.finished.copy_(torch.tensor(self.done))
        return self.out


@probe("decode_loop")
def _probe_decode_loop(impl: Impl) -> Any:
    out = []
    for ends, max_new_tokens, check_every in (([2, 5, 3], 12, 4), ([1, 6], 7, 3)):
        step = _ScriptedStep(ends)
        tokens = attempt(lambda: plain(impl.gpu_decoding.decode_loop(step, step.finished, max_new_tokens, check_every)))
        out.append((tokens, step.calls))
    return out
