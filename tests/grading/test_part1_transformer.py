"""Part 1: every component of DemoTransformer against the reference, activation by activation.

Each component is built from the implementation under test, loaded with the reference's
weights through ``demo_state_dict``, fed the reference's own input activation from
TransformerLens' ``run_with_cache`` and compared with the reference's output activation.
The references' outputs come through the ``oracle`` fixture: computed live the first
time, then read back (see ``sampling_course.grading.oracle``).
The stand-in's weights are all perturbed (no zero biases, no unit LayerNorm weights),
so dropping a bias or LayerNorm's w/b cannot go unnoticed. Every comparison runs on the
stand-in, on the trained story model and, when cached, on real GPT-2 (``parity_reference``).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from sampling_course.config import Config
from sampling_course.grading.tolerances import parity
from sampling_course.weights import demo_state_dict, load_weights

# fp32 activations of a 12-layer model drift by ~1e-5 between two correct implementations;
# every classic mistake in part 1 moves them by more than 1e-3 on the stand-in.
# The bounds for the device graded on, float32 (grading/tolerances.py says why).
TOL = parity()

PROMPTS = [
    "When I was a kid, John and Mary went to the church.",
    "The cat sat on the mat. Jingle bells, jingle bells!",
]


def activation_names(n_layers: int) -> list:
    """The activations the tests below read, named as TransformerLens' cache is indexed."""
    names = ["hook_embed", "hook_pos_embed", "ln_final.hook_out", ("q", 0), ("k", 0), ("pattern", 0)]
    for layer in range(n_layers):
        names += [("resid_pre", layer), ("resid_mid", layer), ("resid_post", layer), ("attn_out", layer),
                  ("mlp_out", layer), f"blocks.{layer}.ln1.hook_out", f"blocks.{layer}.ln2.hook_out"]
    return names


def _key(name) -> str:
    return " ".join(map(str, name)) if isinstance(name, tuple) else name


def tl_run(reference, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Oracle: TransformerLens' logits and the activations of ``activation_names`` on ``tokens``."""
    logits, cache = reference.model.run_with_cache(tokens)
    return logits, {_key(name): cache[name] for name in activation_names(reference.cfg.n_layers)}


class Activations:
    """The stored activations, indexed like TransformerLens' cache: ``cache["resid_pre", 0]``."""

    def __init__(self, stored: dict[str, torch.Tensor]):
        self.stored = stored

    def __getitem__(self, name) -> torch.Tensor:
        return self.stored[_key(name)]


def hf_logits(reference, tokens: torch.Tensor) -> torch.Tensor:
    """Oracle: Hugging Face's logits."""
    return reference.hf_model(tokens).logits


@pytest.fixture(scope="module")
def run(parity_reference, oracle):
    """The reference's logits and activation cache on a padded-free batch of two prompts."""
    tokenizer = parity_reference.tokenizer
    ids = [tokenizer(p).input_ids for p in PROMPTS]
    length = min(len(i) for i in ids)
    tokens = torch.tensor([i[:length] for i in ids])
    logits, stored = oracle(tl_run, parity_reference, tokens)
    return tokens, logits, Activations(stored)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    expected = expected.to(actual.device)  # the references run on the CPU; the learner's model may not
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    torch.testing.assert_close(actual, expected, **TOL, msg=lambda m: f"{what} differs from the reference.\n{m}")


# ---------------------------------------------------------------------------------------
# Config and weight conversion
# ---------------------------------------------------------------------------------------


def test_config_defaults_are_gpt2_small():
    """Config() has GPT-2 small's classic hyperparameters."""
    cfg = Config()
    assert (cfg.d_model, cfg.d_vocab, cfg.n_ctx, cfg.d_head, cfg.d_mlp, cfg.n_heads, cfg.n_layers) == (
        768, 50257, 1024, 64, 3072, 12, 12,
    )
    assert cfg.layer_norm_eps == 1e-5 and cfg.init_range == 0.02 and cfg.debug is True


def test_config_from_hf_reads_every_field(parity_reference):
    """Config.from_hf translates the Hugging Face config field by field."""
    hf = parity_reference.hf_model.config
    cfg = Config.from_hf(hf)
    assert cfg.d_model == hf.n_embd and cfg.n_layers == hf.n_layer and cfg.n_heads == hf.n_head
    assert cfg.d_head * cfg.n_heads == hf.n_embd and cfg.d_vocab == hf.vocab_size
    assert cfg.n_ctx == hf.n_positions and cfg.layer_norm_eps == hf.layer_norm_epsilon
    assert cfg.d_mlp == (hf.n_inner or 4 * hf.n_embd)


def test_config_rejects_nonsense():
    """A Config with a non-positive size says which field is wrong."""
    with pytest.raises(ValueError, match="n_heads"):
        Config(n_heads=0)


# ---------------------------------------------------------------------------------------
# Components against TransformerLens activations
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("LayerNorm")
def test_layer_norm_matches_reference(parity_demo, run):
    """LayerNorm reproduces ln1 and ln2 of every block and ln_final."""
    _, _, cache = run
    for layer, block in enumerate(parity_demo.blocks):
        assert_close(block.ln1(cache["resid_pre", layer]), cache[f"blocks.{layer}.ln1.hook_out"], f"blocks.{layer}.ln1")
        assert_close(block.ln2(cache["resid_mid", layer]), cache[f"blocks.{layer}.ln2.hook_out"], f"blocks.{layer}.ln2")
    last = len(parity_demo.blocks) - 1
    assert_close(parity_demo.ln_final(cache["resid_post", last]), cache["ln_final.hook_out"], "ln_final")


def hf_first_ln(reference, residual: torch.Tensor) -> torch.Tensor:
    """Oracle: Hugging Face's first LayerNorm (block 0's ln_1) on ``residual``."""
    return reference.hf_model.transformer.h[0].ln_1(residual)


@pytest.mark.exercise("LayerNorm")
def test_layer_norm_eps_inside_sqrt(parity_demo, parity_reference, oracle):
    """On inputs with variance far below eps, only sqrt(var + eps) matches the reference."""
    generator = torch.Generator().manual_seed(0)
    tiny_residual = 1e-4 * torch.randn(2, 5, parity_reference.cfg.d_model, generator=generator)
    expected = oracle(hf_first_ln, parity_reference, tiny_residual)
    assert_close(parity_demo.blocks[0].ln1(tiny_residual), expected, "LayerNorm on a low-variance input")


@pytest.mark.exercise("Embed")
def test_embed_matches_reference(parity_demo, run):
    """Embed returns each token's row of W_E."""
    tokens, _, cache = run
    assert_close(parity_demo.embed(tokens), cache["hook_embed"], "embed")


@pytest.mark.exercise("PosEmbed")
def test_pos_embed_matches_reference(parity_demo, run):
    """PosEmbed returns the embedding of positions 0..pos-1 for every sequence in the batch."""
    tokens, _, cache = run
    assert_close(parity_demo.pos_embed(tokens), cache["hook_pos_embed"], "pos_embed")


@pytest.mark.exercise("apply_causal_mask")
def test_causal_mask_gives_reference_pattern(parity_demo, run, parity_reference):
    """softmax(apply_causal_mask(q.k / sqrt(d_head))) equals the reference attention pattern."""
    _, _, cache = run
    q, k = cache["q", 0], cache["k", 0]
    scores = torch.einsum("bqnh,bknh->bnqk", q, k) / math.sqrt(parity_reference.cfg.d_head)
    pattern = parity_demo.blocks[0].attn.apply_causal_mask(scores).softmax(dim=-1)
    assert_close(pattern, cache["pattern", 0], "attention pattern")


@pytest.mark.exercise("apply_causal_mask")
def test_causal_mask_keeps_the_diagonal_and_hides_the_future(parity_demo):
    """Each query sees itself and the past (never an empty row), and nothing after it."""
    scores = torch.zeros(1, 1, 4, 4)
    pattern = parity_demo.blocks[0].attn.apply_causal_mask(scores).softmax(dim=-1)[0, 0]
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]) / torch.arange(1, 5)[:, None]
    assert_close(pattern, expected.float(), "pattern of all-zero scores")


@pytest.mark.exercise("apply_causal_mask")
def test_causal_mask_with_fewer_queries_than_keys(parity_demo, run, parity_reference):
    """With the earlier keys cached (query_pos < key_pos), the queries are the last ones: their rows of the
    reference pattern come out, and on all-zero scores the last query sees every key."""
    _, _, cache = run
    q, k = cache["q", 0], cache["k", 0]
    new = 3
    scores = torch.einsum("bqnh,bknh->bnqk", q[:, -new:], k) / math.sqrt(parity_reference.cfg.d_head)
    pattern = parity_demo.blocks[0].attn.apply_causal_mask(scores).softmax(dim=-1)
    assert_close(pattern, cache["pattern", 0][:, :, -new:], f"pattern of the last {new} queries over every key")
    zeros = parity_demo.blocks[0].attn.apply_causal_mask(torch.zeros(1, 1, 2, 5)).softmax(dim=-1)[0, 0]
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]) / torch.tensor([[4], [5]])
    assert_close(zeros, expected.float(), "pattern of all-zero scores, 2 queries after 3 cached keys")


@pytest.mark.exercise("Attention")
def test_attention_matches_reference(parity_demo, run):
    """Attention maps ln1's output to the reference's attention output, in every layer."""
    _, _, cache = run
    for layer, block in enumerate(parity_demo.blocks):
        assert_close(block.attn(cache[f"blocks.{layer}.ln1.hook_out"]), cache["attn_out", layer], f"blocks.{layer}.attn")


@pytest.mark.exercise("MLP")
def test_mlp_matches_reference(parity_demo, run):
    """MLP (with GPT-2's tanh-approximated gelu_new) maps ln2's output to the reference's MLP output."""
    _, _, cache = run
    for layer, block in enumerate(parity_demo.blocks):
        assert_close(block.mlp(cache[f"blocks.{layer}.ln2.hook_out"]), cache["mlp_out", layer], f"blocks.{layer}.mlp")


@pytest.mark.exercise("TransformerBlock")
def test_block_matches_reference(parity_demo, run):
    """A whole block maps resid_pre to resid_post (both residual additions included)."""
    _, _, cache = run
    for layer, block in enumerate(parity_demo.blocks):
        assert_close(block(cache["resid_pre", layer]), cache["resid_post", layer], f"blocks.{layer}")


@pytest.mark.exercise("Unembed")
def test_unembed_matches_reference(parity_demo, run):
    """Unembed maps ln_final's output to the reference logits."""
    _, logits, cache = run
    assert_close(parity_demo.unembed(cache["ln_final.hook_out"]), logits, "unembed")


@pytest.mark.exercise("Unembed")
def test_unembed_adds_its_bias(parity_demo, run):
    """A non-zero b_U shifts every logit by b_U (GPT-2's own b_U is zero, so this needs its own test)."""
    _, logits, cache = run
    unembed = parity_demo.unembed
    bias = torch.linspace(-1, 1, unembed.b_U.shape[0])
    saved = unembed.b_U.detach().clone()
    try:
        with torch.no_grad():
            unembed.b_U.copy_(bias)
        assert_close(unembed(cache["ln_final.hook_out"]), logits + bias, "unembed with a non-zero b_U")
    finally:
        with torch.no_grad():
            unembed.b_U.copy_(saved)


@pytest.mark.exercise("DemoTransformer")
def test_demo_transformer_matches_hf_logits(parity_demo, run, parity_reference, oracle):
    """The full model's logits equal Hugging Face's GPT2LMHeadModel on the same weights."""
    tokens, _, _ = run
    expected = oracle(hf_logits, parity_reference, tokens)
    with torch.no_grad():
        actual = parity_demo(tokens)
    assert_close(actual, expected, "DemoTransformer logits")


@pytest.mark.exercise("DemoTransformer")
def test_demo_transformer_single_token_and_batch_independence(parity_demo, parity_reference, oracle):
    """A one-token input works, and each sequence's logits do not depend on the rest of the batch."""
    tokens = torch.tensor([[5], [7]])
    expected = oracle(hf_logits, parity_reference, tokens)
    with torch.no_grad():
        assert_close(parity_demo(tokens), expected, "logits of one-token sequences")
        assert_close(parity_demo(tokens[1:]), expected[1:], "logits of a batch of one")


# ---------------------------------------------------------------------------------------
# Weight conversion on models the references do not cover
# ---------------------------------------------------------------------------------------


def _random_weights(seed: int, scale: float, shapes: list[tuple[str, list[int]]]) -> dict[str, torch.Tensor]:
    """Every parameter (name, shape), in sorted order, drawn from N(0, scale); LayerNorm weights from N(1, 0.1)."""
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in shapes:
        noise = torch.randn(shape, generator=generator)
        weights[name] = (1 + 0.1 * noise) if ".ln_" in name and name.endswith("weight") else scale * noise
    return weights


def random_gpt2_run(seed: int, scale: float, dims: dict) -> tuple[dict, list, torch.Tensor, torch.Tensor]:
    """Oracle: a GPT2LMHeadModel with ``_random_weights``, run on random tokens. Returns its config's
    fields, its parameters' names and shapes (the weights follow from the seed), the tokens and its logits."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.initialization import no_init_weights

    # Hugging Face's own initialisation is skipped (every parameter is overwritten below, and at
    # GPT-2 small's size it is the slowest step); tie_weights() then shares W_E with lm_head as usual.
    with no_init_weights():
        model = GPT2LMHeadModel(GPT2Config(**dims)).eval()
    model.tie_weights()
    shapes = [(name, list(param.shape)) for name, param in sorted(model.named_parameters())]
    weights = _random_weights(seed, scale, shapes)
    for name, param in model.named_parameters():
        param.copy_(weights[name])
    config = {key: getattr(model.config, key) for key in ("model_type", "n_embd", "n_head", "n_layer", "n_positions",
                                                           "vocab_size", "n_inner", "layer_norm_epsilon",
                                                           "initializer_range")}
    cfg = Config.from_hf(model.config)
    tokens = torch.randint(0, cfg.d_vocab, (2, min(cfg.n_ctx, 24)), generator=torch.Generator().manual_seed(1))
    return config, shapes, tokens, model(tokens).logits


@pytest.mark.exercise("DemoTransformer")
@pytest.mark.parametrize(
    "dims, scale",
    [
        (dict(), 0.02),  # GPT-2 small's size at its usual init scale
        (dict(n_embd=48, n_layer=3, n_head=6, n_positions=40, vocab_size=300), 0.5),  # larger init
        (dict(n_embd=32, n_layer=2, n_head=2, n_inner=80, n_positions=20, vocab_size=100), 0.3),  # odd d_mlp
    ],
    ids=["gpt2-small-size", "small-large-init", "custom-d_mlp"],
)
def test_random_weights_match_hf(impl, oracle, dims, scale):
    """demo_state_dict + DemoTransformer reproduce GPT2LMHeadModel's logits on random weights."""
    config, shapes, tokens, expected = oracle(random_gpt2_run, len(dims), scale, dims)
    cfg = Config.from_hf(SimpleNamespace(**config))
    demo = impl.transformer.DemoTransformer(cfg)
    # The same weights as the Hugging Face model's: drawn from the same seed, name by name.
    load_weights(demo, demo_state_dict(_random_weights(len(dims), scale, shapes), cfg))
    with torch.no_grad():
        assert_close(demo.eval()(tokens.to(next(demo.parameters()).device)), expected, "logits on random weights")


def test_demo_state_dict_names_and_shapes(impl, parity_reference):
    """demo_state_dict gives exactly DemoTransformer's parameter names, with matching shapes."""
    expected = impl.transformer.DemoTransformer(parity_reference.cfg).state_dict()
    converted = demo_state_dict(parity_reference.hf_model)
    assert sorted(converted) == sorted(expected)
    for name, tensor in converted.items():
        assert tensor.shape == expected[name].shape, name
    assert converted["blocks.0.attn.W_Q"].shape == (parity_reference.cfg.n_heads, parity_reference.cfg.d_model, parity_reference.cfg.d_head)


def test_stand_in_is_perturbed(tiny):
    """The stand-in has no zero bias and no unit LayerNorm weight, so forgetting one shows."""
    for name, param in tiny.hf_model.named_parameters():
        if name.endswith("bias"):
            assert param.abs().min() > 0, name
        if ".ln_" in name and name.endswith("weight"):
            assert not torch.allclose(param, torch.ones_like(param)), name


def test_stand_in_is_peaked(tiny):
    """The stand-in's next-token distributions are peaked like a trained model's, not near-uniform."""
    tokens = tiny.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    with torch.no_grad():
        probs = tiny.hf_model(tokens).logits.softmax(-1)
    entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1)
    assert entropy.mean() < 0.5 * math.log(tiny.cfg.d_vocab)
