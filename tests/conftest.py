"""Shared fixtures: the implementation under test, the reference models, the implementation's
DemoTransformer loaded with each reference's weights, and the store of the references' outputs.

The command-line options (``--impl``, ``--exercise``) and the "not implemented yet"
reporting live in ``sampling_course.grading.pytest_plugin``, which pyproject.toml loads for
every pytest run, so that the options exist before pytest collects anything.
"""

from __future__ import annotations

import pytest
import torch

from sampling_course.files import BrokenCourseFile
from sampling_course.grading.oracle import OracleStore, shared_store
from sampling_course.grading.pytest_plugin import session_device
from sampling_course.implementation import Impl, load_demo
from sampling_course.reference import Reference, gpt2_local_dir, load_reference

# ---------------------------------------------------------------------------------------
# The implementation under test
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def impl(pytestconfig: pytest.Config) -> Impl:
    return Impl(pytestconfig.getoption("--impl"))


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config) -> torch.device:
    """The device the session grades on (``pytest --device``; the CPU by default). The
    references below load there: ``load_reference`` left to its default follows the session."""
    return session_device(pytestconfig)


@pytest.fixture(scope="session")
def oracle(pytestconfig: pytest.Config) -> OracleStore:
    """``oracle(fn, *args)``: ``fn(*args)`` computed live on the references once, then read back
    (see ``sampling_course.grading.oracle``); ``--recompute-oracle`` computes every one again."""
    return shared_store(recompute=pytestconfig.getoption("--recompute-oracle"))


# ---------------------------------------------------------------------------------------
# Reference models
# ---------------------------------------------------------------------------------------


def _require_gpt2() -> Reference:
    if gpt2_local_dir() is None:
        pytest.skip(
            "real GPT-2 small is not in the local Hugging Face cache; "
            "to enable: run `sampling-course download-gpt2` once with internet access"
        )
    return _loaded("gpt2")


def _loaded(name: str) -> Reference:
    """``load_reference(name)``; a failure there is the course's (its files), never the code under test's."""
    try:
        return load_reference(name)
    except BrokenCourseFile:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever breaks while loading a shipped or cached checkpoint
        raise BrokenCourseFile(f"the reference model {name!r} cannot be loaded ({type(exc).__name__}: {exc})") from exc


@pytest.fixture(scope="session")
def tiny() -> Reference:
    """The offline stand-in: small GPT-2 architecture, deterministic perturbed weights."""
    return _loaded("tiny")


@pytest.fixture(scope="session")
def story() -> Reference:
    """The story model shipped with the course: a small GPT-2 trained on the story grammar."""
    return _loaded("story")


@pytest.fixture(scope="session")
def gpt2() -> Reference:
    """Real GPT-2 small; the test is skipped when its weights are not cached locally."""
    return _require_gpt2()


@pytest.fixture(
    scope="session",
    params=["tiny", pytest.param("gpt2", marks=pytest.mark.gpt2)],
)
def reference(request: pytest.FixtureRequest) -> Reference:
    """Each reference in turn: the stand-in always, real GPT-2 when cached locally."""
    if request.param == "gpt2":
        return _require_gpt2()
    return _loaded("tiny")


@pytest.fixture(
    scope="session",
    params=["tiny", "story", pytest.param("gpt2", marks=pytest.mark.gpt2)],
)
def parity_reference(request: pytest.FixtureRequest) -> Reference:
    """The references for exact parity (components, logits, greedy decoding): the stand-in,
    the trained story model, and real GPT-2 when cached locally. Trained weights give
    peaked, structured activations that random ones do not, so a mistake the stand-in
    happens to hide can still show on "story"."""
    if request.param == "gpt2":
        return _require_gpt2()
    return _loaded(request.param)


# ---------------------------------------------------------------------------------------
# The DemoTransformer under test, with a reference's weights
# ---------------------------------------------------------------------------------------
# One fixture per reference fixture above, so that a suite picks the references it grades
# on by name. Module scope: a test that changes its model cannot leak into another suite.


@pytest.fixture(scope="module")
def demo(reference, impl):
    """The implementation under test's DemoTransformer with the weights of each ``reference``."""
    return load_demo(reference, impl.transformer)


@pytest.fixture(scope="module")
def parity_demo(parity_reference, impl):
    """The DemoTransformer under test with the weights of each ``parity_reference`` (story included)."""
    return load_demo(parity_reference, impl.transformer)


@pytest.fixture(scope="module")
def tiny_demo(tiny, impl):
    """The DemoTransformer under test with the stand-in's weights."""
    return load_demo(tiny, impl.transformer)


@pytest.fixture(scope="module")
def gpt2_demo(gpt2, impl):
    """The DemoTransformer under test with real GPT-2 weights (skipped when they are not cached)."""
    return load_demo(gpt2, impl.transformer)


@pytest.fixture(scope="module")
def sampler(reference, demo, impl):
    """The TransformerSampler under test around ``demo``, with the reference's tokenizer."""
    return impl.sampling.TransformerSampler(demo, reference.tokenizer)


@pytest.fixture(scope="module")
def tiny_sampler(tiny, tiny_demo, impl):
    """The TransformerSampler under test around ``tiny_demo``, with the stand-in's tokenizer."""
    return impl.sampling.TransformerSampler(tiny_demo, tiny.tokenizer)
