"""How to put right each of part 4's planted mistakes, keyed by the mistake's name: the sentence shown
after "Fix: " when a learner's failing code behaves like that mistake (see grading/diagnosis.describe_match).

Each names the call or formula the solution uses where the mistake went wrong."""

from __future__ import annotations

FIXES: dict[str, str] = {
    "positional offset forgotten":
        "give the new tokens the positions from the cached length on: torch.arange(past, tokens.shape[1])",
    "positional offset off by one":
        "start the new tokens' positions at the cached length itself: torch.arange(past, ...), not past + 1",
    "new keys and values put before the cached ones":
        "append the new keys and values after the cached ones: torch.cat([past_kv, torch.stack([k, v])], dim=2)",
    "mask not shifted for cached positions":
        "shift the diagonal by the number of cached keys: torch.triu(..., diagonal=key_pos - query_pos + 1)",
    "KeyValueCache.batch reads the position dimension":
        "return shape[2], the batch dimension of (layer, k/v, batch, position, head, d_head)",
    "KeyValueCache.k returns the values":
        "return index 0 of the k/v dimension for the keys ([:, 0]); index 1 holds the values",
    "sample drops the cache the model returns":
        ("keep the cache the model returns, logits, kv_cache = model(..., kv_cache), and pass it back in on the next "
         "step"),
    "cache rows tiled, not following the beams' parents": "give each child its parent's cache row: cache_rows=parents",
    "cache copied k times in the tiled order":
        "select each child's parent row from the cache, cache_rows=parents, instead of repeating the whole cache",
    "children keep the stale cache of the previous step":
        "pass on the cache the model just returned for this step, with cache_rows=parents",
}
