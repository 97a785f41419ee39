"""Part 4's correct variants in the classic course's style: each piece written whole.

``KeyValueCache.new_empty`` without the given checks (a Config, a batch of at least 1: given
code, graded by tests without an exercise marker), ``cached_forward`` (the cache branch of the one forward) adding
the positions in place onto its own embeddings, and part 2's and 3's classic ``sample`` and ``Beams.generate``
written whole, which carry the cache through the loop. Every test of the exercise must pass.
"""

from __future__ import annotations

from sampling_course.grading.catalogue import Variant
from sampling_course.grading.parts.part4_kv_cache.texts import (
    CACHE_METHODS as _CACHE_METHODS, CACHED_FORWARD as _CACHED_FORWARD,
)
from sampling_course.grading.parts.part2_sampling.classic import CLASSIC_SAMPLE, SAMPLE_WHOLE
from sampling_course.grading.parts.part3_beams.classic import CLASSIC_GENERATE, GENERATE_BODY




def _cache_methods(new_empty: str, k: str, v: str, batch: str, seq_len: str) -> str:
    """new_empty's return and the four properties, as the part's other KeyValueCache variants write them."""
    return (
        new_empty + "\n\n"
        "    @property\n    def k(self) -> Tensor:\n" + k + "\n\n"
        "    @property\n    def v(self) -> Tensor:\n" + v + "\n\n"
        "    @property\n    def batch(self) -> int:\n" + batch + "\n\n"
        "    @property\n    def seq_len(self) -> int:\n" + seq_len + "\n"
    )


CLASSIC_VARIANTS: list[Variant] = [
    Variant(4, "KeyValueCache", "classic, whole: new_empty without the given checks", "kv_cache.py",
            "        if not isinstance(cfg, Config):\n"
            '            raise TypeError(f"KeyValueCache.new_empty(cfg, batch) takes a Config, got {type(cfg).__name__}")\n'
            "        if batch < 1:\n"
            '            raise ValueError(f"batch must be >= 1, got {batch}")\n'
            "        ### BEGIN SOLUTION\n" + _CACHE_METHODS,
            _cache_methods(
                "        data = torch.zeros((cfg.n_layers, 2, batch, 0, cfg.n_heads, cfg.d_head), device=device, dtype=dtype)\n"
                "        return cls(data)",
                "        return self.as_subclass(torch.Tensor)[:, 0, ...]",
                "        return self.as_subclass(torch.Tensor)[:, 1, ...]",
                "        return int(self.shape[2])",
                "        return int(self.shape[3])",
            )),
    Variant(4, "cached_forward", "classic: positions added in place, blocks indexed",
            "transformer.py", _CACHED_FORWARD,
            "        step = cache.prepare(tokens, attention_mask)\n"
            "        residual = self.embed(step.new_tokens)\n"
            "        residual += self.pos_embed.W_pos[step.positions]\n"
            "        for i in range(len(self.blocks)):\n"
            "            residual, _ = self.blocks[i](residual, LayerCache(cache, i, step.mask))\n"),
    Variant(4, "cached_sample", "classic, whole: part 2's classic sample, the cache carried through", "sampling.py",
            SAMPLE_WHOLE, CLASSIC_SAMPLE),
    Variant(4, "cached_beam_search", "classic, whole: part 3's classic generate, cache rows copied", "beams.py",
            GENERATE_BODY, CLASSIC_GENERATE),
]
