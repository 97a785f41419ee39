"""Loading weights into a learner's model: strict about parameters, lenient about the model's own buffers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from sampling_course.implementation import load_demo
from sampling_course.weights import load_weights


class Toy(nn.Module):
    """Two parameters and, as in the classic text, a persistent IGNORE buffer."""

    def __init__(self, embed_name: str = "W_E"):
        super().__init__()
        self.register_parameter(embed_name, nn.Parameter(torch.zeros(3, 2)))
        self.b = nn.Parameter(torch.zeros(2))
        self.register_buffer("IGNORE", torch.tensor(-1e5))  # persistent: it is in state_dict()


WEIGHTS = {"W_E": torch.arange(6.0).reshape(3, 2), "b": torch.tensor([1.0, 2.0])}


def test_a_persistent_buffer_need_not_be_in_the_weights():
    """Parameters are copied; the model's own buffer keeps its value although the weights lack it."""
    model = load_weights(Toy(), WEIGHTS)
    assert "IGNORE" in model.state_dict()
    assert torch.equal(model.W_E, WEIGHTS["W_E"]) and torch.equal(model.b, WEIGHTS["b"])
    assert model.IGNORE.item() == -1e5


@pytest.mark.parametrize(
    "model, weights, message",
    [
        (Toy("W_e"), WEIGHTS, "calls 'W_e' what the weights call 'W_E'"),
        (Toy(), {"b": WEIGHTS["b"]}, "parameter 'W_E' is not in the weights"),
        (Toy(), {**WEIGHTS, "W_U": torch.zeros(2, 3)}, "the weights have 'W_U'"),
        (Toy(), {**WEIGHTS, "b": torch.zeros(3)}, r"'b' has shape \(2,\) in the model but \(3,\)"),
    ],
    ids=["misnamed", "missing", "extra", "wrong-shape"],
)
def test_parameter_mismatches_raise_and_name_the_parameter(model, weights, message):
    """A misnamed, missing, extra or wrongly shaped parameter is a ValueError that says which."""
    with pytest.raises(ValueError, match=message):
        load_weights(model, weights)


def test_load_demo_accepts_a_persistent_ignore_buffer(tiny):
    """A DemoTransformer whose Attention registers IGNORE as a persistent buffer loads and matches the reference."""
    from solutions import transformer

    class PersistentIgnore(transformer.DemoTransformer):
        def __init__(self, cfg):
            super().__init__(cfg)
            for block in self.blocks:
                block.attn.register_buffer("IGNORE", torch.tensor(-1e5), persistent=True)

    assert "blocks.0.attn.IGNORE" in PersistentIgnore(tiny.cfg).state_dict()
    model = load_demo(tiny, SimpleNamespace(DemoTransformer=PersistentIgnore))
    tokens = tiny.tokenizer("The cat sat on the mat", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), tiny.hf_model(tokens).logits, atol=1e-4, rtol=1e-4)


def test_load_demo_rejects_a_misnamed_parameter(tiny):
    """Renaming W_Q in the model is caught by load_demo, with both names in the message."""
    from solutions import transformer

    class MisnamedQuery(transformer.DemoTransformer):
        def __init__(self, cfg):
            super().__init__(cfg)
            for block in self.blocks:
                block.attn.W_q = block.attn.W_Q
                del block.attn.W_Q

    with pytest.raises(ValueError, match="'blocks.0.attn.W_q' what the weights call 'blocks.0.attn.W_Q'"):
        load_demo(tiny, SimpleNamespace(DemoTransformer=MisnamedQuery))


def test_demo_state_dict_copies_into_contiguous_tensors(tiny):
    """Every converted weight is contiguous and has storage of its own, so editing the demo
    model's weights never changes the Hugging Face model's."""
    from sampling_course.weights import demo_state_dict

    hf_pointers = {p.untyped_storage().data_ptr() for p in tiny.hf_model.parameters()}
    for name, tensor in demo_state_dict(tiny.hf_model).items():
        assert tensor.is_contiguous(), name
        assert tensor.untyped_storage().data_ptr() not in hf_pointers, f"{name} shares storage with the HF model"
