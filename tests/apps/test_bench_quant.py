"""The quantisation bench (``sampling-course bench-quant``): its figures against independent computations.

No timing is asserted. The memory formula must equal the bytes of the tensors part 11's
``quantise_model`` stores (summed here from the model's ``state_dict``, a route the bench does
not take); the batched, padded scoring must equal scoring each story alone; the layouts that
hand the peers their matrices must agree with part 11's own; a peer's rounding must be within
one quantisation step of the course's.
"""

from __future__ import annotations

import copy

import pytest
import torch

from sampling_course.apps import bench_quant, quant_memory, quant_peers, quant_quality
from sampling_course.config import Config
from sampling_course.implementation import impl_module

SCHEMES = ("int8", "int4-g32", "int4-g64", "nf4-g64", "nf4-g64-dq")
CFG = Config(d_model=64, d_vocab=97, n_ctx=64, d_head=16, d_mlp=256, n_heads=4, n_layers=2)


@pytest.fixture(scope="module")
def fp32():
    torch.manual_seed(0)
    model = impl_module("transformer", "solutions").DemoTransformer(CFG)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    return model.eval()


def state_dict_bytes(model: torch.nn.Module) -> int:
    """Every tensor of the state dict (the quantised codes and scales are there, under parametrizations),
    plus the buffers a state dict leaves out (non-persistent)."""
    saved = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    names = set(model.state_dict())
    unsaved = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if n not in names)
    return saved + unsaved


@pytest.mark.parametrize("scheme", SCHEMES)
def test_weight_bytes_formula_equals_the_stored_tensors(fp32, scheme):
    quantised = impl_module("quantised_model", "solutions").quantise_model(copy.deepcopy(fp32), scheme)
    formula = quant_memory.formula_bytes(fp32, scheme)
    assert formula == state_dict_bytes(quantised)
    assert formula == quant_memory.stored_bytes(quantised)


def test_weight_bytes_formula_by_hand():
    # int8: a (8, 64) matrix is 512 codes and 8 four-byte scales; int4-g32: 256 bytes of packed codes and
    # 16 groups of a scale and a one-byte zero point; nf4-g32-dq: 16 absmaxes in one padded block of 256.
    assert quant_memory.matrix_bytes("int8", 8, 64) == 512 + 32
    assert quant_memory.matrix_bytes("int4-g32", 8, 64) == 256 + 16 * 5
    assert quant_memory.matrix_bytes("nf4-g32", 8, 64) == 256 + 16 * 4
    assert quant_memory.matrix_bytes("nf4-g32-dq", 8, 64) == 256 + 256 + 4 + 4
    for bad in ("int8-g64", "int4", "int4-g64-dq", "fp8"):
        with pytest.raises(ValueError, match="scheme"):
            quant_memory.parse_scheme(bad)


def test_matrix_targets_of_the_issue():
    # Block matrices of GPT-2 small's shapes: int8 about 4x below fp32, 4-bit with its scales at least 6x.
    shapes = [(2304, 768), (768, 768), (3072, 768), (768, 3072)]
    fp32 = sum(4 * o * i for o, i in shapes)
    assert fp32 / sum(quant_memory.matrix_bytes("int8", o, i) for o, i in shapes) > 3.9
    for scheme in ("int4-g64", "int4-g128", "nf4-g64", "nf4-g64-dq"):
        assert fp32 / sum(quant_memory.matrix_bytes(scheme, o, i) for o, i in shapes) >= 6


def test_layouts_agree_with_part_11(fp32):
    quantised_model = impl_module("quantised_model", "solutions")
    for _, name, param in quant_peers.block_matrices(fp32):
        ours = quant_peers.to_matrix(name, param.detach())
        assert torch.equal(ours, quantised_model.as_matrix(param.detach(), name)), name
        assert torch.equal(quant_peers.from_matrix(name, ours, param.shape), param.detach()), name


def test_padded_batches_score_like_each_story_alone(fp32):
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([5, 12, 9, 3])
    tokens = torch.zeros(4, 12, dtype=torch.long)
    for i, n in enumerate(lengths):
        tokens[i, :n] = torch.randint(0, CFG.d_vocab, (int(n),), generator=g)
    heldout = quant_quality.Heldout("tiny", tokens, lengths, torch.ones(4, dtype=torch.float64))
    other = copy.deepcopy(fp32)
    with torch.no_grad():
        other.blocks[0].mlp.W_in.mul_(1.3)
    scores = quant_quality.score_models({"fp32": fp32, "other": other}, heldout, batch_size=3)
    for i, n in enumerate(lengths.tolist()):
        row = tokens[i : i + 1, :n]
        with torch.no_grad():
            p = torch.log_softmax(fp32(row)[0, :-1], -1)
            q = torch.log_softmax(other(row)[0, :-1], -1)
        nll = -q.gather(-1, row[0, 1:, None]).sum()
        kl = (p.exp() * (p - q)).sum()
        assert scores["other"].nll[i].item() == pytest.approx(nll.item(), rel=1e-5, abs=1e-6)
        assert scores["other"].kl[i].item() == pytest.approx(kl.item(), rel=1e-4, abs=1e-6)
        assert scores["fp32"].kl[i].item() == 0


def test_bootstrap_interval():
    counts = torch.tensor([10, 20, 30, 40])
    same = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert quant_quality.bootstrap(same * 2, counts, same) == pytest.approx((0.1, 0.1, 0.1))
    value, low, high = quant_quality.bootstrap(torch.tensor([5.0, -1.0, 2.0, 0.0]), counts)
    assert value == pytest.approx(6 / 100) and low < value < high
    assert quant_quality.separated(-0.2, -0.1) == "lower"
    assert quant_quality.separated(0.1, 0.2) == "higher"
    assert quant_quality.separated(-0.1, 0.2) == "not separated"


@pytest.mark.skipif(not quant_peers.installed("torchao"), reason="torchao is not installed")
def test_torchao_rounding_is_within_a_step_of_the_course(fp32):
    quantise = impl_module("quantise", "solutions")
    matrix = quant_peers.to_matrix("W_in", fp32.blocks[0].mlp.W_in.detach())
    theirs = quant_peers.torchao_roundtrip("int8")(matrix)
    ours = quantise.dequantise_int8(*quantise.quantise_int8(matrix))
    step = matrix.abs().amax(1, keepdim=True) / 127
    assert ((theirs - ours).abs() <= step * 1.01).all()
    theirs4 = quant_peers.torchao_roundtrip("int4-g32")(matrix)
    groups = matrix.reshape(matrix.shape[0], -1, 32)
    step4 = ((groups.amax(-1) - groups.amin(-1)) / 15).repeat_interleave(32, dim=1)
    assert ((theirs4 - matrix).abs() <= step4 * 0.51 + 1e-6).all(), "torchao's 4-bit rounding is within half a step"


def test_peer_rows_say_not_installed(fp32, monkeypatch):
    monkeypatch.setattr(quant_peers, "installed", lambda package: False)
    models, matches, skipped = quant_peers.peer_models(fp32)
    assert not models and not matches
    assert all("not installed" in why for why in skipped.values()) and len(skipped) == len(quant_peers.PEERS)


def test_fits_rows_by_formula():
    transformer = impl_module("transformer", "solutions")
    model = quant_memory.meta_model(transformer, Config())
    rows = quant_memory.fits_rows({"gpt2": (model, Config(), 1024, 256 * 2**20)}, ["fp32", "int4-g64"])
    n_params = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    fp32 = rows[0]["gpt2"]
    assert fp32["weights"] == 4 * n_params
    assert fp32["kv"] == 12 * 2 * 1024 * 768 * 4
    assert not fp32["fits"] and rows[1]["gpt2"]["weights"] < fp32["weights"] / 2


@pytest.mark.slow
def test_quick_run_prints_every_table(capsys):
    assert bench_quant.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for text in ("held-out stories", "entropy floor", "int8 within 0.005 nats of fp32", "weight bytes",
                 "What fits", "valid sentences", "CPU, one token", "one cached decode step", "GPU"):
        assert text in out, text
    assert " NO " not in out, "formula, stored tensors and weight_bytes disagree"
    assert "torchao int8" in out or "torchao is not installed" in out


def test_bad_arguments_are_one_line_before_anything_loads(capsys):
    assert bench_quant.main(["--tokens", "5"]) == 2
    assert bench_quant.main(["--models", "gpt3"]) == 2
    err = capsys.readouterr().err
    assert "--tokens must be an integer >= 100" in err and "invalid choice" in err


def test_validity_of_drawn_stories_by_hand(fp32):
    """A stand-in ``generate`` returning fixed texts: the share of valid sentences is counted as the grammar says,
    and an all-valid share gets the rule of three's interval, not one of zero width."""
    from sampling_course.stories import sample_stories

    story = sample_stories(1, seed=3)[0].text

    class Tok:
        eos_token_id = 0
        texts = [story, story + " Purple the moon ate seven."]

        def decode(self, row):
            return self.texts[row[0]]

    def fake_generate(model, tokenizer, prompts, new_tokens, settings, seed, eos_token_id):
        return torch.tensor([[0, model]] * len(prompts))

    rows = quant_quality.validity_rows({"good": 0, "bad": 1}, Tok(), fake_generate, n_stories=6)
    good, bad = rows[0], rows[1]
    from sampling_course.stories import split_sentences
    per_story = len(split_sentences(story))
    assert per_story > 1  # so that counting sentences instead of stories would give another interval
    n = 6 * per_story
    # The rule of three counts the independent draws, the 6 stories, not the sentences within them.
    assert good["valid"] == (1.0, 0.5, 1.0) and good["sentences"] == n
    assert bad["valid"][0] == pytest.approx(n / (n + 6)) and bad["sentences"] == n + 6


def test_validity_of_a_model_that_writes_no_sentence_is_a_clear_error():
    class Tok:
        eos_token_id = 0

        def decode(self, row):
            return "no full stop here"

    def fake_generate(model, tokenizer, prompts, new_tokens, settings, seed, eos_token_id):
        return torch.zeros(len(prompts), 3, dtype=torch.long)

    with pytest.raises(ValueError, match="'silent' wrote no complete sentence in 4 stories"):
        quant_quality.validity_rows({"silent": 0}, Tok(), fake_generate, n_stories=4)
