"""The bridge's values: what crosses as data, what as a handle, and what a submission may not ask.

``Codec`` turns a value into JSON plus raw tensor bytes and back (``Endpoint`` in
``bridge.py`` inherits it):

* tensors, numbers, strings, None, lists, tuples, dicts, sets, ``torch.Size``, dtypes,
  slices, ranges, bytes, the course's settings records (``Config``, ``LlamaConfig``,
  ``SamplerSettings``: rebuilt from their fields, checked again), a torch ``Generator`` (its state), a few
  classes by name (``torch.Tensor``, ``int``, ...) and exception classes: by value;
* a tensor that is an object's attribute (``cache.buffer``): *shared*, one copy on each side,
  kept in step, so that ``cache.buffer.fill_(...)`` and ``cache.buffer is buffer`` mean what they
  mean in one process (the copy, handed back, is the object's own tensor again);
* a submission's ``torch.nn.Module``: a *mirror* (``proxies.build_mirror``);
* a shipped tokenizer (``recording_tokenizer.shipped_name``): its name; the submission's side makes
  its own from the course's files, once per name;
* an object of the double host made for the submission (``host.made_apart``): its
  description, which the submission's side turns into a handle through its connection to the host;
* anything else: a *handle* (``proxies.RemoteObject``), which names the object and the
  special methods its class has, so ``hasattr(handle, "__len__")`` answers as the object would.

What the grader's objects refuse a submission is in ``policy.py``: a handle to one of them
that the policy keeps back crosses as "refused".
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import torch

from sampling_course.config import Config
from sampling_course.llama_config import LlamaConfig
from sampling_course.sampling_settings import SamplerSettings
from sampling_course.grading.classroom.policy import may_hand_out
from sampling_course.grading.classroom.proxies import SPECIALS, ModuleMirror, RemoteObject, build_mirror, local_type
from sampling_course.grading.classroom.wire import DTYPES, WireError, decode_tensor, encode_tensor

__all__ = ["Codec", "RemoteError", "SubmissionLost", "error_of", "expect_list", "plain", "raise_remote", "tensor_version"]

_MAX_DEPTH = 64

# Exceptions rebuilt by name on the receiving side; any other type arrives as a RemoteError.
_EXCEPTIONS: dict[str, type[BaseException]] = {
    cls.__name__: cls for cls in (
        ValueError, TypeError, IndexError, KeyError, AttributeError, RuntimeError, NotImplementedError,
        ZeroDivisionError, AssertionError, StopIteration, OverflowError, MemoryError, RecursionError,
        LookupError, ArithmeticError, PermissionError, OSError, ImportError, ModuleNotFoundError,
        SyntaxError, NameError, UnboundLocalError, FloatingPointError, UnicodeError, EOFError,
    )
}

# Classes that cross by name (the same class on both sides), e.g. for ``tensor.as_subclass(torch.Tensor)``.
_CLASSES: dict[str, type] = {
    "torch.Tensor": torch.Tensor, "torch.nn.Parameter": torch.nn.Parameter, "torch.nn.Module": torch.nn.Module,
    "int": int, "float": float, "bool": bool, "str": str, "list": list, "tuple": tuple, "dict": dict,
    "Config": Config,
}
_CLASS_NAMES = {cls: name for name, cls in _CLASSES.items()}
# The runtime's settings records, which cross by value (their fields), checked again where they are rebuilt.
_RECORDS: dict[str, type] = {cls.__name__: cls for cls in (Config, LlamaConfig, SamplerSettings)}


class RemoteError(RuntimeError):
    """An exception raised on the other side whose type is not rebuilt here (its name is in the message)."""


class SubmissionLost(RuntimeError):
    """The submission's process ended, broke the protocol or was restarted; its objects are gone."""


def raise_remote(error: dict[str, Any]) -> None:
    name = str(error.get("type", "Exception"))[:100]
    message = str(error.get("msg", ""))[:4000]
    if name == "NotImplementedError" and error.get("stub"):
        raise_stub(str(error["stub"]), message)
    if name == "NotImplementedError":  # not a stub (torch's, or an answer that cannot cross): a failure like any
        raise RemoteError(f"{name}: {message}" if message else name)
    cls = _EXCEPTIONS.get(name)
    if cls is None:
        raise RemoteError(f"{name}: {message}" if message else name)
    raise cls(message)


def raise_stub(stub: str, message: str) -> None:
    """Raise NotImplementedError from a frame named after the stub, so reports say which stub it was."""
    stub = "".join(c for c in stub if c.isidentifier() or c.isalnum() or c in "._<>")[:200] or "stub"
    code = compile("raise NotImplementedError(message)", "<submission>", "exec").replace(co_name=stub.split(".")[-1],
                                                                                        co_qualname=stub)
    exec(code, {"message": message})  # noqa: S102 - a fixed statement; only its frame's name varies


STUB_PACKAGE = "exercises"  # the package a submission's code is imported as: where its stubs are


def error_of(exc: BaseException) -> dict[str, Any]:
    """``exc`` as data. A NotImplementedError is a stub (the exercise not done yet) only when the submission's own
    code raised it bare, as every stub does (``raise NotImplementedError()``); one from torch (a meta or sparse
    tensor's operation) carries a message and is a failure like any other."""
    error = {"type": type(exc).__name__, "msg": str(exc)[:4000]}
    if isinstance(exc, NotImplementedError) and not exc.args:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        module = str(tb.tb_frame.f_globals.get("__name__", "")) if tb is not None else ""
        if module == STUB_PACKAGE or module.startswith(STUB_PACKAGE + "."):
            error["stub"] = getattr(tb.tb_frame.f_code, "co_qualname", tb.tb_frame.f_code.co_name)
    return error


class Codec:
    """Encoding and decoding of values, for an ``Endpoint`` (which holds the state they use)."""

    def encode(self, value: Any, blobs: list[bytes], sent: list, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            raise ValueError("a value nested too deeply to send")
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (int, float)) and type(value) in (int, float):
            return value
        if isinstance(value, torch.Tensor) and not self._is_subclass_to_keep(value):
            ref = self._shared_refs.get(id(value))
            if ref is not None and self._proxies.get(ref) is value:
                return {"Y": ref}  # the copy of an object's tensor the other side shared: its own tensor there
            spec = encode_tensor(value, blobs)
            spec["rg"] = bool(value.requires_grad)
            sent.append(value)
            spec["i"] = len(sent) - 1
            return spec
        if isinstance(value, (RemoteObject, ModuleMirror)) and value._endpoint() is self:
            return {"Y": value._ref()}
        if not self.owns_modules and type(value).__name__ == "Tokenizer" and self._shipped(value) is not None:
            return {"W": self._shipped(value)}  # a shipped tokenizer: made again from its name where it is sent
        if isinstance(value, RemoteObject) and not self.owns_modules:  # the grader's (or host's) handle elsewhere
            made = self.made_for_peer.get(id(value))
            if made is None or made[0] is not value:
                raise TypeError("an object of another process is handed on only when made for this one (made_apart)")
            return {"B": made[1]}  # the submission gets a handle to the double host's object, there
        enc = lambda v: self.encode(v, blobs, sent, depth + 1)  # noqa: E731
        if type(value) is list:
            return {"L": [enc(v) for v in value]}
        if type(value) is tuple:
            return {"U": [enc(v) for v in value]}
        if type(value) is dict:
            return {"D": [[enc(k), enc(v)] for k, v in value.items()]}
        if type(value) in (set, frozenset):  # "Se"/"Fs": "S" is a shared tensor's tag
            return {"Se" if type(value) is set else "Fs": [enc(v) for v in value]}
        if isinstance(value, torch.Size):
            return {"Z": [int(n) for n in value]}
        if isinstance(value, torch.dtype) and str(value).removeprefix("torch.") in DTYPES:
            return {"dt": str(value).removeprefix("torch.")}
        if isinstance(value, torch.device):
            return {"dev": str(value)}
        if type(value) is slice:
            return {"sl": [enc(value.start), enc(value.stop), enc(value.step)]}
        if value is Ellipsis:
            return {"E": 1}
        if type(value) is range:
            return {"rg": [value.start, value.stop, value.step]}
        if type(value) is bytes:
            blobs.append(value)
            return {"by": len(blobs) - 1}
        if type(value) in _RECORDS.values():
            return {"C": {f.name: enc(getattr(value, f.name)) for f in dataclasses.fields(value)},
                    "n": type(value).__name__}
        if isinstance(value, torch.Generator):
            spec = encode_tensor(value.get_state(), blobs)
            sent.append(value)
            return {"G": spec, "i": len(sent) - 1}
        if isinstance(value, type) and issubclass(value, BaseException) and value.__name__ in _EXCEPTIONS:
            return {"X": value.__name__}
        if isinstance(value, type) and _CLASS_NAMES.get(value):
            return {"K": _CLASS_NAMES[value]}
        if self.owns_modules and isinstance(value, torch.nn.Module):
            return self._encode_module(value, blobs, sent)
        return self._encode_handle(value)

    def handle_spec(self, value: Any) -> dict[str, Any]:
        """``value`` handed to the other side as a handle (never by value, never as a mirror): its description."""
        return self._encode_handle(value)

    def adopt(self, spec: Any) -> Any:
        """The handle ``spec`` (from ``handle_spec`` on the other side, relayed as data) describes."""
        if not isinstance(spec, dict) or not isinstance(spec.get("H"), int):
            raise WireError("a handle's description must name it")
        return self._proxy(spec)

    def _shipped(self, tokenizer: Any) -> str | None:
        """The name of the shipped tokenizer ``tokenizer`` is (worked out once per object), or None."""
        known = self.by_name.get(id(tokenizer))
        if known is None or known[0] is not tokenizer:
            from sampling_course.recording_tokenizer import shipped_name

            known = self.by_name[id(tokenizer)] = (tokenizer, shipped_name(tokenizer))
        return known[1]

    def _is_subclass_to_keep(self, value: torch.Tensor) -> bool:
        # A submission's tensor subclass (a KeyValueCache) crosses as a handle: its methods stay with it.
        return self.owns_modules and type(value) not in (torch.Tensor, torch.nn.Parameter)

    def _encode_handle(self, value: Any) -> dict[str, Any]:
        if isinstance(value, type):
            kind = "class"
        elif isinstance(value, types.ModuleType):
            kind = "module"
        elif isinstance(value, torch.Tensor):
            kind = "tensor"
        else:
            kind = "object"
        if not self.owns_modules and not may_hand_out(value):
            kind = "refused"
        spec = {"H": self.export(value), "k": kind, "t": type(value).__name__[:100], "c": callable(value),
                "d": [name for name in SPECIALS if getattr(type(value), name, None) is not None]}
        if self.owns_modules and kind in ("object", "tensor"):
            spec["cls"] = self.export(type(value))  # so that type(handle)(...) builds one there
        return spec

    def _encode_shared(self, tensor: torch.Tensor, blobs: list[bytes]) -> dict[str, Any]:
        """A tensor that is part of an object's state: the other side keeps one copy, kept in step."""
        ref = self.export(tensor)
        if (ref, "") in self._tracked:
            return {"S": ref}
        self.track(ref, "", tensor)
        return {"S": ref, "t": encode_tensor(tensor, blobs)}

    def _encode_module(self, module: torch.nn.Module, blobs: list[bytes], sent: list) -> dict[str, Any]:
        known = id(module) in self._export_ids and self._exports.get(self._export_ids[id(module)]) is module
        ref = self.export(module)
        if known:
            return {"M": ref}
        spec: dict[str, Any] = {
            "M": ref, "t": type(module).__qualname__[:100], "training": module.training,
            "list": isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)), "p": [], "b": [], "c": [],
        }
        for name, param in module.named_parameters(recurse=False):
            spec["p"].append([name, encode_tensor(param, blobs), bool(param.requires_grad)])
            self.track(ref, name, param)
        for name, buffer in module.named_buffers(recurse=False):
            spec["b"].append([name, encode_tensor(buffer, blobs)])
            self.track(ref, name, buffer)
        for name, child in module.named_children():
            spec["c"].append([name, self._encode_module(child, blobs, sent)])
        return spec

    # ----- decoding --------------------------------------------------------------------

    def decode(self, value: Any, blobs: list[memoryview], received: list, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            raise WireError("a value nested too deeply")
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if not isinstance(value, dict) or len(value) == 0:
            raise WireError(f"unexpected value {str(value)[:80]}")
        dec = lambda v: self.decode(v, blobs, received, depth + 1)  # noqa: E731
        if "S" in value:
            return self._shared(value, blobs)
        if "T" in value:
            tensor = decode_tensor(value, blobs)
            if value.get("rg") and tensor.is_floating_point():
                tensor.requires_grad_(True)
            received.append((value.get("i"), tensor, tensor_version(tensor)))
            return tensor
        if "Y" in value:
            return self.local(value["Y"])
        if "H" in value:
            return self._proxy(value)
        if "W" in value and self.owns_modules:  # a shipped tokenizer, by name: made here, once per name
            from sampling_course.recording_tokenizer import SHIPPED_TOKENIZERS, shipped_tokenizer

            name = _choice(value["W"], SHIPPED_TOKENIZERS)
            if name not in self.by_name:
                self.by_name[name] = shipped_tokenizer(name)
            return self.by_name[name]
        if "B" in value:  # an object of the double host, made for this side: a handle through the connection there
            if self.host is None:
                raise WireError("a double host's object, and no connection to a double host")
            return self.host.adopt(value["B"])
        if "M" in value:
            return self.mirror(value, blobs)
        if "L" in value:
            return [dec(v) for v in expect_list(value["L"])]
        if "U" in value:
            return tuple(dec(v) for v in expect_list(value["U"]))
        if "D" in value:
            return {_hashable(dec(k)): dec(v) for k, v in (_pair(p) for p in expect_list(value["D"]))}
        if "Se" in value or "Fs" in value:
            items = [_hashable(dec(v)) for v in expect_list(value.get("Se", value.get("Fs")))]
            return set(items) if "Se" in value else frozenset(items)
        if "Z" in value:
            return torch.Size([_int(n) for n in expect_list(value["Z"])])
        if "dt" in value:
            return DTYPES[_choice(value["dt"], DTYPES)]
        if "dev" in value:
            return torch.device("cpu")  # grading runs on the CPU, whatever the other side names
        if "sl" in value:
            start, stop, step = (dec(v) for v in expect_list(value["sl"], 3))
            return slice(start, stop, step)
        if "E" in value:
            return Ellipsis
        if "rg" in value:
            return range(*(_int(n) for n in expect_list(value["rg"], 3)))
        if "by" in value:
            index = value["by"]
            if not (isinstance(index, int) and 0 <= index < len(blobs)):
                raise WireError("bad bytes reference")
            return bytes(blobs[index])
        if "C" in value:
            fields, record = value["C"], _RECORDS[_choice(value.get("n", "Config"), _RECORDS)]
            if not isinstance(fields, dict):
                raise WireError(f"bad {record.__name__}")
            known = {f.name for f in dataclasses.fields(record) if f.init}
            try:
                return record(**{k: dec(v) for k, v in fields.items() if k in known})
            except (TypeError, ValueError) as exc:
                raise WireError(f"bad {record.__name__}: {exc}") from None
        if "G" in value:
            generator = torch.Generator()
            try:
                generator.set_state(decode_tensor(value["G"], blobs))
            except RuntimeError as exc:
                raise WireError(f"bad generator state: {exc}") from None
            received.append((value.get("i"), generator, generator.get_state()))
            return generator
        if "X" in value:
            return _EXCEPTIONS[_choice(value["X"], _EXCEPTIONS)]
        if "K" in value:
            return _CLASSES[_choice(value["K"], _CLASSES)]
        raise WireError(f"unknown value tag {str(list(value))[:80]}")

    def _shared(self, spec: dict[str, Any], blobs: list[memoryview]) -> torch.Tensor:
        ref = spec["S"]
        if not isinstance(ref, int):
            raise WireError("bad shared tensor")
        known = self._proxies.get(ref)
        if isinstance(known, torch.Tensor):
            return known
        if "t" not in spec:
            raise WireError("a shared tensor was referred to before it was sent")
        tensor = decode_tensor(spec["t"], blobs)
        self._proxies[ref] = tensor
        self._shared_refs[id(tensor)] = ref
        self.track(ref, "", tensor)
        return tensor

    def _proxy(self, spec: dict[str, Any]) -> Any:
        ref = spec["H"]
        if not isinstance(ref, int):
            raise WireError("bad handle")
        proxy = self._proxies.get(ref)
        if proxy is None:
            kind, name = str(spec.get("k", "object")), str(spec.get("t", "?"))[:100]
            specials = spec.get("d")
            specials = tuple(sorted(str(n) for n in specials)) if isinstance(specials, list) else None
            remote_class = None
            if isinstance(spec.get("cls"), int):
                remote_class = self._proxy({"H": spec["cls"], "k": "class", "t": "type", "c": True,
                                            "d": ["__call__"]})
            key = (spec.get("cls"), name, specials)
            if key not in self._local_types:  # one local class per class of the other side
                self._local_types[key] = local_type(name, specials, remote_class)
            proxy = self._local_types[key].make(self, ref, name, kind, bool(spec.get("c")))
            self._proxies[ref] = proxy
        return proxy

    def mirror(self, spec: dict[str, Any], blobs: list[memoryview]) -> Any:
        """The local mirror of a module the other side sent (the same one each time it is sent again)."""
        ref = spec["M"]
        if not isinstance(ref, int):
            raise WireError("bad module handle")
        if ref in self._proxies:
            return self._proxies[ref]
        if "p" not in spec:
            raise WireError("a module was referred to before it was sent")
        return build_mirror(self, spec, blobs)

    def track(self, ref: int, name: str, tensor: torch.Tensor) -> None:
        if tensor_version(tensor) is not None:  # an inference-mode tensor cannot change in place
            self._tracked[(ref, name)] = [tensor, tensor_version(tensor)]

    def remember(self, ref: int, proxy: Any) -> None:
        self._proxies[ref] = proxy


_PLAIN_LEAVES = (type(None), bool, int, float, str, bytes, torch.Size, torch.dtype, torch.device, range, Config,
                 LlamaConfig, SamplerSettings, torch.Generator)


def plain(value: Any, endpoint: Any = None, depth: int = 0) -> bool:
    """Whether ``value`` is plain data: what crosses by value, built of plain types only. With ``endpoint``,
    a handle to the other side's own object through it counts too (it goes back as its name)."""
    if depth > _MAX_DEPTH:
        return False
    if type(value) in _PLAIN_LEAVES or type(value) is torch.Tensor or type(value) is torch.nn.Parameter:
        return True
    if endpoint is not None and isinstance(value, (RemoteObject, ModuleMirror)) and value._endpoint() is endpoint:
        return True
    if type(value) in (list, tuple, set, frozenset):
        return all(plain(v, endpoint, depth + 1) for v in value)
    if type(value) is dict:
        return all(plain(k, endpoint, depth + 1) and plain(v, endpoint, depth + 1) for k, v in value.items())
    if type(value) is slice:
        return all(plain(v, endpoint, depth + 1) for v in (value.start, value.stop, value.step))
    return False


def tensor_version(tensor: torch.Tensor) -> int | None:
    """How often ``tensor`` was modified in place; None for an inference-mode tensor (it cannot be)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def expect_list(value: Any, length: int | None = None) -> list:
    """``value``, which a message must give as a list (of ``length`` items, if given)."""
    if not isinstance(value, list) or (length is not None and len(value) != length):
        raise WireError("expected a list" + (f" of {length}" if length else ""))
    return value


def _pair(value: Any) -> tuple[Any, Any]:
    first, second = expect_list(value, 2)
    return first, second


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError("expected an integer")
    return value


def _choice(value: Any, allowed: dict) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise WireError(f"unexpected name {str(value)[:40]}")
    return value


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        raise WireError("an unhashable dictionary key") from None
    return value
