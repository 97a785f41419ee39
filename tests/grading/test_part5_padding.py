"""Part 5: left padding and the padding-aware model, against Hugging Face's attention and logits on padded batches."""

from __future__ import annotations

import copy

import pytest
import torch

from part5_shared import assert_same_tokens, hf_logits_alone, left_padded, Part5, PROMPTS, TOL


@pytest.fixture(scope="module")
def gen(impl):
    """Part 5's names under test, from whichever module holds them."""
    return Part5(impl)


# ---------------------------------------------------------------------------------------
# The padding-aware model
# ---------------------------------------------------------------------------------------


def random_rows(seed: int, lengths: list[int], d_vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed + 200)
    return [torch.randint(0, d_vocab, (n,), generator=generator).tolist() for n in lengths]


def hf_left_padded(reference, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Oracle: Hugging Face's tokenizer on ``prompts`` with padding_side="left" and pad = EOS: (input_ids, attention_mask)."""
    tok = copy.deepcopy(reference.hf_tokenizer)
    tok.pad_token, tok.padding_side = tok.eos_token, "left"
    expected = tok(prompts, padding=True, return_tensors="pt")
    return expected.input_ids, expected.attention_mask


@pytest.mark.exercise("left_pad")
def test_left_pad_matches_the_tokenizers_left_padding(gen, reference, oracle):
    """left_pad gives what Hugging Face's tokenizer gives with padding_side="left" (pad = EOS): every row's last
    real token in the last column, pads before it, the mask 1 at real tokens and 0 at pads."""
    tok = reference.tokenizer
    for prompts in (PROMPTS, PROMPTS[1:2], ["same length", "same length"]):
        expected_ids, expected_mask = oracle(hf_left_padded, reference, prompts)
        ids, mask = gen.left_pad([tok.encode(p) for p in prompts], tok.eos_token_id)
        assert not ids.is_floating_point() and not mask.is_floating_point(), "input_ids and attention_mask hold integers"
        assert_same_tokens(ids, expected_ids, f"left_pad({len(prompts)} prompts): input_ids")
        assert_same_tokens(mask, expected_mask, f"left_pad({len(prompts)} prompts): attention_mask")


@pytest.mark.exercise("position_ids_from_mask")
def test_position_ids_count_real_tokens_only(impl):
    """position_ids_from_mask numbers each row's real tokens 0, 1, 2, ... (what pads get is not checked)."""
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1], [0, 1, 1, 0, 0]])
    positions = impl.transformer.position_ids_from_mask(mask)
    assert positions.shape == mask.shape
    for row in range(mask.shape[0]):
        real = positions[row][mask[row].bool()].tolist()
        assert real == list(range(len(real))), f"row {row} (mask {mask[row].tolist()}): real tokens at positions {real}"


def hf_attention_io(reference, ids: torch.Tensor, mask: torch.Tensor, layer: int = 0):
    """Oracle: Hugging Face's input to a block's attention (its ln_1 output) and that attention's output, on a padded
    batch with the positions Hugging Face's generate gives it (real tokens counted from 0, pads at 0)."""
    seen = {}
    block = reference.hf_model.transformer.h[layer]
    hooks = [block.ln_1.register_forward_hook(lambda module, args, out: seen.__setitem__("x", out)),
             block.attn.register_forward_hook(lambda module, args, out: seen.__setitem__("out", out[0]))]
    try:
        with torch.no_grad():
            reference.hf_model(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    finally:
        for hook in hooks:
            hook.remove()
    return seen["x"], seen["out"]


class ListCache:
    """A cache of the protocol made here: each layer's keys and values kept in order, the new ones after the old."""

    def __init__(self):
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer in self.kv:
            k, v = torch.cat([self.kv[layer][0], k], 1), torch.cat([self.kv[layer][1], v], 1)
        self.kv[layer] = (k, v)
        return k, v


@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("masked_forward")
@pytest.mark.parametrize("layer", [0, -1], ids=["first layer", "last layer"])
def test_masked_forward_matches_hf_attention_on_a_padded_batch(demo, reference, oracle, impl, seed, layer):
    """Attention.forward on a layer of a cache whose step mask hides the pad keys, fed Hugging Face's own
    attention input for a left-padded batch, gives Hugging Face's attention output at every real token: all
    positions at once, and with a cache (the first positions, then the last two on top)."""
    cfg = reference.cfg
    layer = layer % cfg.n_layers
    rows = random_rows(seed + 3, [7, 2, 5], cfg.d_vocab)
    ids, mask = left_padded(rows, reference.tokenizer.eos_token_id)
    x, expected = oracle(hf_attention_io, reference, ids, mask, layer)
    attn, real, n = demo.blocks[layer].attn, mask.bool(), ids.shape[1]
    LayerCache = impl.kv_cache.LayerCache

    def hides_pads(upto: int) -> torch.Tensor:
        return real[:, None, None, :upto]

    with torch.no_grad():
        out, _ = attn(x, LayerCache(ListCache(), layer, hides_pads(n)))
        cache = ListCache()
        first, _ = attn(x[:, : n - 2], LayerCache(cache, layer, hides_pads(n - 2)))
        last, _ = attn(x[:, n - 2 :], LayerCache(cache, layer, hides_pads(n)))
    for what, got, want, keep in (("all positions new", out, expected, real),
                                  ("cached: the first positions", first, expected[:, : n - 2], real[:, : n - 2]),
                                  ("cached: the last two on top", last, expected[:, n - 2 :], real[:, n - 2 :])):
        assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        torch.testing.assert_close(got[keep], want[keep], **TOL,
                                   msg=lambda m: f"layer {layer}, {what}: attention output at real tokens.\n{m}")


@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("padded_forward")
def test_padded_rows_equal_each_row_alone(demo, reference, oracle, seed):
    """Without a cache: at every real position, each row of a left-padded batch gives Hugging Face's
    logits of that row run alone; an all-ones mask gives the plain forward's logits."""
    cfg = reference.cfg
    rows = random_rows(seed, [9, 3, 14, 1], cfg.d_vocab)
    pad = reference.tokenizer.eos_token_id
    ids, mask = left_padded(rows, pad)
    with torch.no_grad():
        logits = demo(ids, attention_mask=mask)
        plain = demo(ids[2:3])
        ones = demo(ids[2:3], attention_mask=mask[2:3])
    assert logits.shape == (*ids.shape, cfg.d_vocab)
    torch.testing.assert_close(ones, plain, **TOL, msg=lambda m: f"an all-ones mask changed the logits.\n{m}")
    for r, row in enumerate(rows):
        expected = oracle(hf_logits_alone, reference, row)
        torch.testing.assert_close(
            logits[r, ids.shape[1] - len(row) :], expected, **TOL,
            msg=lambda m: f"row {r} ({len(row)} tokens after {ids.shape[1] - len(row)} pads) differs from the row alone.\n{m}",
        )


@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.exercise("padded_forward")
def test_padded_rows_with_a_cache(demo, reference, oracle, impl, seed):
    """With a KV cache: a padded prefill, then new tokens one or two at a time; row 1 'finishes' after the
    second step and receives masked pads. At every step the other rows' logits equal each row run alone."""
    cfg = reference.cfg
    KVC = impl.transformer.KeyValueCache
    rows = random_rows(seed, [6, 2, 9], cfg.d_vocab)
    pad = reference.tokenizer.eos_token_id
    ids, mask = left_padded(rows, pad)
    extra = random_rows(seed + 1, [5, 5, 5], cfg.d_vocab)
    cache = KVC.new_empty(cfg, batch=3)
    with torch.no_grad():
        logits, cache = demo(ids, cache, attention_mask=mask)
        for r, row in enumerate(rows):
            torch.testing.assert_close(logits[r, -len(row):], oracle(hf_logits_alone, reference, row), **TOL,
                                       msg=lambda m: f"prefill, row {r}.\n{m}")
        done = 0
        for step, n_new in enumerate((1, 1, 2, 1)):
            new = torch.tensor([e[done : done + n_new] for e in extra])
            new_mask = torch.ones_like(new)
            if step >= 2:  # row 1 is finished: it gets pads, masked out
                new[1], new_mask[1] = pad, 0
            ids, mask = torch.cat([ids, new], 1), torch.cat([mask, new_mask], 1)
            logits, cache = demo(ids, cache, attention_mask=mask)
            done += n_new
            assert isinstance(cache, KVC) and cache.seq_len == ids.shape[1]
            for r in range(3):
                if r == 1 and step >= 2:
                    continue
                real = ids[r][mask[r].bool()].tolist()
                expected = oracle(hf_logits_alone, reference, real)[-n_new:]
                torch.testing.assert_close(logits[r], expected, **TOL,
                                           msg=lambda m: f"step {step}, row {r}: cached padded logits differ from the row alone.\n{m}")


@pytest.mark.exercise("padded_forward")
def test_attention_mask_is_checked(demo, reference):
    """A mask of another shape, or with values other than 0 and 1, raises a ValueError saying what a mask holds."""
    ids = torch.zeros(2, 4, dtype=torch.long)
    for mask in (torch.ones(2, 3, dtype=torch.long), torch.full((2, 4), 2), torch.ones(2, 4) * 0.5):
        with pytest.raises(ValueError, match="attention_mask"):
            demo(ids, attention_mask=mask)
