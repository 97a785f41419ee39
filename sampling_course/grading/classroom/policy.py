"""What a submission may ask of the grader's objects: public, read-only questions.

The grader hands a submission handles to some of its objects (the model a submission's
``sample`` calls, say). Those objects answer only the requests in ``SAFE_OPS``, never give
out a name that ``refused_name`` refuses, and never hand out what ``may_hand_out`` keeps
back. ``codec.py`` applies the rules when it sends a handle, ``bridge.perform`` when it
answers a request; this module imports neither.
"""

from __future__ import annotations

import types
from typing import Any

__all__ = ["SAFE_OPS", "may_hand_out", "refused_name"]

# Requests a submission may make of the grader's objects; "import", "setattr" and the like are not among them.
# What they give back must be plain data (``codec.plain``) or a method of the same object.
SAFE_OPS = frozenset({"getattr", "call", "method", "getitem", "len", "iter", "next", "contains", "bool", "eq", "repr",
                      "str", "int", "float", "index"})

# What a submission may not ask of the grader's objects: private names and the introspection
# that leads to code and frames, and the methods that would change or save the grader's state.
_REFUSED_PREFIXES = ("_", "register_", "save", "push_", "from_", "load", "set_", "add_", "to_json", "dump",
                     "export", "resize", "tie_", "init_", "apply")
_REFUSED_NAMES = frozenset({
    "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame", "ag_code",
    "f_globals", "f_locals", "f_back", "f_builtins", "f_code", "tb_frame", "tb_next", "func_globals",
    "train", "to", "cuda", "cpu", "half", "float", "double", "bfloat16", "type", "share_memory",
    "requires_grad_", "zero_grad", "post_init", "copy_", "fill_", "zero_", "data", "grad", "storage",
    "untyped_storage", "set_", "modules", "named_modules", "children", "named_children",
})


def refused_name(name: str) -> bool:
    """Whether a submission is refused the attribute ``name`` of one of the grader's objects."""
    return not isinstance(name, str) or name.startswith(_REFUSED_PREFIXES) or name in _REFUSED_NAMES


def may_hand_out(value: Any) -> bool:
    """The grader's objects a submission may hold a handle to: not modules, builtins or code."""
    return not isinstance(value, (types.ModuleType, types.BuiltinFunctionType, types.CodeType, types.FrameType,
                                  types.TracebackType))
