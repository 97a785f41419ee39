"""The implementation switch: grade (or run) the learner's ``exercises`` or the ``solutions``.

The model layer (``Config``, ``load_reference``, the weight conversion) never imports
either package; the code that chooses one lives here, and the grading machinery and the
programs in ``sampling_course.apps`` go through it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch stays unloaded for commands that never build a model (`sampling-course hint`)
    from collections.abc import Iterable

    import torch

    from sampling_course.reference import Reference

IMPLS = ("solutions", "exercises")


def has_solutions() -> bool:
    """Whether the ``solutions`` package can be imported: in the course's checkout, not in the student release."""
    try:
        return importlib.util.find_spec("solutions") is not None
    except (ImportError, ValueError):
        return False


def resolve_impl(impl: str | None = None, default: str = "exercises") -> str:
    """The implementation to use: ``impl``, else $SAMPLING_COURSE_IMPL, else ``default``; a default of
    ``"solutions"`` where they cannot be imported (the student release) is the learner's ``exercises``."""
    if default == "solutions" and not has_solutions():
        default = "exercises"
    impl = impl or os.environ.get("SAMPLING_COURSE_IMPL") or default
    if impl not in IMPLS:
        raise ValueError(f"impl (or SAMPLING_COURSE_IMPL) must be one of {', '.join(IMPLS)}, got {impl!r}")
    return impl


def impl_module(module: str, impl: str | None = None, default: str = "solutions") -> ModuleType:
    """``module`` (``"transformer"``, ``"sampling"``, ...) of the chosen implementation."""
    return importlib.import_module(f"{resolve_impl(impl, default)}.{module}")


def solved_earlier(impl: Any) -> Any:
    """The implementation that runs the course's earlier parts around the code under test (part 9's model in
    the engine of parts 3 to 6, say): the solutions where they can be imported (the course's checkout, a
    grader), else ``impl`` itself (the student release has no solutions: the learner's own earlier parts)."""
    return Impl("solutions") if has_solutions() else impl


def use_earlier(impl: str, earlier_impl: str, modules: "Iterable[str]") -> tuple[str, ...]:
    """Make ``impl``'s own imports of ``modules`` read ``earlier_impl``'s: the notebooks' ``EARLIER_IMPL`` switch.

    With ``use_earlier("exercises", "solutions", ["generate", ...])`` the course's ``generate`` runs
    wherever the learner's code imports it (``from .generate import ...`` inside exercises/engine.py),
    not only where the notebook imports it: ``sys.modules["exercises.generate"]`` is the solutions'
    module. Every module of ``impl`` imported before is dropped, so that its next import binds the
    choice made here; with ``earlier_impl == impl`` nothing is replaced (a second call undoes a first).
    A check still grades ``impl``'s own files: it imports them afresh (``grading.sandbox.isolated_package``)
    and puts these modules back afterwards. Returns the modules that now come from ``earlier_impl``.
    """
    import sys

    impl, earlier_impl = resolve_impl(impl), resolve_impl(earlier_impl)
    package = importlib.import_module(impl)
    for name in [name for name in sys.modules if name.startswith(impl + ".")]:
        del sys.modules[name]
        package.__dict__.pop(name.rpartition(".")[2], None)
    if earlier_impl == impl:
        return ()
    modules = tuple(modules)
    for module in modules:
        sys.modules[f"{impl}.{module}"] = importlib.import_module(f"{earlier_impl}.{module}")
        setattr(package, module, sys.modules[f"{impl}.{module}"])
    return modules


class StaleInstallError(RuntimeError):
    """The implementation Python would import is an installed copy, not the checkout's files."""


def find_checkout(start: Path | None = None) -> Path | None:
    """The course's source checkout: ``start`` (the working directory by default) or a parent of
    it that holds ``tests/conftest.py`` and ``exercises/``; None when there is none."""
    start = (start or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / "tests" / "conftest.py").is_file() and (folder / "exercises").is_dir():
            return folder
    return None


DISTRIBUTION = "sampling-course"  # the project's name in pyproject.toml


def installed_copies(package: str) -> set[Path]:
    """Folders where pip installed a copy of ``package`` (``pip install .``, not ``-e``), from its records."""
    import importlib.metadata

    copies = set()
    for dist in importlib.metadata.distributions(name=DISTRIBUTION):
        for file in dist.files or ():
            if file.parts == (package, "__init__.py"):
                copies.add(Path(dist.locate_file(file)).resolve().parent)
    return copies


def stale_install_message(package: str, checkout: Path) -> str | None:
    """One line saying to reinstall when ``package`` would be imported from a copy that
    ``pip install .`` made, instead of from ``checkout/package``; None when all is well.

    Only an installed copy counts: a copy put first on PYTHONPATH on purpose is what its
    caller wants graded.
    """
    local = (checkout / package).resolve()
    if not (local / "__init__.py").is_file():
        return None
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    imported = Path(spec.origin).resolve().parent
    if imported == local or imported not in installed_copies(package):
        return None
    return (f"{package}/ is imported from a copy made by `pip install .` ({imported}), not from {local}, "
            f"so your edits there do not count: reinstall the course with `pip install -e .` in {checkout}")


def load_demo(
    reference: "Reference",
    transformer_module: ModuleType | None = None,
    *,
    device: "str | torch.device | None" = None,
    dtype: "torch.dtype | None" = None,
) -> "torch.nn.Module":
    """A DemoTransformer (from ``transformer_module``, the solutions by default, the learner's own in the student
    release) with the reference's weights.

    It lives on ``device`` in ``dtype``: the reference's own when None (``load_reference``
    chose them), else where it is told (``"auto"`` is the course's device rule).
    Raises a ValueError naming each parameter that is missing, extra, misnamed or of the wrong shape.
    """
    from sampling_course.devices import pick_device
    from sampling_course.weights import demo_state_dict, load_weights

    if transformer_module is None:
        transformer_module = impl_module("transformer", "solutions" if has_solutions() else "exercises")
    device = reference.device if device is None else pick_device(device)
    dtype = reference.dtype if dtype is None else dtype
    model = transformer_module.DemoTransformer(reference.cfg)
    # Every parameter must match by name and shape; buffers the model makes itself (such as a
    # persistent IGNORE) need not be in the weights. The weights come straight from the
    # checkpoint's file (building the Hugging Face model takes seconds of imports); the model
    # is built and filled on the CPU, then moved: a learner's model may make tensors in
    # __init__ without saying where.
    model = load_weights(model, demo_state_dict(reference.weights, reference.cfg))
    return model.to(device=device, dtype=dtype).eval()


class Impl:
    """Attribute access to the modules of one implementation: ``Impl("solutions").transformer``.

    Each attribute imports ``<package>.<module>`` on first use, so an implementation whose
    later parts are still stubs can be used for its earlier parts.
    """

    def __init__(self, package: str):
        self.package = package

    def __getattr__(self, module: str) -> ModuleType:
        if module.startswith("_"):
            raise AttributeError(module)
        return importlib.import_module(f"{self.package}.{module}")

    def __repr__(self) -> str:
        return f"Impl({self.package!r})"
