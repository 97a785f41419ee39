"""Shared fixtures: the implementation under test and the reference models.

The command-line options (``--impl``, ``--exercise``) and the "not implemented yet"
reporting live in ``sampling_course.grading.pytest_plugin``, which pyproject.toml loads for
every pytest run, so that the options exist before pytest collects anything.
"""

from __future__ import annotations

import pytest

from sampling_course.implementation import Impl
from sampling_course.reference import Reference, gpt2_local_dir, load_reference

# ---------------------------------------------------------------------------------------
# The implementation under test
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def impl(pytestconfig: pytest.Config) -> Impl:
    return Impl(pytestconfig.getoption("--impl"))


# ---------------------------------------------------------------------------------------
# Reference models
# ---------------------------------------------------------------------------------------


def _require_gpt2() -> Reference:
    if gpt2_local_dir() is None:
        pytest.skip(
            "real GPT-2 small is not in the local Hugging Face cache; "
            "run `sampling-course download-gpt2` once with internet access to enable this tier"
        )
    return load_reference("gpt2")


@pytest.fixture(scope="session")
def tiny() -> Reference:
    """The offline stand-in: small GPT-2 architecture, deterministic perturbed weights."""
    return load_reference("tiny")


@pytest.fixture(scope="session")
def story() -> Reference:
    """The story model shipped with the course: a small GPT-2 trained on the story grammar."""
    return load_reference("story")


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
    return load_reference("tiny")


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
    return load_reference(request.param)
