"""Name the classic mistake behind a failing check.

The course knows the classic mistakes of every exercise: the planted-mistake catalogue (each
part's ``MISTAKES`` in ``grading/parts/``). When a learner's exercise fails its tests, this
module runs the learner's code and each planted mistake of that exercise through the same
small, fixed input (the exercise's *probe*, in ``grading/parts/<part>/probes.py``); when the
learner's output is the output of one of the mistakes, the checker says so first, in plain
words:

    This matches a classic mistake: the unbiased variance (dividing by d_model - 1 instead
    of d_model), where GPT-2's LayerNorm divides by d_model.

The pieces live next door: ``grading/planting.py`` plants a mistake into a copy of the
solutions (imported from memory) and finds the exercise it belongs to;
``grading/matching.py`` says when two outputs are the same (exactly, or statistically for
random draws); ``grading/probing.py`` holds the probe registry and its toy inputs.

Planted outputs, and the solution's own, are cached for the rest of the process, since the
solutions do not change during a session. A learner whose output matches the solution's is
named nothing (the failure lies elsewhere), and so is one whose probe raises or runs longer
than ``TIME_LIMIT_S`` (a loop that never ends).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import re
import textwrap
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from sampling_course.grading.catalogue import Exercise, Mistake
from sampling_course.grading.course import EXERCISES, MISTAKES, get_exercise
from sampling_course.grading.matching import Raised, exact_draws, same, seed_cpu
from sampling_course.grading.planting import exercises_of, mistake_target, mistakes_of, planted
from sampling_course.grading.probing import Impl, load_probes
from sampling_course.grading.sandbox import isolated_package, resolve_target, substituted, terminal_like
from sampling_course.grading.time_limit import TookTooLong, time_limit

__all__ = ["TIME_LIMIT_S", "coverage", "describe_match", "explain", "helpers_of", "name_mistake", "name_mistakes",
           "planted_output"]

# A learner's probe that runs longer than this is stopped (a loop that never ends).
TIME_LIMIT_S = 5.0

_NOTHING = object()  # a planted probe that failed: matches nothing
_OUTPUTS: dict[tuple[str, Mistake | None], Any] = {}


def explain(mistake: Mistake) -> str:
    """The mistake in plain words, as one sentence."""
    text = (mistake.why or mistake.name).strip()
    return text if text.endswith((".", "!", "?")) else text + "."


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Seeded, gradient-free, silent (progress bars, prints), on the CPU, and the caller's RNG state kept."""
    sink = io.StringIO()
    # One thread: the probes' tensors are tiny, and on a busy machine waking a thread pool
    # for every small op costs more than the op.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # torch.device("cpu"): the probes' tensors (and seeded CPU generators) stay on the CPU even where
        # torch's default device is a GPU, as in a notebook on a GPU runtime.
        with torch.device("cpu"), torch.random.fork_rng(devices=[]), torch.no_grad(), terminal_like(), \
                contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            seed_cpu(0)
            yield
    finally:
        torch.set_num_threads(threads)


def planted_output(exercise: Exercise | str, change: Mistake | None) -> Any:
    """The probe output of the solutions with ``change`` planted (None: the solutions), cached.

    A planted probe that raises gives a marker that matches nothing.
    """
    exercise = get_exercise(exercise)
    probes = load_probes()
    key = (exercise.name, change)
    if key not in _OUTPUTS:
        # A mistake can belong to several exercises (Attention and apply_causal_mask): probe them all at once.
        wanted = [exercise] if change is None else [e for e in exercises_of(change) if e.name in probes]
        try:
            with _quiet(), planted(*([change] if change else [])) as package, exact_draws():
                for e in wanted:
                    try:
                        _OUTPUTS[(e.name, change)] = probes[e.name](Impl(package))
                    except Exception:  # noqa: BLE001 - a mistake whose probe raises is never named
                        _OUTPUTS[(e.name, change)] = _NOTHING
        except Exception:  # noqa: BLE001
            for e in wanted:
                _OUTPUTS[(e.name, change)] = _NOTHING
    return _OUTPUTS.get(key, _NOTHING)


@functools.lru_cache(maxsize=None)
def helpers_of(exercise: Exercise) -> tuple[Exercise, ...]:
    """The exercises of the same part and file that ``exercise``'s solution calls (named in its source).

    A learner's probe runs with the solutions' versions of these, so that a mistake in a
    helper (an n-gram off by one in get_topk_non_repeating) is named on the helper, not on
    its caller (Beams.generate). Left out: the exercise itself, the class holding it or the
    methods it holds, and any exercise whose code holds one of this exercise's own mistakes
    (Attention's, which only the cached forward reveals).
    """
    owner, attr = resolve_target(exercise, "solutions")
    try:
        source = inspect.getsource(getattr(owner, attr))
    except (OSError, TypeError):
        return ()
    code = _code_only(source)
    own_code = {(Path(m.file).stem, mistake_target(m)) for m in mistakes_of(exercise)}
    helpers = []
    for other in EXERCISES:
        name = other.target.split(".")[-1]
        # A method is called as .name(...), a function as name(...); a class is named anywhere.
        pattern = rf"\.{name}\(" if "." in other.target else (rf"\b{name}\b" if name[:1].isupper() else rf"\b{name}\(")
        related = other.module == exercise.module and (
            other.target == exercise.target or other.target.startswith(exercise.target + ".")
            or exercise.target.startswith(other.target + "."))
        holds_own = any(module == other.module and target is not None
                        and (target == other.target or target.startswith(other.target + "."))
                        for module, target in own_code)
        # Same part and file only: a later part's probe builds whole models and caches, where the
        # solutions' classes would meet the learner's (a solutions' DemoTransformer handed the
        # learner's cache) and the probe could no longer run.
        same_lesson = other.part == exercise.part and other.module == exercise.module
        if same_lesson and not related and not holds_own and re.search(pattern, code):
            helpers.append(other)
    return tuple(helpers)


def _code_only(source: str) -> str:
    """The source's names and operators, without comments, strings and docstrings, one space apart."""
    tokens = tokenize.generate_tokens(io.StringIO(textwrap.dedent(source)).readline)
    return " ".join(t.string for t in tokens if t.type in (tokenize.NAME, tokenize.OP)).replace(" . ", ".").replace(" (", "(")


def _solutions_object(exercise: Exercise) -> Any:
    owner, attr = resolve_target(exercise, "solutions")
    return getattr(owner, attr)


def _learner_output(exercise: Exercise, package: str, obj: Any) -> Any:
    """The probe output of ``package`` (imported afresh), with ``obj`` in place of the exercise's object
    and the solutions' versions of the exercises it calls (``helpers_of``)."""
    probe = load_probes()[exercise.name]
    with _quiet(), isolated_package(package), contextlib.ExitStack() as stack:
        for helper in helpers_of(exercise):
            stack.enter_context(substituted(package, helper, _solutions_object(helper)))
        if obj is not None:
            stack.enter_context(substituted(package, exercise, obj))
        with time_limit(TIME_LIMIT_S):
            return probe(Impl(package))


def name_mistakes(exercise: Exercise | str, package: str, obj: Any = None) -> list[Mistake]:
    """Every planted mistake of ``exercise`` whose output ``package``'s code reproduces, in catalogue order.

    ``package`` is an implementation (``"exercises"``, ``"solutions"`` or any importable
    copy); with ``obj``, that object replaces the exercise's own, as in ``check(name, obj=...)``.
    Empty when the exercise has no probe or no mistakes, when the learner's probe raises or
    runs too long, when its output is the solution's, or when no mistake matches. More than
    one when two mistakes behave the same on every input (the same error written two ways).
    """
    exercise = get_exercise(exercise)
    candidates = mistakes_of(exercise)
    if exercise.name not in load_probes() or not candidates:
        return []
    # The solution's output first: it also loads what the probe shares (the tokenizer), which
    # must not count against the learner's time limit.
    solution = planted_output(exercise, None)
    if solution is _NOTHING:
        return []
    try:
        learner = _learner_output(exercise, package, obj)
    except (Exception, TookTooLong):  # noqa: BLE001 - a learner's error is the tests' to report
        return []
    if isinstance(learner, (list, tuple)) and learner and all(isinstance(step, Raised) for step in learner):
        return []
    if same(learner, solution):
        return []
    matches = []
    for mistake in candidates:
        output = planted_output(exercise, mistake)
        if output is not _NOTHING and same(learner, output):
            matches.append(mistake)
    return matches


def name_mistake(exercise: Exercise | str, package: str, obj: Any = None) -> Mistake | None:
    """The first planted mistake of ``exercise`` whose output ``package``'s code reproduces, or None
    (see ``name_mistakes``)."""
    matches = name_mistakes(exercise, package, obj)
    return matches[0] if matches else None


def describe_match(exercise: Exercise | str, package: str, obj: Any = None) -> str | None:
    """The sentence a failing check shows first, or None when no classic mistake matches.

    When two mistakes behave the same, both are named. Never raises: a diagnosis that goes
    wrong must not hide the test's own message.
    """
    try:
        matches = name_mistakes(exercise, package, obj)
    except Exception:  # noqa: BLE001
        return None
    if not matches:
        return None
    sentence = f"This matches a classic mistake: {explain(matches[0])}"
    for other in matches[1:]:
        sentence += f" It behaves exactly like another one: {explain(other)}"
    fixes = [m.fix.strip().rstrip(".") + "." for m in matches if m.fix.strip()]
    return sentence + (f" Fix: {fixes[0]}" if fixes else "")


def coverage(parts: tuple[int, ...]) -> tuple[list[tuple[Mistake, Exercise]], list[tuple[Mistake, str]]]:
    """``(probed, unnamed)``: every (mistake, exercise) pair of ``parts`` with a probe, and each
    mistake of ``parts`` that cannot be named, with the reason."""
    probes = load_probes()
    probed: list[tuple[Mistake, Exercise]] = []
    unnamed: list[tuple[Mistake, str]] = []
    for mistake in MISTAKES:
        if mistake.part not in parts:
            continue
        exercises = exercises_of(mistake)
        with_probe = [e for e in exercises if e.name in probes]
        probed += [(mistake, e) for e in with_probe]
        if not exercises:
            unnamed.append((mistake, f"its code ({mistake_target(mistake)}) belongs to no part-{mistake.part} exercise"))
        elif not with_probe:
            unnamed.append((mistake, f"no probe for {', '.join(e.name for e in exercises)}"))
    return probed, unnamed
