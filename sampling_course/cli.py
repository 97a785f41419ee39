"""The `sampling-course` command: one entry point for learners and instructors."""

from __future__ import annotations

import sys
from collections.abc import Callable


def _demo(argv: list[str]) -> int:
    from sampling_course.demo import main

    return main(argv)


def _make_exercises(argv: list[str]) -> int:
    from sampling_course.stubs import main

    return main(argv)


def _check(argv: list[str]) -> int:
    from sampling_course.checking import cli_check

    return cli_check(argv)


def _progress(argv: list[str]) -> int:
    from sampling_course.checking import cli_progress

    return cli_progress(argv)


def _hint(argv: list[str]) -> int:
    from sampling_course.checking import cli_hint

    return cli_hint(argv)


def _bench(argv: list[str]) -> int:
    from sampling_course.bench import main

    return main(argv)


def _plant_mistakes(argv: list[str]) -> int:
    from sampling_course.mistakes import main

    return main(argv)


def _download_gpt2(argv: list[str]) -> int:
    from sampling_course.reference import ReferenceUnavailable, download_gpt2

    if argv:
        print("usage: sampling-course download-gpt2", file=sys.stderr)
        return 2
    try:
        print(f"GPT-2 small is in {download_gpt2()}")
    except ReferenceUnavailable as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "demo": (_demo, "run the finished solutions next to the reference model"),
    "check": (_check, "check one exercise (or all) in exercises/"),
    "progress": (_progress, "list every exercise with done / not yet / failing"),
    "hint": (_hint, "print a graded hint for an exercise"),
    "make-exercises": (_make_exercises, "regenerate exercises/ from solutions/ (instructors)"),
    "plant-mistakes": (_plant_mistakes, "check that the tests catch each classic mistake (instructors)"),
    "bench": (_bench, "time cached and uncached decoding against Hugging Face generate"),
    "download-gpt2": (_download_gpt2, "fetch GPT-2 small into the local Hugging Face cache (needs internet)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: sampling-course <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    lines += ["", "Run `sampling-course <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"sampling-course: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return COMMANDS[command][0](rest)


if __name__ == "__main__":
    raise SystemExit(main())
