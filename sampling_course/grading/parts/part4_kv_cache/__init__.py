"""Part 4, KV cache: its exercises (what each asks, three graded hints) and its planted mistakes."""

from __future__ import annotations

from sampling_course.grading.catalogue import Exercise, Mistake, Variant, exercise, with_fixes
from sampling_course.grading.parts.part4_kv_cache.texts import (
    CACHE_METHODS as _CACHE_METHODS, CACHED_FORWARD as _CACHED_FORWARD,
)

PART = 4
TITLE = "KV cache"

EXERCISES: tuple[Exercise, ...] = (
    exercise(
        "KeyValueCache", 4, "kv_cache", "KeyValueCache",
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
        "cached_forward", 4, "transformer", "DemoTransformer.forward",
        "Run only the positions the cache does not hold yet and return their logits and the extended cache: "
        "the same forward pass, with the cache's hook (prepare, update in every attention, commit).",
        "The new tokens sit at positions seq_len, seq_len + 1, ... of the sequence, so their "
        "positional embedding must start at the cache's seq_len, not at 0 (step_after in kv_cache.py "
        "decides the positions; the forward embeds W_pos[step.positions]).",
        "In every layer the queries come from the new positions only, while the keys and values "
        "are the cached ones followed by the new ones (GrowingCache.update concatenates along the "
        "position dimension; Attention.forward hands k and v to cache.update and attends to what it "
        "returns). The scores are then rectangular (query_pos < key_pos) and the queries are "
        "the last positions, so query i may see keys up to i + key_pos - query_pos: if your "
        "part-1 apply_causal_mask assumed square scores, shift it now (torch.triu's diagonal argument).",
        "step = cache.prepare(tokens, attention_mask)\n"
        "residual = self.embed(step.new_tokens) + self.pos_embed.W_pos[step.positions]\n"
        "for layer, block in enumerate(self.blocks):\n"
        "    residual, _ = block(residual, LayerCache(cache, layer, step.mask))\n"
        "# (the given code after your lines unembeds the residual)\n"
        "# in Attention.forward: k, v = cache.update(k, v)\n"
        "# in step_after: positions = torch.arange(past, tokens.shape[1])[None]\n"
        "# in GrowingCache.update: kv = torch.cat([past_kv, torch.stack([k, v])], dim=2)",
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
# `sampling-course plant-mistakes` checks that the tests of its exercise catch it.
# The attention-cache mistakes rewrite part 1's Attention, yet only the cached forward
# reveals them (without a cache the scores are square): they name that exercise.
MISTAKES: list[Mistake] = [
    Mistake(4, "positional offset forgotten", "kv_cache.py",
            "positions = torch.arange(past, tokens.shape[1], device=tokens.device)[None]",
            "positions = torch.arange(tokens.shape[1] - past, device=tokens.device)[None]", exercise="cached_forward",
            why="embedding the new tokens at positions 0, 1, ... instead of right after the cached positions"),
    Mistake(4, "positional offset off by one", "kv_cache.py",
            "positions = torch.arange(past, tokens.shape[1], device=tokens.device)[None]",
            "positions = torch.arange(past + 1, tokens.shape[1] + 1, device=tokens.device)[None]", exercise="cached_forward",
            why="embedding the new tokens one position too far on (from seq_len + 1 instead of seq_len)"),
    Mistake(4, "new keys and values put before the cached ones", "kv_cache.py",
            "kv = torch.cat([past_kv, torch.stack([k, v])], dim=2)",
            "kv = torch.cat([torch.stack([k, v]), past_kv], dim=2)", exercise="cached_forward",
            why="putting the new keys and values before the cached ones instead of after them"),
    Mistake(4, "mask not shifted for cached positions", "transformer.py",
            "diagonal=key_pos - query_pos + 1,", "diagonal=1,", exercise="cached_forward",
            why="a causal mask not shifted by the number of cached keys, so the new queries are masked as if they sat at positions 0, 1, ..."),
    Mistake(4, "KeyValueCache.batch reads the position dimension", "kv_cache.py",
            "return self.shape[2]", "return self.shape[3]",
            why="batch reading the position dimension (shape[3]) instead of the batch dimension (shape[2])"),
    Mistake(4, "KeyValueCache.k returns the values", "kv_cache.py",
            "return self.as_subclass(torch.Tensor)[:, 0]", "return self.as_subclass(torch.Tensor)[:, 1]",
            why="k returning the values (index 1) instead of the keys (index 0)"),
    Mistake(4, "sample drops the cache the model returns", "sampling.py",
            "logits, kv_cache = self.model(input_ids[None], kv_cache)",
            "logits, _ = self.model(input_ids[None], kv_cache)",
            why="throwing away the cache the model returns, so every step runs the whole sequence again"),
    Mistake(4, "cache rows tiled, not following the beams' parents", "beams.py",
            "self.new_beams(new_logprob_sums, new_tokens, cache, cache_rows=parents)",
            "self.new_beams(new_logprob_sums, new_tokens, cache, cache_rows=torch.arange(len(parents)) % len(self))",
            why="giving the children cache rows in tiled order instead of their own parent's row"),
    Mistake(4, "cache copied k times in the tiled order", "beams.py",
            "self.new_beams(new_logprob_sums, new_tokens, cache, cache_rows=parents)",
            "self.new_beams(new_logprob_sums, new_tokens, KeyValueCache(cache.repeat(1, 1, k, 1, 1, 1)))",
            why="copying the cache k times in tiled order instead of giving each child its parent's row"),
    Mistake(4, "children keep the stale cache of the previous step", "beams.py",
            "self.new_beams(new_logprob_sums, new_tokens, cache, cache_rows=parents)",
            "self.new_beams(new_logprob_sums, new_tokens, self.kv_cache, cache_rows=parents)",
            why="giving the children the cache from before this step instead of the one the model just extended"),
]

# Correct implementations in other styles than the solutions' (the way learners write them);
# `sampling-course plant-mistakes --variants` checks that every test of the exercise accepts each.


def _cache_methods(new_empty: str, k: str, v: str, batch: str, seq_len: str) -> str:
    return (
        new_empty + "\n\n"
        "    @property\n    def k(self) -> Tensor:\n" + k + "\n\n"
        "    @property\n    def v(self) -> Tensor:\n" + v + "\n\n"
        "    @property\n    def batch(self) -> int:\n" + batch + "\n\n"
        "    @property\n    def seq_len(self) -> int:\n" + seq_len + "\n"
    )


_CAUSAL_MASK = (
    "        future = torch.triu(\n"
    "            torch.ones(query_pos, key_pos, dtype=torch.bool, device=attn_scores.device),\n"
    "            diagonal=key_pos - query_pos + 1,\n"
    "        )\n"
    "        return attn_scores.masked_fill(future, self.IGNORE)\n"
)
_CACHED_STEP = (
    "                logits, kv_cache = self.model(input_ids[None], kv_cache)\n"
    "                logits = logits[0, -1]\n"
)
# The last line of Beams.generate: each child reads its parent's cache row.
_NEW_BEAMS = "        return self.new_beams(new_logprob_sums, new_tokens, cache, cache_rows=parents)\n"

# sample()'s whole body after the argument checks, and the same written as a while loop over
# a Python list of ids, whose cached branch is the exercise here.
_SAMPLE_BODY = (
    '        input_ids = self.tokenizer.encode(prompt, return_tensors="pt")[0].to(self.device)\n'
    "        if verbose:\n"
    '            print(prompt, end="", flush=True)\n'
    "        for _ in range(max_tokens_generated):\n"
    "            if kv_cache is None:\n"
    "                ### BEGIN SOLUTION\n"
    "                # The model has learned positions 0..n_ctx-1 only, so it sees the last n_ctx tokens.\n"
    "                logits = self.model(input_ids[None, -self.cfg.n_ctx :])[0, -1]\n"
    "                ### END SOLUTION\n"
    "            else:\n"
    "                ### BEGIN SOLUTION\n"
    "                # Hint: pass the whole sequence; the cache knows which positions are new.\n"
    + _CACHED_STEP
    + "                ### END SOLUTION\n"
    "            ### BEGIN SOLUTION\n"
    "            next_token = self.sample_next_token(input_ids, logits, **kwargs)\n"
    "            input_ids = torch.cat([input_ids, input_ids.new_tensor([next_token])])\n"
    "            ### END SOLUTION\n"
    "            if verbose:  # show the text as it grows\n"
    '                print(self.tokenizer.decode(input_ids[-1]), end="", flush=True)\n'
    "            ### BEGIN SOLUTION\n"
    "            # Stop after, not before, the end-of-text token: it is part of the output.\n"
    "            if next_token == self.tokenizer.eos_token_id:\n"
    "                break\n"
    "            ### END SOLUTION\n"
    "        if verbose:\n"
    "            print()\n"
    "        return self.tokenizer.decode(input_ids)\n"
)
_SAMPLE_WHILE_LOOP = (
    "        ids: list[int] = self.tokenizer.encode(prompt)\n"
    "        n_prompt = len(ids)\n"
    "        if verbose:\n"
    '            print(prompt, end="", flush=True)\n'
    "        while len(ids) < n_prompt + max_tokens_generated:\n"
    "            sequence = torch.tensor(ids, device=self.device)\n"
    "            if kv_cache is None:\n"
    "                context = sequence[max(0, len(ids) - self.cfg.n_ctx) :]\n"
    "                logits = self.model(context.unsqueeze(0)).squeeze(0)[-1]\n"
    "            else:\n"
    "                output, kv_cache = self.model(sequence.unsqueeze(0), kv_cache=kv_cache)\n"
    "                logits = output[0, -1, :]\n"
    "            token = self.sample_next_token(sequence, logits, **kwargs)\n"
    "            ids.append(int(token))\n"
    "            if verbose:\n"
    '                print(self.tokenizer.decode([ids[-1]]), end="", flush=True)\n'
    "            if ids[-1] == self.tokenizer.eos_token_id:\n"
    "                break\n"
    "        if verbose:\n"
    "            print()\n"
    "        return self.tokenizer.decode(ids)\n"
)
# The end of Beams.generate, and the same with Python loops that copy each child's cache row.
_GENERATE_TAIL = (
    "        logprobs = logits.log_softmax(dim=-1)\n"
    "        topk_logprobs, topk_tokens = self.get_topk_non_repeating(logprobs, no_repeat_ngram_size, k)\n"
    "        parents = torch.arange(len(self), device=self.tokens.device).repeat_interleave(k)\n"
    "        new_logprob_sums = (self.logprob_sums[:, None] + topk_logprobs).flatten()\n"
    "        new_tokens = torch.cat([self.tokens[parents], topk_tokens.flatten()[:, None]], dim=-1)\n"
    "        # Each child inherits its parent's cache row: it reads row parents[i], no copy needed.\n"
    + _NEW_BEAMS
)
_GENERATE_LOOPS = (
    "        logprobs = torch.log_softmax(logits, dim=-1)\n"
    "        topk_logprobs, topk_tokens = self.get_topk_non_repeating(logprobs, no_repeat_ngram_size, k)\n"
    "        sums, rows, parents = [], [], []\n"
    "        for beam in range(len(self)):\n"
    "            for rank in range(k):\n"
    "                sums.append(self.logprob_sums[beam] + topk_logprobs[beam, rank])\n"
    "                rows.append(torch.cat([self.tokens[beam], topk_tokens[beam, rank : rank + 1]]))\n"
    "                parents.append(beam)\n"
    "        new_cache = None if cache is None else cache[:, :, torch.tensor(parents, device=self.tokens.device)]\n"
    "        return self.new_beams(torch.stack(sums), torch.stack(rows), new_cache)\n"
)

VARIANTS: list[Variant] = [
    # KeyValueCache
    Variant(4, "KeyValueCache", "zeros, select/unbind, size()", "kv_cache.py", _CACHE_METHODS,
            _cache_methods(
                "        shape = (cfg.n_layers, 2, batch, 0, cfg.n_heads, cfg.d_head)\n"
                "        return KeyValueCache(torch.zeros(shape, device=device, dtype=dtype))",
                "        return self.select(1, 0)",
                "        return self.unbind(dim=1)[1]",
                "        return self.size(2)",
                "        return self.size(dim=3)",
            )),
    Variant(4, "KeyValueCache", "empty(0).reshape, narrow + squeeze, shape unpacking", "kv_cache.py",
            _CACHE_METHODS,
            _cache_methods(
                "        data = torch.empty(0, device=device, dtype=dtype)\n"
                "        return cls(data.reshape(cfg.n_layers, 2, batch, 0, cfg.n_heads, cfg.d_head))",
                "        return self.as_subclass(torch.Tensor).narrow(1, 0, 1).squeeze(1)",
                "        return self.as_subclass(torch.Tensor).narrow(1, 1, 1).squeeze(1)",
                "        n_layers, two, batch, seq_len, n_heads, d_head = self.shape\n        return batch",
                "        return self.shape[-3]",
            )),
    Variant(4, "KeyValueCache", "zeros(...) with the device, k/v by plain indexing, sizes read off k", "kv_cache.py",
            _CACHE_METHODS,
            _cache_methods(
                "        zeros = torch.zeros(cfg.n_layers, 2, batch, 0, cfg.n_heads, cfg.d_head, dtype=dtype, device=device)\n"
                "        return KeyValueCache(zeros)",
                "        return self[:, 0]",
                "        return self[:, 1]",
                "        return self.k.shape[1]",
                "        return self.k.size(2)",
            )),
    # cached_forward
    Variant(4, "cached_forward", "indexed layers, embeddings by F.embedding", "transformer.py",
            _CACHED_FORWARD,
            "        step = cache.prepare(tokens, attention_mask)\n"
            "        residual = torch.nn.functional.embedding(step.new_tokens, self.embed.W_E)\n"
            "        residual = residual + torch.nn.functional.embedding(step.positions, self.pos_embed.W_pos)\n"
            "        for layer in range(self.cfg.n_layers):\n"
            "            residual, kv = self.blocks[layer](residual, LayerCache(cache, layer, step.mask))\n"),
    Variant(4, "cached_forward", "positions of the whole sequence, then sliced", "kv_cache.py",
            "        positions = torch.arange(past, tokens.shape[1], device=tokens.device)[None]\n",
            "        positions = torch.arange(tokens.shape[1], device=tokens.device)[None, past:]\n"),
    Variant(4, "cached_forward", "keys and values concatenated separately", "kv_cache.py",
            "        kv = torch.cat([past_kv, torch.stack([k, v])], dim=2)\n",
            "        past_k, past_v = past_kv\n"
            "        k = torch.cat([past_k, k], dim=1)\n"
            "        v = torch.cat([past_v, v], dim=1)\n"
            "        kv = torch.stack([k, v], dim=0)\n"),
    Variant(4, "cached_forward", "shifted mask from arange comparisons", "transformer.py", _CAUSAL_MASK,
            "        offset = key_pos - query_pos  # keys already in the cache\n"
            "        rows = torch.arange(query_pos, device=attn_scores.device)[:, None] + offset\n"
            "        cols = torch.arange(key_pos, device=attn_scores.device)[None, :]\n"
            "        return torch.where(cols <= rows, attn_scores, self.IGNORE)\n"),
    Variant(4, "cached_forward", "shifted mask filled with -inf", "transformer.py", _CAUSAL_MASK,
            "        future = torch.ones(query_pos, key_pos, dtype=torch.bool, device=attn_scores.device)\n"
            "        future = future.triu(diagonal=key_pos - query_pos + 1)\n"
            '        return attn_scores.masked_fill(future, float("-inf"))\n'),
    # cached_sample
    Variant(4, "cached_sample", "tuple output unpacked by index, [0, -1, :]", "sampling.py", _CACHED_STEP,
            "                output = self.model(input_ids.unsqueeze(0), kv_cache=kv_cache)\n"
            "                kv_cache = output[1]\n"
            "                logits = output[0][0, -1, :]\n"),
    Variant(4, "cached_sample", "while loop over a Python list of ids", "sampling.py", _SAMPLE_BODY, _SAMPLE_WHILE_LOOP),
    Variant(4, "cached_sample", "squeeze the batch, then the last position", "sampling.py", _CACHED_STEP,
            "                all_logits, kv_cache = self.model(torch.stack([input_ids]), kv_cache)\n"
            "                logits = all_logits.squeeze(0)[-1]\n"),
    # cached_beam_search
    Variant(4, "cached_beam_search", "cache rows copied with cache[:, :, parents]", "beams.py",
            _NEW_BEAMS,
            "        new_cache = None if cache is None else cache[:, :, parents]\n"
            "        return self.new_beams(new_logprob_sums, new_tokens, new_cache)\n"),
    Variant(4, "cached_beam_search", "cache rows copied with repeat_interleave", "beams.py",
            _NEW_BEAMS,
            "        if cache is not None:\n"
            "            cache = KeyValueCache(cache.repeat_interleave(k, dim=2))\n"
            "        return self.new_beams(new_logprob_sums, new_tokens, cache)\n"),
    Variant(4, "cached_beam_search", "Python loops over beams and ranks, cache rows copied per child", "beams.py",
            _GENERATE_TAIL, _GENERATE_LOOPS),
]
from sampling_course.grading.parts.part4_kv_cache.classic import CLASSIC_VARIANTS  # noqa: E402  (reads the texts above)
from sampling_course.grading.parts.part4_kv_cache.fixes import FIXES  # noqa: E402  (each mistake's "Fix: " sentence)

VARIANTS += CLASSIC_VARIANTS
MISTAKES = with_fixes(MISTAKES, FIXES)
