"""How to put right each of part 1's planted mistakes, keyed by the mistake's name: the sentence shown
after "Fix: " when a learner's failing code behaves like that mistake (see grading/diagnosis.describe_match).

Each names the call or formula the solution uses where the mistake went wrong."""

from __future__ import annotations

FIXES: dict[str, str] = {
    "LayerNorm with unbiased variance":
        "take the plain mean of the squared deviations, residual.pow(2).mean(dim=-1), which divides by d_model",
    "LayerNorm eps outside the sqrt": "add layer_norm_eps to the variance before the square root: (var + eps).sqrt()",
    "LayerNorm without w": "multiply the normalised vector by w before adding b: residual / scale * w + b",
    "LayerNorm without b": "add b after scaling by w: residual / scale * w + b",
    "attention scaled by d_model": "divide the scores by sqrt(d_head), the size of one head's query, not sqrt(d_model)",
    "attention not scaled": "divide the query-key scores by math.sqrt(d_head) before the mask and the softmax",
    "causal mask hides the diagonal":
        ("mask strictly above the diagonal, torch.triu(..., diagonal=1) (key_pos - query_pos + 1 with a cache), so "
         "each token sees itself"),
    "causal mask lets one future token through":
        "mask from the first key after the query, torch.triu(..., diagonal=1) (key_pos - query_pos + 1 with a cache)",
    "MLP with relu": "apply gelu_new, GPT-2's tanh approximation of GELU, to the MLP's hidden layer",
    "MLP with erf gelu":
        "use gelu_new, 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3))), not torch's exact GELU",
    "positions not added": "add the positional embedding to the token embedding: embed(tokens) + pos_embed(tokens)",
    "missing b_Q": "add b_Q to the queries after the einsum with W_Q",
    "missing b_V": "add b_V to the values after the einsum with W_V",
    "missing b_O": "add b_O once, after summing every head's output through W_O",
    "missing b_in": "add b_in to the MLP's hidden layer before the GELU",
    "missing b_out": "add b_out after the einsum with W_out",
    "missing b_U": "add b_U to the logits after the einsum with W_U",
}
