"""Every command's arguments: a bad one is one line on stderr and exit code 2, before torch or a model loads;
Ctrl-C ends any command with one line and exit code 130.

The table runs in one child process (importing the command line once), which also proves
that no rejection needed torch: the child checks ``sys.modules`` after every command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sampling_course.apps import cli
from sampling_course.reference import gpt2_local_dir, tiny_dir

REPO = Path(__file__).resolve().parents[2]

# (command line, words the one-line message must contain). The first rows are the glitches a
# new learner met: a seed that is not a number, an n-gram size without beams, GPT-2 offline,
# a token budget past the model's context, an infinite temperature, the cache's choices.
BAD_INPUTS = [
    (["generate", "--prompt", "x", "--seed", "abc"], "seed must be an integer >= 0, got 'abc'"),
    (["generate", "--prompt", "x", "--no-repeat-ngram-size", "2"], "works with beam search"),
    (["generate", "--prompt", "x", "--model", "tiny", "--max-new-tokens", "100000"], "context of 128 tokens"),
    (["generate", "--prompt", "x", "--temperature", "inf"], "temperature must be a finite number >= 0"),
    (["generate", "--prompt", "x", "--temperature", "nan"], "temperature must be a finite number >= 0"),
    (["generate", "--prompt", "x", "--cache", "paged"], "cache must be one of dynamic, static"),
    (["generate", "--prompt", "x", "--top-p", "abc"], "top_p must be in (0, 1]"),
    (["generate", "--prompt", "x", "--num-beams", "3", "--temperature", "0.5"], "beam search is deterministic"),
    (["generate", "--prompt", "x", "--threads", "0"], "--threads must be an integer >= 1"),
    (["generate", "--prompt", " "], "--prompt must not be empty"),
    (["generate"], "--prompt is required"),
    (["generate", "--bogus"], "unrecognized arguments"),
    (["generate", "--prompt", "x", "--model", "nope"], "invalid choice"),
    (["demo", "--seed", "abc"], "--seed must be an integer >= 0, got 'abc'"),
    (["demo", "--max-tokens", "0"], "--max-tokens must be an integer >= 1"),
    (["demo", "--reference", "story", "--max-tokens", "100000"], "context of 512 tokens"),
    (["demo", "--reference", "nope"], "invalid choice"),
    (["demo", "--prompt", ""], "--prompt must not be empty"),
    (["demo", "--threads", "two"], "--threads must be an integer >= 1"),
    (["check", "NoSuchExercise"], "there is no exercise called 'NoSuchExercise'"),
    (["check", "--impl", "nope"], "invalid choice"),
    (["check", "LayerNorm", "--threads", "0"], "--threads must be an integer >= 1"),
    (["progress", "--impl", "nope"], "invalid choice"),
    (["progress", "LayerNorm"], "unrecognized arguments"),
    (["hint", "NoSuchExercise"], "there is no exercise called"),
    (["hint", "LayerNorm", "--level", "5"], "--level must be an integer from 1 to 3"),
    (["hint"], "name an exercise"),
    (["make-exercises", "--solutions", "/no/such/folder"], "--solutions must be an existing folder"),
    (["make-exercises", "--force", "--check"], "choose one"),
    (["plant-mistakes", "--part", "12"], "--part must be an integer from 1 to"),
    (["plant-mistakes", "--jobs", "0"], "--jobs must be an integer >= 1"),
    (["bench", "--new-tokens", "0"], "--new-tokens must be an integer >= 1"),
    (["bench", "--budget", "-5"], "--budget must be a finite number > 0"),
    (["bench", "--prompt-tokens", "1000", "--new-tokens", "100"], "1024 positions"),
    (["bench-speculative", "--gammas", "0-3"], "--gammas must look like 1-8 or 1,2,4"),
    (["bench-speculative", "--temperature", "inf"], "--temperature must be a finite number >= 0"),
    (["long-text", "--model", "story", "--window", "1000"], "window must be an integer in [2, n_ctx=512]"),
    (["long-text", "--texts", "0"], "--texts must be an integer >= 1"),
    (["bench-structured", "--repeats", "0"], "--repeats must be an integer >= 1"),
    (["bench-structured", "--impl", "mine"], "invalid choice"),
    (["release"], "the following arguments are required: out"),
    (["grade", "/no/such/submissions", "--out", "report"], "no submissions at"),
    (["grade", ".", "--out", "report", "--jobs", "0"], "--jobs must be an integer >= 1"),
    (["autograder", "out.zip", "--config", "/no/such.toml"], "--config must be an existing TOML file"),
    (["download-gpt2", "extra"], "unrecognized arguments"),
    (["no-such-command"], "unknown command 'no-such-command'"),
]
if gpt2_local_dir() is None:  # offline: asking for GPT-2 says which flag works without it
    BAD_INPUTS += [
        (["generate", "--prompt", "x", "--model", "gpt2"], "--model story works offline"),
        (["demo", "--reference", "gpt2"], "--reference story works offline"),
    ]

CHILD = textwrap.dedent("""
    import contextlib, io, json, sys
    from sampling_course.apps.cli import main
    results = []
    for argv in json.loads(sys.argv[1]):
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)
        results.append([code, err.getvalue(), out.getvalue(), "torch" in sys.modules])
    print(json.dumps(results))
""")


def test_every_command_rejects_bad_input_in_one_line_before_loading_torch():
    tiny_dir()  # the stand-in's cache, built here once: building it is not what is tested
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    argvs = [argv for argv, _ in BAD_INPUTS]
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(argvs)], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    problems = []
    for (argv, words), (code, err, out, torch_loaded) in zip(BAD_INPUTS, results):
        lines = [line for line in err.splitlines() if line.strip()]
        if code != 2 or len(lines) != 1 or words not in lines[0] or out.strip() or torch_loaded:
            problems.append(f"{' '.join(argv)}: exit {code}, torch loaded: {torch_loaded}, stderr {err!r}, stdout {out!r}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_ctrl_c_ends_every_command_in_one_line(command, monkeypatch, capsys):
    """Wherever Ctrl-C lands, even while the command's module loads, the command ends with one line and 130."""

    def interrupted(name):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.importlib, "import_module", interrupted)
    assert cli.main([command]) == 130
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.strip()] == [f"sampling-course {command}: interrupted"]


@pytest.mark.parametrize("command", ["bench", "demo"])
def test_ctrl_c_whose_cleanup_fails_still_ends_in_one_line(command, monkeypatch, capsys):
    """Ctrl-C inside an import (torch's, in a command's first seconds) can make the cleanup that runs
    next fail on the half-imported module; that error replaces the KeyboardInterrupt. It is still
    an interruption: one line and 130, not a traceback and 1."""

    def interrupted_then_broken(name):
        try:
            raise KeyboardInterrupt
        finally:
            raise AttributeError("partially initialized module 'torch' has no attribute 'set_num_threads'")

    monkeypatch.setattr(cli.importlib, "import_module", interrupted_then_broken)
    assert cli.main([command]) == 130
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.strip()] == [f"sampling-course {command}: interrupted"]


def test_an_error_of_its_own_is_not_taken_for_ctrl_c(monkeypatch):
    """Only an error raised while a KeyboardInterrupt was handled counts as one: others still raise."""

    def broken(name):
        raise AttributeError("a bug")

    monkeypatch.setattr(cli.importlib, "import_module", broken)
    with pytest.raises(AttributeError, match="a bug"):
        cli.main(["bench"])


@pytest.mark.slow
def test_ctrl_c_during_the_demo():
    """A real Ctrl-C (SIGINT) while the demo runs: one line, exit code 130, no traceback."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    # Python leaves Ctrl-C ignored when it starts ignored, as it does for a shell's background
    # job (CI runs this beside the notebooks): the child takes it as a terminal's process would.
    proc = subprocess.Popen([sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                             "from sampling_course.apps.cli import main; sys.exit(main(['demo', '--reference', 'story']))"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        for line in proc.stdout:  # wait until it is at work
            if line.startswith("Reference:"):
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and [line for line in err.splitlines() if line.strip()][-1:] == [
        "sampling-course demo: interrupted"], err


def test_a_report_printed_to_a_log_keeps_one_line_per_table_row(monkeypatch, capsys):
    """Without a terminal, rich would fold a bench's table to 80 columns; a log gets LOG_WIDTH, or $COLUMNS when set."""
    from rich.table import Table

    from sampling_course.apps.options import LOG_WIDTH, report_console

    table = Table("method", "tokens/s", "vs Hugging Face eager", "vs Hugging Face compiled", "of the bandwidth limit", "tokens")
    table.add_row("static cache, eager", "2,357", "1.68x", "0.63x", "3%", "same as Hugging Face eager")
    monkeypatch.delenv("COLUMNS", raising=False)
    console = report_console()  # pytest's captured stdout is not a terminal
    assert console.width == LOG_WIDTH
    console.print(table)
    row = [line for line in capsys.readouterr().out.splitlines() if "static cache" in line]
    assert len(row) == 1 and "same as Hugging Face eager" in row[0], "the row was folded over several lines"
    monkeypatch.setenv("COLUMNS", "100")
    assert report_console().width == 100
