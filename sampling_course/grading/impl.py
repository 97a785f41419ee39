"""The implementation switch: grade (or run) the learner's ``exercises`` or the ``solutions``.

The model layer (``Config``, ``load_reference``, the weight conversion) never imports
either package; the code that chooses one lives here, and the grading machinery and the
programs in ``sampling_course.apps`` go through it.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch stays unloaded for commands that never build a model (`sampling-course hint`)
    import torch

    from sampling_course.reference import Reference

IMPLS = ("solutions", "exercises")


def resolve_impl(impl: str | None = None, default: str = "exercises") -> str:
    """The implementation to use: ``impl``, else $SAMPLING_COURSE_IMPL, else ``default``."""
    impl = impl or os.environ.get("SAMPLING_COURSE_IMPL") or default
    if impl not in IMPLS:
        raise ValueError(f"impl (or SAMPLING_COURSE_IMPL) must be one of {', '.join(IMPLS)}, got {impl!r}")
    return impl


def impl_module(module: str, impl: str | None = None, default: str = "solutions") -> ModuleType:
    """``module`` (``"transformer"``, ``"sampling"``, ...) of the chosen implementation."""
    return importlib.import_module(f"{resolve_impl(impl, default)}.{module}")


def load_demo(reference: "Reference", transformer_module: ModuleType | None = None) -> "torch.nn.Module":
    """A DemoTransformer (from ``transformer_module``, the solutions by default) with the reference's weights.

    Raises a ValueError naming each parameter that is missing, extra, misnamed or of the wrong shape.
    """
    from sampling_course.config import Config
    from sampling_course.weights import demo_state_dict, load_weights

    if transformer_module is None:
        transformer_module = impl_module("transformer", "solutions")
    cfg = Config.from_hf(reference.hf_model.config)
    model = transformer_module.DemoTransformer(cfg)
    # Every parameter must match by name and shape; buffers the model makes itself (such as a
    # persistent IGNORE) need not be in the weights.
    return load_weights(model, demo_state_dict(reference.hf_model)).eval()
