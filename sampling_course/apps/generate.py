"""`sampling-course generate`: the generation engine of part 5 on the command line.

    sampling-course generate --prompt "Once upon a time" --temperature 0.8 --top-p 0.9
    sampling-course generate --prompt "The cat" --num-beams 4 --no-repeat-ngram-size 2
    sampling-course generate --prompt "Once" --min-p 0.05 --dry-multiplier 0.8 --xtc-probability 0.5
    sampling-course generate --prompt "Once" --samplers "top_k;top_p;min_p;temperature"   # llama.cpp's order
    sampling-course generate --interactive            # a prompt per line; /help for commands
    sampling-course generate --cache static ...       # part 6's static cache: the fast path
    sampling-course generate --impl exercises ...     # run your own code from exercises/

On a terminal the text is printed as it is generated; piped into a file or another
program it is printed once, at the end (and beam search shows no progress bar). In the REPL (``--interactive``) every line is a
prompt, ``/set temperature 0.7`` changes a setting, ``/show`` lists them, Ctrl-C stops the
current generation (not the program), and Ctrl-D or ``/quit`` leave.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sampling_course.apps.options import command as cli_command
from sampling_course.apps.options import (
    OneLineParser,
    UsageError,
    add_device_option,
    add_threads_option,
    integer_check,
    number_check,
)
from sampling_course.llama_reference import LLAMA_STORY_MODELS
from sampling_course.sampling_settings import SamplerSettings, check_setting, describe

MODELS = ("auto", "story", "gpt2", "tiny", "story-llama", "story-llama-sink")
IMPLS = ("solutions", "exercises")
WHOSE = {"solutions": "the course's solutions (solutions/); --impl exercises runs your code",
         "exercises": "your code (exercises/)"}


# ---------------------------------------------------------------------------------------
# Settings: one parser per setting, shared by the flags and the REPL's /set
# ---------------------------------------------------------------------------------------


def _number(kind: type, name: str, low: float | None = None, low_open: bool = False):
    """A parser from text to ``kind`` that raises ValueError("<name> must be ...") when out of range (or not finite)."""
    if kind is int:
        return integer_check(name, None if low is None else int(low))
    return number_check(name, low, low_open)


def _sampler_setting(name: str, kind: type):
    """A parser for the sampler setting ``name``, judged by the check ``SamplerSettings`` declares for it, so the
    command refuses what part 5's ``generate`` and part 7's ``speculative_generate`` refuse, saying the same."""

    def parse(text: str):
        try:
            value = kind(text)
        except (TypeError, ValueError):
            value = text  # not a number at all: the check says what is allowed
        check_setting(name, value)
        return value

    return parse


def _choice(name: str, options: tuple[str, ...]) -> Callable[[str], str]:
    """A parser that accepts one of ``options`` and raises ValueError("<name> must be one of ...") otherwise."""

    def parse(text: str) -> str:
        if text not in options:
            raise ValueError(f"{name} must be one of {', '.join(options)}, got {text!r}")
        return text

    return parse


def _optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse``, or None for "none"/"off"."""
    return lambda text: None if str(text).lower() in ("none", "off") else parse(text)


def _early_stopping(text: str) -> bool | str:
    """Hugging Face's early_stopping: true, false or never."""
    value = {"true": True, "false": False, "never": "never"}.get(str(text).lower())
    if value is None:
        raise ValueError(f"early_stopping must be true, false or never, got {text!r}")
    return value


def _samplers(text: str) -> str:
    """The chain's order, llama.cpp's way: step names separated by ';' (checked when generation starts)."""
    names = [name for name in str(text).replace(",", ";").split(";") if name.strip()]
    if not names:
        raise ValueError(f"samplers must be step names separated by ';', such as top_k;top_p;temperature, got {text!r}")
    return ";".join(name.strip() for name in names)


def _logit_bias(text: str) -> dict[int, float]:
    """TOKEN:BIAS pairs separated by commas or spaces, e.g. "5:2.5,17:-3"."""
    bias = {}
    for item in str(text).replace(",", " ").split():
        token, sep, value = item.partition(":")
        try:
            if not sep:
                raise ValueError
            bias[int(token)] = float(value)
        except ValueError:
            raise ValueError(f"logit_bias must be TOKEN:BIAS pairs such as 5:2.5,17:-3, got {item!r}") from None
    return bias


def _words(text: str) -> list[str]:
    """Words or phrases separated by commas."""
    words = [w.strip() for w in str(text).split(",") if w.strip()]
    if not words:
        raise ValueError(f"bad_words must be words separated by commas, got {text!r}")
    return words


# Sampler settings with a parser of their own (the others are numbers); bad_words_ids and the DRY breakers are
# given as words on the command line (--bad-words) or left at their defaults.
TEXT_SETTINGS: dict[str, Callable[[str], Any]] = {"samplers": _optional(_samplers), "logit_bias": _optional(_logit_bias)}
NOT_FLAGS = ("bad_words_ids", "dry_sequence_breakers")


def _sampler_flags() -> dict[str, tuple[Callable[[str], Any], Any, str]]:
    """One flag per setting ``SamplerSettings`` declares, with its default, its check and its description."""
    flags = {}
    for name in SamplerSettings.names():
        if name in NOT_FLAGS:
            continue
        default, _, about = describe(name)
        parse = TEXT_SETTINGS.get(name) or _sampler_setting(name, type(default))
        flags[name] = (parse, default, about)
    return flags


# name -> (parser, default, help). The REPL's /set uses the same names and parsers.
SETTINGS: dict[str, tuple[Callable[[str], Any], Any, str]] = {
    "max_new_tokens": (_number(int, "max_new_tokens", 0), 50, "new tokens at most"),
    **_sampler_flags(),
    "bad_words": (_optional(_words), None, "never write these words (repeatable flag; also with a leading space)"),
    "logprobs": (_optional(_number(int, "logprobs", 1)), None,
                 "after the text, each new token's log-probability and the model's LOGPROBS most likely tokens"),
    "num_return_sequences": (_number(int, "num_return_sequences", 1), 1, "texts per prompt (beam search: the best ones)"),
    "num_beams": (_number(int, "num_beams", 1), 1, "beam search with this many beams (1 samples instead)"),
    "no_repeat_ngram_size": (_optional(_number(int, "no_repeat_ngram_size", 1)), None, "beam search: block repeated n-grams"),
    "length_penalty": (_optional(_number(float, "length_penalty")), None,
                       "beam search: rank finished beams by sum / length ** this (none: part 3's classic search)"),
    "early_stopping": (_optional(_early_stopping), None, "beam search: true, false or never (none: part 3's classic search)"),
    "seed": (_optional(_number(int, "seed", 0)), None, "seed of the draws (none: random)"),
    "cache": (_choice("cache", ("dynamic", "static")), "dynamic",
              "dynamic or static: part 4's KeyValueCache (dynamic) or part 6's StaticKeyValueCache and fast path "
              "(static)"),
}


# Settings only beam search reads (None: off), and those that sampling and beam search both read; every
# other setting is sampling's alone.
BEAM_SETTINGS = ("no_repeat_ngram_size", "length_penalty", "early_stopping")
SHARED_SETTINGS = ("max_new_tokens", "num_beams", "num_return_sequences", "cache")

# Flags that may be given several times: how their values combine.
REPEATABLE: dict[str, Callable[[list], Any]] = {
    "logit_bias": lambda values: {k: v for bias in values for k, v in bias.items()},
    "bad_words": lambda values: [w for words in values for w in words],
}


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = OneLineParser(
        prog="sampling-course generate", description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", choices=MODELS, default="auto",
                        help="reference weights: real GPT-2 when available (auto), story, gpt2, the offline stand-in tiny, "
                             "or the Llama-style story-llama and story-llama-sink (part 9)")
    parser.add_argument("--impl", choices=IMPLS, default=None,
                        help="whose code runs: solutions (default, or $SAMPLING_COURSE_IMPL) or your exercises")
    parser.add_argument("--prompt", help="the text to continue (required unless --interactive)")
    parser.add_argument("--interactive", action="store_true", help="a REPL: every line is a prompt; /help for commands")
    parser.add_argument("--stop", action="append", default=None, metavar="TEXT",
                        help="stop once the text ends with TEXT (repeatable)")
    add_device_option(parser)
    for name, (convert, default, about) in SETTINGS.items():
        repeatable = dict(action="append") if name in REPEATABLE else {}
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=_argparse_type(convert), default=default,
                            help=f"{about} (default {default})", **repeatable)
    add_threads_option(parser)
    args = parser.parse_args(argv)
    for name, merge in REPEATABLE.items():  # one value from all the times the flag was given
        values = [v for v in getattr(args, name) or [] if v is not None]
        setattr(args, name, merge(values) if values else None)
    if args.prompt is None and not args.interactive:
        parser.error("--prompt is required (or use --interactive)")
    if args.prompt is not None and not args.prompt.strip():
        parser.error("--prompt must not be empty")
    if args.num_beams > 1 and args.stop:
        parser.error("--stop works with sampling, not with --num-beams")
    beam_only = [name for name in BEAM_SETTINGS if getattr(args, name) is not None]
    if args.num_beams == 1 and beam_only:
        parser.error(f"--{beam_only[0].replace('_', '-')} works with beam search: add --num-beams 2 or more")
    sampling_only = [name for name, (_, default, _) in SETTINGS.items()
                     if name not in BEAM_SETTINGS + SHARED_SETTINGS and getattr(args, name) != default]
    if args.num_beams > 1 and sampling_only:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in sampling_only)
        parser.error(f"beam search is deterministic and takes no sampling setting: leave out {flags} with --num-beams")
    return args


# ---------------------------------------------------------------------------------------
# The engine: a model, its tokenizer, and the chosen implementation's code
# ---------------------------------------------------------------------------------------


@dataclass
class Engine:
    model: Any
    tokenizer: Any
    generate: Callable  # part 5's generate(model, tokenizer, prompts, max_new_tokens, **settings)
    text_streamer: type  # part 5's TextStreamer
    sampler: type  # part 2/3's TransformerSampler, for beam search
    static_cache: type  # part 6's StaticKeyValueCache, for --cache static


def load_engine(model_name: str, impl: str | None, device=None) -> Engine:
    """Load the reference weights into the chosen implementation's DemoTransformer, on ``device``
    (the course's device when None)."""
    from sampling_course.implementation import impl_module, load_demo, resolve_impl
    from sampling_course.reference import load_reference

    impl = resolve_impl(impl, default="solutions")
    reference = load_reference(model_name, device)
    if model_name in LLAMA_STORY_MODELS:  # part 9's model behind part 5's loop; no beam search, no static cache
        from sampling_course.apps.llama_engine import llama_for_generate

        return Engine(model=llama_for_generate(reference, impl_module("llama", impl)), tokenizer=reference.tokenizer,
                      generate=impl_module("generate", impl).generate, text_streamer=impl_module("outputs", impl).TextStreamer,
                      sampler=None, static_cache=None)
    return Engine(
        model=load_demo(reference, impl_module("transformer", impl)),
        tokenizer=reference.tokenizer,
        generate=impl_module("generate", impl).generate,
        text_streamer=impl_module("outputs", impl).TextStreamer,
        sampler=impl_module("sampling", impl).TransformerSampler,
        static_cache=impl_module("caches", impl).StaticKeyValueCache,
    )


def new_cache(engine: Engine, prompt: str, settings: dict, batch: int):
    """An empty cache for one generation: part 6's static cache sized for it, or None (the engine's default)."""
    if engine.static_cache is None:  # a Llama-style model decodes with its own cache
        if settings["cache"] == "static":
            raise ValueError("--cache static runs on the GPT-2 models only (auto, story, gpt2, tiny)")
        return engine.model.new_cache()
    if settings["cache"] != "static":
        return None
    cfg = engine.model.cfg
    needed = len(engine.tokenizer.encode(prompt)) + settings["max_new_tokens"]
    # Past n_ctx generate and beam_search raise their own error, which says what to shorten.
    return engine.static_cache.new_empty(cfg, batch=batch, max_len=max(1, min(needed, cfg.n_ctx)))


def bad_words_ids(tokenizer, words: list[str] | None) -> list[list[int]] | None:
    """Each word's token ids, as it is written and with a leading space (how it appears mid-sentence)."""
    if not words:
        return None
    ids: list[list[int]] = []
    for word in words:
        for form in (word, " " + word.lstrip()):
            encoded = list(tokenizer.encode(form))
            if encoded and encoded not in ids:
                ids.append(encoded)
    return ids


def run_once(engine: Engine, prompt: str, settings: dict, stop: list[str] | None, stream: bool) -> None:
    """Generate the continuations of ``prompt`` and print them (streamed, or at the end), one per line."""
    if settings["num_beams"] > 1:
        if engine.sampler is None:
            raise ValueError("beam search (--num-beams) runs on the GPT-2 models only (auto, story, gpt2, tiny)")
        sampler = engine.sampler(engine.model, engine.tokenizer)
        results = sampler.beam_search(
            prompt, min(settings["num_return_sequences"], settings["num_beams"]), settings["num_beams"],
            settings["max_new_tokens"], no_repeat_ngram_size=settings["no_repeat_ngram_size"],
            kv_cache=new_cache(engine, prompt, settings, batch=settings["num_beams"]),
            length_penalty=settings["length_penalty"], early_stopping=settings["early_stopping"],
        )
        for _, text in results:
            print(text, flush=True)
        return
    if settings["num_return_sequences"] > 1:
        stream = False  # a streamer prints one text
    if settings["logprobs"]:
        stream = False  # the table follows the text
    streamer = engine.text_streamer(engine.tokenizer, file=sys.stdout, skip_special_tokens=True) if stream else None
    sampler = SamplerSettings(
        **{name: settings[name] for name in SamplerSettings.names() if name in settings and name != "logit_bias"},
        logit_bias=settings["logit_bias"] or None, bad_words_ids=bad_words_ids(engine.tokenizer, settings["bad_words"]),
    )
    batch = settings["num_return_sequences"]
    try:
        out = engine.generate(
            engine.model, engine.tokenizer, [prompt], settings["max_new_tokens"], settings=sampler,
            stop_strings=stop or None, streamer=streamer, kv_cache=new_cache(engine, prompt, settings, batch=batch),
            num_return_sequences=batch, logprobs=settings["logprobs"], seed=settings["seed"],
        )
    except KeyboardInterrupt:
        if streamer is not None:
            streamer.end()  # what was generated so far
        print("\n[stopped]", flush=True)
        return
    sequences = out.sequences if settings["logprobs"] else out
    if streamer is None:
        for row in sequences:
            print(engine.tokenizer.decode(row, skip_special_tokens=True), flush=True)
    else:
        print(flush=True)
    if settings["logprobs"]:
        print(logprob_table(engine.tokenizer, out), flush=True)


def logprob_table(tokenizer, out) -> str:
    """Each new token of each text: its log-probability under the model and the model's most likely tokens there."""
    lines = []
    width = out.sequences.shape[1] - out.logprobs.shape[1]
    for row in range(out.sequences.shape[0]):
        if out.sequences.shape[0] > 1:
            lines.append(f"text {row + 1}:")
        for step in range(out.logprobs.shape[1]):
            logprob = float(out.logprobs[row, step])
            if logprob != logprob:  # NaN: the row had finished
                break
            token = int(out.sequences[row, width + step])
            top = ", ".join(f"{tokenizer.decode([int(t)])!r} {float(v):.3f}"
                            for t, v in zip(out.top_tokens[row, step], out.top_logprobs[row, step]))
            lines.append(f"  {tokenizer.decode([token])!r} {logprob:.3f}   top: {top}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# The REPL
# ---------------------------------------------------------------------------------------

HELP = """\
Type a prompt and press Enter to continue it. Commands:
  /set NAME VALUE   change a setting, e.g. /set temperature 0.7, /set samplers top_k;temperature,
                    /set logit_bias 5:2.5,17:-3, /set bad_words dog,cat (none/off switches off those that can be)
  /set stop TEXT    stop when the text ends with TEXT (/set stop off to clear)
  /show             show the settings
  /help             this help
  /quit             leave (or Ctrl-D); Ctrl-C stops the current generation only"""


def show(settings: dict, stop: list[str] | None) -> str:
    lines = [f"  {name} = {value}" for name, value in settings.items()]
    lines.append(f"  stop = {stop or 'off'}")
    return "\n".join(lines)


def command(line: str, settings: dict, stop: list[str]) -> bool:
    """Run one /command; False means leave the REPL."""
    name, _, rest = line[1:].strip().partition(" ")
    if name in ("quit", "exit", "q"):
        return False
    if name == "help":
        print(HELP)
    elif name == "show":
        print(show(settings, stop))
    elif name == "set":
        key, _, value = rest.strip().partition(" ")
        key, value = key.replace("-", "_"), value.strip()
        if key == "stop":
            stop.clear()
            if value.lower() not in ("", "off", "none"):
                stop.append(value)
            print(f"stop = {stop or 'off'}")
        elif key not in SETTINGS:
            print(f"unknown setting {key!r}; settings: {', '.join(SETTINGS)}, stop")
        elif not value:
            print(f"usage: /set {key} VALUE")
        else:
            try:
                settings[key] = SETTINGS[key][0](value)
                print(f"{key} = {settings[key]}")
            except ValueError as exc:
                print(exc)
    else:
        print(f"unknown command /{name}; /help lists the commands")
    return True


def repl(engine: Engine, settings: dict, stop: list[str]) -> int:
    interactive = sys.stdin.isatty()
    if interactive:
        print("sampling-course generate: type a prompt, /help for commands, Ctrl-D to leave.")
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            if interactive:
                print()
            return 0
        except KeyboardInterrupt:  # at the prompt: a fresh line, as in a shell
            print()
            continue
        line = line.strip()
        if not line:
            continue
        if line.startswith("/"):
            if not command(line, settings, stop):
                return 0
            continue
        try:
            run_once(engine, line, settings, stop, stream=sys.stdout.isatty())
        except KeyboardInterrupt:  # Ctrl-C just outside the generation: still only this prompt stops
            print("\n[stopped]", flush=True)
        except ValueError as exc:  # e.g. a prompt too long for the model: say so, keep going
            print(f"error: {exc}")
        except NotImplementedError:
            print("not implemented yet: fill in the part-5 stubs in exercises/ (or use --impl solutions)")


@cli_command("sampling-course generate")
def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parse(argv)
    if isinstance(args, int):
        return args
    settings = {name: getattr(args, name) for name in SETTINGS}
    stop = list(args.stop or [])
    # The model's settings and tokenizer load in a moment, without torch: check the prompt and the
    # token budget against its context before torch and the weights load.
    from sampling_course.apps.demo import checked_settings

    name, cfg, tokenizer = checked_settings(args.model, "--model")
    n_prompt = len(tokenizer.encode(args.prompt)) if args.prompt is not None else 1
    if n_prompt + settings["max_new_tokens"] > cfg.n_ctx:
        raise UsageError(f"the prompt ({n_prompt} token{'s' * (n_prompt != 1)}) and --max-new-tokens "
                         f"{settings['max_new_tokens']} do not fit in {name}'s context of {cfg.n_ctx} tokens: ask for "
                         f"at most {max(0, cfg.n_ctx - n_prompt)}")
    from sampling_course.devices import pick_device

    try:  # a device this machine lacks: one line, before the model loads
        device = pick_device(args.device)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--device {args.device}: {exc}") from None
    from sampling_course.apps.demo import progress_bars_on_a_terminal_only
    from sampling_course.apps.threads import course_threads, torch_threads
    from sampling_course.implementation import impl_module, resolve_impl

    impl = resolve_impl(args.impl, default="solutions")
    # Whose code runs: a learner who forgot --impl exercises would otherwise read the course's text as theirs.
    print(f"sampling-course generate: running {WHOSE[impl]}", file=sys.stderr)
    with torch_threads(course_threads(args.threads, cfg.d_model)):
        try:
            engine = load_engine(args.model, impl, device)
        except (ValueError, ImportError) as exc:  # e.g. your DemoTransformer's parameters do not fit the weights
            print(f"sampling-course generate: error: {exc}", file=sys.stderr)
            return 1
        with progress_bars_on_a_terminal_only(impl_module("sampling", impl)):
            if args.interactive:
                return repl(engine, settings, stop)
            try:
                run_once(engine, args.prompt, settings, stop, stream=sys.stdout.isatty())
            except ValueError as exc:
                print(f"sampling-course generate: error: {exc}", file=sys.stderr)
                return 2
            except NotImplementedError:
                print("sampling-course generate: not implemented yet: fill in the part-5 stubs in exercises/ "
                      "(or use --impl solutions)", file=sys.stderr)
                return 1
    return 0


def _parse(argv: Sequence[str]) -> argparse.Namespace | int:
    try:
        return parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return int(exc.code or 0)


if __name__ == "__main__":
    raise SystemExit(main())
