"""Part 4's cache grows into a buffer with room (``kv_cache.Room``): given code, not graded as the learner's.

Each layer writes its new positions into the buffer as the forward pass reaches it; ``commit``
returns a view. Two passes from the same cache, the second run while the first is under way (or
after it stopped with an error), must not share the positions they write.
"""

from __future__ import annotations

import torch

from sampling_course.grading.tolerances import parity

TOL = parity()


def test_two_passes_from_one_cache_at_once_keep_their_own_positions(impl, demo, reference, seed):
    """Pass A from a cache reaches its second layer; there pass B from the same cache runs whole. Each pass's cache
    then holds its own tokens' keys (continuing from either gives the uncached logits), B's is not changed by A's
    later layers, and the cache both started from is unchanged."""
    cfg = reference.cfg
    generator = torch.Generator().manual_seed(seed)
    a = torch.randint(0, cfg.d_vocab, (2, 8), generator=generator)
    b = torch.cat([a[:, :5], (a[:, 5:] + 1) % cfg.d_vocab], dim=1)
    inner = {}
    with torch.no_grad():
        full_a, full_b = demo(a), demo(b)
        _, past = demo(a[:, :5], impl.kv_cache.KeyValueCache.new_empty(cfg, 2))
        kept = past.as_subclass(torch.Tensor).clone()

        def run_b(*_):
            if not inner:
                inner["running"] = True  # B's own pass meets this hook too
                inner["logits"], inner["cache"] = demo(b[:, :7], past)
                inner["kept"] = inner["cache"].as_subclass(torch.Tensor).clone()

        handle = demo.blocks[1].register_forward_pre_hook(run_b)
        try:
            logits_a, cache_a = demo(a[:, :7], past)
        finally:
            handle.remove()
        assert torch.equal(inner["cache"].as_subclass(torch.Tensor), inner["kept"]), (
            "a pass from the same cache, under way while this one ran, wrote into this one's cache")
        last_a, _ = demo(a, cache_a)
        last_b, _ = demo(b, inner["cache"])
    assert torch.equal(past.as_subclass(torch.Tensor), kept), "the cache both passes started from changed"
    torch.testing.assert_close(torch.cat([logits_a, last_a], dim=1), full_a[:, 5:], **TOL, msg="pass A's logits")
    torch.testing.assert_close(torch.cat([inner["logits"], last_b], dim=1), full_b[:, 5:], **TOL, msg="pass B's logits")
