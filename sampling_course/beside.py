"""Objects made in the process where the code under test runs: a test's double beside the code that calls it.

A test hands the code it grades a stand-in whose answer it knows (a toy model, a tokenizer of
token ids, a scripted decode step) and then reads what the stand-in saw (the calls it got).
``made_beside(where, factory, *args)`` is ``factory(*args)``, made in the process where ``where``
(a module or function of the code under test) runs.

When that code runs in another process (a submission graded in a sandbox), the object is made
there, by this same runtime loaded there, from a plain description: the factory's name and
arguments that are plain data. The code under test then calls it where it is, without a
message per call, and the test holds a handle whose attributes it reads as data. The factory
must be a class or function of the course's runtime (``sampling_course.<module>.<name>``).

What an object made beside records, the code under test can change. A record that decides a
verdict (how often a loop called its model) is kept apart: ``made_apart(model, factory)`` is
``factory(model)``, made in a third process when ``model`` lives in another process (the double
host, ``sampling_course.grading.classroom.host``: the course's runtime, sandboxed, neither the
grader's nor the submission's). The code under test calls it there; the test reads its record
from there, as data.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["build", "elsewhere", "made_apart", "made_beside"]


def made_beside(where: Any, factory: Any, /, *args: Any, **kwargs: Any) -> Any:
    """``factory(*args, **kwargs)``, made in the process where ``where`` runs."""
    name = _checked_name(factory)
    beside = getattr(type(where), "run_beside", None)
    if beside is not None:  # the code under test runs in another process: the object is made there
        made = beside(where, f"{__name__}.build", name, *args, **kwargs)
        if made is not NotImplemented:
            return made
    return factory(*args, **kwargs)


def elsewhere(made: Any) -> bool:
    """Whether ``made`` (from ``made_beside``) lives in another process: the test holds a handle to it."""
    return getattr(type(made), "run_beside", None) is not None


def made_apart(wrapped: Any, factory: Any, /, *args: Any, **kwargs: Any) -> Any:
    """``factory(wrapped, *args, **kwargs)``; when ``wrapped`` lives in another process, made in the double
    host beside that process, around a handle to ``wrapped``."""
    name = _checked_name(factory)
    apart = getattr(type(wrapped), "run_apart", None)
    if apart is not None:  # the code under test runs in another process: the object is made in its host
        return apart(wrapped, name, *args, **kwargs)
    return factory(wrapped, *args, **kwargs)


def build(where: Any, name: str, /, *args: Any, **kwargs: Any) -> Any:
    """In the process of ``where``: the runtime's ``name`` ("sampling_course.<module>.<name>") called with the arguments."""
    if not isinstance(name, str) or not name.startswith("sampling_course.") or name.count(".") != 2:
        raise ValueError(f"only a class or function of a module of sampling_course is built here, not {name!r}")
    return _resolve(name)(*args, **kwargs)


def _checked_name(factory: Any) -> str:
    name = f"{getattr(factory, '__module__', '')}.{getattr(factory, '__qualname__', '')}"
    if not name.startswith("sampling_course.") or name.count(".") != 2 or _resolve(name) is not factory:
        raise ValueError(f"only a class or function of a module of sampling_course is made beside, not {factory!r}")
    return name


def _resolve(name: str) -> Any:
    module, _, attribute = name.rpartition(".")
    return getattr(importlib.import_module(module), attribute)
