"""What an object of the other side looks like on the side that holds a handle to it.

* ``RemoteObject``: any object of the other side. Attribute reads, calls, indexing, ``len``,
  iteration, ``repr``, ``==`` and ``isinstance(x, remote_class)`` travel to its side.
  ``local_type`` makes its class: one per class of the other side, with the special methods
  (``SPECIALS``) that class has.
* ``ModuleMirror`` / ``MirrorList``: a submission's ``torch.nn.Module`` on the grader's side,
  with local copies of its parameters and buffers (kept in step by the bridge) and a
  ``forward`` that runs in the submission's process (``build_mirror``).

A handle asks its questions through the endpoint it came from (a ``Channel``:
``bridge.Endpoint``), which ``codec.py`` gives it when it decodes one; the other side's answer
is ``bridge.perform``. This module imports neither.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from sampling_course.grading.classroom.wire import WireError, decode_tensor

__all__ = ["SPECIALS", "Channel", "ModuleMirror", "MirrorList", "RemoteObject", "build_mirror", "local_type"]

# Special methods a handle has exactly when the object's class has them.
# Never a comparison: on the grader's side that is its own judgement, made on plain data
# (RemoteObject.__eq__ is identity there, and truth and membership are refused).
SPECIALS = ("__call__", "__len__", "__iter__", "__next__", "__getitem__", "__setitem__", "__delitem__",
            "__int__", "__float__", "__index__", "__enter__", "__exit__", "__add__", "__radd__", "__sub__",
            "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__",
            "__mod__", "__pow__", "__rpow__", "__matmul__", "__rmatmul__",
            "__and__", "__or__", "__xor__", "__neg__", "__pos__", "__abs__", "__invert__")


class Channel(Protocol):
    """What a handle or a mirror needs of the endpoint it came through (``bridge.Endpoint`` is one)."""

    peer_trusted: bool  # True on the submission's side: the handles it holds name the grader's objects

    def request(self, op: str, ref: int | None, *args: Any, **fields: Any) -> Any:
        """Ask the other side to do ``op`` on its object ``ref``."""

    def remember(self, ref: int, proxy: Any) -> None:
        """Keep ``proxy`` as the local stand-in for the other side's object ``ref``."""

    def track(self, ref: int, name: str, tensor: torch.Tensor) -> None:
        """Keep ``tensor`` in step with its copy on the other side."""

    def mirror(self, spec: dict[str, Any], blobs: list[memoryview]) -> Any:
        """The mirror of a module the other side sent."""

    made_apart: Any  # the grader's side: (ref, name, args, kwargs) -> the runtime's ``name`` made in the double host


def _values(value: Any) -> Any:
    """``value`` with every remote tensor replaced by its data (for a torch function called here).

    The data is a plain ``torch.Tensor`` rebuilt from bytes; any other remote object is refused.
    """
    if isinstance(value, RemoteObject):
        data = value._ask("value") if object.__getattribute__(value, "_rk") == "tensor" else None
        if type(data) is not torch.Tensor:
            raise TypeError(f"a torch function was given the submission's {object.__getattribute__(value, '_rt')}; "
                            "only its data (a tensor) can be used")
        return data
    if isinstance(value, (list, tuple)):
        return type(value)(_values(v) for v in value)
    if isinstance(value, dict):
        return {k: _values(v) for k, v in value.items()}
    return value


class RemoteObject:
    """An object of the other side. Everything done to it is done there.

    A tensor of the other side's own class (a submission's KeyValueCache) is one too: its
    methods and indexing run there, and a torch function given it here gets its data.
    """

    __slots__ = ("_rb", "_rr", "_rt", "_rk", "_rc", "_cache", "__weakref__")

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # ``type(obj)(...)`` on a handle builds a new object of the same class, on its side; so does a
        # class written here that derives from a class of the other side (see __mro_entries__).
        base = next((k for k in cls.__mro__ if k.__dict__.get("_bridge_class") is not None), None)
        if base is None:
            raise TypeError("a RemoteObject is made by the bridge, not called directly")
        remote_class = base.__dict__["_bridge_class"]
        if base is not cls:
            remote_class = _remote_subclass(cls, base, remote_class)
        return remote_class(*args, **kwargs)

    def __mro_entries__(self, bases: tuple) -> tuple:
        """``class Mine(remote_class): ...``: a local class whose objects are made on the other side."""
        return (local_type(object.__getattribute__(self, "_rt"), ("__call__",), self),)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass  # set up by make()

    @classmethod
    def make(cls, endpoint: Channel, ref: int, type_name: str, kind: str, is_callable: bool) -> "RemoteObject":
        obj = object.__new__(cls)
        for slot, value in zip(RemoteObject.__slots__[:6], (endpoint, ref, type_name, kind, is_callable, {})):
            object.__setattr__(obj, slot, value)
        return obj

    def _endpoint(self) -> Channel:
        return object.__getattribute__(self, "_rb")

    def _ref(self) -> int:
        return object.__getattribute__(self, "_rr")

    def _ask(self, op: str, *args: Any, **fields: Any) -> Any:
        return self._endpoint().request(op, self._ref(), *args, **fields)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # special methods are the handle class's (see local_type)
        cache = object.__getattribute__(self, "_cache")
        if name in cache:
            return cache[name]
        value = self._ask("getattr", name=name)
        # A class's or module's functions and classes are looked up thousands of times by a
        # statistical test: remember them (until something is assigned on this side).
        if object.__getattribute__(self, "_rk") in ("class", "module") and isinstance(value, RemoteObject):
            cache[name] = value
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        object.__getattribute__(self, "_cache").clear()
        self._ask("setattr", name=name, value=value)

    def __delattr__(self, name: str) -> None:
        object.__getattribute__(self, "_cache").clear()
        self._ask("delattr", name=name)

    def _trusted(self) -> bool:
        """Whether this handle names an object of the grader's (held by the submission's side)."""
        return bool(getattr(self._endpoint(), "peer_trusted", False))

    def __eq__(self, other: Any) -> Any:
        if self._trusted():
            return self._ask("eq", other)  # the grader's object answers for itself
        return self is other  # the submission's object never says what it equals

    def __ne__(self, other: Any) -> Any:
        result = self.__eq__(other)
        return ~result if isinstance(result, torch.Tensor) else not result

    def __bool__(self) -> bool:
        if self._trusted():
            return self._ask("bool") is True
        raise TypeError(f"the submission's {object.__getattribute__(self, '_rt')} has no truth value here: "
                        "a test judges plain data only")

    def __contains__(self, item: Any) -> bool:
        if self._trusted():
            return self._ask("contains", item) is True
        raise TypeError(f"the submission's {object.__getattribute__(self, '_rt')} is not asked what it contains")

    def __hash__(self) -> int:
        return hash((id(self._endpoint()), self._ref()))

    def __instancecheck__(self, obj: Any) -> bool:
        if not isinstance(obj, (RemoteObject, ModuleMirror)) or obj._endpoint() is not self._endpoint():
            return False
        return self._ask("instancecheck", obj) is True

    def __repr__(self) -> str:
        try:
            text = self._ask("repr")
        except Exception:  # noqa: BLE001 - a repr must not fail (pytest calls it for messages)
            text = None
        return text if isinstance(text, str) else f"<remote {object.__getattribute__(self, '_rt')}>"

    def __str__(self) -> str:
        text = self._ask("str")
        return text if isinstance(text, str) else repr(self)

    @staticmethod
    def run_beside(handle: "RemoteObject", function: str, *args: Any, **kwargs: Any) -> Any:
        """``function`` ("sampling_course.<module>.<name>", of the course's runtime) called with ``handle``'s
        object and ``args`` in that object's process, by the runtime loaded there: one message for a loop
        of calls (``sampling_course.repeat``). The grader's objects run nothing a submission names: from
        the submission's side, NotImplemented (the caller runs its loop where it is)."""
        if handle._trusted():
            return NotImplemented
        module, _, name = function.rpartition(".")
        if module.count(".") != 1 or not module.startswith("sampling_course."):
            raise ValueError(f"only a function of the course's runtime runs beside an object, not {function!r}")
        runtime = handle._endpoint().request("import", None, name=module)
        return getattr(runtime, name)(handle, *args, **kwargs)

    @staticmethod
    def run_apart(handle: "RemoteObject", name: str, *args: Any, **kwargs: Any) -> Any:
        """The runtime's ``name`` called with ``handle``'s object and ``args``, made in the double host
        (``sampling_course.beside.made_apart``): a record there that neither side's code can change."""
        return _apart(handle._endpoint(), handle._ref(), name, args, kwargs)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        # Here, on the tensors' data: the submission's tensor class never decides what a torch function gives.
        return func(*_values(args), **_values(kwargs or {}))


def _apart(endpoint: Channel, ref: int, name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
    if getattr(endpoint, "made_apart", None) is None:
        raise RuntimeError("this connection has no double host")
    return endpoint.made_apart(ref, name, args, kwargs)


def _remote_subclass(cls: type, base: type, remote_class: Any) -> Any:
    """The other side's subclass of ``remote_class`` for the local class ``cls``: its methods call back here."""
    made = cls.__dict__.get("_bridge_made")
    if made is not None:
        return made
    members: dict[str, Any] = {}
    for klass in reversed(cls.__mro__[: cls.__mro__.index(base)]):
        for name, value in vars(klass).items():
            if not name.startswith("__") or name in ("__call__", "__len__", "__getitem__"):
                members[name] = value
    made = remote_class._endpoint().request("subclass", None, remote_class, members, name=cls.__name__)
    type.__setattr__(cls, "_bridge_made", made)
    return made


class _Specials:
    """The special methods a handle's class gets when the object's class has them (``local_type``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._ask("call", *args, kw=kwargs)

    def __getitem__(self, key: Any) -> Any:
        return self._ask("getitem", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._ask("setitem", key, value)

    def __delitem__(self, key: Any) -> None:
        self._ask("delitem", key)

    def __len__(self) -> int:
        n = self._ask("len")
        if not isinstance(n, int) or n < 0:
            raise TypeError("len() of a remote object must be a non-negative int")
        return n

    def __iter__(self) -> Any:
        iterator = self._ask("iter")
        return iterator if isinstance(iterator, RemoteObject) else iter(iterator)

    def __next__(self) -> Any:
        return self._ask("next")

    def __int__(self) -> int:
        return int(self._ask("int"))

    def __float__(self) -> float:
        return float(self._ask("float"))

    def __index__(self) -> int:
        value = self._ask("index")
        if not isinstance(value, int):
            raise TypeError("__index__ must give an int")
        return value

    def __add__(self, other: Any) -> Any:
        return self._ask("method", other, name="__add__")

    def __radd__(self, other: Any) -> Any:
        return self._ask("method", other, name="__radd__")

    def __sub__(self, other: Any) -> Any:
        return self._ask("method", other, name="__sub__")

    def __rsub__(self, other: Any) -> Any:
        return self._ask("method", other, name="__rsub__")

    def __mul__(self, other: Any) -> Any:
        return self._ask("method", other, name="__mul__")

    def __rmul__(self, other: Any) -> Any:
        return self._ask("method", other, name="__rmul__")

    def __truediv__(self, other: Any) -> Any:
        return self._ask("method", other, name="__truediv__")

    def __rtruediv__(self, other: Any) -> Any:
        return self._ask("method", other, name="__rtruediv__")

    def __floordiv__(self, other: Any) -> Any:
        return self._ask("method", other, name="__floordiv__")

    def __rfloordiv__(self, other: Any) -> Any:
        return self._ask("method", other, name="__rfloordiv__")

    def __mod__(self, other: Any) -> Any:
        return self._ask("method", other, name="__mod__")

    def __pow__(self, other: Any) -> Any:
        return self._ask("method", other, name="__pow__")

    def __rpow__(self, other: Any) -> Any:
        return self._ask("method", other, name="__rpow__")

    def __matmul__(self, other: Any) -> Any:
        return self._ask("method", other, name="__matmul__")

    def __rmatmul__(self, other: Any) -> Any:
        return self._ask("method", other, name="__rmatmul__")

    def __and__(self, other: Any) -> Any:
        return self._ask("method", other, name="__and__")

    def __or__(self, other: Any) -> Any:
        return self._ask("method", other, name="__or__")

    def __xor__(self, other: Any) -> Any:
        return self._ask("method", other, name="__xor__")

    def __neg__(self) -> Any:
        return self._ask("method", name="__neg__")

    def __pos__(self) -> Any:
        return self._ask("method", name="__pos__")

    def __abs__(self) -> Any:
        return self._ask("method", name="__abs__")

    def __invert__(self) -> Any:
        return self._ask("method", name="__invert__")

    def __enter__(self) -> Any:
        return self._ask("method", name="__enter__")

    def __exit__(self, *exc: Any) -> Any:
        return self._ask("method", name="__exit__", kw={})


def local_type(name: str, specials: Any, remote_class: Any = None) -> type:
    """A handle class named like the object's class, with the special methods it has.

    With ``remote_class``, calling the handle class (``type(handle)(...)``) builds a new
    object of that class on its side.
    """
    names = SPECIALS if specials is None else [n for n in specials if n in SPECIALS]
    namespace = {n: vars(_Specials)[n] for n in names}
    namespace.update(__slots__=(), _bridge_class=remote_class)
    return type(name if isinstance(name, str) and name.isidentifier() else "Remote", (RemoteObject,), namespace)


def _valid_name(name: Any) -> str:
    if not isinstance(name, str) or not name.isidentifier() and not name.isdigit() or name.startswith("_bridge"):
        raise WireError(f"bad module attribute name {str(name)[:40]}")
    return name


class _MirrorMixin:
    """What ModuleMirror and MirrorList share: where they live, attribute fallback, train()."""

    def _endpoint(self) -> Channel:
        return self.__dict__["_bridge_ep"]

    def _ref(self) -> int:
        return self.__dict__["_bridge_ref"]

    def __getattr__(self, name: str) -> Any:
        try:
            return torch.nn.Module.__getattr__(self, name)  # parameters, buffers, submodules
        except AttributeError:
            pass
        endpoint = self.__dict__.get("_bridge_ep")
        if endpoint is None or name.startswith("__"):
            raise AttributeError(name)
        return endpoint.request("getattr", self.__dict__["_bridge_ref"], name=name)

    def train(self, mode: bool = True) -> Any:
        for module in self.modules():
            module.__dict__["training"] = bool(mode)
        self._endpoint().request("method", self._ref(), bool(mode), name="train")
        return self

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._endpoint().request("call", self._ref(), *args, kw=kwargs)

    @staticmethod
    def run_apart(mirror: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        """Like ``RemoteObject.run_apart``, for a submission's module."""
        return _apart(mirror._endpoint(), mirror._ref(), name, args, kwargs)

    def extra_repr(self) -> str:
        return f"in the submission's process: {self.__dict__.get('_bridge_type', '?')}"


class ModuleMirror(_MirrorMixin, torch.nn.Module):
    """A submission's module: local parameters, remote forward."""


class MirrorList(_MirrorMixin, torch.nn.ModuleList):
    """A submission's ModuleList or Sequential: indexable and iterable here, callable there."""


def build_mirror(endpoint: Channel, spec: dict[str, Any], blobs: list[memoryview]) -> torch.nn.Module:
    """The mirror of a module the submission sent (``codec.Codec._encode_module``)."""
    ref = spec["M"]
    mirror = (MirrorList if spec.get("list") else ModuleMirror)()
    mirror.__dict__.update(_bridge_ep=endpoint, _bridge_ref=ref, _bridge_type=str(spec.get("t", "?"))[:100])
    endpoint.remember(ref, mirror)
    for item in _items(spec.get("p"), 3):
        name, tensor_spec, requires_grad = item
        tensor = decode_tensor(tensor_spec, blobs)
        param = torch.nn.Parameter(tensor, requires_grad=bool(requires_grad) and tensor.is_floating_point())
        mirror._parameters[_valid_name(name)] = param
        endpoint.track(ref, name, param)
    for item in _items(spec.get("b"), 2):
        name, tensor_spec = item
        buffer = decode_tensor(tensor_spec, blobs)
        mirror._buffers[_valid_name(name)] = buffer
        endpoint.track(ref, name, buffer)
    for item in _items(spec.get("c"), 2):
        name, child = item
        if not isinstance(child, dict) or "M" not in child:
            raise WireError("a submodule must be a module")
        mirror._modules[_valid_name(name)] = endpoint.mirror(child, blobs)
    mirror.__dict__["training"] = bool(spec.get("training"))
    return mirror


def _items(value: Any, width: int) -> list:
    if not isinstance(value, list) or not all(isinstance(v, list) and len(v) == width for v in value):
        raise WireError("a malformed module description")
    return value
