"""Part 4, KV cache: its exercises (what each asks, three graded hints) and its planted mistakes."""

from __future__ import annotations

from sampling_course.grading.catalogue import Exercise, Mistake, exercise

PART = 4
TITLE = "KV cache"

EXERCISES: tuple[Exercise, ...] = (
    exercise(
        "KeyValueCache", 4, "transformer", "KeyValueCache",
        "A tensor of shape (n_layers, 2, batch, seq_len, n_heads, d_head) holding past keys and "
        "values, with new_empty, k, v, batch and seq_len.",
        "Index 0 of the second dimension holds the keys and index 1 the values; batch is "
        "dimension 2 and seq_len dimension 3.",
        "An empty cache has seq_len 0: torch.empty(n_layers, 2, batch, 0, n_heads, d_head) "
        "wrapped in the class. In k and v, view the cache as a plain tensor first "
        "(self.as_subclass(torch.Tensor)), so the result is not a KeyValueCache.",
        "new_empty: return cls(torch.empty(cfg.n_layers, 2, batch, 0, cfg.n_heads, cfg.d_head, device=device, dtype=dtype))\n"
        "k: return self.as_subclass(torch.Tensor)[:, 0]      v: ...[:, 1]\n"
        "batch: return self.shape[2]                          seq_len: return self.shape[3]",
    ),
    exercise(
        "cached_forward", 4, "transformer", "DemoTransformer.cached_forward",
        "Run only the positions the cache does not hold yet and return their logits and the extended cache.",
        "The new tokens sit at positions seq_len, seq_len + 1, ... of the sequence, so their "
        "positional embedding must start at the cache's seq_len, not at 0.",
        "In every layer the queries come from the new positions only, while the keys and values "
        "are the cached ones followed by the new ones (concatenate along the position "
        "dimension). The scores are then rectangular (query_pos < key_pos) and the queries are "
        "the last positions, so query i may see keys up to i + key_pos - query_pos: if your "
        "part-1 apply_causal_mask assumed square scores, shift it now (torch.triu's diagonal "
        "argument). Return each layer's full keys and values as the new cache.",
        "past = kv_cache.seq_len\n"
        "new = tokens[:, past:]\n"
        "residual = self.embed(new) + self.pos_embed(new, offset=past)\n"
        "layers = []\n"
        "for block, past_kv in zip(self.blocks, kv_cache.unbind(0)):\n"
        "    residual, kv = block(residual, past_kv)  # in Attention: k = torch.cat([past_kv[0], k], dim=1)\n"
        "    layers.append(kv)\n"
        "return self.unembed(self.ln_final(residual)), KeyValueCache(torch.stack(layers))",
    ),
    exercise(
        "cached_sample", 4, "sampling", "TransformerSampler.sample",
        "Sample with a KV cache: one step over the prompt fills it, then each step runs only the newest token.",
        "The tokens you draw must be exactly those of uncached sampling with the same seed: "
        "the cache changes the cost, never the result.",
        "With a cache the model takes the whole sequence so far plus the cache, runs only the "
        "positions the cache lacks, and returns (logits, new cache). Keep the new cache for the "
        "next step, and still give sample_next_token the full input_ids (the frequency penalty "
        "needs them).",
        "logits, kv_cache = self.model(input_ids[None], kv_cache)\n"
        "logits = logits[0, -1]",
    ),
    exercise(
        "cached_beam_search", 4, "beams", "Beams.generate",
        "Beam search with a KV cache: every beam owns one row of the cache, which must follow the beams.",
        "The cache's batch dimension is the beam dimension: row i holds the past keys and values of beam i.",
        "When generate turns each parent into k children, each child inherits its parent's "
        "cache row (index the cache with the same parent indices as the tokens). filter "
        "reorders and drops beams through Beams.__getitem__, which indexes the cache the same "
        "way. A cache that is not reordered gives beams another beam's past.",
        "logits, cache = self.model(self.tokens, self.kv_cache)\n"
        "logprobs = logits[:, -1].log_softmax(dim=-1)\n"
        "...\n"
        "return self.new_beams(sums, tokens, cache[:, :, parents])",
    ),
)

# Each mistake rewrites one piece of the solutions the way a learner might get it wrong;
# `sampling-course plant-mistakes` checks that the named test file catches it.
MISTAKES: list[Mistake] = [
    Mistake(4, "positional offset forgotten", "transformer.py",
            "self.pos_embed(new_tokens, offset=past)", "self.pos_embed(new_tokens)", "test_kv_cache.py",
            why="embedding the new tokens at positions 0, 1, ... instead of right after the cached positions"),
    Mistake(4, "positional offset off by one", "transformer.py",
            "self.pos_embed(new_tokens, offset=past)", "self.pos_embed(new_tokens, offset=past + 1)",
            "test_kv_cache.py",
            why="embedding the new tokens one position too far on (offset seq_len + 1 instead of seq_len)"),
    Mistake(4, "new keys and values put before the cached ones", "transformer.py",
            "kv = torch.cat([past_kv, torch.stack([k, v])], dim=2)",
            "kv = torch.cat([torch.stack([k, v]), past_kv], dim=2)",
            "test_kv_cache.py",
            why="putting the new keys and values before the cached ones instead of after them"),
    Mistake(4, "mask not shifted for cached positions", "transformer.py",
            "diagonal=key_pos - query_pos + 1,", "diagonal=1,", "test_kv_cache.py",
            why="a causal mask not shifted by the number of cached keys, so the new queries are masked as if they sat at positions 0, 1, ..."),
    Mistake(4, "KeyValueCache.batch reads the position dimension", "transformer.py",
            "return self.shape[2]", "return self.shape[3]", "test_kv_cache.py",
            why="batch reading the position dimension (shape[3]) instead of the batch dimension (shape[2])"),
    Mistake(4, "KeyValueCache.k returns the values", "transformer.py",
            "return self.as_subclass(torch.Tensor)[:, 0]", "return self.as_subclass(torch.Tensor)[:, 1]",
            "test_kv_cache.py",
            why="k returning the values (index 1) instead of the keys (index 0)"),
    Mistake(4, "sample drops the cache the model returns", "sampling.py",
            "logits, kv_cache = self.model(input_ids[None], kv_cache)",
            "logits, _ = self.model(input_ids[None], kv_cache)", "test_kv_cache.py",
            why="throwing away the cache the model returns, so every step runs the whole sequence again"),
    Mistake(4, "cache rows tiled, not following the beams' parents", "beams.py",
            "self.new_beams(new_logprob_sums, new_tokens, cache, cache_rows=parents)",
            "self.new_beams(new_logprob_sums, new_tokens, cache, cache_rows=torch.arange(len(parents)) % len(self))",
            "test_kv_cache.py",
            why="giving the children cache rows in tiled order instead of their own parent's row"),
    Mistake(4, "cache copied k times in the tiled order", "beams.py",
            "self.new_beams(new_logprob_sums, new_tokens, cache, cache_rows=parents)",
            "self.new_beams(new_logprob_sums, new_tokens, KeyValueCache(cache.repeat(1, 1, k, 1, 1, 1)))",
            "test_kv_cache.py",
            why="copying the cache k times in tiled order instead of giving each child its parent's row"),
    Mistake(4, "children keep the stale cache of the previous step", "beams.py",
            "self.new_beams(new_logprob_sums, new_tokens, cache, cache_rows=parents)",
            "self.new_beams(new_logprob_sums, new_tokens, self.kv_cache, cache_rows=parents)", "test_kv_cache.py",
            why="giving the children the cache from before this step instead of the one the model just extended"),
]
