"""The oracle's outputs, computed live once and then reused: stored, never invented.

The grading tests compare the learner's code with independent references (Hugging Face
logits and ``generate``, TransformerLens activations). Importing those libraries takes
8-13 s, far longer than the comparisons themselves, and their outputs for the grading
inputs never change unless the inputs, the weights or the libraries do. So a test asks
for an oracle output through ``OracleStore`` (the ``oracle`` fixture)::

    def hf_logits(reference, tokens):          # module level; reads only its arguments
        return reference.hf_model(tokens).logits

    expected = oracle(hf_logits, reference, tokens)

The first time, ``hf_logits(reference, tokens)`` runs live, on the reference, and its
result is stored under ``cache_home()/oracle/``, keyed by

* the function: its module, its name and the text of the file that defines it (with
  this module and ``reference.py``), so editing a test recomputes its outputs;
* its arguments: a reference counts as its name and the SHA-256 of its weights, a tensor
  as its dtype, shape and bytes, anything else as its value;
* the versions of torch, transformers, transformer_lens and tokenizers.

Later calls with the same key read the stored output; a different input (say, tokens
that the learner's code produced) is simply a new key, computed live. A stored file is
written atomically with its manifest and checked on reading; a damaged one is computed
again, with a one-line notice. ``--recompute-oracle`` (pytest, ``sampling-course check``)
or ``SAMPLING_COURSE_RECOMPUTE_ORACLE=1`` recomputes every output it meets.

Rules for an oracle function, so that its key says everything its output depends on:
it is defined at the top level of a module (no lambda, no closure), reads only its
arguments and its own module, and returns tensors and plain values (lists, tuples,
dicts, numbers, strings). Randomness comes from a seed passed as an argument.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import io
import json
import os
import sys
import types
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import torch

from sampling_course.files import cache_home, read_cached, write_cached

RECOMPUTE_ENV = "SAMPLING_COURSE_RECOMPUTE_ORACLE"
LIBRARIES = ("torch", "transformers", "transformer_lens", "tokenizers")
FORMAT = 1  # bump to ignore every output stored by an older version of this module


def recompute_requested(flag: bool = False) -> bool:
    """Whether to recompute every oracle output: ``flag``, or $SAMPLING_COURSE_RECOMPUTE_ORACLE set to 1/yes/true."""
    return flag or os.environ.get(RECOMPUTE_ENV, "").strip().lower() in ("1", "yes", "true", "on")


@cache
def library_versions() -> dict[str, str]:
    """The installed versions of the libraries the oracle computes with (read without importing them)."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


@cache
def _file_digest(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


def _code_digest(fn: Callable) -> str:
    """The text of the files that decide what ``fn`` computes: its own, this module and reference.py."""
    from sampling_course import reference

    files = (fn.__code__.co_filename, __file__, reference.__file__)
    return hashlib.sha256("".join(_file_digest(f) for f in files).encode()).hexdigest()


def _tensor_digest(tensor: torch.Tensor) -> str:
    data = tensor.detach().cpu().contiguous()
    if data.dtype == torch.bfloat16:  # numpy has no bfloat16; the same bits as int16
        data = data.view(torch.int16)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()


def describe(value: Any) -> Any:
    """A JSON-able description of ``value`` that is equal exactly when two values would give the oracle the same input."""
    from sampling_course.reference import Reference

    if isinstance(value, Reference):
        return {"reference": value.name, "weights": value.digest, "device": str(value.device), "dtype": str(value.dtype)}
    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype), "shape": list(value.shape), "sha256": _tensor_digest(value)}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"float": value.hex()}  # exact, and NaN/inf included
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [describe(v) for v in value]
        if isinstance(value, (set, frozenset)):  # no order of their own: sort by description
            items.sort(key=lambda item: json.dumps(item, sort_keys=True))
        return {type(value).__name__: items}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("an oracle argument's dict keys must be strings")
        return {"dict": {k: describe(v) for k, v in sorted(value.items())}}
    if isinstance(value, (torch.Generator, torch.nn.Module, types.FunctionType, types.MethodType,
                          types.BuiltinFunctionType, type)):
        raise TypeError(f"an oracle argument cannot be a {type(value).__name__}: pass a seed, a reference or plain values")
    cls = type(value)
    module = sys.modules.get(cls.__module__)
    state = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else vars(value)
    return {"object": f"{cls.__module__}.{cls.__qualname__}",
            "code": _file_digest(getattr(module, "__file__", "") or ""), "state": describe(state)}


def _device_of(value: Any):
    """Where the oracle's inputs live: the first reference's device, else the first tensor's; None when none."""
    from sampling_course.reference import Reference

    if isinstance(value, Reference):
        return value.device
    if isinstance(value, torch.Tensor):
        return value.device
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        device = _device_of(item)
        if device is not None:
            return device
    return None


def _placed(value: Any, device) -> Any:
    """``value`` with every tensor moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list):
        return [_placed(v, device) for v in value]
    if isinstance(value, tuple):
        return tuple(_placed(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _placed(v, device) for k, v in value.items()}
    return value


def _detached(value: Any) -> Any:
    """``value`` with every tensor a compact CPU copy (a view would store its whole base tensor)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, list):
        return [_detached(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    raise TypeError(f"an oracle function must return tensors and plain values, not a {type(value).__name__}")


class OracleStore:
    """Oracle outputs keyed by function, arguments, weights and library versions (see the module).

    ``store(fn, *args, **kwargs)`` returns ``fn(*args, **kwargs)``, computed live the first
    time and read back afterwards. ``computed`` and ``reused`` count both kinds of call.
    """

    def __init__(self, folder: Path | None = None, recompute: bool = False):
        self.folder = folder
        self.recompute = recompute_requested(recompute)
        self.computed = 0
        self.reused = 0
        self._memory: dict[str, bytes] = {}  # this process's outputs, as stored: a second call reads no file

    def _folder(self) -> Path:
        if self.folder is None:
            self.folder = cache_home() / "oracle"
        return self.folder

    def key(self, fn: Callable, args: tuple, kwargs: dict) -> str:
        qualname = getattr(fn, "__qualname__", "")
        if not hasattr(fn, "__code__") or "<lambda>" in qualname or "<locals>" in qualname or fn.__closure__:
            raise TypeError(f"an oracle function must be defined at the top level of a module, got {fn!r}")
        description = {
            "format": FORMAT,
            "function": f"{fn.__module__}.{qualname}",
            "code": _code_digest(fn),
            "arguments": describe([list(args), kwargs]),
            "libraries": library_versions(),
        }
        return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()

    def __call__(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, stored or live; its tensors come back where the inputs live (the CPU if none)."""
        value = self._value(fn, args, kwargs)
        device = _device_of([list(args), kwargs])
        return value if device is None or device.type == "cpu" else _placed(value, device)

    def _value(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        key = self.key(fn, args, kwargs)
        path = self._folder() / key[:2] / f"{key}.pt"
        data = None if self.recompute and key not in self._memory else self._memory.get(key)
        problem = None
        if data is None and not self.recompute:
            data, problem = read_cached(path)
        if data is not None:
            try:
                value = torch.load(io.BytesIO(data), weights_only=True)  # tensors and plain values only: no code runs
            except Exception as exc:  # noqa: BLE001 - a file that passed its checksum but does not load
                problem, data = f"it cannot be loaded ({type(exc).__name__})", None
            else:
                self._memory[key] = data
                self.reused += 1
                return value
        buffer = io.BytesIO()
        torch.save(_detached(_live(fn, args, kwargs)), buffer)
        data = buffer.getvalue()
        try:
            write_cached(path, data)
        except OSError:
            pass  # a read-only or full disk: the output is still right, only not kept
        self._memory[key] = data
        self.computed += 1
        if problem is not None:
            from sampling_course.files import notice

            notice(f"recomputed a stored reference output ({fn.__qualname__}): {path.name} was damaged ({problem})")
        # Read back what was stored, so that a test gets the same objects whether computed or reused.
        return torch.load(io.BytesIO(data), weights_only=True)


@cache
def shared_store(recompute: bool = False) -> OracleStore:
    """One store per process (per setting of ``recompute``), so that a later check reuses what an earlier one read."""
    return OracleStore(recompute=recompute)


def _live(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` without gradients, leaving torch's global random state as it found it,
    so that a test behaves the same whether its oracle output was computed or read back."""
    state = torch.get_rng_state()
    try:
        with torch.no_grad():
            return fn(*args, **kwargs)
    finally:
        torch.set_rng_state(state)
