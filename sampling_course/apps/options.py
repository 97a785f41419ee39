"""What every ``sampling-course`` command shares: its options, how it checks them, how it ends.

Each option is defined once here (``add_threads_option``, ``add_impl_option``,
``add_device_option``, ...) and each command adds the ones it takes. Every argument is checked while it is parsed, before
torch or a model loads, and a bad one is one line on stderr::

    sampling-course generate: error: argument --seed: seed must be an integer, got 'abc' (see --help)

Exit codes, the same for every command:

* 0: all is well;
* 1: something checked is not (a failing exercise, a missed target, a stale ``exercises/``);
* 2: a bad argument (one line, before anything heavy loads);
* 3: the course's own files are broken (one line naming the file: reinstall the course);
* 130: interrupted with Ctrl-C (one line).
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch loads with the command's work, not with its --help
    import torch
    from rich.console import Console

EXIT_OK, EXIT_NOT_OK, EXIT_USAGE, EXIT_BROKEN, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class UsageError(ValueError):
    """An argument that cannot work, found after parsing (for instance, more tokens than the model's n_ctx)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (and exit status 2)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    """``parser.parse_args(argv)``, or the exit code when it printed --help (0) or a usage error (2)."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


# ---------------------------------------------------------------------------------------
# Argument types: each names the setting and says what is allowed
# ---------------------------------------------------------------------------------------


def _type(check: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from a function that raises ValueError with the whole message."""

    def convert(text: str):
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(check, "__name__", "value")
    return convert


def integer_check(name: str, low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """A parser from text to an int in [low, high], raising ValueError("<name> must be ...")."""
    allowed = ("an integer" + (f" >= {low}" if low is not None and high is None else "")
               + (f" from {low} to {high}" if low is not None and high is not None else "")
               + (f" <= {high}" if high is not None and low is None else ""))

    def parse_integer(text: str) -> int:
        try:
            value = int(str(text).strip())
        except ValueError:
            raise ValueError(f"{name} must be {allowed}, got {text!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(f"{name} must be {allowed}, got {text!r}")
        return value

    return parse_integer


def number_check(name: str, low: float | None = None, low_open: bool = False,
                 high: float | None = None) -> Callable[[str], float]:
    """A parser from text to a finite float (above ``low``, at most ``high``), raising ValueError("<name> must be ...")."""
    bounds = []
    if low is not None:
        bounds.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        bounds.append(f"<= {high:g}")
    allowed = "a finite number" + (" " + " and ".join(bounds) if bounds else "")

    def parse_number(text: str) -> float:
        try:
            value = float(str(text).strip())
        except ValueError:
            raise ValueError(f"{name} must be {allowed}, got {text!r}") from None
        too_low = low is not None and (value <= low if low_open else value < low)
        if not math.isfinite(value) or too_low or (high is not None and value > high):
            raise ValueError(f"{name} must be {allowed}, got {text!r}")
        return value

    return parse_number


def integer(name: str, low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An argparse type for an int in [low, high] (see ``integer_check``)."""
    return _type(integer_check(name, low, high))


def number(name: str, low: float | None = None, low_open: bool = False, high: float | None = None) -> Callable[[str], float]:
    """An argparse type for a finite float (see ``number_check``)."""
    return _type(number_check(name, low, low_open, high))


def nonempty(name: str) -> Callable[[str], str]:
    def parse_text(text: str) -> str:
        if not text.strip():
            raise ValueError(f"{name} must not be empty")
        return text

    return _type(parse_text)


# ---------------------------------------------------------------------------------------
# Options shared by several commands
# ---------------------------------------------------------------------------------------


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """``--threads N``: torch threads (default: the course's policy, ``sampling_course.apps.threads``)."""
    parser.add_argument(
        "--threads", type=integer("--threads", 1), default=None, metavar="N",
        help="torch threads (default: one for the course's small models, else one per core that other "
        "processes leave free; $OMP_NUM_THREADS also sets it)",
    )


def add_impl_option(parser: argparse.ArgumentParser, default: str | None = "solutions", what: str = "whose code runs") -> None:
    """``--impl solutions|exercises``; a default of solutions where they cannot be imported (the student
    release) is the learner's exercises."""
    from sampling_course.implementation import has_solutions

    if default == "solutions" and not has_solutions():
        default = "exercises"
    parser.add_argument(
        "--impl", choices=["solutions", "exercises"], default=default,
        help=f"{what}: solutions or exercises (default: {default or 'exercises'}; also $SAMPLING_COURSE_IMPL)",
    )


DEVICE_HELP = (
    "where the models compute: auto (the default: $SAMPLING_COURSE_DEVICE, else an NVIDIA GPU, "
    "else an Apple GPU, else the CPU), cpu, cuda (or cuda:N) or mps"
)


def add_device_option(parser: argparse.ArgumentParser, default: str = "auto", help: str = DEVICE_HELP) -> None:
    """Add ``--device`` to ``parser`` (checked later, by ``device_from``)."""
    parser.add_argument("--device", default=default, metavar="auto|cpu|cuda|mps", help=help)


def device_from(parser: argparse.ArgumentParser, args: argparse.Namespace) -> "torch.device":
    """The device ``args.device`` names, by the course's rule (``sampling_course.devices.pick_device``);
    exits with status 2 and one line on stderr when it is no device or this machine does not have it."""
    from sampling_course.devices import pick_device

    try:
        return pick_device(args.device)
    except (ValueError, TypeError) as exc:
        parser.exit(EXIT_USAGE, f"{parser.prog}: error: --device {args.device}: {exc}\n")


# ---------------------------------------------------------------------------------------
# How a command ends
# ---------------------------------------------------------------------------------------


def run_command(prog: str, main: Callable[[], int]) -> int:
    """``main()``, with the endings every command shares: Ctrl-C (130), a bad argument found late (2),
    the course's own files broken (3), each as one line on stderr."""
    from sampling_course.files import BrokenCourseFile

    try:
        return main()
    except SystemExit as exc:  # argparse's --help (0) and usage errors (2), already printed
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(f"{prog}: error: {exc.code}", file=sys.stderr, flush=True)  # SystemExit("message"): one line, 1
        return EXIT_NOT_OK
    except KeyboardInterrupt:
        return _interrupted(prog)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except BrokenCourseFile as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_BROKEN
    except Exception as exc:
        # Ctrl-C in the first seconds can land inside an import (torch's, say); the cleanup that
        # runs next then fails on the half-imported module, and that error replaces the
        # KeyboardInterrupt. It is still an interruption, not a crash.
        if raised_while_interrupted(exc):
            return _interrupted(prog)
        raise


def raised_while_interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while a KeyboardInterrupt was being handled (or was caused by one)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, KeyboardInterrupt):
            return True
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return False


def _interrupted(prog: str) -> int:
    # On a terminal ^C was echoed without a newline: end that line first.
    print(f"{chr(10) if sys.stderr.isatty() else ''}{prog}: interrupted", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


def command(prog: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Decorate a command's ``main(argv)`` with ``run_command``'s endings (also when called directly, as in tests)."""

    def wrap(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def run(argv: Sequence[str] | None = None) -> int:
            return run_command(prog, lambda: main(argv))

        return run

    return wrap


# Wide enough for the benches' tables; rich folds a table to fit 80 columns when no terminal says otherwise.
LOG_WIDTH = 200


def report_console() -> "Console":
    """The console a command prints its tables to: the terminal's width in a terminal, else (the
    output is a file or a pipe, as in a log) ``$COLUMNS`` when set, else ``LOG_WIDTH`` columns,
    so that a saved table keeps one line per row instead of words folded inside its cells."""
    import os

    from rich.console import Console

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=LOG_WIDTH)
