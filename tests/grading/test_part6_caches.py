"""Part 6: the static cache and the attention-sink cache, against live references.

How the tests judge:

* ``StaticKeyValueCache`` is fed sequences in chunks; after every call its logits must
  equal Hugging Face's full forward over the whole sequence, and those of part 4's
  ``KeyValueCache``. The buffer is filled with NaN before use, so a cache that reads a slot
  it has not written gives NaN logits, never a near miss. ``crop`` then re-running must
  give the same logits; ``reorder`` is checked on a buffer of known contents with
  permutations that have cycles (a row-by-row copy in place overwrites rows still to be
  read) and repeats, and through beam search.
* ``sample``, ``beam_search`` and part 5's ``generate`` must give the same output with the
  static cache as with the dynamic one, and every misuse raises an error saying why.
* ``SinkCache`` is judged against an oracle that shares none of its code: Hugging Face's
  uncached forward over the whole text with an explicit attention mask (each token sees
  the sinks and the recent window) and the position ids of the rule, past n_ctx. Its size
  never exceeds ``window_length``; before the window fills it equals the dynamic cache.
* ``fuse_qkv`` is checked against the einsum of each head's own weights; the fast path
  (the model's one forward with QKV fused at load, ``fuse_at_load``) by the static cache's
  logits above, which run on it.

Nothing here is statistical. Random tokens come from ``SAMPLING_COURSE_TEST_SEED``.
"""

from __future__ import annotations

import copy

import pytest
import torch

from sampling_course.grading.tolerances import parity

# fp32 logits of two correct implementations agree to ~2e-5 at the stand-in's logit scale (~25);
# every classic mistake of part 6 moves them by far more than 1e-3.
# The bounds for the device graded on, float32 (grading/tolerances.py says why).
TOL = parity()

PROMPTS = ["When I was a kid", "The cat sat on the", "Jingle bells, jingle bells"]


@pytest.fixture(scope="module")
def caches(impl):
    return impl.caches


@pytest.fixture(scope="module")
def sink_cache(impl):
    return impl.sink_cache


@pytest.fixture(scope="module")
def fast_path(impl):
    return impl.fast_path


@pytest.fixture(scope="module")
def fast_demo(demo, fast_path):
    """A copy of the model on the fast path: its QKV weights fused at load (``fuse_at_load``), the same forward."""
    return fast_path.fuse_at_load(copy.deepcopy(demo))


def random_tokens(seed: int, batch: int, length: int, d_vocab: int) -> torch.Tensor:
    return torch.randint(0, d_vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def hf_logits(reference, tokens: torch.Tensor, **kwargs) -> torch.Tensor:
    """Oracle (through the ``oracle`` fixture): Hugging Face's logits at every position of ``tokens``."""
    with torch.no_grad():
        return reference.hf_model(tokens, **kwargs).logits


def poisoned_static_cache(caches, cfg, batch: int, max_len: int):
    """A static cache whose unwritten slots hold NaN: reading one gives NaN logits."""
    cache = caches.StaticKeyValueCache.new_empty(cfg, batch=batch, max_len=max_len)
    cache.buffer.fill_(float("nan"))
    return cache


# ---------------------------------------------------------------------------------------
# The static cache
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("StaticKeyValueCache.update")
@pytest.mark.parametrize("batch", [1, 3])
def test_update_writes_the_next_slots_and_returns_the_filled_prefix(demo, caches, batch, seed):
    """update writes in place at seq_len.., leaves every other slot alone, and returns views of slots 0..end."""
    cfg = demo.cfg
    cache = poisoned_static_cache(caches, cfg, batch, max_len=10)
    cache.batch = batch
    buffer = cache.buffer
    generator = torch.Generator().manual_seed(seed)
    written_k = torch.full((batch, 10, cfg.n_heads, cfg.d_head), float("nan"))
    written_v = written_k.clone()
    for new_pos in (3, 1, 2):
        start = cache.seq_len
        for layer in range(cfg.n_layers):
            k = torch.randn(batch, new_pos, cfg.n_heads, cfg.d_head, generator=generator)
            v = torch.randn(batch, new_pos, cfg.n_heads, cfg.d_head, generator=generator)
            keys, values = cache.update(layer, k, v)
            assert keys.shape == values.shape == (batch, start + new_pos, cfg.n_heads, cfg.d_head), (
                "update returns the keys and values of the filled slots only: (batch, seq_len + new_pos, n_heads, d_head)"
            )
            torch.testing.assert_close(keys[:, start:], k, rtol=0, atol=0)
            torch.testing.assert_close(values[:, start:], v, rtol=0, atol=0)
            if layer == 0:
                written_k[:, start : start + new_pos], written_v[:, start : start + new_pos] = k, v
                torch.testing.assert_close(keys, written_k[:, : start + new_pos], rtol=0, atol=0)
                torch.testing.assert_close(values, written_v[:, : start + new_pos], rtol=0, atol=0)
            assert cache.seq_len == start, "update must not move seq_len: forward does, after the last layer"
        assert cache.buffer is buffer and cache.buffer[:, :, :, start + new_pos :].isnan().all(), (
            "update writes into the cache's own buffer, and only the new slots"
        )
        cache.seq_len += new_pos  # what forward does after the last layer


@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("fast_forward")
@pytest.mark.parametrize("schedule", [[7, 1, 1, 1], [1, 1, 1, 4, 1, 3]], ids=["prefill-then-singles", "chunks"])
@pytest.mark.parametrize("batch", [1, 3])
def test_static_cache_logits_equal_full_forward(reference, oracle, demo, fast_demo, caches, impl, schedule, batch, seed):
    """Fed in chunks to the model on the fast path, the static cache gives HF's full-forward logits and the
    dynamic cache's (on the model as part 1 wrote it)."""
    cfg = demo.cfg
    tokens = random_tokens(seed, batch, sum(schedule), cfg.d_vocab)
    expected = oracle(hf_logits, reference, tokens)
    static = poisoned_static_cache(caches, cfg, batch, max_len=sum(schedule) + 5)
    dynamic = impl.kv_cache.KeyValueCache.new_empty(cfg, batch)
    end = 0
    with torch.no_grad():
        for chunk in schedule:
            end += chunk
            logits, returned = fast_demo(tokens[:, :end], static)
            assert returned is static, "model(tokens, static_cache) must return the same cache object, filled in place"
            torch.testing.assert_close(logits, expected[:, end - chunk : end], **TOL)
            dynamic_logits, dynamic = demo(tokens[:, :end], dynamic)
            torch.testing.assert_close(logits, dynamic_logits, **TOL)
            assert static.seq_len == end
    assert static.k.shape == (cfg.n_layers, batch, end, cfg.n_heads, cfg.d_head)
    torch.testing.assert_close(static.k, dynamic.k, **TOL)
    torch.testing.assert_close(static.v, dynamic.v, **TOL)


@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("fast_forward")
def test_static_cache_crop_rolls_back(reference, oracle, fast_demo, caches, seed):
    """After crop(n), running the rest again gives the logits of a full forward."""
    cfg = fast_demo.cfg
    tokens = random_tokens(seed, 2, 12, cfg.d_vocab)
    expected = oracle(hf_logits, reference, tokens)
    cache = poisoned_static_cache(caches, cfg, 2, 16)
    with torch.no_grad():
        fast_demo(tokens, cache)
        cache.crop(5)
        assert cache.seq_len == 5
        other = random_tokens(seed + 1, 2, 12, cfg.d_vocab)
        other[:, :5] = tokens[:, :5]
        logits, cache = fast_demo(other, cache)  # overwrites slots 5.. with another continuation
        torch.testing.assert_close(logits, oracle(hf_logits, reference, other)[:, 5:], **TOL)
        cache.crop(8)
        logits, cache = fast_demo(other, cache)
        torch.testing.assert_close(logits, oracle(hf_logits, reference, other)[:, 8:], **TOL)
    del expected
    with pytest.raises(ValueError, match="seq_len"):
        cache.crop(13)


@pytest.mark.exercise("fast_forward")
def test_static_cache_misuse_fails_loudly(demo, caches, reference):
    """Overflow, a wrong batch, a wrong model and a stale sequence raise errors that say why."""
    cfg = demo.cfg
    tokens = random_tokens(0, 1, 6, cfg.d_vocab)
    cache = caches.StaticKeyValueCache.new_empty(cfg, max_len=8)
    with torch.no_grad():
        demo(tokens, cache)
        with pytest.raises(ValueError, match="max_len"):
            demo(torch.cat([tokens, tokens], 1), cache)
        with pytest.raises(ValueError, match="batch"):
            demo(torch.cat([tokens, tokens])[:, :7], cache)
        with pytest.raises(ValueError, match="already run"):
            demo(tokens, cache)
    with pytest.raises(ValueError, match="max_len"):
        caches.StaticKeyValueCache.new_empty(cfg, max_len=cfg.n_ctx + 1)
    with pytest.raises(ValueError, match="batch"):
        caches.StaticKeyValueCache.new_empty(cfg, batch=0)
    other_cfg = type(cfg)(**{**cfg.__dict__, "n_layers": cfg.n_layers + 1})
    with pytest.raises(ValueError, match="another model"), torch.no_grad():
        demo(tokens, caches.StaticKeyValueCache.new_empty(other_cfg))


@pytest.mark.exercise("StaticKeyValueCache.reorder")
@pytest.mark.parametrize("rows", [[2, 0, 1], [1, 2, 0], [1, 1, 0], [2, 2, 2], [0, 2], [2, 0, 1, 1, 0]], ids=str)
def test_reorder_permutes_rows_in_place(demo, caches, rows):
    """Row i afterwards holds what row rows[i] held, in the same buffer (cycles, repeats, growth)."""
    cfg = demo.cfg
    cache = caches.StaticKeyValueCache.new_empty(cfg, batch=3, max_len=6)
    cache.buffer.fill_(float("nan"))
    cache.buffer[:, :, :, :4] = torch.randn(cache.buffer[:, :, :, :4].shape, generator=torch.Generator().manual_seed(1))
    cache.seq_len = 4  # four positions filled, as a forward pass would leave them
    before_k, before_v = cache.k.clone(), cache.v.clone()
    buffer = cache.buffer
    cache.reorder(torch.tensor(rows))
    assert cache.batch == len(rows) and cache.seq_len == 4
    torch.testing.assert_close(cache.k, before_k[:, rows], rtol=0, atol=0)
    torch.testing.assert_close(cache.v, before_v[:, rows], rtol=0, atol=0)
    if len(rows) <= 3:
        assert cache.buffer is buffer, "reorder must reuse the cache's buffer while the rows fit in it"


# Not graded as the learner's: reorder_later (beam search's deferred reorder) is given code around the learner's reorder.
def test_reorder_later_reorders_each_layer_before_it_reads_its_keys(demo, caches, seed):
    """A reorder left for the next forward pass gives that pass the logits and the cache an immediate reorder gives,
    and reading k or v in between finishes it first."""
    cfg = demo.cfg
    tokens = random_tokens(seed, 3, 7, cfg.d_vocab)
    rows = torch.tensor([2, 0, 0, 1])
    with torch.no_grad():
        now, later, peeked = (caches.StaticKeyValueCache.new_empty(cfg, batch=3, max_len=8) for _ in range(3))
        for cache in (now, later, peeked):
            demo(tokens[:, :6], cache)
        now.reorder(rows)
        later.reorder_later(rows)
        peeked.reorder_later(rows)
        torch.testing.assert_close(peeked.k, now.k, rtol=0, atol=0)
        torch.testing.assert_close(peeked.v, now.v, rtol=0, atol=0)
        step = tokens[rows, :7]
        expected, _ = demo(step, now)
        actual, _ = demo(step, later)
    assert later.batch == now.batch == 4 and later.seq_len == now.seq_len == 7
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    torch.testing.assert_close(later.k, now.k, rtol=0, atol=0)


@pytest.mark.exercise("StaticKeyValueCache.reorder")
def test_reorder_rejects_bad_rows(demo, caches):
    cache = caches.StaticKeyValueCache.new_empty(demo.cfg, batch=2, max_len=4)
    with pytest.raises(ValueError, match="rows"):
        cache.reorder(torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="rows"):
        cache.reorder(torch.tensor([[0, 1]]))


@pytest.mark.exercise("fast_forward")
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_beam_search_with_static_cache_equals_dynamic(sampler, demo, caches, impl, prompt):
    """Beam search on the static cache returns the dynamic cache's beams and scores."""
    settings = dict(num_return_sequences=3, num_beams=3, max_new_tokens=8, no_repeat_ngram_size=2)
    expected = sampler.beam_search(prompt, **settings, kv_cache=impl.kv_cache.KeyValueCache.new_empty(demo.cfg))
    actual = sampler.beam_search(prompt, **settings, kv_cache=poisoned_static_cache(caches, demo.cfg, 1, 32))
    assert [text for _, text in actual] == [text for _, text in expected]
    torch.testing.assert_close(torch.tensor([s for s, _ in actual]), torch.tensor([s for s, _ in expected]), atol=1e-4, rtol=0)


@pytest.mark.exercise("fast_forward")
@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(temperature=1.0, seed=3), dict(temperature=0.8, top_k=5, seed=4)], ids=str)
def test_sample_with_static_cache_equals_dynamic(sampler, demo, caches, impl, settings):
    """TransformerSampler.sample draws the same tokens with the static cache as with the dynamic one."""
    for prompt in PROMPTS:
        dynamic = sampler.sample(prompt, 12, kv_cache=impl.kv_cache.KeyValueCache.new_empty(demo.cfg), **settings)
        static = sampler.sample(prompt, 12, kv_cache=caches.StaticKeyValueCache.new_empty(demo.cfg), **settings)
        assert static == dynamic


@pytest.mark.exercise("fast_forward")
def test_generate_with_static_cache_equals_dynamic(reference, demo, caches, impl):
    """Part 5's generate on left-padded prompts gives the same tokens and log-probs with a static cache."""
    kwargs = dict(max_new_tokens=10, temperature=0.9, top_k=20, seed=7, return_dict_in_generate=True)
    dynamic = impl.generate.generate(demo, reference.tokenizer, PROMPTS, **kwargs)
    static_cache = poisoned_static_cache(caches, demo.cfg, len(PROMPTS), 40)
    static = impl.generate.generate(demo, reference.tokenizer, PROMPTS, kv_cache=static_cache, **kwargs)
    assert torch.equal(static.sequences, dynamic.sequences)
    torch.testing.assert_close(static.logprobs, dynamic.logprobs, **TOL, equal_nan=True)


@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("fast_forward")
def test_padded_forward_on_static_cache_equals_each_prompt_alone(reference, oracle, fast_demo, caches):
    """With an attention mask, each left-padded row's logits are those of its prompt run alone."""
    rows = [random_tokens(s, 1, n, fast_demo.cfg.d_vocab)[0].tolist() for s, n in ((1, 5), (2, 9), (3, 2))]
    width = max(map(len, rows))
    tokens = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    cache = poisoned_static_cache(caches, fast_demo.cfg, 3, width + 2)
    with torch.no_grad():
        logits, cache = fast_demo(tokens, cache, attention_mask=mask)
        for i, row in enumerate(rows):
            torch.testing.assert_close(logits[i, width - len(row) :], oracle(hf_logits, reference, torch.tensor([row]))[0], **TOL)


@pytest.mark.exercise("fast_forward")
def test_fast_path_keeps_pad_positions_finite(reference, oracle, fast_demo):
    """The fast path's attention (one kernel, an additive mask) on a left-padded batch without a cache: a pad query
    at the start of a row sees no real key, and its numbers must stay finite (NaN there would reach the real
    queries through the pad keys of the next layer, masked or not: 0 * NaN is NaN); real rows match HF."""
    rows = [random_tokens(s, 1, n, fast_demo.cfg.d_vocab)[0].tolist() for s, n in ((4, 7), (5, 3))]
    tokens = torch.tensor([[0] * (7 - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (7 - len(r)) + [1] * len(r) for r in rows])
    with torch.no_grad():
        logits = fast_demo(tokens, attention_mask=mask)
    assert torch.isfinite(logits).all(), "the fast path made NaN or inf logits at some position of a padded batch"
    for i, row in enumerate(rows):
        torch.testing.assert_close(logits[i, 7 - len(row) :], oracle(hf_logits, reference, torch.tensor([row]))[0], **TOL)


@pytest.mark.exercise("fuse_qkv")
def test_fuse_qkv_gives_each_heads_queries_keys_values(demo, fast_path, seed):
    """x @ W_QKV + b_QKV, viewed as (..., 3, n_heads, d_head), holds each head's q, k and v."""
    cfg, attn = demo.cfg, demo.blocks[0].attn
    fused = fast_path.fuse_qkv(attn)
    x = torch.randn(5, cfg.d_model, generator=torch.Generator().manual_seed(seed))
    qkv = (x @ fused.W_QKV + fused.b_QKV).view(5, 3, cfg.n_heads, cfg.d_head)
    for i, (W, b) in enumerate(((attn.W_Q, attn.b_Q), (attn.W_K, attn.b_K), (attn.W_V, attn.b_V))):
        torch.testing.assert_close(qkv[:, i], torch.einsum("pd,ndh->pnh", x, W) + b, **TOL)
    z = torch.randn(5, cfg.n_heads, cfg.d_head, generator=torch.Generator().manual_seed(seed + 1))
    torch.testing.assert_close(z.reshape(5, -1) @ fused.W_O, torch.einsum("pnh,nhd->pd", z, attn.W_O), **TOL)


# Not graded as the learner's: the packed weights are given code (fast_path.PackedLinear, PackedMLP, PackedUnembed).
def test_packed_weights_multiply_as_the_plain_weights_and_follow_a_change(fast_path, seed):
    if not fast_path.packing_available():
        pytest.skip("this build of PyTorch has no oneDNN packed matmul: the fast path multiplies as usual")
    g = torch.Generator().manual_seed(seed)
    W, b, x = torch.randn(512, 512, generator=g), torch.randn(512, generator=g), torch.randn(3, 5, 512, generator=g)
    packed = fast_path.PackedLinear()
    with torch.no_grad():
        torch.testing.assert_close(packed(x, W, b), x @ W + b, **TOL)
        assert packed(x[:1, :1], W, b) is None, "one row is a matrix-vector product: it keeps the plain weight"
        assert packed(x[..., :256], W[:256, :256], b[:256]) is None, "a weight under PACK_FROM is not worth packing"
        assert packed(x.double(), W.double(), b.double()) is None, "only float32 weights are packed"
        W.mul_(-2.0)  # changed in place: the packed copy is stale
        torch.testing.assert_close(packed(x, W, b), x @ W + b, **TOL)
        W = torch.randn(512, 512, generator=g)  # another weight in its place
        torch.testing.assert_close(packed(x, W, b), x @ W + b, **TOL)
    assert packed(x, W.requires_grad_(), b) is None, "where autograd records, the plain matmul runs"
    assert packed(x, W.requires_grad_(False), b.requires_grad_()) is None, "a trainable bias needs autograd too"


# Not graded as the learner's: given code (fast_path.fuse_at_load, PackedMLP, PackedUnembed).
def test_a_model_on_packed_weights_copies_pickles_and_learns(demo, fast_path, seed, monkeypatch):
    """Rows of a batch run through the packed MLP and unembedding with the plain model's logits; the fused model
    deep-copies and pickles (an opaque oneDNN tensor does neither: the copy packs again), follows a weight given
    new memory, drops its packed copies once cast, and where autograd records, its gradients flow through the
    model's own weights. (The stand-in's weights are smaller than any
    worth packing: the threshold is lowered for the test.)"""
    import pickle

    if not fast_path.packing_available():
        pytest.skip("this build of PyTorch has no oneDNN packed matmul: the fast path multiplies as usual")
    monkeypatch.setattr(fast_path, "PACK_FROM", 0)
    model = fast_path.fuse_at_load(copy.deepcopy(demo))
    tokens = random_tokens(seed, 2, 6, demo.cfg.d_vocab)
    with torch.no_grad():
        expected = demo(tokens)
        torch.testing.assert_close(model(tokens), expected, **TOL)
        assert all(block.mlp.packed.W_in.packed is not None for block in model.blocks), "the MLP's packed kernel did not run"
        assert model.unembed.packed.W_U.packed is not None, "the unembedding's packed kernel did not run"
        for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            torch.testing.assert_close(twin(tokens), expected, **TOL)
        plain = copy.deepcopy(demo)
        for m in (model, plain):  # the same Parameter, new memory (what .to() and .data = ... do): packed again
            m.blocks[0].mlp.W_in.data = plain.blocks[0].mlp.W_in.detach().flip(0)
        torch.testing.assert_close(model(tokens), plain(tokens), **TOL)
        model.double()  # cast: nothing applies any more, and the packed copies are dropped
        model(tokens)
        assert model.blocks[0].mlp.packed.W_in.packed is None and model.unembed.packed.W_U.packed is None
    model.float()(tokens).sum().backward()
    assert model.blocks[0].mlp.W_in.grad is not None and model.unembed.W_U.grad is not None
    unpacked = fast_path.fuse_at_load(model, pack=False)  # the plain matmuls: no second copy of the weights
    assert all(b.mlp.packed is None and b.attn.fused_qkv.W_O is None for b in unpacked.blocks)
    assert unpacked.unembed.packed is None
    with torch.no_grad():
        torch.testing.assert_close(unpacked(tokens), plain(tokens), **TOL)  # plain: the same swapped W_in


# ---------------------------------------------------------------------------------------
# The attention-sink cache
# ---------------------------------------------------------------------------------------


def sink_oracle(reference, tokens, window_length: int, num_sink_tokens: int, rule: str, n_ctx: int) -> torch.Tensor:
    """Oracle: Hugging Face's uncached forward with the sink cache's attention pattern and positions."""
    seq = tokens.shape[1]
    i, j = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    sees = (j <= i) & ((j < num_sink_tokens) | (i - j < window_length - num_sink_tokens))
    mask = torch.zeros(1, 1, seq, seq).masked_fill(~sees, torch.finfo(torch.float32).min)
    last = window_length - 1 if rule == "cache" else n_ctx - 1
    positions = torch.arange(seq).clamp(max=last)[None].expand(tokens.shape[0], -1)
    return hf_logits(reference, tokens, attention_mask=mask.expand(tokens.shape[0], -1, -1, -1), position_ids=positions)


@pytest.mark.exercise("SinkCache.positions")
@pytest.mark.parametrize("rule", ["cache", "absolute"])
def test_sink_positions_follow_the_rule(demo, sink_cache, rule):
    """Token t gets min(t, window_length - 1) ("cache") or min(t, n_ctx - 1) ("absolute")."""
    cfg = demo.cfg
    cache = sink_cache.SinkCache.new_empty(cfg, window_length=8, num_sink_tokens=2, position_rule=rule)
    last = 7 if rule == "cache" else cfg.n_ctx - 1
    for seen, new_pos in ((0, 5), (cfg.n_ctx + 3, 2), (6, 3)):
        cache.seen = seen
        expected = [min(t, last) for t in range(seen, seen + new_pos)]
        got = cache.positions(new_pos).tolist()
        assert got == expected, (
            f'position_rule="{rule}", window_length=8, n_ctx={cfg.n_ctx}: after {seen} tokens, the next {new_pos} '
            f"should be at positions {expected} (token t at min(t, {last})), got {got}"
            + ("; positions past the last one stay there, they do not wrap around" if seen > last else "")
        )


@pytest.mark.exercise("SinkCache.update")
@pytest.mark.parametrize("rule", ["cache", "absolute"])
@pytest.mark.parametrize("window_length, num_sink_tokens, first_chunk", [(16, 2, 1), (16, 4, 10), (12, 0, 12), (9, 3, 30)])
def test_sink_cache_matches_its_oracle_past_n_ctx(reference, oracle, demo, sink_cache, rule, window_length, num_sink_tokens, first_chunk, seed):
    """Token by token past n_ctx, every logit equals HF's masked forward with the cache's positions."""
    if reference.name != "tiny":
        pytest.skip("n_ctx + 24 single steps: run on the stand-in only")
    cfg = demo.cfg
    tokens = random_tokens(seed, 1, cfg.n_ctx + 24, cfg.d_vocab)
    expected = oracle(sink_oracle, reference, tokens, window_length, num_sink_tokens, rule, cfg.n_ctx)
    cache = sink_cache.SinkCache.new_empty(cfg, window_length=window_length, num_sink_tokens=num_sink_tokens, position_rule=rule)
    cache.buffer.fill_(float("nan"))
    got = []
    with torch.no_grad():
        logits, cache = demo(tokens[:, :first_chunk], cache)
        got.append(logits)
        for end in range(first_chunk + 1, tokens.shape[1] + 1):
            logits, cache = demo(tokens[:, :end], cache)
            got.append(logits)
            assert cache.seq_len <= window_length and cache.buffer.shape[3] == window_length
    torch.testing.assert_close(torch.cat(got, 1), expected, **TOL)
    assert cache.seq_len == window_length


@pytest.mark.exercise("SinkCache.update")
def test_sink_cache_before_the_window_fills_is_the_dynamic_cache(sampler, demo, sink_cache, impl):
    """Until the window is full, greedy sampling with a SinkCache equals the dynamic cache's."""
    for prompt in PROMPTS:
        expected = sampler.sample(prompt, 16, temperature=0.0, kv_cache=impl.kv_cache.KeyValueCache.new_empty(demo.cfg))
        actual = sampler.sample(prompt, 16, temperature=0.0, kv_cache=sink_cache.SinkCache.new_empty(demo.cfg, window_length=40))
        assert actual == expected


@pytest.mark.exercise("SinkCache.update")
def test_sampling_with_a_sink_cache_goes_past_n_ctx(reference, demo, sink_cache, impl):
    """sample(..., kv_cache=SinkCache) keeps going past n_ctx, where a KeyValueCache must stop."""
    cfg = demo.cfg
    sampler = impl.sampling.TransformerSampler(demo, reference.tokenizer)
    cache = sink_cache.SinkCache.new_empty(cfg, window_length=16, num_sink_tokens=2)
    # tiny's tokenizer never ends a text early at temperature 0 with these weights: ask for n_ctx + 20 tokens.
    text = sampler.sample(PROMPTS[0], cfg.n_ctx + 20, temperature=0.0, kv_cache=cache)
    assert cache.seen > cfg.n_ctx or text.endswith(reference.tokenizer.eos_token)
    assert cache.seq_len == 16


@pytest.mark.exercise("SinkCache.update")
def test_sink_cache_misuse_fails_loudly(demo, sink_cache):
    cfg = demo.cfg
    with pytest.raises(ValueError, match="window_length"):
        sink_cache.SinkCache.new_empty(cfg, window_length=cfg.n_ctx + 1)
    with pytest.raises(ValueError, match="num_sink_tokens"):
        sink_cache.SinkCache.new_empty(cfg, window_length=8, num_sink_tokens=8)
    with pytest.raises(ValueError, match="position_rule"):
        sink_cache.SinkCache.new_empty(cfg, window_length=8, position_rule="relative")
    cache = sink_cache.SinkCache.new_empty(cfg, window_length=8)
    tokens = random_tokens(0, 1, 4, cfg.d_vocab)
    with pytest.raises(ValueError, match="unpadded"), torch.no_grad():
        demo(tokens, cache, attention_mask=torch.ones_like(tokens))
    with torch.no_grad():
        demo(tokens, cache)
        with pytest.raises(ValueError, match="already run"):
            demo(tokens, cache)


# Graded as part 7's crop_cache, which it calls: in course order, the fast path is checked
# before crop_cache is written, so this test must not grade fast_forward.
@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("crop_cache")
def test_speculative_crop_cache_crops_a_static_cache(reference, oracle, demo, caches, impl, seed):
    """Part 7's crop_cache rolls a static cache back in place; the next step gives a full forward's logits."""
    cfg = demo.cfg
    tokens = random_tokens(seed, 1, 10, cfg.d_vocab)
    cache = poisoned_static_cache(caches, cfg, 1, 12)
    with torch.no_grad():
        demo(tokens, cache)
        cropped = impl.speculative.crop_cache(cache, 6)
        assert cropped is cache and cache.seq_len == 6
        other = tokens.clone()
        other[0, 6:] = random_tokens(seed + 1, 1, 4, cfg.d_vocab)
        logits, cache = demo(other, cache)
    torch.testing.assert_close(logits, oracle(hf_logits, reference, other)[:, 6:], **TOL)
