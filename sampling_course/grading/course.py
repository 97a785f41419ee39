"""The course map: every exercise in order, what it asks, and three hints for each.

The names here are the names the tests use in ``@pytest.mark.exercise("<name>")``, so
``check("LayerNorm")``, ``sampling-course check LayerNorm`` and
``pytest --exercise LayerNorm`` all mean the same tests.

Each exercise also records where its code lives (``module`` and ``target``, relative to
the ``solutions``/``exercises`` package), which is what ``check(name, obj=...)``
replaces with an object defined in a notebook.

Hints are graded: the first nudges, the second names the technique and the classic
trap, the third is close to the solution.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

__all__ = ["Exercise", "EXERCISES", "PARTS", "UnknownExerciseError", "get_exercise", "exercise_names"]

PARTS: dict[int, str] = {
    1: "GPT-2 from scratch",
    2: "Sampling",
    3: "Beam search",
    4: "KV cache",
}


@dataclass(frozen=True)
class Exercise:
    """One exercise of the course.

    ``module`` is the file in ``solutions/``/``exercises/`` that holds the code and
    ``target`` the attribute path inside it (``"LayerNorm"``,
    ``"TransformerSampler.sample_top_p"``) that ``check(name, obj=...)`` replaces.
    """

    name: str
    part: int
    module: str
    target: str
    task: str
    hints: tuple[str, str, str]

    @property
    def part_title(self) -> str:
        return PARTS[self.part]

    @property
    def location(self) -> str:
        """Where a learner fills it in, e.g. ``exercises/transformer.py: LayerNorm``."""
        return f"exercises/{self.module}.py: {self.target}"

    def hint(self, level: int) -> str:
        """Hint ``level`` (1 = gentle ... 3 = nearly the solution)."""
        if not 1 <= level <= len(self.hints):
            raise ValueError(f"{self.name} has hints 1 to {len(self.hints)}, not {level!r}")
        return self.hints[level - 1]


def _ex(name: str, part: int, module: str, target: str, task: str, *hints: str) -> Exercise:
    if len(hints) != 3:
        raise ValueError(f"{name}: expected 3 hints, got {len(hints)}")
    return Exercise(name, part, module, target, task, tuple(hints))  # type: ignore[arg-type]


EXERCISES: tuple[Exercise, ...] = (
    # -----------------------------------------------------------------------------------
    # Part 1: GPT-2 from scratch
    # -----------------------------------------------------------------------------------
    _ex(
        "LayerNorm", 1, "transformer", "LayerNorm",
        "Normalise each position's residual vector to mean 0 and variance 1, then scale by w and shift by b.",
        "All statistics are taken over the last dimension (d_model) only, separately for every "
        "batch entry and position. keepdim=True lets them broadcast back over the vector.",
        "Subtract the mean, then divide by sqrt(variance + layer_norm_eps). Two classic traps: "
        "GPT-2 uses the biased variance (divide by d_model, i.e. unbiased=False), and eps goes "
        "inside the square root, not added to it afterwards.",
        "x = residual - residual.mean(dim=-1, keepdim=True)\n"
        "x = x / (x.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt()\n"
        "return x * self.w + self.b",
    ),
    _ex(
        "Embed", 1, "transformer", "Embed",
        "Look up the embedding vector of every token: one row of W_E per token id.",
        "W_E has shape (d_vocab, d_model): row i is the vector of token id i.",
        "Indexing a tensor with an integer tensor works for any shape of index: indexing W_E "
        "with a (batch, pos) tensor of ids gives a (batch, pos, d_model) tensor. No loop needed.",
        "return self.W_E[tokens]",
    ),
    _ex(
        "PosEmbed", 1, "transformer", "PosEmbed",
        "Return the learned embedding of each position, the same for every sequence in the batch.",
        "The result depends only on how many positions there are (tokens.shape[1]), never on "
        "the token ids themselves.",
        "Take rows offset .. offset + seq_len - 1 of W_pos (offset is 0 unless a KV cache already "
        "holds earlier positions) and repeat them along a new batch dimension.",
        "batch, seq_len = tokens.shape\n"
        "positions = self.W_pos[offset : offset + seq_len]\n"
        'return einops.repeat(positions, "pos d_model -> batch pos d_model", batch=batch)',
    ),
    _ex(
        "apply_causal_mask", 1, "transformer", "Attention.apply_causal_mask",
        "Hide every key that lies after its query by writing IGNORE into its attention score.",
        "Score [q, k] must be hidden exactly when key k is in the future of query q. A token "
        "may attend to itself, so the diagonal stays visible and no row is ever fully masked.",
        "Build a boolean (query_pos, key_pos) mask with torch.triu(..., diagonal=...) on the scores' "
        "device and apply it with masked_fill(mask, self.IGNORE). The queries are the last "
        "query_pos of the key_pos positions (earlier keys may come from a cache), so the diagonal "
        "offset is key_pos - query_pos + 1, which is 1 without a cache.",
        "query_pos, key_pos = attn_scores.shape[-2:]\n"
        "future = torch.triu(torch.ones(query_pos, key_pos, dtype=torch.bool, device=attn_scores.device),\n"
        "                    diagonal=key_pos - query_pos + 1)\n"
        "return attn_scores.masked_fill(future, self.IGNORE)",
    ),
    _ex(
        "Attention", 1, "transformer", "Attention",
        "Causal multi-head self-attention: per-head queries, keys and values, scaled and masked "
        "scores, softmax, weighted values, and the output projection.",
        "Follow the shapes: W_Q, W_K, W_V are (n_heads, d_model, d_head), so q, k and v are "
        "(batch, pos, n_heads, d_head) once b_Q, b_K, b_V are added; the scores are "
        "(batch, n_heads, query_pos, key_pos).",
        "Divide the scores by sqrt(d_head) (not sqrt(d_model)), apply self.apply_causal_mask "
        "before the softmax over key_pos, and mix the values with the pattern. Each head "
        "writes through its own slice of W_O and the heads are summed; b_O is added once.",
        'q = einops.einsum(x, self.W_Q, "b s d, n d h -> b s n h") + self.b_Q   # same for k, v\n'
        'scores = einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)\n'
        "pattern = self.apply_causal_mask(scores).softmax(dim=-1)\n"
        'z = einops.einsum(pattern, v, "b n q k, b k n h -> b q n h")\n'
        'return einops.einsum(z, self.W_O, "b q n h, n h d -> b q d") + self.b_O',
    ),
    _ex(
        "MLP", 1, "transformer", "MLP",
        "Expand to d_mlp with W_in, apply GPT-2's gelu_new, project back to d_model with W_out.",
        "Two affine maps with a non-linearity between them, and both have a bias (b_in, b_out).",
        "GPT-2's GELU is the tanh approximation: use this module's gelu_new, not torch's default "
        "exact (erf) GELU and not ReLU. The difference is small but the tests see it.",
        'pre = einops.einsum(x, self.W_in, "b s d, d m -> b s m") + self.b_in\n'
        'return einops.einsum(gelu_new(pre), self.W_out, "b s m, m d -> b s d") + self.b_out',
    ),
    _ex(
        "TransformerBlock", 1, "transformer", "TransformerBlock",
        "A pre-LayerNorm block: add attention(ln1(resid)) to the residual stream, then add mlp(ln2(resid_mid)).",
        "Each sub-layer reads a normalised copy of the residual stream and its output is added "
        "to the stream, never substituted for it.",
        "ln2 normalises resid_mid, the stream after the attention output has been added, not "
        "resid_pre. Both residual additions are needed.",
        "resid_mid = resid_pre + self.attn(self.ln1(resid_pre))\n"
        "return resid_mid + self.mlp(self.ln2(resid_mid))",
    ),
    _ex(
        "Unembed", 1, "transformer", "Unembed",
        "Map the final residual stream to one logit per vocabulary entry with W_U and b_U.",
        "W_U is (d_model, d_vocab): a matrix product over d_model at every position.",
        "Do not drop b_U. GPT-2's own b_U is zero, but the tests also use a non-zero one.",
        'return einops.einsum(x, self.W_U, "b s d, d v -> b s v") + self.b_U',
    ),
    _ex(
        "DemoTransformer", 1, "transformer", "DemoTransformer",
        "Chain it all: token + positional embeddings, every block in order, the final LayerNorm, unembed.",
        "The residual stream starts as the sum of the token embedding and the positional "
        "embedding of the same tokens.",
        "Feed the stream through self.blocks one after the other (each returns the new stream), "
        "then ln_final, then unembed. The logits come back for every position, not just the last.",
        "residual = self.embed(tokens) + self.pos_embed(tokens)\n"
        "for block in self.blocks:\n"
        "    residual = block(residual)\n"
        "return self.unembed(self.ln_final(residual))",
    ),
    # -----------------------------------------------------------------------------------
    # Part 2: Sampling
    # -----------------------------------------------------------------------------------
    _ex(
        "greedy_search", 2, "sampling", "TransformerSampler.greedy_search",
        "Pick the most likely next token.",
        "Greedy decoding has no randomness. Softmax keeps the order of the logits, so you do "
        "not need probabilities at all.",
        "Take the argmax over the last (vocabulary) dimension, so that any leading batch "
        "dimensions are kept. On ties argmax returns the first index, as Hugging Face does.",
        "return logits.argmax(dim=-1)",
    ),
    _ex(
        "sample_basic", 2, "sampling", "TransformerSampler.sample_basic",
        "Draw one token at random from softmax(logits), for every leading index.",
        "Turn the logits into probabilities over the vocabulary, then draw one index according to them.",
        "Use torch.multinomial(probs, num_samples=1): it is the draw Hugging Face makes, so with "
        "the same seed you get the same tokens. It takes 1-D or 2-D input only, so flatten the "
        "leading dimensions first and restore them afterwards.",
        "probs = logits.softmax(dim=-1)\n"
        "draws = torch.multinomial(probs.reshape(-1, probs.shape[-1]), num_samples=1)\n"
        "return draws.reshape(logits.shape[:-1])",
    ),
    _ex(
        "apply_temperature", 2, "sampling", "TransformerSampler.apply_temperature",
        "Scale the logits by the temperature: below 1 sharpens the distribution, above 1 flattens it.",
        "Think about the limits: as the temperature goes to 0 sampling should become greedy, "
        "and as it grows the distribution should approach uniform.",
        "Divide the logits by the temperature; multiplying does the opposite of what you want. "
        "Temperature 0 never reaches this function: sample_next_token treats it as greedy.",
        "return logits / temperature",
    ),
    _ex(
        "apply_frequency_penalty", 2, "sampling", "TransformerSampler.apply_frequency_penalty",
        "Lower each token's logit by freq_penalty for every time it already occurs in input_ids.",
        "A token that occurs n times in the input so far loses n * freq_penalty; tokens that "
        "never occurred keep their logit.",
        "torch.bincount(input_ids, minlength=d_vocab) counts every token id in one call and "
        "gives a vector as long as the vocabulary. The penalty is per occurrence, not once per "
        "distinct token.",
        "counts = torch.bincount(input_ids, minlength=logits.shape[-1])\n"
        "return logits - freq_penalty * counts.to(logits.dtype)",
    ),
    _ex(
        "sample_top_k", 2, "sampling", "TransformerSampler.sample_top_k",
        "Draw the next token from the k most likely tokens only, renormalised.",
        "Keep the k largest logits, sample among them, then translate the position you drew "
        "back into a vocabulary id.",
        "logits.topk(k, dim=-1) returns the values and their token ids. Sampling from the kept "
        "logits with sample_basic renormalises them for you; gather the chosen id from the "
        "indices.",
        "top_logits, top_tokens = logits.topk(k, dim=-1)\n"
        "choice = TransformerSampler.sample_basic(top_logits)\n"
        "return top_tokens.gather(-1, choice[..., None])[..., 0]",
    ),
    _ex(
        "sample_top_p", 2, "sampling", "TransformerSampler.sample_top_p",
        "Nucleus sampling: draw from the smallest set of most likely tokens whose probability adds up to at least top_p.",
        "Sort the tokens from most to least likely and walk down the list adding up their "
        "probabilities; stop as soon as the total reaches top_p.",
        "The cutoff is inclusive: the token that takes the running total to top_p or past it is "
        "kept. Equivalently, keep a token when the probability of the tokens ranked above it "
        "(cumsum minus its own probability) is still < top_p. Always keep at least "
        "min_tokens_to_keep tokens, and map the sorted position you draw back to a token id.",
        "sorted_logits, sorted_tokens = logits.sort(dim=-1, descending=True)\n"
        "probs = sorted_logits.softmax(dim=-1)\n"
        "keep = probs.cumsum(dim=-1) - probs < top_p\n"
        "keep[..., :min_tokens_to_keep] = True\n"
        'choice = TransformerSampler.sample_basic(sorted_logits.masked_fill(~keep, float("-inf")))\n'
        "return sorted_tokens.gather(-1, choice[..., None])[..., 0]",
    ),
    _ex(
        "sample_next_token", 2, "sampling", "TransformerSampler.sample_next_token",
        "Turn one position's logits into the next token according to the decoding settings.",
        "Temperature 0 means greedy decoding: return greedy_search's token and ignore the other settings.",
        "Otherwise the order is fixed: apply the temperature, then the frequency penalty (only "
        "when it is non-zero), then top-k or top-p (whichever is set), else plain sampling. "
        "Return a Python int.",
        "if temperature == 0: return int(greedy_search(logits))\n"
        "logits = apply_temperature(logits, temperature)\n"
        "if frequency_penalty != 0.0: logits = apply_frequency_penalty(input_ids, logits, frequency_penalty)\n"
        "if top_k > 0: return int(sample_top_k(logits, top_k))\n"
        "if top_p > 0.0: return int(sample_top_p(logits, top_p))\n"
        "return int(sample_basic(logits))",
    ),
    _ex(
        "sample", 2, "sampling", "TransformerSampler.sample",
        "The generation loop: run the model, pick a token, append it, until max_tokens_generated or end-of-text.",
        "Only the logits of the last position matter for the next token, and the model must "
        "never see more than n_ctx positions.",
        "Each step: logits = model(input_ids[None, -n_ctx:])[0, -1], then "
        "sample_next_token(input_ids, logits, **kwargs), then append the token. Stop after "
        "(not before) the end-of-text token, and decode the whole sequence, prompt included.",
        "for _ in range(max_tokens_generated):\n"
        "    logits = self.model(input_ids[None, -self.cfg.n_ctx:])[0, -1]\n"
        "    next_token = self.sample_next_token(input_ids, logits, **kwargs)\n"
        "    input_ids = torch.cat([input_ids, input_ids.new_tensor([next_token])])\n"
        "    if next_token == self.tokenizer.eos_token_id: break\n"
        "return self.tokenizer.decode(input_ids)",
    ),
    # -----------------------------------------------------------------------------------
    # Part 3: Beam search
    # -----------------------------------------------------------------------------------
    _ex(
        "Beams.generate", 3, "beams", "Beams.generate",
        "Extend every beam by each of its k most likely next tokens, adding their log-probs to the beam's sum.",
        "Beams are ranked by the sum of the log-probabilities of their tokens, so take "
        "log_softmax of the last position's logits: raw logits are only defined up to a "
        "per-beam constant and cannot be summed across beams.",
        "Get each beam's k best tokens from get_topk_non_repeating (so n-gram blocking applies). "
        "Every parent is repeated k times, children grouped by parent in order: child sum = "
        "parent sum + the token's log-prob, child tokens = parent tokens + the token.",
        "logprobs = self.model(self.tokens)[:, -1].log_softmax(dim=-1)\n"
        "top_lp, top_tok = self.get_topk_non_repeating(logprobs, no_repeat_ngram_size, k)\n"
        "parents = torch.arange(len(self)).repeat_interleave(k)\n"
        "sums = (self.logprob_sums[:, None] + top_lp).flatten()\n"
        "tokens = torch.cat([self.tokens[parents], top_tok.flatten()[:, None]], dim=-1)\n"
        "return self.new_beams(sums, tokens)",
    ),
    _ex(
        "Beams.get_topk_non_repeating", 3, "beams", "Beams.get_topk_non_repeating",
        "The top k next tokens of each beam, never completing an n-gram the beam already contains.",
        "With n = no_repeat_ngram_size, the beam's last n - 1 tokens plus a candidate form an "
        "n-gram. If that n-gram already occurs anywhere in the beam (prompt included), the "
        "candidate is blocked (log-prob -inf) before taking the top k. None means a plain topk.",
        "The rule is Hugging Face's NoRepeatNGramLogitsProcessor: for every earlier window where "
        "tokens[i : i + n - 1] equals the last n - 1 tokens, block tokens[i + n - 1]. Mind the "
        "off-by-one: the window is n - 1 long and the blocked token is the one right after it. "
        "With n = 1 every token already present is blocked; a beam shorter than n blocks nothing.",
        "ngrams = self.tokens.unfold(1, n, 1)                      # (batch, windows, n)\n"
        "tail = self.tokens[:, seq_len - (n - 1):]\n"
        "live = (ngrams[:, :, :-1] == tail[:, None, :]).all(dim=-1)\n"
        "blocked = torch.zeros_like(logprobs, dtype=torch.long).scatter_add_(1, ngrams[:, :, -1], live.long())\n"
        'return logprobs.masked_fill(blocked > 0, float("-inf")).topk(k, dim=-1)',
    ),
    _ex(
        "Beams.filter", 3, "beams", "Beams.filter",
        "Keep the k best beams and split them into those still going and those that just ended with end-of-text.",
        "Rank all beams by logprob_sums, best first, and keep the top k before splitting them.",
        "A beam whose last token is eos_token_id is finished: it goes to the terminated beams "
        "and must not appear among the continuing ones, or it would be extended past its end.",
        "best = self.logprob_sums.topk(min(k, len(self))).indices\n"
        "ended = self.tokens[best, -1] == self.tokenizer.eos_token_id\n"
        "return self[best[~ended]], self[best[ended]]",
    ),
    _ex(
        "beam_search", 3, "sampling", "TransformerSampler.beam_search",
        "Run beam search from the prompt and return the best num_return_sequences as (log-prob sum, text).",
        "Start from one beam, the prompt, with log-prob sum 0; every step is a generate "
        "followed by a filter.",
        "Each step: beams.generate(k=num_beams, ...), then beams.filter(k=num_beams). Set the "
        "terminated beams aside as finished and return as soon as num_return_sequences have "
        "finished; after max_new_tokens steps, top up with the best unfinished beams.",
        "for _ in range(max_new_tokens):\n"
        "    beams = beams.generate(k=num_beams, no_repeat_ngram_size=no_repeat_ngram_size)\n"
        "    beams, terminated = beams.filter(k=num_beams)\n"
        "    finished.extend(terminated.logprobs_and_completions())\n"
        "    if len(finished) >= num_return_sequences: return finished[:num_return_sequences]\n"
        "finished.extend(beams.logprobs_and_completions())\n"
        "return finished[:num_return_sequences]",
    ),
    # -----------------------------------------------------------------------------------
    # Part 4: KV cache
    # -----------------------------------------------------------------------------------
    _ex(
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
    _ex(
        "cached_forward", 4, "transformer", "DemoTransformer.cached_forward",
        "Run only the positions the cache does not hold yet and return their logits and the extended cache.",
        "The new tokens sit at positions seq_len, seq_len + 1, ... of the sequence, so their "
        "positional embedding must start at the cache's seq_len, not at 0.",
        "In every layer the queries come from the new positions only, while the keys and values "
        "are the cached ones followed by the new ones (concatenate along the position "
        "dimension). The mask is then rectangular; apply_causal_mask's key_pos - query_pos + 1 "
        "offset already handles it. Return each layer's full keys and values as the new cache.",
        "past = kv_cache.seq_len\n"
        "new = tokens[:, past:]\n"
        "residual = self.embed(new) + self.pos_embed(new, offset=past)\n"
        "layers = []\n"
        "for block, past_kv in zip(self.blocks, kv_cache.unbind(0)):\n"
        "    residual, kv = block(residual, past_kv)  # in Attention: k = torch.cat([past_kv[0], k], dim=1)\n"
        "    layers.append(kv)\n"
        "return self.unembed(self.ln_final(residual)), KeyValueCache(torch.stack(layers))",
    ),
    _ex(
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
    _ex(
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

_BY_NAME: dict[str, Exercise] = {exercise.name.lower(): exercise for exercise in EXERCISES}


class UnknownExerciseError(ValueError):
    """No exercise of the course has that name."""


def exercise_names() -> list[str]:
    """Every exercise name, in course order."""
    return [exercise.name for exercise in EXERCISES]


def get_exercise(name: str | Exercise) -> Exercise:
    """The exercise called ``name`` (case-insensitive), e.g. ``get_exercise("layernorm")``.

    Raises ``UnknownExerciseError`` (a ValueError) listing the valid names, closest first.
    """
    if isinstance(name, Exercise):
        return name
    if not isinstance(name, str):
        raise TypeError(f"an exercise name must be a string, got {type(name).__name__}")
    try:
        return _BY_NAME[name.strip().lower()]
    except KeyError:
        pass
    close = difflib.get_close_matches(name.strip().lower(), list(_BY_NAME), n=3, cutoff=0.5)
    suggestion = f" Did you mean {' or '.join(repr(_BY_NAME[c].name) for c in close)}?" if close else ""
    by_part = "; ".join(
        f"part {part} ({title}): " + ", ".join(e.name for e in EXERCISES if e.part == part)
        for part, title in PARTS.items()
    )
    raise UnknownExerciseError(f"there is no exercise called {name!r}.{suggestion} Valid names: {by_part}")
