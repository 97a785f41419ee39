"""sampling-course: build GPT-2 from scratch, then every decoding method that matters.

This package is the course engine that learners never edit. Its top level is what
learners and notebooks import: the model ``Config``, reference models
(``sampling_course.reference``), weight conversion (``sampling_course.weights``) and
the tokenizer. ``sampling_course.grading`` holds the grading machinery (course map,
pytest plugin, checker, stub generator, planted mistakes); ``sampling_course.apps``
holds the programs (the ``sampling-course`` command, demo, bench, notebook helpers).

In a notebook::

    from sampling_course import check, hint, progress, compare
    check("LayerNorm")                  # run that exercise's tests on exercises/
    check("LayerNorm", obj=LayerNorm)   # ... or on a class defined in the notebook
    hint("LayerNorm")                   # each call reveals the next hint
    progress()                          # every exercise and its status
    compare(temperature=0.7)            # your sampler next to the solution's
    workload("2")                       # part 2's exercises: lines to write, hints, check times
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sampling_course.config import Config

if TYPE_CHECKING:
    from sampling_course.grading.checking import check, hint, progress
    from sampling_course.grading.compare import compare
    from sampling_course.grading.workload import workload

__all__ = ["Config", "check", "compare", "hint", "progress", "workload"]

# The checker imports pytest and rich; load it on first use so `import sampling_course` stays light.
_LAZY = {
    "check": "sampling_course.grading.checking",
    "hint": "sampling_course.grading.checking",
    "progress": "sampling_course.grading.checking",
    "compare": "sampling_course.grading.compare",
    "workload": "sampling_course.grading.workload",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sampling_course' has no attribute {name!r}")
