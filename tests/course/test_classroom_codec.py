"""The codec carries every type the design names by value, each through a real connection (no sandbox needed).

Two endpoints talk over a socket pair, as in ``test_classroom_boundary.py``: the grader's and the
submission's, which serves in a thread. Each value goes to the submission's code and comes back
(``echo``), and the submission's code builds one of its own and returns it (``made``): both must
arrive as the same type with the same value. An answer the codec cannot carry (a meta, sparse or
mkldnn tensor) fails as a wrong type, never as an unfinished stub.
"""

from __future__ import annotations

import math
import socket
import sys
import threading
import types

import pytest
import torch

from sampling_course.config import Config
from sampling_course.grading.classroom.bridge import Endpoint
from sampling_course.grading.classroom.codec import RemoteError, error_of, raise_remote
from sampling_course.llama_config import LlamaConfig
from sampling_course.sampling_settings import SamplerSettings

MODULE = "classroom_codec_submission"

CFG = Config(d_model=8, d_vocab=5, n_ctx=4, d_head=2, d_mlp=8, n_heads=4, n_layers=1)
LLAMA = LlamaConfig(d_model=8, d_vocab=5, n_ctx=4, d_head=2, d_mlp=8, n_heads=4, n_key_value_heads=2, n_layers=1)

# name -> a function of no arguments that builds the value (called on each side, so each builds its own)
VALUES = {
    "None": lambda: None, "bool": lambda: True, "int": lambda: -(2 ** 70), "float": lambda: 2.5,
    "inf": lambda: -math.inf, "str": lambda: "héllo\n", "bytes": lambda: b"\x00\xff", "list": lambda: [1, [2, "x"]],
    "tuple": lambda: (1, (2.0, None)), "dict": lambda: {"a": 1, 2: [3], (4, 5): "t"},
    "set": lambda: {3, 1, "two", (4, 5)}, "frozenset": lambda: frozenset({1, 2}), "empty set": lambda: set(),
    "set in a dict": lambda: {"seen": {1, 2}, "kept": [frozenset({"a"})]},
    "torch.Size": lambda: torch.Size([2, 3]), "dtype": lambda: torch.bfloat16, "device": lambda: torch.device("cpu"),
    "slice": lambda: slice(1, None, 2), "Ellipsis": lambda: Ellipsis, "range": lambda: range(2, 11, 3),
    "Config": lambda: CFG, "LlamaConfig": lambda: LLAMA, "SamplerSettings": lambda: SamplerSettings(top_k=3),
    "tensor": lambda: torch.arange(6, dtype=torch.float32).reshape(2, 3),
    "int64 tensor": lambda: torch.tensor([[5, -1]]), "bool tensor": lambda: torch.tensor([True, False]),
    "half tensor": lambda: torch.tensor([1.5], dtype=torch.float16), "empty tensor": lambda: torch.zeros(0, 4),
    "tensors in a tuple": lambda: (torch.ones(2), {"k": torch.zeros(1)}),
    "class by name": lambda: torch.Tensor, "int class": lambda: int, "exception class": lambda: ValueError,
}


def _same(a, b) -> bool:
    """Equal in type and value, tensors included (compared here, on plain tensors)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def _submission_module() -> types.ModuleType:
    module = types.ModuleType(MODULE)
    module.echo = lambda value: value
    module.made = lambda name: VALUES[name]()
    module.generator = lambda seed: torch.Generator().manual_seed(seed)
    module.draws = lambda generator: torch.rand(3, generator=generator)
    module.meta = lambda: torch.empty(3, device="meta")
    module.sparse = lambda: torch.eye(3).to_sparse()
    module.mkldnn = lambda: torch.ones(2, 2).to_mkldnn()
    module.meta_item = lambda: torch.empty(3, device="meta").cpu()  # torch: NotImplementedError, with a message
    return module


@pytest.fixture
def submission():
    """The submission's module, as the grader sees it through a connection to an endpoint serving in a thread."""
    sys.modules[MODULE] = _submission_module()
    ours, theirs = socket.socketpair()
    student = Endpoint(theirs, peer_trusted=True, owns_modules=True)
    thread = threading.Thread(target=student.serve_forever, daemon=True)
    thread.start()
    grader = Endpoint(ours, peer_trusted=False, owns_modules=False)
    grader.allowance = 60.0  # an exchange that breaks fails the test instead of waiting for ever
    yield grader.request("import", None, name=MODULE)
    ours.close()
    thread.join(timeout=10)
    theirs.close()
    del sys.modules[MODULE]


@pytest.mark.parametrize("name", list(VALUES))
def test_a_value_crosses_by_value_both_ways(submission, name):
    """Sent to the submission's code and back, and built by it and returned: the same type and value here."""
    expected = VALUES[name]()
    assert _same(submission.echo(expected), expected), name
    assert _same(submission.made(name), expected), name


def test_a_generator_crosses_as_its_state(submission):
    """A generator the submission makes arrives as a generator here in the same state; one the grader lends is
    advanced there and its new state comes back."""
    theirs = submission.generator(7)
    assert type(theirs) is torch.Generator and torch.equal(theirs.get_state(), torch.Generator().manual_seed(7).get_state())
    ours, twin = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(submission.draws(ours), torch.rand(3, generator=twin))
    assert torch.equal(ours.get_state(), twin.get_state())


@pytest.mark.parametrize("kind", ["meta", "sparse", "mkldnn"])
def test_an_answer_the_codec_cannot_carry_fails_as_a_wrong_type(submission, kind):
    """A meta, sparse or mkldnn tensor answer is a TypeError naming what crosses, never "not implemented yet"."""
    if kind == "mkldnn" and not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no mkldnn")
    with pytest.raises(TypeError, match="cannot be sent: only a dense tensor"):
        getattr(submission, kind)()


def test_only_the_submissions_own_bare_raise_is_a_stub(submission):
    """torch's NotImplementedError (an operation on a meta tensor) is a failure with its message; a bare
    ``raise NotImplementedError()`` in the submission's package, as every stub has, is a stub."""
    with pytest.raises(RemoteError, match="NotImplementedError: .*meta tensor"):
        submission.meta_item()
    code = compile("def apply_temperature():\n    raise NotImplementedError()\n", "<stub>", "exec")
    space = {"__name__": "exercises.sampling"}
    exec(code, space)  # noqa: S102 - a stub, defined as if in the submission's package
    with pytest.raises(NotImplementedError) as caught:
        space["apply_temperature"]()
    error = error_of(caught.value)
    assert error["stub"] == "apply_temperature"
    with pytest.raises(NotImplementedError):
        raise_remote(error)
    elsewhere = {"__name__": "torch.something"}
    exec(code, elsewhere)  # noqa: S102
    with pytest.raises(NotImplementedError) as caught:
        elsewhere["apply_temperature"]()
    assert "stub" not in error_of(caught.value)
