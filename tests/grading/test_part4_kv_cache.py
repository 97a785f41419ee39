"""Part 4: the KV cache, against full forwards of Hugging Face and TransformerLens.

How the tests judge:

* ``KeyValueCache`` is checked on tensors built here: shape, ``k``/``v``/``batch``/
  ``seq_len``, ``new_empty``, indexing along the batch (beams) keeping the class, torch
  operations giving plain tensors, and every misuse raising a ValueError/TypeError that
  says what went wrong.
* The cached forward is fed a sequence in chunks (one token at a time, a prefill then
  single tokens, a multi-token chunk mid-way; batch 1 and 3). After every call its logits
  must equal Hugging Face's full forward over the whole sequence (and the uncached
  DemoTransformer), and the cache must hold TransformerLens' keys and values.
* The forward meets any cache through the protocol alone: a cache made in the test (prepare,
  update per layer, commit) gives Hugging Face's logits; ARENA's per-layer contract
  (``Attention.forward(x, past_kv)``, ``TransformerBlock.forward(resid, past_kv)`` returning
  ``(output, kv)``) still holds with the classic tensor ``past_kv``.
* Cached ``sample`` must draw exactly the tokens of uncached ``sample`` and of Hugging
  Face ``generate`` (greedy, and seeded sampling), and must really use the cache: a recording
  model (``counted``) checks that each step after the prompt runs one new position.
* Cached ``beam_search`` must return Hugging Face's beams and summed log-probs (and the
  uncached ones), and every beam's cache row must hold the keys of that beam's own tokens.

Nothing here is statistical: every comparison is exact up to float tolerance. Random
token sequences are drawn from ``SAMPLING_COURSE_TEST_SEED`` (default 0; also a range such
as ``1-200`` or a list ``1,5,9-12``, which runs each seeded test once per seed), and any
seed must pass.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sampling_course.grading.tolerances import parity

from doubles import counted

# fp32 logits of two correct implementations agree to ~1e-5 (as in test_transformer.py);
# every classic mistake of part 4 moves them by far more than 1e-3 on the stand-in.
# The bounds for the device graded on, float32 (grading/tolerances.py says why).
TOL = parity()
# Sums of a few fp32 log-probs from two correct implementations agree to ~1e-5.
ATOL = 1e-4
# ... but downstream of the learner's own model the gap grows with the value: every token's
# log-prob carries that model's float32 rounding (LayerNorm by rsqrt or by 1 / sqrt, fused or
# looped attention: up to ~1e-5 apart per token), a sum of L of them about L times that, and
# a length-normalised score scales the sum by L ** -length_penalty (x L at length_penalty = -1,
# where scores reach -90 and a correct model was measured 1.09e-4 from Hugging Face). So sums
# and scores compared with Hugging Face's are also allowed a relative 1e-5 of their size,
# still far below what any classic mistake moves them (a token more or less changes a score
# by a tenth or more).
RTOL = 1e-5

PROMPTS = [
    "When I was a kid",
    "The cat sat on the",
    "Jingle bells, jingle bells",
]

# How many new positions each call of the cached forward adds, from an empty cache.
SCHEDULES = {
    "one-at-a-time": [1] * 10,
    "prefill-then-singles": [7, 1, 1, 1, 1],
    "chunk-midway": [4, 1, 1, 5, 1, 3, 1],
}


# ---------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def KVC(impl):
    """The KeyValueCache class under test."""
    return impl.kv_cache.KeyValueCache


def random_tokens(seed: int, batch: int, length: int, d_vocab: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, d_vocab, (batch, length), generator=generator)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    torch.testing.assert_close(actual, expected, **TOL, check_dtype=False, msg=lambda m: f"{what} differs from the reference.\n{m}")


def assert_cache_shape(KVC, cache, cfg, batch: int, seq_len: int, what: str) -> None:
    assert isinstance(cache, KVC), f"{what}: expected a KeyValueCache, got {type(cache).__name__}"
    expected = (cfg.n_layers, 2, batch, seq_len, cfg.n_heads, cfg.d_head)
    assert tuple(cache.shape) == expected, f"{what}: cache shape {tuple(cache.shape)}, expected {expected}"
    assert cache.batch == batch and cache.seq_len == seq_len, (
        f"{what}: cache.batch={cache.batch}, cache.seq_len={cache.seq_len}, expected {batch} and {seq_len}"
    )


def zeros_cache(KVC, cfg, batch: int, seq_len: int):
    return KVC(torch.zeros(cfg.n_layers, 2, batch, seq_len, cfg.n_heads, cfg.d_head))


# The oracle's functions: each runs live once through the ``oracle`` fixture, then is read back.


def hf_logits(reference, tokens: torch.Tensor) -> torch.Tensor:
    """Hugging Face's logits at every position of ``tokens``."""
    return reference.hf_model(tokens).logits


def tl_keys_values(reference, tokens: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    """TransformerLens' keys and values of every layer: {"k": [layer 0, ...], "v": [...]}, each (batch, pos, n_heads, d_head)."""
    _, activations = reference.model.run_with_cache(tokens)
    layers = range(reference.cfg.n_layers)
    return {"k": [activations["k", layer] for layer in layers], "v": [activations["v", layer] for layer in layers]}


# ---------------------------------------------------------------------------------------
# KeyValueCache: shape, helpers, indexing
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("KeyValueCache")
def test_new_empty_has_the_model_shape(KVC, reference):
    """new_empty(cfg, batch) is an empty KeyValueCache (seq_len 0) of shape (n_layers, 2, batch, 0, n_heads, d_head)."""
    cfg = reference.cfg
    cache = KVC.new_empty(cfg)
    assert_cache_shape(KVC, cache, cfg, batch=1, seq_len=0, what="new_empty(cfg)")
    assert cache.dtype == torch.float32
    assert_cache_shape(KVC, KVC.new_empty(cfg, batch=3), cfg, batch=3, seq_len=0, what="new_empty(cfg, batch=3)")
    assert tuple(cache.k.shape) == (cfg.n_layers, 1, 0, cfg.n_heads, cfg.d_head)
    assert tuple(cache.v.shape) == (cfg.n_layers, 1, 0, cfg.n_heads, cfg.d_head)


@pytest.mark.exercise("KeyValueCache")
def test_new_empty_makes_the_batch_it_is_asked_for(KVC, reference):
    """new_empty(cfg, batch=2) holds two rows."""
    assert KVC.new_empty(reference.cfg, batch=2).batch == 2


# Not graded as the learner's (no exercise marker): these checks are given code, above the
# learner's region of new_empty; a new_empty written whole need not repeat them.
def test_new_empty_rejects_bad_arguments(KVC, reference):
    """new_empty wants a Config and a batch of at least 1."""
    with pytest.raises(ValueError, match="batch"):
        KVC.new_empty(reference.cfg, batch=0)
    with pytest.raises(TypeError, match="Config"):
        KVC.new_empty(dataclasses.asdict(reference.cfg))


@pytest.mark.exercise("KeyValueCache")
def test_k_v_batch_and_seq_len_read_their_dimensions(KVC):
    """k is [:, 0] and v is [:, 1] (plain tensors); batch is dimension 2 and seq_len dimension 3."""
    data = torch.randn(3, 2, 4, 5, 2, 6, generator=torch.Generator().manual_seed(0))
    cache = KVC(data.clone())
    assert cache.batch == 4 and cache.seq_len == 5
    assert torch.equal(cache.k, data[:, 0]) and torch.equal(cache.v, data[:, 1])
    assert not isinstance(cache.k, KVC) and not isinstance(cache.v, KVC)


@pytest.mark.exercise("KeyValueCache")
def test_indexing_along_the_batch_keeps_the_class(KVC):
    """cache[:, :, index] (index tensor, boolean mask or slice) is a KeyValueCache with those rows,
    in that order; other torch operations give plain tensors."""
    data = torch.randn(2, 2, 3, 4, 2, 5, generator=torch.Generator().manual_seed(1))
    cache = KVC(data.clone())
    for index in (torch.tensor([2, 0, 0, 1]), torch.tensor([True, False, True]), slice(1, 3), [1]):
        rows = cache[:, :, index]
        expected = data[:, :, index]
        assert isinstance(rows, KVC), f"cache[:, :, {index!r}] is a {type(rows).__name__}, not a KeyValueCache"
        assert torch.equal(rows.as_subclass(torch.Tensor), expected)
        assert rows.batch == expected.shape[2] and rows.seq_len == 4
    for what, result in {
        "cache * 2": cache * 2,
        "torch.cat([cache, cache], dim=3)": torch.cat([cache, cache], dim=3),
        "cache.unbind(0)[0]": cache.unbind(0)[0],
        "cache[0]": cache[0],
    }.items():
        assert not isinstance(result, KVC), f"{what} should be a plain tensor"


# ---------------------------------------------------------------------------------------
# Misuse fails loudly, saying what went wrong
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("KeyValueCache")
def test_batch_mismatch_raises(KVC, demo, reference):
    """Tokens with another batch size than the cache raise a ValueError naming both sizes."""
    cache = KVC.new_empty(reference.cfg, batch=2)
    assert cache.batch == 2
    tokens = random_tokens(0, 3, 4, reference.cfg.d_vocab)
    with pytest.raises(ValueError, match=r"batch size 3.*holds 2"):
        demo(tokens, cache)


@pytest.mark.exercise("KeyValueCache")
def test_tokens_not_longer_than_the_cache_raise(KVC, demo, reference):
    """Tokens that are not longer than the cache (e.g. only the newest token) raise a ValueError."""
    cache = zeros_cache(KVC, reference.cfg, batch=1, seq_len=5)
    assert cache.seq_len == 5
    tokens = random_tokens(0, 1, 5, reference.cfg.d_vocab)
    for length in (5, 1):
        with pytest.raises(ValueError, match=rf"{length} positions.*already holds 5"):
            demo(tokens[:, :length], cache)


@pytest.mark.exercise("KeyValueCache")
def test_cache_of_another_model_raises(KVC, demo, reference):
    """A cache built for another config (more layers, or other heads) raises a ValueError saying so."""
    cfg = reference.cfg
    tokens = random_tokens(0, 1, 3, cfg.d_vocab)
    others = [
        dataclasses.replace(cfg, n_layers=cfg.n_layers + 1),
        dataclasses.replace(cfg, n_heads=cfg.n_heads * 2, d_head=cfg.d_head // 2),
    ]
    for other in others:
        cache = KVC.new_empty(other)
        assert cache.seq_len == 0
        with pytest.raises(ValueError, match="another model"):
            demo(tokens, cache)


@pytest.mark.exercise("KeyValueCache")
def test_going_past_n_ctx_raises(KVC, demo, reference):
    """More than n_ctx positions with a cache raise a ValueError naming n_ctx and what to do instead."""
    cfg = reference.cfg
    tokens = random_tokens(0, 1, cfg.n_ctx + 1, cfg.d_vocab)
    for cache in (zeros_cache(KVC, cfg, batch=1, seq_len=cfg.n_ctx), KVC.new_empty(cfg)):
        with pytest.raises(ValueError, match=rf"n_ctx={cfg.n_ctx}") as excinfo:
            demo(tokens, cache)
        message = str(excinfo.value)
        assert "fresh cache" in message or "without a cache" in message, f"no way out in the message: {message}"


@pytest.mark.exercise("KeyValueCache")
def test_a_cache_that_is_not_a_keyvaluecache_raises(KVC, demo, reference):
    """A plain tensor or Hugging Face-style tuple as kv_cache raises a TypeError naming KeyValueCache."""
    cfg = reference.cfg
    cache = KVC.new_empty(cfg)
    assert cache.seq_len == 0
    tokens = random_tokens(0, 1, 3, cfg.d_vocab)
    for wrong in (cache.as_subclass(torch.Tensor), (cache.k, cache.v)):
        with pytest.raises(TypeError, match="KeyValueCache"):
            demo(tokens, wrong)


# ---------------------------------------------------------------------------------------
# The cached forward against the full forward
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("cached_forward")
def test_causal_mask_is_shifted_for_cached_keys(demo):
    """With 3 new queries after 2 cached keys, query i sees keys 0..2+i and nothing after them.

    Part 1 only ever needs square scores; with a cache the queries are the last positions
    of the keys, so apply_causal_mask must shift the mask (graded here, with the cached forward).
    Judged as part 1 judges the square mask, by the softmax: visible scores are left as they
    are and hidden keys get zero weight, whether they hold IGNORE, -inf or another large
    negative number.
    """
    attn = demo.blocks[0].attn
    masked = attn.apply_causal_mask(torch.zeros(1, 1, 3, 5))[0, 0]
    allowed = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(masked[allowed], torch.zeros(int(allowed.sum()))), "a visible score was changed"
    expected = allowed.float() / allowed.sum(dim=-1, keepdim=True)
    assert_close(masked.softmax(dim=-1), expected, "pattern of all-zero scores, 3 queries after 2 cached keys")
    # A single new query after 4 cached keys sees all 5 keys.
    assert torch.equal(attn.apply_causal_mask(torch.zeros(1, 1, 1, 5)), torch.zeros(1, 1, 1, 5))


@pytest.mark.exercise("cached_forward")
@pytest.mark.parametrize("schedule", list(SCHEDULES.values()), ids=list(SCHEDULES))
@pytest.mark.parametrize("batch", [1, 3])
def test_cached_logits_match_the_full_forward_at_every_step(KVC, demo, reference, oracle, seed, batch, schedule):
    """Fed in chunks from an empty cache, each call returns the logits of exactly its new positions,
    equal to HF's (and the uncached DemoTransformer's) full-sequence logits there, and the cache grows by them."""
    cfg = reference.cfg
    tokens = random_tokens(seed, batch, sum(schedule), cfg.d_vocab)
    expected = oracle(hf_logits, reference, tokens)
    with torch.no_grad():
        uncached = demo(tokens)
    cache = KVC.new_empty(cfg, batch=batch)
    start = 0
    with torch.no_grad():
        for step, n_new in enumerate(schedule):
            end = start + n_new
            logits, cache = demo(tokens[:, :end], cache)
            what = f"step {step} (positions {start}..{end - 1})"
            assert_cache_shape(KVC, cache, cfg, batch, end, what)
            assert_close(logits, expected[:, start:end], f"cached logits at {what} vs Hugging Face")
            assert_close(logits, uncached[:, start:end], f"cached logits at {what} vs the uncached forward")
            start = end


@pytest.mark.exercise("cached_forward")
def test_cache_holds_the_reference_keys_and_values(KVC, demo, reference, oracle, seed):
    """After every call, cache.k[layer] / cache.v[layer] equal TransformerLens' keys / values of all
    positions so far, in position order."""
    cfg = reference.cfg
    tokens = random_tokens(seed, 2, 10, cfg.d_vocab)
    activations = oracle(tl_keys_values, reference, tokens)
    cache = KVC.new_empty(cfg, batch=2)
    end = 0
    with torch.no_grad():
        for n_new in (4, 1, 3, 2):
            end += n_new
            _, cache = demo(tokens[:, :end], cache)
            for layer in range(cfg.n_layers):
                assert_close(cache.k[layer], activations["k"][layer][:, :end], f"cached keys of layer {layer} at length {end}")
                assert_close(cache.v[layer], activations["v"][layer][:, :end], f"cached values of layer {layer} at length {end}")


@pytest.mark.exercise("cached_forward")
def test_cached_forward_leaves_its_input_cache_alone(KVC, demo, reference, seed):
    """The cache passed in is not modified (beam search reuses it for every child of a beam)."""
    cfg = reference.cfg
    tokens = random_tokens(seed, 1, 6, cfg.d_vocab)
    with torch.no_grad():
        _, cache = demo(tokens[:, :4], KVC.new_empty(cfg))
        before = cache.as_subclass(torch.Tensor).clone()
        demo(tokens, cache)
    assert cache.seq_len == 4 and torch.equal(cache.as_subclass(torch.Tensor), before)


@pytest.mark.exercise("cached_forward")
def test_cached_forward_reaches_the_last_position(KVC, demo, reference, oracle, seed):
    """A prefill of n_ctx - 1 tokens, then one more at position n_ctx - 1, gives HF's last logits."""
    cfg = reference.cfg
    tokens = random_tokens(seed, 1, cfg.n_ctx, cfg.d_vocab)
    with torch.no_grad():
        _, cache = demo(tokens[:, :-1], KVC.new_empty(cfg))
        logits, cache = demo(tokens, cache)
    assert_cache_shape(KVC, cache, cfg, 1, cfg.n_ctx, "after the last position")
    assert_close(logits, oracle(hf_logits, reference, tokens)[:, -1:], "logits at position n_ctx - 1")


class RecordingCache:
    """A cache of the protocol made here (prepare, update, commit), sharing no code with the course's but
    the step it returns (``CacheStep``): keys kept per layer in order, the new ones after the old; it
    records the calls it receives."""

    def __init__(self, CacheStep):
        self.CacheStep = CacheStep
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.seen = 0
        self.calls: list[str] = []

    def prepare(self, tokens, attention_mask=None):
        self.calls.append("prepare")
        new = tokens.shape[1] - self.seen
        self.new = new
        return self.CacheStep(tokens[:, self.seen :], torch.arange(self.seen, tokens.shape[1])[None])

    def update(self, layer, k, v):
        self.calls.append(f"update {layer}")
        if layer in self.kv:
            k, v = torch.cat([self.kv[layer][0], k], 1), torch.cat([self.kv[layer][1], v], 1)
        self.kv[layer] = (k, v)
        return k, v

    def commit(self):
        self.calls.append("commit")
        self.seen += self.new
        return self


@pytest.mark.exercise("cached_forward")
def test_the_forward_runs_any_cache_of_the_protocol(demo, reference, oracle, impl, seed):
    """DemoTransformer.forward meets a cache only through prepare (once), update (once per layer, in order)
    and commit (once): a cache made here gives Hugging Face's logits, chunk after chunk, and forward returns
    what commit returns."""
    cfg = reference.cfg
    tokens = random_tokens(seed, 2, 9, cfg.d_vocab)
    expected = oracle(hf_logits, reference, tokens)
    cache = RecordingCache(impl.kv_cache.CacheStep)
    start = 0
    with torch.no_grad():
        for end in (5, 6, 9):
            cache.calls.clear()
            logits, returned = demo(tokens[:, :end], cache)
            assert returned is cache, "forward returns what the cache's commit returns"
            assert cache.calls == ["prepare", *(f"update {layer}" for layer in range(cfg.n_layers)), "commit"], cache.calls
            assert_close(logits, expected[:, start:end], f"logits of positions {start}..{end - 1} through a cache of the protocol")
            start = end


@pytest.mark.exercise("cached_forward")
def test_arenas_per_layer_contract_still_holds(demo, reference, seed):
    """Attention.forward(x, past_kv) and TransformerBlock.forward(resid, past_kv), with ARENA's classic
    past_kv (one layer's past keys and values, (2, batch, past_pos, n_heads, d_head)), return (output, kv):
    the outputs of the new positions, and kv the past keys and values followed by the new ones."""
    cfg = reference.cfg
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, cfg.d_model, generator=generator)
    block = demo.blocks[0]
    with torch.no_grad():
        full_attn = block.attn(x)
        full_block = block(x)
        _, past = block.attn(x[:, :3], torch.zeros(2, 2, 0, cfg.n_heads, cfg.d_head))
        out, kv = block.attn(x[:, 3:], past)
        _, block_past = block(x[:, :3], torch.zeros(2, 2, 0, cfg.n_heads, cfg.d_head))
        resid, block_kv = block(x[:, 3:], block_past)
    assert tuple(past.shape) == (2, 2, 3, cfg.n_heads, cfg.d_head) and tuple(kv.shape) == (2, 2, 5, cfg.n_heads, cfg.d_head)
    assert torch.equal(kv[:, :, :3], past), "kv starts with the past keys and values, unchanged"
    assert_close(out, full_attn[:, 3:], "Attention.forward with past_kv: the new positions' outputs")
    assert_close(resid, full_block[:, 3:], "TransformerBlock.forward with past_kv: the new positions' outputs")
    assert tuple(block_kv.shape) == (2, 2, 5, cfg.n_heads, cfg.d_head) and torch.equal(block_kv[:, :, :3], block_past), (
        "TransformerBlock.forward passes the attention's keys and values through: the past ones, then the new"
    )


# Not graded as the learner's: where a committed cache is stored is given code (GrowingCache.commit, Room).
def test_committed_caches_keep_their_contents_while_later_steps_fill_their_room(KVC, demo, reference, seed):
    """A step writes only its new positions, into the room the previous cache left (the same storage: no
    copy of the whole cache at commit); every cache committed earlier keeps its contents, and a step from an
    older cache (a second continuation of the same prefix) leaves the newer ones alone."""
    cfg = reference.cfg
    tokens = random_tokens(seed, 2, 9, cfg.d_vocab)
    branch = tokens.clone()
    branch[:, 6:] = (branch[:, 6:] + 1) % cfg.d_vocab
    with torch.no_grad():
        full, full_branch = demo(tokens), demo(branch)
        _, c6 = demo(tokens[:, :6], KVC.new_empty(cfg, 2))
        _, c7 = demo(tokens[:, :7], c6)
        _, c8 = demo(tokens[:, :8], c7)
        kept = [c.as_subclass(torch.Tensor).clone() for c in (c6, c7, c8)]
        other, c8b = demo(branch[:, :8], c6)  # from c6 again: c7 and c8 must not change
        last, c9 = demo(tokens, c8)
        last_b, _ = demo(branch, c8b)
    assert c7.data_ptr() == c6.data_ptr() and c8.data_ptr() == c6.data_ptr(), (
        "consecutive steps should write into the room of the cache before them, not copy it")
    for cache, before in zip((c6, c7, c8), kept):
        assert torch.equal(cache.as_subclass(torch.Tensor), before), "a committed cache changed after a later step"
    assert_close(last, full[:, 8:], "the last step after a continuation from an older cache")
    assert_close(torch.cat([other, last_b], dim=1), full_branch[:, 6:], "the second continuation of the prefix")


def test_logits_to_keep_gives_the_last_positions_logits(KVC, demo, reference, seed):
    """``logits_to_keep=k`` (Hugging Face's name) returns the last k positions' logits, with a cache, with padding
    and without either; 0 keeps them all; a 1-D tensor of positions keeps those; anything else is refused."""
    cfg = reference.cfg
    tokens = random_tokens(seed, 2, 7, cfg.d_vocab)
    mask = torch.ones_like(tokens)
    mask[1, :2] = 0
    with torch.no_grad():
        full = demo(tokens)
        padded = demo(tokens, attention_mask=mask)
        assert_close(demo(tokens, logits_to_keep=2), full[:, -2:], "logits_to_keep=2 without a cache")
        assert_close(demo(tokens, logits_to_keep=0), full, "logits_to_keep=0")
        logits, cache = demo(tokens, KVC.new_empty(cfg, 2), logits_to_keep=1)
        assert_close(logits, full[:, -1:], "logits_to_keep=1 with a cache")
        assert cache.seq_len == 7, "every position is cached, whatever logits are kept"
        assert_close(demo(tokens, attention_mask=mask, logits_to_keep=1), padded[:, -1:], "logits_to_keep=1 with padding")
        some = torch.tensor([0, 3, 6])  # Hugging Face's other form: the positions to keep
        assert_close(demo(tokens, logits_to_keep=some), full[:, some], "logits_to_keep=tensor([0, 3, 6])")
        assert_close(demo(tokens, KVC.new_empty(cfg, 2), logits_to_keep=some)[0], full[:, some], "the same, cached")
        for bad in (-1, 1.5, True, "1", torch.tensor([[1]]), torch.tensor([1.0]), torch.tensor([1], dtype=torch.uint8)):
            with pytest.raises(ValueError, match="logits_to_keep"):
                demo(tokens, logits_to_keep=bad)


# ---------------------------------------------------------------------------------------
# Cached sampling
# ---------------------------------------------------------------------------------------


def hf_generate_text(reference, prompt: str, max_new_tokens: int, **kwargs) -> str:
    """Oracle: the text of Hugging Face's generate."""
    tok = reference.tokenizer
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = reference.hf_model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
            pad_token_id=tok.eos_token_id, **kwargs,
        )
    return tok.decode(out[0])


@pytest.mark.exercise("cached_sample")
@pytest.mark.parametrize("prompt", PROMPTS)
def test_cached_greedy_matches_hf_and_uncached(KVC, sampler, reference, oracle, prompt):
    """Cached greedy sample equals HF generate(do_sample=False) and uncached greedy sample, token for token."""
    expected = oracle(hf_generate_text, reference, prompt, 30, do_sample=False)
    cached = sampler.sample(prompt, 30, temperature=0, kv_cache=KVC.new_empty(reference.cfg))
    assert cached == expected, "cached greedy decoding differs from Hugging Face generate"
    assert cached == sampler.sample(prompt, 30, temperature=0), "cached and uncached greedy decoding differ"


@pytest.mark.exercise("cached_sample")
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_cached_seeded_sampling_matches_uncached(KVC, sampler, reference, seed, prompt):
    """With the same seed, cached sample(temperature=1) draws the same tokens as uncached sample.

    The draws come from your own sample_next_token either way, so any correct way of drawing
    passes; only the logits (cached or not) may differ, and they must not.
    """
    cached = sampler.sample(prompt, 30, seed=seed, kv_cache=KVC.new_empty(reference.cfg))
    expected = sampler.sample(prompt, 30, seed=seed)
    assert cached == expected, "cached seeded sampling differs from uncached sampling with the same seed"


@pytest.mark.exercise("cached_sample")
@pytest.mark.parametrize(
    "kwargs",
    [dict(top_k=10), dict(temperature=1.5, top_k=3), dict(top_p=0.9), dict(temperature=0.8, frequency_penalty=2.0)],
    ids=["top_k", "temperature-top_k", "top_p", "frequency_penalty"],
)
def test_cached_and_uncached_sampling_agree(KVC, sampler, reference, seed, kwargs):
    """With the same seed, cached and uncached sample give the same text for every decoding setting."""
    prompt = PROMPTS[0]
    uncached = sampler.sample(prompt, 30, seed=seed, **kwargs)
    cached = sampler.sample(prompt, 30, seed=seed, kv_cache=KVC.new_empty(reference.cfg), **kwargs)
    assert cached == uncached


@pytest.mark.exercise("cached_sample")
def test_cached_sample_runs_one_new_position_per_step(KVC, demo, reference, impl):
    """With a cache, the first call runs the whole prompt from an empty cache and every later call
    passes a cache holding all but the newest position."""
    spy = counted(demo)  # the calls are recorded apart, where the sampler cannot change the record
    sampler = impl.sampling.TransformerSampler(spy, reference.tokenizer)
    prompt = PROMPTS[0]
    n_prompt = len(reference.tokenizer(prompt).input_ids)
    out = sampler.sample(prompt, 12, temperature=0, kv_cache=KVC.new_empty(reference.cfg))
    assert reference.tokenizer.eos_token not in out, "precondition: greedy decoding reached EOS"
    assert len(spy.calls) == 12, f"{len(spy.calls)} model calls for 12 new tokens"
    assert all(cached is not None for _, cached in spy.calls), "the model was called without the cache"
    assert spy.calls[0] == (n_prompt, 0), "the first call should run the prompt from the empty cache"
    for step, (passed, cached) in enumerate(spy.calls[1:], start=1):
        assert (passed, cached) == (n_prompt + step, n_prompt + step - 1), (
            f"step {step}: the cache holds {cached} of {passed} positions; keep the cache the model returns"
        )


@pytest.mark.exercise("cached_sample")
def test_cached_sample_past_n_ctx_raises(KVC, tiny, tiny_sampler):
    """Cached sampling past n_ctx raises a ValueError naming n_ctx (uncached sampling slides instead)."""
    sampler = tiny_sampler
    n_ctx = tiny.cfg.n_ctx
    # A prompt a few tokens short of n_ctx (decoded random ids re-encode to a different length).
    length = n_ctx - 8
    while True:
        prompt = tiny.tokenizer.decode(random_tokens(0, 1, length, tiny.tokenizer.eos_token_id)[0])
        n_prompt = len(tiny.tokenizer(prompt).input_ids)
        if n_prompt <= n_ctx - 4:
            break
        length -= 4
    steps = n_ctx - n_prompt + 4
    uncached = sampler.sample(prompt, steps, temperature=0)
    assert tiny.tokenizer.eos_token not in uncached, "precondition: greedy decoding reached EOS before n_ctx"
    with pytest.raises(ValueError, match=f"n_ctx={n_ctx}"):
        sampler.sample(prompt, steps, temperature=0, kv_cache=KVC.new_empty(tiny.cfg))


# ---------------------------------------------------------------------------------------
# Cached beam search
# ---------------------------------------------------------------------------------------


def hf_beam_search(reference, prompt: str, num_beams: int, max_new_tokens: int, ngram: int | None):
    """Oracle: Hugging Face's beam search, scored by summed log-probs, as (score, text) pairs."""
    tok = reference.tokenizer
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = reference.hf_model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=num_beams,
            num_return_sequences=num_beams, no_repeat_ngram_size=ngram, max_new_tokens=max_new_tokens,
            length_penalty=0.0, early_stopping="never", output_scores=True, return_dict_in_generate=True,
            pad_token_id=tok.eos_token_id,
        )
    new = out.sequences[:, ids.shape[1] :]
    # Precondition: where no beam ends in EOS, HF's beam search is the classic algorithm.
    assert new.shape[1] == max_new_tokens and not (new == tok.eos_token_id).any(), (
        "precondition failed: a Hugging Face beam reached EOS; pick another prompt or horizon"
    )
    return [(float(score), tok.decode(seq)) for score, seq in zip(out.sequences_scores, out.sequences)]


def assert_same_beams(actual, expected, what: str) -> None:
    assert [text for _, text in actual] == [text for _, text in expected], f"{what}: different beams or order"
    assert [lp for lp, _ in actual] == pytest.approx([lp for lp, _ in expected], rel=RTOL, abs=ATOL), (
        f"{what}: different summed log-probs"
    )


@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("cached_beam_search")
@pytest.mark.parametrize(
    "prompt, num_beams, ngram",
    [(PROMPTS[0], 3, None), (PROMPTS[1], 4, None), (PROMPTS[2], 4, 2)],
    ids=["3-beams", "4-beams", "4-beams-ngram-2"],
)
def test_cached_beam_search_matches_hf_and_uncached(KVC, sampler, reference, oracle, prompt, num_beams, ngram):
    """Cached beam_search returns HF generate(num_beams)'s beams and summed log-probs, and the uncached ones."""
    steps = 12
    expected = oracle(hf_beam_search, reference, prompt, num_beams, steps, ngram)
    cached = sampler.beam_search(
        prompt, num_beams, num_beams, steps, no_repeat_ngram_size=ngram, kv_cache=KVC.new_empty(reference.cfg)
    )
    assert_same_beams(cached, expected, "cached beam search vs Hugging Face")
    assert_same_beams(cached, sampler.beam_search(prompt, num_beams, num_beams, steps, ngram), "cached vs uncached")


@pytest.mark.exercise("cached_beam_search")
def test_every_beam_keeps_its_own_cache_row(KVC, demo, reference, oracle, impl):
    """After each generate and filter, beam b's cache row (``beams.beam_cache``) holds
    TransformerLens' keys and values of beam b's tokens[:-1]: children inherit their
    parent's row, and rows follow the beams."""
    tok, cfg = reference.tokenizer, reference.cfg
    tokens = tok(PROMPTS[1], return_tensors="pt").input_ids
    beams = impl.beams.Beams(demo, tok, torch.zeros(1), tokens, KVC.new_empty(cfg))

    def check(beams, what):
        cache = beams.beam_cache
        assert_cache_shape(KVC, cache, cfg, len(beams), beams.tokens.shape[1] - 1, what)
        activations = oracle(tl_keys_values, reference, beams.tokens[:, :-1])
        for layer in range(cfg.n_layers):
            assert_close(cache.k[layer], activations["k"][layer], f"{what}: keys of layer {layer}")
            assert_close(cache.v[layer], activations["v"][layer], f"{what}: values of layer {layer}")

    with torch.no_grad():
        for step in range(4):
            beams = beams.generate(k=3)
            check(beams, f"step {step}, after generate")
            beams, terminated = beams.filter(k=3)
            assert len(terminated) == 0, "precondition: no beam reached EOS"
            check(beams, f"step {step}, after filter")
