"""Part 10's engine, the given code around the learner's exercises: what it keeps out of a step's work.

A prefill pass draws one token per prompt, from the logits after its last position, so the engine
runs the unembedding on those positions alone (Hugging Face's ``logits_to_keep``): counted here at
the model's own ``unembed``, and the tokens checked against the model run without any cache, one
token at a time. A decode step's slots may come as tensors (views of each table's slots, as the
engine hands them out) or as lists of ints: the layout of the step is the same either way. The
paged cache reads each layer's keys and values into one buffer it keeps (its ``reading``), and
that buffer must not get in the way of a pass run outside ``torch.inference_mode`` or with
autograd on.
"""

from __future__ import annotations

import torch

from sampling_course.config import Config
from sampling_course.sampling_settings import SamplerSettings
from solutions import block_pool
from solutions.engine import Engine
from solutions.transformer import DemoTransformer


def tiny_model(seed: int = 0) -> DemoTransformer:
    torch.manual_seed(seed)
    cfg = Config(d_model=32, d_vocab=50, n_ctx=64, d_head=8, d_mlp=64, n_heads=4, n_layers=2)
    model = DemoTransformer(cfg).eval()
    with torch.no_grad():  # biases away from 0 and the layer norms off 1, so that a wrong position shows
        for name, parameter in model.named_parameters():
            if name.endswith(("b_Q", "b_K", "b_V", "b_O", "b_in", "b_out", ".w", ".b")):
                parameter.normal_(0, 0.3)
    return model


def greedy_without_cache(model: DemoTransformer, prompt: list[int], n_new: int) -> list[int]:
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(n_new):
            tokens.append(int(model(torch.tensor([tokens]))[0, -1].argmax()))
    return tokens[len(prompt):]


def test_a_prefill_pass_unembeds_only_the_positions_that_draw_a_token():
    """Three prompts of 5, 7 and 9 tokens prefilled in one pass: the unembedding sees 3 positions, not 21; every
    later pass one position per request; and the tokens are the model's own, run without a cache."""
    model = tiny_model()
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21]]
    unembedded: list[int] = []
    handle = model.unembed.register_forward_hook(lambda module, args, out: unembedded.append(out.shape[:-1].numel()))
    try:
        engine = Engine(model, n_blocks=16, block_size=4)
        requests = [engine.add_request(p, 4, SamplerSettings(temperature=0.0)) for p in prompts]
        engine.run()
    finally:
        handle.remove()
    assert unembedded[0] == 3, f"the prefill pass unembedded {unembedded[0]} positions, not one per prompt"
    assert unembedded[1:] == [3, 3, 3]
    assert [r.output for r in requests] == [greedy_without_cache(model, p, 4) for p in prompts]


def test_a_decode_step_is_laid_out_the_same_from_slot_tensors_and_from_lists():
    rng = torch.Generator().manual_seed(0)
    segments = []
    for n_held in (5, 9, 1, 12):
        slots = torch.randperm(40, generator=rng)[:n_held].tolist()
        segments.append(block_pool.Segment([3], n_held - 1, slots))
    as_lists = block_pool.one_segment_a_row(segments)
    as_tensors = block_pool.one_segment_a_row(
        [block_pool.Segment(s.tokens, s.start, torch.tensor(s.slots)) for s in segments])
    for field in ("tokens", "positions", "valid", "write_slots", "read_slots", "mask", "last"):
        assert torch.equal(getattr(as_lists, field), getattr(as_tensors, field)), field
    assert as_tensors.write_slots.tolist() == [s.slots[-1] for s in segments]


def test_the_paged_cache_reuses_its_reading_buffer_and_runs_in_every_grad_mode():
    """Under inference mode two layers' reads land in the same memory (the buffer is reused); the same cache then
    gives the model's own logits under no_grad (the buffer made under inference mode cannot be written there),
    with autograd on (index_select refuses out= there), and under inference mode again."""
    model = tiny_model()
    tokens = [4, 8, 15, 16, 23, 42, 7]
    pool, cache = block_pool.BlockPool(8, 4), block_pool.PagedKVCache(model.cfg, 8, 4)
    table = block_pool.BlockTable(4)
    table.grow(pool, len(tokens))
    segment = block_pool.Segment(tokens, 0, table.slots(0, len(tokens)).tolist())
    with torch.no_grad():
        expected = model(torch.tensor([tokens]))
    with torch.inference_mode():
        plan = cache.plan([[segment]])
        new = torch.zeros(*plan.tokens.shape, model.cfg.n_heads, model.cfg.d_head)
        first, _ = cache.update(0, new, new)
        second, _ = cache.update(1, new, new)
        assert first.data_ptr() == second.data_ptr(), "each layer's read should reuse the cache's buffer"
    for mode in (torch.inference_mode, torch.no_grad, torch.enable_grad, torch.inference_mode):
        with mode():
            plan = cache.plan([[segment]])
            logits, _ = model(plan.tokens, cache)
        torch.testing.assert_close(logits.detach(), expected, msg=lambda m, mode=mode: f"{mode.__name__}: {m}")
