"""Command-line options that several commands share, defined once.

``add_device_option(parser)`` gives a command ``--device auto|cpu|cuda|mps`` (``cuda:N``
too); ``device_from(parser, args)`` turns it into a ``torch.device`` by the course's rule
(``sampling_course.devices.pick_device``) before anything heavy is loaded, and a device
this machine lacks ends the command with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads with the command's work, not with its --help
    import torch

DEVICE_HELP = (
    "where the models compute: auto (the default: $SAMPLING_COURSE_DEVICE, else an NVIDIA GPU, "
    "else an Apple GPU, else the CPU), cpu, cuda (or cuda:N) or mps"
)


def add_device_option(parser: argparse.ArgumentParser, default: str = "auto", help: str = DEVICE_HELP) -> None:
    """Add ``--device`` to ``parser`` (checked later, by ``device_from``)."""
    parser.add_argument("--device", default=default, metavar="auto|cpu|cuda|mps", help=help)


def device_from(parser: argparse.ArgumentParser, args: argparse.Namespace) -> "torch.device":
    """The device ``args.device`` names, by the course's rule; exits with status 2 and one line
    on stderr when it is no device or this machine does not have it."""
    from sampling_course.devices import pick_device

    try:
        return pick_device(args.device)
    except (ValueError, TypeError) as exc:
        parser.exit(2, f"{parser.prog}: error: --device {args.device}: {exc}\n")
