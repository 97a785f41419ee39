"""Where the tensors of a grading session are made: ``pytest --device cuda`` grades on a GPU.

``DeviceSession`` puts every tensor a test makes without naming a device on the session's device;
``on_the_cpu`` undoes that for a block (tests whose oracle runs on the CPU only). The pytest
plugin (``sampling_course.grading.pytest_plugin``) enters the session and offers ``on_the_cpu`` as
the ``cpu_session`` fixture.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cache

import torch

from sampling_course.devices import use_device

__all__ = ["DeviceSession", "device_constructors", "on_the_cpu"]


class DeviceSession(torch.overrides.TorchFunctionMode):
    """Every tensor a test makes without naming a device is made on the session's device.

    Tests build their inputs with plain ``torch.tensor``, ``torch.randn`` and friends, as
    they would on a CPU. A draw from an explicit ``torch.Generator`` on another device (the
    tests' seeded CPU generators) is made where the generator is and then moved, so every
    device grades on the same numbers.
    """

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if kwargs.get("device") is None and func in device_constructors():
            generator = kwargs.get("generator")
            if isinstance(generator, torch.Generator) and generator.device != self.device:
                return func(*args, **{**kwargs, "device": generator.device}).to(self.device)
            kwargs["device"] = self.device
        return func(*args, **kwargs)


@cache
def device_constructors() -> frozenset:
    """The torch functions that make a tensor on a device (those ``DeviceSession`` places)."""
    from torch.utils._device import _device_constructors

    return frozenset(_device_constructors())


@contextlib.contextmanager
def on_the_cpu() -> Iterator[None]:
    """Within the block, a session on another device is back on the CPU: tensors made without a
    device, loaders left to their default and torch's default device are the CPU's.

    For tests whose oracle runs on the CPU only (part 9's Hugging Face Llama, for one); outside a
    session on another device it changes nothing."""
    with use_device("cpu"), DeviceSession(torch.device("cpu")), torch.device("cpu"):
        yield
