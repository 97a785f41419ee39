"""The `sampling-course` command: one entry point for learners and instructors.

Every command checks its arguments before loading anything heavy and ends the same way
(exit codes and one-line errors: ``sampling_course.apps.options``).
"""

from __future__ import annotations

import importlib
import sys


def download_gpt2_main(argv: list[str]) -> int:
    """`sampling-course download-gpt2`: fetch GPT-2 small into the local Hugging Face cache."""
    from sampling_course.apps.options import OneLineParser, parse
    from sampling_course.reference import ReferenceUnavailable, download_gpt2

    parser = OneLineParser(prog="sampling-course download-gpt2",
                           description="Download GPT-2 small into the local Hugging Face cache (needs internet).")
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    try:
        print(f"GPT-2 small is in {download_gpt2()}")
    except ReferenceUnavailable as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


# command -> ("module:function" taking argv and returning an exit code, one-line description).
# Imported only when the command runs, so `sampling-course hint` does not load torch.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("sampling_course.apps.demo:main", "run the decoders (the solutions, or your code in the student release) next to the reference model"),
    "check": ("sampling_course.apps.course_commands:check_main", "check one exercise (or all) in exercises/"),
    "progress": ("sampling_course.apps.course_commands:progress_main", "list every exercise with done / not yet / failing"),
    "watch": ("sampling_course.apps.watch:watch_main", "check an exercise again each time you save its file (Ctrl-C stops)"),
    "hint": ("sampling_course.apps.course_commands:hint_main", "print a graded hint for an exercise"),
    "make-exercises": ("sampling_course.apps.course_commands:make_exercises_main", "regenerate exercises/ from solutions/ (instructors)"),
    "start-at": ("sampling_course.apps.course_commands:start_at_main", "start at part N: the course's code for every earlier exercise, yours kept"),
    "plant-mistakes": ("sampling_course.apps.course_commands:plant_mistakes_main", "check that the tests catch each classic mistake (instructors)"),
    "generate": ("sampling_course.apps.generate:main", "continue a prompt with the part-5 engine; --interactive for a REPL"),
    "bench": ("sampling_course.apps.bench:main", "time cached and uncached decoding against Hugging Face generate"),
    "bench-speculative": ("sampling_course.apps.bench_speculative:main", "measure speculative decoding for gamma 1-8 against the theory and HF"),
    "bench-structured": ("sampling_course.apps.bench_structured:main", "race part 8's constrained decoding against outlines-core and xgrammar"),
    "bench-serving": ("sampling_course.apps.bench_serving:main", "serve a request stream: part 10's server, part 5's static batches, HF continuous batching"),
    "bench-quant": ("sampling_course.apps.bench_quant:main", "quantised weights: quality against the entropy floor, memory, speed, torchao and quanto"),
    "long-text": ("sampling_course.apps.long_text:main", "the long-text experiment: full attention, sliding window, window and sink caches past n_ctx"),
    "release": ("sampling_course.apps.classroom:release_main", "write the student copy: no solutions, no hidden tests (instructors)"),
    "grade": ("sampling_course.apps.classroom:grade_main", "grade a class's submissions, each in a confined process (instructors)"),
    "autograder": ("sampling_course.apps.classroom:autograder_main", "write a Gradescope autograder bundle (instructors)"),
    "download-gpt2": ("sampling_course.apps.cli:download_gpt2_main", "fetch GPT-2 small into the local Hugging Face cache (needs internet)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: sampling-course <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    lines += ["", "Run `sampling-course <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from sampling_course.apps.options import EXIT_USAGE, run_command

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else EXIT_USAGE
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"sampling-course: error: unknown command {command!r}; the commands are {', '.join(COMMANDS)} "
              "(see sampling-course --help)", file=sys.stderr)
        return EXIT_USAGE
    module, function = COMMANDS[command][0].split(":")
    # Importing the command's module is inside, so that Ctrl-C during it also ends in one line.
    return run_command(f"sampling-course {command}", lambda: getattr(importlib.import_module(module), function)(rest))


if __name__ == "__main__":
    raise SystemExit(main())
