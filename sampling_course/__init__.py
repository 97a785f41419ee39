"""sampling-course: build GPT-2 from scratch, then every decoding method that matters.

This package is the course engine that learners never edit: the model ``Config``,
reference-model loading (real GPT-2 or the offline stand-in), weight conversion,
the stub generator, the exercise checker and the command-line interface.

In a notebook::

    from sampling_course import check, hint, progress, compare
    check("LayerNorm")                  # run that exercise's tests on exercises/
    check("LayerNorm", obj=LayerNorm)   # ... or on a class defined in the notebook
    hint("LayerNorm")                   # each call reveals the next hint
    progress()                          # every exercise and its status
    compare(temperature=0.7)            # your sampler next to the solution's
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sampling_course.config import Config

if TYPE_CHECKING:
    from sampling_course.checking import check, compare, hint, progress

__all__ = ["Config", "check", "compare", "hint", "progress"]

# The checker imports pytest and rich; load it on first use so `import sampling_course` stays light.
_LAZY = {"check", "compare", "hint", "progress"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from sampling_course import checking

        return getattr(checking, name)
    raise AttributeError(f"module 'sampling_course' has no attribute {name!r}")
