"""Part 1, GPT-2 from scratch: its exercises (what each asks, three graded hints) and its planted mistakes."""

from __future__ import annotations

from sampling_course.grading.catalogue import Exercise, Mistake, exercise

PART = 1
TITLE = "GPT-2 from scratch"

EXERCISES: tuple[Exercise, ...] = (
    exercise(
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
    exercise(
        "Embed", 1, "transformer", "Embed",
        "Look up the embedding vector of every token: one row of W_E per token id.",
        "W_E has shape (d_vocab, d_model): row i is the vector of token id i.",
        "Indexing a tensor with an integer tensor works for any shape of index: indexing W_E "
        "with a (batch, pos) tensor of ids gives a (batch, pos, d_model) tensor. No loop needed.",
        "return self.W_E[tokens]",
    ),
    exercise(
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
    exercise(
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
    exercise(
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
    exercise(
        "MLP", 1, "transformer", "MLP",
        "Expand to d_mlp with W_in, apply GPT-2's gelu_new, project back to d_model with W_out.",
        "Two affine maps with a non-linearity between them, and both have a bias (b_in, b_out).",
        "GPT-2's GELU is the tanh approximation: use this module's gelu_new, not torch's default "
        "exact (erf) GELU and not ReLU. The difference is small but the tests see it.",
        'pre = einops.einsum(x, self.W_in, "b s d, d m -> b s m") + self.b_in\n'
        'return einops.einsum(gelu_new(pre), self.W_out, "b s m, m d -> b s d") + self.b_out',
    ),
    exercise(
        "TransformerBlock", 1, "transformer", "TransformerBlock",
        "A pre-LayerNorm block: add attention(ln1(resid)) to the residual stream, then add mlp(ln2(resid_mid)).",
        "Each sub-layer reads a normalised copy of the residual stream and its output is added "
        "to the stream, never substituted for it.",
        "ln2 normalises resid_mid, the stream after the attention output has been added, not "
        "resid_pre. Both residual additions are needed.",
        "resid_mid = resid_pre + self.attn(self.ln1(resid_pre))\n"
        "return resid_mid + self.mlp(self.ln2(resid_mid))",
    ),
    exercise(
        "Unembed", 1, "transformer", "Unembed",
        "Map the final residual stream to one logit per vocabulary entry with W_U and b_U.",
        "W_U is (d_model, d_vocab): a matrix product over d_model at every position.",
        "Do not drop b_U. GPT-2's own b_U is zero, but the tests also use a non-zero one.",
        'return einops.einsum(x, self.W_U, "b s d, d v -> b s v") + self.b_U',
    ),
    exercise(
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
)

# Each mistake rewrites one piece of the solutions the way a learner might get it wrong;
# `sampling-course plant-mistakes` checks that the named test file catches it.
MISTAKES: list[Mistake] = [
    Mistake(1, "LayerNorm with unbiased variance", "transformer.py",
            "residual.pow(2).mean(dim=-1, keepdim=True)",
            "residual.var(dim=-1, keepdim=True, unbiased=True)", "test_transformer.py"),
    Mistake(1, "LayerNorm eps outside the sqrt", "transformer.py",
            "(residual.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt()",
            "residual.pow(2).mean(dim=-1, keepdim=True).sqrt() + self.cfg.layer_norm_eps", "test_transformer.py"),
    Mistake(1, "LayerNorm without w", "transformer.py",
            "return residual / scale * self.w + self.b", "return residual / scale + self.b", "test_transformer.py"),
    Mistake(1, "LayerNorm without b", "transformer.py",
            "return residual / scale * self.w + self.b", "return residual / scale * self.w", "test_transformer.py"),
    Mistake(1, "attention scaled by d_model", "transformer.py",
            '"b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)',
            '"b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_model)', "test_transformer.py"),
    Mistake(1, "attention not scaled", "transformer.py",
            '"b q n h, b k n h -> b n q k") / math.sqrt(self.cfg.d_head)',
            '"b q n h, b k n h -> b n q k")', "test_transformer.py"),
    Mistake(1, "causal mask hides the diagonal", "transformer.py",
            "diagonal=key_pos - query_pos + 1,", "diagonal=key_pos - query_pos,", "test_transformer.py"),
    Mistake(1, "causal mask lets one future token through", "transformer.py",
            "diagonal=key_pos - query_pos + 1,", "diagonal=key_pos - query_pos + 2,", "test_transformer.py"),
    Mistake(1, "MLP with relu", "transformer.py",
            "einops.einsum(gelu_new(pre),", "einops.einsum(torch.relu(pre),", "test_transformer.py"),
    Mistake(1, "MLP with erf gelu", "transformer.py",
            "einops.einsum(gelu_new(pre),", "einops.einsum(torch.nn.functional.gelu(pre),", "test_transformer.py"),
    Mistake(1, "positions not added", "transformer.py",
            "residual = self.embed(tokens) + self.pos_embed(tokens)\n", "residual = self.embed(tokens)\n",
            "test_transformer.py"),
    Mistake(1, "missing b_Q", "transformer.py",
            '"b s n d, n d h -> b s n h") + self.b_Q', '"b s n d, n d h -> b s n h")', "test_transformer.py"),
    Mistake(1, "missing b_V", "transformer.py",
            '"b s n d, n d h -> b s n h") + self.b_V', '"b s n d, n d h -> b s n h")', "test_transformer.py"),
    Mistake(1, "missing b_O", "transformer.py",
            '"b q n h, n h d -> b q d") + self.b_O', '"b q n h, n h d -> b q d")', "test_transformer.py"),
    Mistake(1, "missing b_in", "transformer.py",
            '"b s d, d m -> b s m") + self.b_in', '"b s d, d m -> b s m")', "test_transformer.py"),
    Mistake(1, "missing b_out", "transformer.py",
            '"b s m, m d -> b s d") + self.b_out', '"b s m, m d -> b s d")', "test_transformer.py"),
    Mistake(1, "missing b_U", "transformer.py",
            '"b s d, d v -> b s v") + self.b_U', '"b s d, d v -> b s v")', "test_transformer.py"),
]
