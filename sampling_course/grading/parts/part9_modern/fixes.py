"""How to put right each of part 9's planted mistakes, keyed by the mistake's name: the sentence shown
after "Fix: " when a learner's failing code behaves like that mistake (see grading/diagnosis.describe_match).

Each names the call or formula the solution uses where the mistake went wrong."""

from __future__ import annotations

FIXES: dict[str, str] = {
    "RMSNorm with the mean subtracted":
        "scale x itself: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps), with no mean subtracted",
    "RMSNorm eps outside the sqrt": "add eps inside the root: torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)",
    "RMSNorm without w": "multiply the normalised vector by w",
    "RoPE rotating by the wrong half": "use torch.cat((-second, first), dim=-1) as the rotated half",
    "RoPE ignores the offset": "number the positions from the offset: torch.arange(offset, offset + seq_len)",
    "RoPE on values": "rotate only q and k; leave v as it is",
    "repeat instead of repeat_interleave for KV heads":
        "use k.repeat_interleave(group, dim=2) (and v likewise), so query head i reads KV head i // group",
    "attention scaled by d_model": "divide the scores by sqrt(d_head), the size of one head's query",
    "q/k norms after the rotation": "apply q_norm and k_norm to each head first, then rotate",
    "causal mask not shifted for the cache":
        "shift the diagonal by the number of cached keys: .triu(key_pos - query_pos + 1)",
    "SwiGLU gating the wrong projection": "apply SiLU to the gate: F.silu(x @ W_gate) * (x @ W_in)",
    "SwiGLU with GELU": "use F.silu on the gate projection",
    "position offset 0 on a cached step": "start at the cache's length: offset = 0 if cache is None else cache.seq_len",
    "cache length read inside the block loop":
        "read offset = cache.seq_len once, before the loop, and give every block that same offset",
    "Rotary returning float32": "cast the rotated result back: (x * cos + rotated_half * sin).to(x.dtype)",
    "final RMSNorm skipped": "apply ln_final before unembedding: ln_final(residual) @ W_U",
    "re-rotating the wrong way": "turn the kept keys back by the shift: rotate by -shift",
    "re-rotating each key by its own index": "turn every kept key by the same angle, the one for position -shift",
    "kept keys not re-rotated":
        "re-rotate the kept keys back by the number evicted: rerotate(rotary, kept_keys, evict)",
    "sinks evicted": "keep the first n_sink keys and values, and evict only from the positions after them",
}
