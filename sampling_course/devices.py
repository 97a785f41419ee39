"""Where the course computes: one rule picks the device, and one message says when two disagree.

The rule (``pick_device``): a device you name is used as it is (``"cpu"``, ``"cuda"``,
``"cuda:1"``, ``"mps"``); ``None`` or ``"auto"`` means the course's device:

1. the device a test session grades on (``pytest --device``, see ``use_device``), if any;
2. else ``$SAMPLING_COURSE_DEVICE``, if set;
3. else an NVIDIA GPU (``cuda``), else an Apple GPU (``mps``), else the CPU.

Loaders (``load_reference``, ``load_demo``), caches, samplers and every command
(``--device``) go through it, so a notebook, a command and a test session agree on one
device without being told twice.

A model's inputs must live where its weights do. When they do not, torch's own error names
an operator deep inside the model; the course says instead, in one line, which object is
on which device and how to fix it (``check_same_device``, ``check_generator``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

DEVICE_ENV = "SAMPLING_COURSE_DEVICE"
DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")


class DeviceUnavailable(ValueError):
    """A device was asked for that this machine (or this build of torch) does not have."""


class DeviceMismatchError(ValueError):
    """A tensor, cache or generator is on another device than the model it is used with."""


# The device a test session grades on (set by ``use_device``); consulted before the environment.
_session_device: torch.device | None = None


def cuda_available() -> bool:
    return torch.cuda.is_available()


def mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def available_devices() -> list[str]:
    """The device types torch can use on this machine, in the order the rule prefers them."""
    return [name for name, ok in (("cuda", cuda_available()), ("mps", mps_available()), ("cpu", True)) if ok]


def _why_unavailable(kind: str) -> str:
    if kind == "cuda":
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        return f"torch {torch.__version__} ({build}) finds no CUDA GPU"
    return f"torch {torch.__version__} finds no Apple GPU (MPS)"


def parse_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device`` of a kind the course runs on (cpu, cuda, mps); raises otherwise."""
    if isinstance(device, torch.device):
        parsed = device
    elif isinstance(device, str):
        try:
            parsed = torch.device(device.strip().lower())
        except RuntimeError:
            parsed = None
        if parsed is None or parsed.type not in DEVICE_CHOICES:
            raise ValueError(f"device must be one of {', '.join(DEVICE_CHOICES)} (or cuda:N), got {device!r}")
    else:
        raise TypeError(f"device must be a string such as 'cuda' or a torch.device, got {type(device).__name__}")
    if parsed.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device must be one of {', '.join(DEVICE_CHOICES)} (or cuda:N), got {str(parsed)!r}")
    return parsed


def _validated(device: torch.device, origin: str = "") -> torch.device:
    """``device`` if this machine has it, else a DeviceUnavailable that says so and what there is.
    ``origin`` names where the request came from (an environment variable), if not the caller."""
    where = f"{origin}: " if origin else ""
    if device.type == "cuda":
        if not cuda_available():
            raise DeviceUnavailable(f"{where}{device} is not available here: {_why_unavailable('cuda')}; "
                                    f"devices here: {', '.join(available_devices())}")
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise DeviceUnavailable(f"{where}{device} is not available here: this machine has "
                                    f"{torch.cuda.device_count()} CUDA GPU(s), numbered from 0")
        return torch.device("cuda", index)
    if device.type == "mps" and not mps_available():
        raise DeviceUnavailable(f"{where}mps is not available here: {_why_unavailable('mps')}; "
                                f"devices here: {', '.join(available_devices())}")
    return device


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """The device to compute on: ``device`` itself, or for None / ``"auto"`` the course's rule
    (the test session's device, else $SAMPLING_COURSE_DEVICE, else cuda, then mps, then cpu).

    Raises ``DeviceUnavailable`` (a ValueError) for a device this machine does not have, and
    ValueError for a name that is no device.
    """
    if device is not None and not (isinstance(device, str) and device.strip().lower() == "auto"):
        return _validated(parse_device(device))
    if _session_device is not None:
        return _session_device
    from_env = os.environ.get(DEVICE_ENV, "").strip()
    if from_env and from_env.lower() != "auto":
        try:
            parsed = parse_device(from_env)
        except ValueError as exc:
            raise ValueError(f"${DEVICE_ENV}: {exc}") from None
        return _validated(parsed, f"${DEVICE_ENV}={from_env}")
    if cuda_available():
        return torch.device("cuda", torch.cuda.current_device())
    if mps_available():
        return torch.device("mps")
    return torch.device("cpu")


@contextlib.contextmanager
def use_device(device: str | torch.device) -> Iterator[torch.device]:
    """Within the block, ``pick_device()`` (and so every loader left to its default) gives ``device``.

    The pytest plugin grades a whole session this way (``pytest --device``); the previous
    setting comes back afterwards, so a check run from a notebook leaves the notebook's alone.
    """
    global _session_device
    chosen = pick_device(device)
    before, _session_device = _session_device, chosen
    try:
        yield chosen
    finally:
        _session_device = before


def same_device(a: torch.device | str, b: torch.device | str) -> bool:
    """Whether ``a`` and ``b`` are one device (``cuda`` and ``cuda:0`` are, on a one-GPU machine)."""
    if a == b:
        return True
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.type == "cuda":
        current = torch.cuda.current_device() if cuda_available() else 0
        return (current if a.index is None else a.index) == (current if b.index is None else b.index)
    return True


def model_device(model: torch.nn.Module) -> torch.device:
    """Where a model's weights live: its first parameter's device (the CPU for a model without any)."""
    param = next(model.parameters(), None) if hasattr(model, "parameters") else None
    return param.device if param is not None else torch.device("cpu")


def check_same_device(what: str, device: torch.device | str, expected: torch.device | str, fix: str = "") -> None:
    """Raise the course's one-line DeviceMismatchError when ``what`` (on ``device``) is not on ``expected``,
    the model's device. ``fix`` says how to put it there."""
    if not same_device(device, expected):
        advice = fix or f"move it with .to({str(torch.device(expected))!r})"
        verb = "are" if what.endswith("s") else "is"  # "the tokens are on meta", "the KeyValueCache is on cpu"
        raise DeviceMismatchError(f"{what} {verb} on {torch.device(device)} but the model is on {torch.device(expected)}: {advice}")


def check_generator(generator: torch.Generator | None, expected: torch.device | str) -> None:
    """A ``torch.Generator`` draws on its own device only: it must be on the model's."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    check_same_device(
        "the generator", generator.device, expected,
        f"make it there with torch.Generator(device={str(torch.device(expected))!r}).manual_seed(seed)",
    )


@contextlib.contextmanager
def fork_rng(device: torch.device | str | None = None) -> Iterator[None]:
    """Inside the block, random draws on the CPU and on ``device`` leave the caller's random state
    as it was afterwards (torch.random.fork_rng forks the CPU and, when asked, one device type)."""
    device = torch.device("cpu") if device is None else torch.device(device)
    if device.type == "cpu":
        with torch.random.fork_rng(devices=[]):
            yield
        return
    index = [device.index if device.index is not None else 0] if device.type == "cuda" else None
    with torch.random.fork_rng(devices=index, device_type=device.type):
        yield


def synchronize(device: torch.device | str) -> None:
    """Wait until the device has finished the work queued on it (a no-op on the CPU).

    GPU work runs asynchronously: a Python timer around a GPU call measures the time to queue
    it unless the device is synchronised first and last.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@contextlib.contextmanager
def full_fp32_precision() -> Iterator[None]:
    """Float32 matrix products in full float32 inside the block, as on a CPU.

    On NVIDIA GPUs since Ampere, torch may compute float32 matmuls with TF32 (a 10-bit
    mantissa) when allowed; an implementation compared with a reference at float32's
    tolerances must not be, or the two differ by 1e-3 where float32 agrees to 1e-6.
    Hugging Face's own test suite turns TF32 off for the same reason. The previous settings
    come back afterwards.
    """
    precision = torch.get_float32_matmul_precision()
    cudnn_tf32 = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.allow_tf32 = cudnn_tf32
