"""Part 11: the learner's own models (part 1's GPT-2, part 9's Llama-style decoder) run on quantised weights.

* ``quantise_matrix`` / ``dequantise_matrix``: the stored tensors are the earlier exercises' (checked
  against torchao and brute force in ``test_part11_quantise.py`` and ``test_part11_nf4.py``), 4-bit
  codes packed two per byte; reading them back gives exactly what those exercises give.
* ``quantise_model``: the quantised model's logits are bit for bit those of its twin, the float model
  whose block weights were replaced by their dequantised values (each converted to an (out, in) matrix
  and back by the test's own permutes, so the layout conversion is checked too); it holds fewer bytes; a
  cached decode (part 4's KeyValueCache, part 9's LlamaCache) equals the uncached forward; part 6's fused
  QKV reads the same weights; and ``weight_bytes`` is the formula for codes, scales and zero points.
  The stored tensors are read by the test (dtypes and shapes of the scheme), given new random contents and
  dequantised by the test's own code: the logits must follow, so a model that computes from a float copy fails.

The tests marked ``downstream`` also run on every correct variant of parts 1 and 4 (the learner's own model).
"""

from __future__ import annotations

import pytest
import torch

from sampling_course.grading.tolerances import parity
from sampling_course.implementation import load_demo
from sampling_course.llama_config import LlamaConfig
from sampling_course.llama_weights import random_llama_weights
from sampling_course.weights import load_weights

from part11_oracles import PUBLISHED_NF4, random_matrix

TOL = parity()
PUBLISHED_LEVELS = torch.tensor(PUBLISHED_NF4, dtype=torch.float32)
SCHEMES = ["int8", "int4-g32", "nf4-g32", "nf4-g16-dq"]
LLAMA = LlamaConfig(d_model=32, d_vocab=64, n_ctx=32, d_head=8, d_mlp=64, n_heads=4, n_key_value_heads=2,
                    n_layers=2, qk_norm=True)


def reference_matrix(impl, matrix: torch.Tensor, scheme: str) -> torch.Tensor:
    """``matrix`` (out, in) quantised and dequantised with the earlier exercises' functions, in float32."""
    q, nf4 = impl.quantise, impl.nf4
    if scheme == "int8":
        return q.dequantise_int8(*q.quantise_int8(matrix))
    kind, group = scheme.split("-")[0], int(scheme.split("-")[1][1:])
    if kind == "int4":
        codes, scale, zero_point = q.quantise_groups(matrix, group)
        return q.dequantise_groups(codes, scale, zero_point, group)
    codes, absmax = nf4.quantise_nf4(matrix, group)
    if scheme.endswith("-dq"):
        absmax = nf4.double_quantise(absmax).dequantise()
    return nf4.dequantise_nf4(codes, absmax, group)


# The test's own layout conversion: each weight name -> (to (out, in), back to the model's layout).
def _to_matrix(name: str, w: torch.Tensor) -> torch.Tensor:
    if w.ndim == 2:  # (in, out), used as x @ W
        return w.T.contiguous()
    n, a, b = w.shape
    if name == "W_O":  # (n_heads, d_head, d_model): inputs are the heads' outputs side by side
        return w.reshape(n * a, b).T.contiguous()
    return w.permute(0, 2, 1).reshape(n * b, a).contiguous()  # (n_heads, d_model, d_head)


def _from_matrix(name: str, m: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    if len(shape) == 2:
        return m.T
    n, a, b = shape
    if name == "W_O":
        return m.T.reshape(n, a, b)
    return m.reshape(n, b, a).permute(0, 2, 1)


NAMES = ("W_Q", "W_K", "W_V", "W_O", "W_in", "W_out", "W_gate")


def targets(model: torch.nn.Module) -> list[tuple[str, str]]:
    """(module path, weight name) of every weight matrix in the float model's blocks."""
    return [(path, name) for path, module in model.named_modules() if path.startswith("blocks.")
            for name in NAMES if isinstance(module._parameters.get(name), torch.nn.Parameter)]


def check_quantised(impl, make_model, scheme: str, tokens: torch.Tensor) -> torch.nn.Module:
    """Quantise a fresh model and check it against its twin: a float model whose block weights were replaced by
    their dequantised values (the earlier exercises', through the test's own layout conversion). The logits
    must be the twin's bit for bit, and the quantised model must hold fewer bytes (the float weights gone).
    Returns the quantised model.

    ``weight_bytes`` is the submission's (given code in its file), so it decides nothing alone: the stored tensors
    are read by the test itself (``check_reads_its_stored_tensors``). A class grader sees a submission's model
    through a mirror made when the model was built, which does not follow the parametrisations quantise_model
    registers; ``parametrizations`` is asked of the submission's model and crosses as a new mirror, whose tensors
    are kept in step with the submission's."""
    model, twin = make_model(), make_model()
    where = targets(twin)
    assert len(where) >= 6, f"expected the blocks' weight matrices, found {where}"
    with torch.no_grad():
        for path, name in where:
            weight = getattr(twin.get_submodule(path), name)
            matrix = reference_matrix(impl, _to_matrix(name, weight.detach().clone()), scheme)
            weight.copy_(_from_matrix(name, matrix, weight.shape))
        float_bytes = impl.quantised_model.weight_bytes(model)
        assert impl.quantised_model.quantise_model(model, scheme) is model, "quantise_model returns the model"
        assert torch.equal(model(tokens), twin(tokens)), (
            "the quantised model's logits are not those of the model holding its dequantised weights")
        assert impl.quantised_model.weight_bytes(model) < float_bytes, "the quantised model holds as many bytes as before"
        check_reads_its_stored_tensors(impl, model, make_model, where, scheme, tokens)
    return model


def stored_tensors(model: torch.nn.Module, path: str, name: str) -> list[torch.Tensor]:
    """The tensors the quantised model stores for its weight ``name`` of ``path``, read by the test (not by the
    submission's ``weight_bytes``, which a class grader cannot trust): the originals of its parametrisation."""
    plist = getattr(model.get_submodule(path), "parametrizations", None)
    plist = None if plist is None else getattr(plist, name, None)
    assert plist is not None, (f"{path}.{name} is not parametrised: its float weight is still what the model stores "
                               "(register QuantisedWeight with torch.nn.utils.parametrize)")
    named = dict(plist.named_parameters(recurse=False)) | dict(plist.named_buffers(recurse=False))
    order = sorted((n for n in named if n.startswith("original")), key=lambda n: int(n[8:] or 0))
    assert order, f"{path}.{name}'s parametrisation stores nothing"
    return [named[n] for n in order]


def _stored_layout(scheme: str, out: int, inp: int) -> list[tuple[torch.dtype | None, tuple[int, ...]]]:
    """(dtype, shape) of each tensor ``quantise_matrix`` stores for an (out, in) matrix; None: the model's float dtype."""
    if scheme == "int8":
        return [(torch.int8, (out, inp)), (None, (out,))]
    group = int(scheme.split("-")[1][1:])
    groups = (out, inp // group)
    if scheme.startswith("int4"):
        return [(torch.uint8, (out, inp // 2)), (None, groups), (torch.uint8, groups)]
    if not scheme.endswith("-dq"):
        return [(torch.uint8, (out, inp // 2)), (None, groups)]
    n = groups[0] * groups[1]
    return [(torch.uint8, (out, inp // 2)), (torch.int8, (-(-n // 256) * 256,)), (None, (-(-n // 256),)), (None, ())]


def _new_contents(scheme: str, stored: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """Random codes and scales for ``stored`` that no quantiser made: weights of about 0.1 (codes of any value)."""
    g = torch.Generator().manual_seed(seed)  # the test's inputs, made on the CPU and moved where they are stored
    def uniform(t, low, high):
        return (low + (high - low) * torch.rand(t.shape, generator=g)).to(t.dtype)

    def codes(t, low, high):
        return torch.randint(low, high + 1, t.shape, generator=g, dtype=t.dtype)

    if scheme == "int8":
        return [codes(stored[0], -127, 127), uniform(stored[1], 0.05 / 127, 0.15 / 127)]
    if scheme.startswith("int4"):
        return [codes(stored[0], 0, 255), uniform(stored[1], 0.1 / 15, 0.3 / 15), codes(stored[2], 0, 15)]
    if not scheme.endswith("-dq"):
        return [codes(stored[0], 0, 255), uniform(stored[1], 0.05, 0.15)]
    return [codes(stored[0], 0, 255), codes(stored[1], -127, 127), uniform(stored[2], 0.02 / 127, 0.05 / 127),
            uniform(stored[3], 0.08, 0.12)]


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """Two codes per byte, unpacked by the test (input 2j in the low four bits, 2j + 1 in the high four): the
    submission's unpack_int4 is given code in its file, which a class grader cannot trust."""
    packed = packed.detach().cpu()
    return torch.stack([packed & 15, packed >> 4], dim=-1).reshape(packed.shape[0], 2 * packed.shape[1])


def _dequantised(scheme: str, stored: list[torch.Tensor], out: int, inp: int) -> torch.Tensor:
    """The (out, in) float32 matrix ``stored`` stands for, computed by the test (not by the submission)."""
    t = [x.detach().cpu() for x in stored]
    if scheme == "int8":
        return t[0].float() * t[1].float()[:, None]
    q = unpack(t[0]).float()
    group = int(scheme.split("-")[1][1:])
    q = q.reshape(out, inp // group, group)
    if scheme.startswith("int4"):
        return ((q - t[2].float()[..., None]) * t[1].float()[..., None]).reshape(out, inp)
    if scheme.endswith("-dq"):
        n, block = out * (inp // group), t[1].numel() // t[2].numel()
        absmax = ((t[1].float().reshape(-1, block) * t[2].float()[:, None]).flatten()[:n] + t[3].float())
        absmax = absmax.reshape(out, inp // group)
    else:
        absmax = t[1].float()
    return (PUBLISHED_LEVELS[q.long()] * absmax[..., None]).reshape(out, inp)


def check_reads_its_stored_tensors(impl, model, make_model, where, scheme: str, tokens: torch.Tensor) -> None:
    """The quantised model stores, for each weight, the tensors of its scheme (dtypes and shapes checked here, on
    what crossed to the test), and its forward pass reads them: after every stored tensor is given new random
    contents, its logits are those of a float model holding what they stand for, dequantised by the test itself.
    A model that kept its float weights (fake quantisation, with ``weight_bytes`` saying otherwise) or that stores
    codes but computes from a float copy fails; both earned ``quantise_model`` in class grading before."""
    twin = make_model()
    for i, (path, name) in enumerate(where):
        stored = stored_tensors(model, path, name)
        weight = getattr(twin.get_submodule(path), name)
        out, inp = _to_matrix(name, weight.detach()).shape
        layout = _stored_layout(scheme, out, inp)
        got = [(t.dtype, tuple(t.shape)) for t in stored]
        assert len(got) == len(layout) and all(
            (d == dtype if d is not None else dtype == weight.dtype) and shape == want
            for (d, want), (dtype, shape) in zip(layout, got)), (
            f"{path}.{name} ({scheme}) stores {got}; expected {[(d or weight.dtype, want) for d, want in layout]}")
        new = _new_contents(scheme, stored, 36 + i)
        for t, value in zip(stored, new):
            t.copy_(value.to(t.device))
        weight.copy_(_from_matrix(name, _dequantised(scheme, new, out, inp).to(weight.dtype).to(weight.device),
                                  weight.shape))
    torch.testing.assert_close(model(tokens), twin(tokens), **TOL, msg=(
        "after new codes and scales were stored, the model's logits are not those of the weights they stand for: "
        "its forward pass does not read what it stores"))


@pytest.fixture(scope="module")
def tokens(tiny, device):
    """Tokens on the session's device, where load_demo puts the model."""
    return torch.randint(0, tiny.cfg.d_vocab, (2, 12), generator=torch.Generator().manual_seed(31)).to(device)


# ---------------------------------------------------------------------------------------
# Storing a matrix and reading it back
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("quantise_matrix")
def test_stored_tensors_are_the_quantisers_with_4_bit_codes_packed(impl):
    weight = random_matrix(32, 8, 64)
    Scheme, store = impl.quantised_model.Scheme, impl.quantised_model.quantise_matrix
    q, scale = store(weight.clone(), Scheme.parse("int8"))
    ref_q, ref_scale = impl.quantise.quantise_int8(weight)
    assert torch.equal(q, ref_q) and torch.equal(scale, ref_scale)
    packed, scale, zero_point = store(weight.clone(), Scheme.parse("int4-g32"))
    ref = impl.quantise.quantise_groups(weight, 32)
    assert packed.dtype == torch.uint8 and packed.shape == (8, 32), ("4-bit codes must be packed", packed.shape)
    assert torch.equal(unpack(packed), ref[0]) and torch.equal(scale, ref[1])
    assert zero_point.dtype == torch.uint8 and torch.equal(zero_point.float(), ref[2]), (
        f"int4's zero points are stored as uint8 (whole numbers in [0, 15], one byte each), those of your "
        f"quantise_groups; got {zero_point.dtype}")
    packed, absmax = store(weight.clone(), Scheme.parse("nf4-g32"))
    codes, ref_absmax = impl.nf4.quantise_nf4(weight, 32)
    assert torch.equal(unpack(packed), codes) and torch.equal(absmax, ref_absmax)
    packed, dq_codes, dq_scales, offset = store(weight.clone(), Scheme.parse("nf4-g32-dq"))
    dq = impl.nf4.double_quantise(ref_absmax)
    assert torch.equal(unpack(packed), codes)
    assert torch.equal(dq_codes, dq.codes) and torch.equal(dq_scales, dq.scales) and torch.equal(offset, dq.offset)


@pytest.mark.exercise("dequantise_matrix")
@pytest.mark.parametrize("scheme", SCHEMES)
def test_reading_back_gives_the_dequantisers_result(impl, scheme):
    weight = random_matrix(33, 8, 64)
    parsed = impl.quantised_model.Scheme.parse(scheme)
    stored = impl.quantised_model.quantise_matrix(weight.clone(), parsed)
    back = impl.quantised_model.dequantise_matrix(stored, parsed, tuple(weight.shape), torch.float32)
    assert back.dtype == torch.float32 and torch.equal(back, reference_matrix(impl, weight, scheme))
    half = impl.quantised_model.dequantise_matrix(stored, parsed, tuple(weight.shape), torch.bfloat16)
    assert half.dtype == torch.bfloat16 and torch.equal(half, back.to(torch.bfloat16))


# ---------------------------------------------------------------------------------------
# The models, through their one forward pass
# ---------------------------------------------------------------------------------------


@pytest.mark.exercise("quantise_model")
@pytest.mark.downstream  # also run on every correct part-1/4 variant planted (the learner's own model)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_gpt2_runs_on_its_quantised_weights_with_and_without_a_cache(impl, tiny, tokens, scheme):
    model = check_quantised(impl, lambda: load_demo(tiny, impl.transformer), scheme, tokens)
    with torch.no_grad():
        full = model(tokens)
        cache = impl.kv_cache.KeyValueCache.new_empty(tiny.cfg, tokens.shape[0], tokens.device, torch.float32)
        first, cache = model(tokens[:, :7], cache)
        rest, cache = model(tokens, cache)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, **TOL)


@pytest.mark.exercise("quantise_model")
@pytest.mark.downstream  # the fused path reads the quantised weights: also on every part-1/4 variant
def test_the_fused_qkv_fast_path_reads_the_quantised_weights(impl, tiny, tokens):
    quantised = impl.quantised_model.quantise_model(load_demo(tiny, impl.transformer), "int4-g32")
    fused_before = impl.quantised_model.quantise_model(impl.fast_path.fuse_at_load(load_demo(tiny, impl.transformer)),
                                                       "int4-g32")
    fused_after = impl.fast_path.fuse_at_load(impl.quantised_model.quantise_model(load_demo(tiny, impl.transformer),
                                                                                  "int4-g32"))
    with torch.no_grad():
        expected = quantised(tokens)
        torch.testing.assert_close(fused_before(tokens), expected, **TOL)
        torch.testing.assert_close(fused_after(tokens), expected, **TOL)


@pytest.mark.exercise("quantise_model")
@pytest.mark.parametrize("scheme", ["int8", "nf4-g16-dq"])
def test_the_llama_style_model_runs_on_its_quantised_weights(impl, scheme):
    def make():
        return load_weights(impl.llama.LlamaTransformer(LLAMA), random_llama_weights(LLAMA, seed=34)).eval()

    tokens = torch.randint(0, LLAMA.d_vocab, (2, 9), generator=torch.Generator().manual_seed(35))
    model = check_quantised(impl, make, scheme, tokens)
    with torch.no_grad():
        full = model(tokens)
        cache = impl.llama.LlamaCache(LLAMA.n_layers)
        first, cache = model(tokens[:, :5], cache)
        rest, cache = model(tokens, cache)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, **TOL)


@pytest.mark.exercise("quantise_model")
def test_weight_bytes_is_the_formula_for_codes_scales_and_zero_points(impl, tiny):
    cfg = tiny.cfg
    model = load_demo(tiny, impl.transformer)
    float_bytes = impl.quantised_model.weight_bytes(model)
    assert float_bytes == sum(p.numel() * 4 for p in model.parameters()) + sum(b.numel() * b.element_size() for b in model.buffers())
    # (out, in) of each matrix in a block: W_Q, W_K, W_V, W_O, W_in, W_out.
    d, hd, mlp = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.d_mlp
    shapes = [(hd, d)] * 3 + [(d, hd), (mlp, d), (d, mlp)]
    matrices = sum(o * i for o, i in shapes) * cfg.n_layers
    rows = sum(o for o, _ in shapes) * cfg.n_layers
    groups = sum(o * i // 32 for o, i in shapes) * cfg.n_layers  # groups of 32
    per_scheme = {
        "int8": matrices * 1 + rows * 4,  # a byte a weight, a float32 scale a row
        "int4-g32": matrices // 2 + groups * (4 + 1),  # half a byte a weight; a float32 scale and a uint8 zero point a group
        "nf4-g32": matrices // 2 + groups * 4,  # half a byte a weight, a float32 absmax a group
    }
    for scheme, stored in per_scheme.items():
        quantised = impl.quantised_model.quantise_model(load_demo(tiny, impl.transformer), scheme)
        assert impl.quantised_model.weight_bytes(quantised) == float_bytes - matrices * 4 + stored, scheme


# Not graded as the learner's: the scales' dtype is given code (QuantisedWeight.right_inverse), and a class
# grader's mirror of a submission's model does not follow a cast of the model to another dtype.
def test_a_bfloat16_model_quantises_and_runs_in_bfloat16(impl, tiny, tokens):
    model = impl.quantised_model.quantise_model(load_demo(tiny, impl.transformer, dtype=torch.bfloat16), "nf4-g32")
    with torch.no_grad():
        assert model.blocks[0].attn.W_Q.dtype == torch.bfloat16 and model(tokens).dtype == torch.bfloat16


# Not graded as the learner's: when part 6's fused copy is stale is decided by given code (FusedQKV.refresh).
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])  # generate and the samplers decode in inference mode
def test_a_fused_quantised_model_does_not_dequantise_its_attention_weights_at_every_step(impl, tiny, tokens, mode):
    """Decode steps through the static cache (part 6's fast path) on a quantised, fused model: the attention weights
    are read through the fused copy made at load, so no step dequantises W_Q, W_K, W_V or W_O (each read of a
    parametrised weight dequantises it into a new tensor; a staleness test that reads them fuses again at every
    step); the MLP's weights are dequantised once a step. The logits are those of the fused float twin holding the
    dequantised weights (the prefill's bit for bit)."""
    scheme, steps = "int4-g32", 4
    model = impl.fast_path.fuse_at_load(impl.quantised_model.quantise_model(load_demo(tiny, impl.transformer), scheme))
    twin = load_demo(tiny, impl.transformer)
    reads: dict[str, int] = {}
    with torch.no_grad():
        for path, name in targets(twin):
            weight = getattr(twin.get_submodule(path), name)
            weight.copy_(_from_matrix(name, reference_matrix(impl, _to_matrix(name, weight.detach().clone()), scheme),
                                      weight.shape))
            dequantise = model.get_submodule(path).parametrizations[name][0]
            dequantise.register_forward_hook(lambda *_, name=name: reads.__setitem__(name, reads.get(name, 0) + 1))
    twin = impl.fast_path.fuse_at_load(twin)
    for block in twin.blocks:  # quantised MLP weights are never packed (PackedMLP): nor are the twin's, whatever its size
        block.mlp.packed = None
    prompt = tokens[:, :5]
    with getattr(torch, mode)():
        caches = [impl.caches.StaticKeyValueCache.new_empty(tiny.cfg, prompt.shape[0], prompt.shape[1] + steps)
                  for _ in range(2)]
        logits = [m(prompt, cache)[0] for m, cache in zip((model, twin), caches)]
        assert torch.equal(logits[0], logits[1]), "the fused quantised model's prefill differs from its fused twin's"
        reads.clear()
        for _ in range(steps):
            prompt = torch.cat([prompt, logits[1][:, -1:].argmax(-1)], dim=1)
            logits = [m(prompt, cache)[0] for m, cache in zip((model, twin), caches)]
            # Close, not equal: a one-row matmul over a dequantised weight (a transposed view) may take another
            # kernel than over the twin's contiguous copy of the same numbers.
            torch.testing.assert_close(logits[0], logits[1], **TOL,
                                       msg="a decode step of the fused quantised model differs from its twin's")
    layers = tiny.cfg.n_layers
    assert {name: reads.get(name, 0) for name in ("W_Q", "W_K", "W_V", "W_O")} == dict.fromkeys(("W_Q", "W_K", "W_V", "W_O"), 0), (
        f"{steps} decode steps dequantised the attention weights {reads} times: the fused copy is not reused")
    assert reads.get("W_in") == reads.get("W_out") == steps * layers, reads


# ---------------------------------------------------------------------------------------
# Given code (not graded as the learner's): schemes and refusals
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["int8", "int4-g64", "int4-g128", "nf4-g64", "nf4-g64-dq"])
def test_a_scheme_reads_back_as_its_text(impl, text):
    assert str(impl.quantised_model.Scheme.parse(text)) == text


@pytest.mark.parametrize("text", ["int4", "int8-g64", "int8-dq", "int4-g64-dq", "fp8", "nf4-g0", "nf4-g33"])
def test_a_bad_scheme_says_what_is_allowed(impl, text):
    with pytest.raises(ValueError, match="int8|int4|nf4|group_size|double"):
        impl.quantised_model.Scheme.parse(text)


def test_quantise_model_refuses_what_it_cannot_do_and_leaves_the_model_alone(impl, tiny):
    model = load_demo(tiny, impl.transformer)
    before = {name: p.clone() for name, p in model.state_dict().items()}
    with pytest.raises(ValueError, match="group_size 128 does not divide"):
        impl.quantised_model.quantise_model(model, "int4-g128")  # d_model is 64
    assert all(torch.equal(before[name], p) for name, p in model.state_dict().items())
    impl.quantised_model.quantise_model(model, "int8")
    with pytest.raises(ValueError, match="quantised already"):
        impl.quantised_model.quantise_model(model, "int8")
    with pytest.raises(TypeError, match="blocks"):
        impl.quantised_model.quantise_model(torch.nn.Linear(2, 2), "int8")
