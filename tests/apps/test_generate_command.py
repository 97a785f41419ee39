"""The ``sampling-course generate`` command, run on the stand-in "tiny" model.

In-process for its modes (piped, streamed on a terminal, beam search, the static cache,
the REPL), plus a real subprocess (the REPL reading real stdin); bad flags are in
tests/apps/test_command_line.py with every other command's. The
expected text is what the solutions' ``generate`` (or ``beam_search``) returns for the same
prompt and settings: the command must print exactly that, once.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from sampling_course.implementation import load_demo

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cli():
    from sampling_course.apps import generate as cli_module

    return cli_module


def run_cli(cli, argv, monkeypatch, capsys, tty: bool = False, stdin: str | None = None):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: tty, raising=False)
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def expected_text(prompt: str, new: int, **settings) -> str:
    from sampling_course.reference import load_reference
    from solutions import transformer
    from solutions.generate import generate

    ref = load_reference("tiny")
    out = generate(load_demo(ref, transformer), ref.tokenizer, [prompt], new, **settings)
    return ref.tokenizer.decode(out[0], skip_special_tokens=True)


def test_cli_piped_prints_the_text_once(cli, monkeypatch, capsys):
    """Piped, `sampling-course generate` prints the prompt and its continuation once, as generate() makes it."""
    argv = ["--model", "tiny", "--impl", "solutions", "--prompt", "The cat", "--max-new-tokens", "12", "--seed", "3",
            "--temperature", "0.8", "--top-p", "0.9", "--stop", "zzz"]
    code, out, err = run_cli(cli, argv, monkeypatch, capsys)
    assert code == 0, err
    assert out == expected_text("The cat", 12, seed=3, temperature=0.8, top_p=0.9, stop_strings=["zzz"]) + "\n"


def test_cli_streams_on_a_terminal(cli, monkeypatch, capsys):
    """On a terminal the same text arrives in several writes (streamed), ending with a newline."""
    writes = []
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    real_write = sys.stdout.write
    monkeypatch.setattr(sys.stdout, "write", lambda s: (writes.append(s), real_write(s))[1], raising=False)
    code = cli.main(["--model", "tiny", "--prompt", "Once upon", "--max-new-tokens", "20", "--temperature", "0"])
    out = capsys.readouterr().out
    assert code == 0
    assert out == expected_text("Once upon", 20, temperature=0.0) + "\n"
    assert len([w for w in writes if w]) >= 3, f"expected streamed writes, got {writes}"


def test_cli_beam_search(cli, monkeypatch, capsys):
    """--num-beams runs part 3's beam search and prints its best continuation."""
    from sampling_course.reference import load_reference
    from solutions import sampling, transformer

    ref = load_reference("tiny")
    sampler = sampling.TransformerSampler(load_demo(ref, transformer), ref.tokenizer)
    [(_, best)] = sampler.beam_search("The cat", 1, 3, 6, no_repeat_ngram_size=2)
    code, out, err = run_cli(cli, ["--model", "tiny", "--prompt", "The cat", "--max-new-tokens", "6", "--num-beams", "3",
                                   "--no-repeat-ngram-size", "2"], monkeypatch, capsys)
    assert code == 0, err
    assert out == best + "\n"


def test_cli_static_cache_gives_the_same_text(cli, monkeypatch, capsys):
    """--cache static (part 6's fast path) prints what the default cache does, sampling and beam search alike."""
    sampling = ["--model", "tiny", "--prompt", "The cat", "--max-new-tokens", "12", "--seed", "5", "--top-k", "20"]
    beams = ["--model", "tiny", "--prompt", "The cat", "--max-new-tokens", "6", "--num-beams", "3"]
    for argv in (sampling, beams):
        code, expected, err = run_cli(cli, argv, monkeypatch, capsys)
        assert code == 0, err
        code, out, err = run_cli(cli, argv + ["--cache", "static"], monkeypatch, capsys)
        assert code == 0, err
        assert out == expected
    code, _, err = run_cli(cli, sampling + ["--cache", "paged"], monkeypatch, capsys)
    assert code == 2 and "cache must be one of dynamic, static" in err


def test_cli_repl_settings_and_ctrl_c(cli, monkeypatch, capsys):
    """In the REPL, /set changes a setting (and rejects a bad one), /show shows it, Ctrl-C during a generation stops
    that generation only, and the next prompt still runs; end of input leaves with status 0."""
    real_generate = cli.load_engine

    calls = []

    def engine_that_is_interrupted_once(*args, **kwargs):
        engine = real_generate(*args, **kwargs)
        original = engine.generate

        def generate(*a, **k):
            calls.append(k)
            if len(calls) == 1:
                raise KeyboardInterrupt
            return original(*a, **k)

        engine.generate = generate
        return engine

    monkeypatch.setattr(cli, "load_engine", engine_that_is_interrupted_once)
    stdin = "/set temperature 0\n/set top_p 7\n/set colour blue\n/show\nfirst prompt\nThe cat\n/help\n"
    code, out, err = run_cli(cli, ["--model", "tiny", "--interactive", "--max-new-tokens", "8"], monkeypatch, capsys, stdin=stdin)
    assert code == 0, err
    assert "temperature = 0" in out and "top_p must be in (0, 1]" in out and "unknown setting 'colour'" in out
    assert "stopped" in out
    assert expected_text("The cat", 8, temperature=0.0) in out
    assert "/quit" in out  # from /help
    assert len(calls) == 2 and calls[1]["settings"].temperature == 0.0


CLI = [sys.executable, "-c", "import sys; from sampling_course.apps.cli import main; sys.exit(main())", "generate"]


@pytest.mark.slow
def test_cli_repl_reads_stdin():
    """The REPL in a real process: prompts and commands from stdin, /quit leaves with status 0."""
    stdin = "/set temperature 0\n/show\nThe cat\n/quit\nnever reached\n"
    proc = subprocess.run(CLI + ["--model", "tiny", "--interactive", "--max-new-tokens", "6"], input=stdin,
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "temperature = 0" in proc.stdout
    assert expected_text("The cat", 6, temperature=0.0) in proc.stdout
    assert "never reached" not in proc.stdout


def test_cli_takes_the_newer_settings(cli, monkeypatch, capsys):
    """Every newer setting has a flag (HF's, vLLM's or llama.cpp's name), and the piped text is what generate()
    makes with those settings."""
    argv = ["--model", "tiny", "--prompt", "The cat", "--max-new-tokens", "10", "--seed", "4",
            "--temperature", "0.9", "--typical-p", "0.95", "--epsilon-cutoff", "0.0001", "--eta-cutoff", "0.0005",
            "--top-n-sigma", "3", "--xtc-probability", "0.5", "--xtc-threshold", "0.05",
            "--samplers", "top_n_sigma;top_k;typical_p;top_p;min_p;xtc;epsilon_cutoff;eta_cutoff;temperature",
            "--dry-multiplier", "0.8", "--dry-base", "1.5", "--dry-allowed-length", "2", "--dry-penalty-last-n", "32",
            "--logit-bias", "5:2.5", "--logit-bias", "17:-3", "--bad-words", "The", "--min-new-tokens", "4",
            "--num-return-sequences", "2"]
    code, out, err = run_cli(cli, argv, monkeypatch, capsys)
    assert code == 0, err
    from sampling_course.reference import load_reference
    from solutions import transformer
    from solutions.generate import generate

    ref = load_reference("tiny")
    settings = dict(seed=4, temperature=0.9, typical_p=0.95, epsilon_cutoff=0.0001, eta_cutoff=0.0005, top_n_sigma=3.0,
                    xtc_probability=0.5, xtc_threshold=0.05,
                    samplers="top_n_sigma;top_k;typical_p;top_p;min_p;xtc;epsilon_cutoff;eta_cutoff;temperature",
                    dry_multiplier=0.8, dry_base=1.5, dry_allowed_length=2, dry_penalty_last_n=32,
                    logit_bias={5: 2.5, 17: -3.0}, bad_words_ids=[ref.tokenizer.encode("The"), ref.tokenizer.encode(" The")],
                    min_new_tokens=4, num_return_sequences=2)
    rows = generate(load_demo(ref, transformer), ref.tokenizer, ["The cat"], 10, **settings)
    assert out == "".join(ref.tokenizer.decode(row, skip_special_tokens=True) + "\n" for row in rows)
    argv = ["--model", "tiny", "--prompt", "The cat", "--max-new-tokens", "6", "--mirostat", "2", "--mirostat-tau",
            "4", "--mirostat-eta", "0.2", "--seed", "1"]
    code, out, err = run_cli(cli, argv, monkeypatch, capsys)
    assert code == 0, err
    assert out == expected_text("The cat", 6, seed=1, mirostat=2, mirostat_tau=4.0, mirostat_eta=0.2) + "\n"


def test_cli_beam_search_with_length_penalty(cli, monkeypatch, capsys):
    """--length-penalty and --early-stopping go to part 3's beam search (Hugging Face's algorithm)."""
    from sampling_course.reference import load_reference
    from solutions import sampling, transformer

    ref = load_reference("tiny")
    sampler = sampling.TransformerSampler(load_demo(ref, transformer), ref.tokenizer)
    [(_, best)] = sampler.beam_search("The cat", 1, 3, 6, length_penalty=2.0, early_stopping="never")
    code, out, err = run_cli(cli, ["--model", "tiny", "--prompt", "The cat", "--max-new-tokens", "6", "--num-beams", "3",
                                   "--length-penalty", "2", "--early-stopping", "never"], monkeypatch, capsys)
    assert code == 0, err
    assert out == best + "\n"


def test_cli_says_whose_code_it_runs(cli, monkeypatch, capsys):
    """Without --impl the course's solutions run, and the command says so (on stderr: piped text stays clean)."""
    monkeypatch.delenv("SAMPLING_COURSE_IMPL", raising=False)
    argv = ["--model", "tiny", "--prompt", "The cat", "--max-new-tokens", "3", "--temperature", "0"]
    code, out, err = run_cli(cli, argv, monkeypatch, capsys)
    assert code == 0, err
    assert "running the course's solutions (solutions/); --impl exercises runs your code" in err
    assert "solutions" not in out


def test_cli_logprobs_prints_each_tokens_logprob_and_the_top_tokens(cli, monkeypatch, capsys):
    """--logprobs 2: after the text, one line per new token with its log-probability under the model and the
    model's two most likely tokens, as generate(logprobs=2) reports them (the model's own log_softmax, here)."""
    import torch

    from sampling_course.reference import load_reference
    from solutions import transformer

    argv = ["--model", "tiny", "--impl", "solutions", "--prompt", "The cat", "--max-new-tokens", "4", "--seed", "5",
            "--top-k", "5", "--logprobs", "2"]
    code, out, err = run_cli(cli, argv, monkeypatch, capsys)
    assert code == 0, err
    ref = load_reference("tiny")
    model = load_demo(ref, transformer)
    text, *rows = out.rstrip("\n").split("\n")
    assert text == expected_text("The cat", 4, seed=5, top_k=5)
    ids = ref.tokenizer.encode(text)
    n_prompt = len(ref.tokenizer.encode("The cat"))
    with torch.no_grad():
        logprobs = model(torch.tensor([ids])).log_softmax(dim=-1)[0]
    assert len(rows) == len(ids) - n_prompt
    for step, row in enumerate(rows):
        position = n_prompt + step - 1
        token = ids[position + 1]
        best = logprobs[position].topk(2)
        expected = (f"  {ref.tokenizer.decode([token])!r} {float(logprobs[position, token]):.3f}   top: "
                    + ", ".join(f"{ref.tokenizer.decode([int(t)])!r} {float(v):.3f}" for t, v in zip(best.indices, best.values)))
        assert row == expected
