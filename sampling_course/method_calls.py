"""How often a class's method is called, counted where the class lives.

A test that checks that code asks an object for something (an engine asking each request's
``BlockTable.slots`` where its positions go) wraps that method: the same results, and each call
counted. ``MethodCalls(cls, name)`` replaces ``cls.name`` with such a wrapper until ``restore()``.

It lives in the course's runtime so that it can be made beside the code under test
(``sampling_course.beside.made_beside``): graded in another process, the class and the code
that calls it are there, and a wrapper written in the test would be an object of the grader's.
There the count is the submission's to change: a check that fails on it convicts, one that holds
earns nothing (``op_recorder.own_record_held``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MethodCalls"]


class MethodCalls:
    """``cls.name`` (a function defined on ``cls`` itself) wrapped: ``calls`` counts its calls."""

    def __init__(self, cls: type, name: str):
        original = vars(cls).get(name) if isinstance(cls, type) and isinstance(name, str) else None
        if not callable(original):
            raise TypeError(f"MethodCalls wraps a function defined on a class, not {cls!r}.{name!r}")
        self.calls = 0
        self._restore = (cls, name, original)

        def counted(obj: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(obj, *args, **kwargs)

        setattr(cls, name, counted)

    def restore(self) -> None:
        """Put the original method back."""
        cls, name, original = self._restore
        setattr(cls, name, original)
