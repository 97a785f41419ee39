"""Tests for the course registry (``grading.course``) and the checker (``grading.runner``, ``checking``, ``compare``).

The checker runs pytest in-process, so several tests here run a nested pytest session
on part 1's LayerNorm tests (a few seconds each, on the offline stand-in). The nested
session imports the implementation under test afresh and puts the outer session's
modules back afterwards; ``test_nested_check_leaves_outer_modules_alone`` pins that.
"""

from __future__ import annotations

import json

import ast
import io
import os
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

from sampling_course.grading import checking, runner
from sampling_course.grading import compare as compare_module
from sampling_course.apps.course_commands import check_main, hint_main
from sampling_course.grading.checking import check, hint
from sampling_course.grading.compare import compare
from sampling_course.grading.render import render_progress, render_result
from sampling_course.grading.results import (
    DONE,
    FAILING,
    NO_TESTS_YET,
    NOT_IMPLEMENTED_YET,
    CheckReport,
    TestOutcome,
    summarize,
)
from sampling_course.grading.runner import run_checks
from sampling_course.grading.sandbox import resolve_target, substituted, terminal_like
from sampling_course.grading.course import EXERCISES, MISTAKES, PARTS, UnknownExerciseError, get_exercise
from sampling_course.grading.stubs import is_learner_edited

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

COURSE_ORDER = [
    "LayerNorm", "Embed", "PosEmbed", "apply_causal_mask", "Attention", "MLP", "TransformerBlock", "Unembed",
    "DemoTransformer",
    "greedy_search", "sample_basic", "apply_temperature", "apply_frequency_penalty", "sample_top_k",
    "sample_top_p", "sample_next_token", "sample",
    "Beams.generate", "Beams.get_topk_non_repeating", "Beams.filter", "beam_search", "BeamHypotheses",
    "KeyValueCache", "cached_forward", "cached_sample", "cached_beam_search",
    "left_pad", "position_ids_from_mask", "masked_forward", "padded_forward", "top_k_filter", "top_p_filter",
    "min_p_filter", "warp_logits", "batched_sample", "generate", "StopStringCriteria", "TextStreamer",
    "typical_filter", "epsilon_filter", "eta_filter", "top_n_sigma_filter", "xtc_filter", "mirostat_step",
    "apply_repetition_penalty", "apply_presence_and_frequency_penalty", "apply_dry_penalty", "ban_bad_words",
    "fuse_qkv", "StaticKeyValueCache.update", "StaticKeyValueCache.reorder", "fast_forward", "SinkCache.positions",
    "SinkCache.update", "fixed_shape_step", "race_sample", "decode_loop",
    "filtered_probs", "draft_tokens", "residual_probs", "accept_or_resample", "crop_cache", "speculative_round",
    "prompt_lookup",
    "token_bytes", "walk_token", "build_index", "TokenConstraint", "constrained_generate", "schema_to_regex",
    "exact_laws", "kl_divergence",
    "RMSNorm", "Rotary", "GroupedQueryAttention", "SwiGLU", "LlamaTransformer", "rerotate",
    "RotatingSinkCache.make_room",
    "BlockPool", "BlockTable", "PagedKVCache.update", "Scheduler.schedule", "Engine.step", "block_hashes",
    "quantise_int8", "dequantise_int8", "quantise_groups", "dequantise_groups", "nf4_levels", "quantise_nf4",
    "dequantise_nf4", "double_quantise", "quantise_matrix", "dequantise_matrix", "quantise_model", "gptq_quantise",
]


def recording_console() -> Console:
    """A console that records instead of printing, wide enough that nothing wraps mid-word."""
    return Console(file=io.StringIO(), width=200, record=True, color_system=None)


def marker_names() -> dict[str, set[str]]:
    """Every ``@pytest.mark.exercise("<name>")`` in tests/, as {name: {files using it}}."""
    found: dict[str, set[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (  # a call of pytest.mark.exercise or of mark.exercise
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "exercise"
                and (
                    (isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "mark")
                    or (isinstance(node.func.value, ast.Name) and node.func.value.id == "mark")
                )
            ):
                assert node.args and isinstance(node.args[0], ast.Constant), f"{path.name}:{node.lineno}: marker needs a literal name"
                found.setdefault(node.args[0].value, set()).add(path.name)
    return found


def exercises_untouched() -> None:
    """Skip when the learner has already filled in exercises/transformer.py (the tests assume the stub)."""
    if is_learner_edited(REPO / "exercises" / "transformer.py"):
        pytest.skip("exercises/transformer.py has been edited; these tests need the generated stub")


# ---------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------


def test_registry_is_in_course_order():
    """EXERCISES lists every exercise once, in course order, with the parts in sequence."""
    assert [e.name for e in EXERCISES] == COURSE_ORDER
    parts = [e.part for e in EXERCISES]
    assert parts == sorted(parts) and set(parts) == set(PARTS) == {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}


def test_every_marker_names_a_registered_exercise():
    """Each exercise marker in tests/ uses a registered name, spelled exactly."""
    markers = marker_names()
    assert markers, "no exercise markers found: the scan is broken"
    registered = {e.name for e in EXERCISES}
    unknown = {name: sorted(files) for name, files in markers.items() if name not in registered}
    assert not unknown, f"markers that name no exercise in sampling_course.grading.course.EXERCISES: {unknown}"


def test_every_tested_exercise_has_its_target_in_the_solutions():
    """For each exercise with tests, the object check(obj=...) replaces exists in solutions/."""
    markers = marker_names()
    for exercise in EXERCISES:
        if exercise.name in markers:
            owner, attr = resolve_target(exercise, "solutions")
            assert attr in vars(owner), exercise.name


def test_every_exercise_has_planted_correct_variants_that_apply():
    """Each exercise has at least two planted correct variants (other styles that
    `sampling-course plant-mistakes --variants` runs its tests on), and every planted variant
    and mistake rewrites text found exactly once in the solutions."""
    from sampling_course.grading.course import MISTAKES, VARIANTS

    registered = {e.name for e in EXERCISES}
    assert {v.exercise for v in VARIANTS} <= registered
    for exercise in EXERCISES:
        names = [v.name for v in VARIANTS if v.exercise == exercise.name]
        assert len(names) >= 2, f"{exercise.name}: {len(names)} planted correct variants, expected at least 2"
        assert len(set(names)) == len(names), f"{exercise.name}: two variants share a name"
    for change in [*MISTAKES, *VARIANTS]:
        source = (REPO / "solutions" / change.file).read_text()
        assert source.count(change.old) == 1, f"{change.name!r}: its text occurs {source.count(change.old)} times in solutions/{change.file}"
        assert change.new != change.old, change.name


def test_hints_come_in_three_distinct_levels():
    """Every exercise has a one-line task and three different, non-empty hints."""
    for exercise in EXERCISES:
        assert exercise.task.strip() and "\n" not in exercise.task, exercise.name
        assert len(exercise.hints) == 3, exercise.name
        assert all(h.strip() for h in exercise.hints) and len(set(exercise.hints)) == 3, exercise.name
        assert exercise.hint(3) == exercise.hints[2]
    with pytest.raises(ValueError, match="hints 1 to 3"):
        get_exercise("LayerNorm").hint(4)


def test_get_exercise_is_case_insensitive():
    """Names match whatever their case, and an Exercise passes through."""
    assert get_exercise("layernorm").name == "LayerNorm"
    assert get_exercise("BEAMS.GENERATE").name == "Beams.generate"
    assert get_exercise(" sample_top_p ").name == "sample_top_p"
    assert get_exercise(get_exercise("MLP")) is get_exercise("mlp")


def test_get_exercise_error_suggests_and_lists_names():
    """An unknown name raises a ValueError with the closest match and every valid name."""
    with pytest.raises(UnknownExerciseError) as info:
        get_exercise("LayerNrom")
    message = str(info.value)
    assert "Did you mean 'LayerNorm'" in message
    assert all(e.name in message for e in EXERCISES)
    assert isinstance(info.value, ValueError)


# ---------------------------------------------------------------------------------------
# Summarising test outcomes (no pytest run needed)
# ---------------------------------------------------------------------------------------


def _outcome(kind: str, message: str = "", stub: str = "") -> TestOutcome:
    return TestOutcome(f"t::{kind}{message}", ("LayerNorm",), kind, message, stub)  # type: ignore[arg-type]


def test_summarize_statuses():
    """Failures outrank stubs, stubs outrank passes, and no tests at all is 'no tests yet'."""
    ex = get_exercise("LayerNorm")
    assert summarize(ex, []).status == NO_TESTS_YET
    assert summarize(ex, [_outcome("skipped", "no gpt2")]).status == NO_TESTS_YET
    done = summarize(ex, [_outcome("passed"), _outcome("skipped", "no gpt2")])
    assert (done.status, done.passed, done.ran, done.total) == (DONE, 1, 1, 2)
    todo = summarize(ex, [_outcome("passed"), _outcome("not implemented", "x", "LayerNorm.forward")])
    assert todo.status == NOT_IMPLEMENTED_YET and todo.stubs == ("LayerNorm.forward",)
    bad = summarize(ex, [_outcome("not implemented", "x", "f"), _outcome("failed", "AssertionError: a"),
                         _outcome("failed", "AssertionError: b")])
    assert bad.status == FAILING and bad.message == "AssertionError: a" and bad.hint == ex.hints[0]
    assert bad.failed == 2 and not bad.done


def test_progress_overview_counts_done_exercises():
    """The progress view lists every exercise and says how many of them are done."""
    results = [summarize(e, [_outcome("passed")] if e.part == 1 else []) for e in EXERCISES]
    console = recording_console()
    console.print(render_progress(CheckReport(results)))
    text = console.export_text()
    assert f"9/{len(COURSE_ORDER)} exercises done" in text
    assert all(e.name in text for e in EXERCISES)


def test_progress_lists_part_6b_as_6b():
    """Notebook 06b's exercises appear under "Part 6b", not under part 6."""
    console = recording_console()
    console.print(render_progress(CheckReport([summarize(e, []) for e in EXERCISES])))
    text = console.export_text()
    assert "Part 6b: Fast decoding on a GPU" in text
    assert text.index("Part 6b") < text.index("race_sample") < text.index("Part 7")
    assert text.index("SinkCache.update") < text.index("Part 6b")


def test_a_stub_of_another_exercise_is_named_with_its_own_file():
    """An exercise whose test runs into another exercise's stub says which exercise and file to fill in."""
    result = summarize(get_exercise("Beams.generate"),
                       [_outcome("not implemented", "x", "Beams.get_topk_non_repeating")])
    console = recording_console()
    console.print(render_result(result))
    text = " ".join(console.export_text().split())
    assert "Beams.get_topk_non_repeating (exercises/beams.py: Beams.get_topk_non_repeating)" in text
    assert "exercises/beams.py: Beams.generate" not in text
    own = summarize(get_exercise("LayerNorm"), [_outcome("not implemented", "x", "LayerNorm.forward")])
    console.print(render_result(own))
    assert "Fill it in (exercises/transformer.py: LayerNorm)" in " ".join(console.export_text().split())


# ---------------------------------------------------------------------------------------
# Running the checks (nested, in-process pytest)
# ---------------------------------------------------------------------------------------


def test_layer_norm_solution_is_done():
    """run_checks on the solutions' LayerNorm reports it done, with the passing tests counted."""
    [result] = run_checks(["LayerNorm"], impl="solutions")
    assert result.status == DONE, result
    assert result.passed >= 2 and result.failed == 0 and result.not_implemented == 0


@pytest.mark.slow
def test_layer_norm_stub_is_not_implemented_and_cli_fails():
    """The generated stub reports 'not implemented yet' naming the stub, and the CLI exits non-zero."""
    exercises_untouched()
    [result] = run_checks(["layernorm"], impl="exercises")
    assert result.status == NOT_IMPLEMENTED_YET, result
    assert result.stubs == ("LayerNorm.forward",) and result.passed == 0
    assert check_main(["LayerNorm", "--impl", "exercises"]) != 0
    assert check_main(["LayerNorm", "--impl", "solutions"]) == 0


def test_cli_check_rejects_unknown_names():
    """An unknown exercise or --impl is a usage error (exit code 2), not a crash."""
    assert check_main(["NoSuchExercise"]) == 2
    assert check_main(["LayerNorm", "--impl", "mine"]) == 2


class WrongLayerNorm(torch.nn.Module):
    """A LayerNorm with the classic mistake: the unbiased variance (divides by d_model - 1)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.w = torch.nn.Parameter(torch.ones(cfg.d_model))
        self.b = torch.nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, residual):
        residual = residual - residual.mean(dim=-1, keepdim=True)
        scale = (residual.var(dim=-1, keepdim=True, unbiased=True) + self.cfg.layer_norm_eps).sqrt()
        return residual / scale * self.w + self.b


@pytest.mark.slow
def test_check_with_an_object_from_the_notebook():
    """check(name, obj=...) grades that object: the solution's class passes, a wrong one fails with a message."""
    from solutions.transformer import LayerNorm

    console = recording_console()
    good = check("LayerNorm", obj=LayerNorm, console=console)
    assert good and good["LayerNorm"].status == DONE
    text = console.export_text()
    assert "All" in text and "passed" in text

    bad = check("LayerNorm", obj=WrongLayerNorm, console=console)
    result = bad["LayerNorm"]
    assert not bad and result.status == FAILING
    assert "differs from the reference" in result.message
    text = console.export_text()
    assert "differs from the reference" in text and "This matches a classic mistake" in text
    # The named mistake's own why and fix replace the exercise's general first hint.
    assert result.hint is None and get_exercise("LayerNorm").hints[0][:40] not in text
    fix = next(m.fix for m in MISTAKES if m.name == "LayerNorm with unbiased variance")
    unwrapped = " ".join(" ".join(line.strip("│╭╰─ ") for line in text.splitlines()).split())
    assert f"Fix: {fix}." in unwrapped


@pytest.mark.slow
def test_nested_check_leaves_outer_modules_alone():
    """After a check, the modules and classes the caller imported before are the same objects."""
    import exercises.transformer
    import solutions.transformer

    names = ["exercises.transformer", "solutions.transformer", "conftest", "test_part1_transformer", __name__]
    before = {name: sys.modules[name] for name in names if name in sys.modules}
    assert __name__ in before and "conftest" in before, "the outer session's modules should be imported"
    layer_norm = exercises.transformer.LayerNorm
    current_test = os.environ.get("PYTEST_CURRENT_TEST")
    run_checks(["LayerNorm"], impl="exercises", obj=WrongLayerNorm)
    run_checks(["LayerNorm"], impl="solutions")
    assert {name: sys.modules.get(name) for name in before} == before
    assert exercises.transformer.LayerNorm is layer_norm
    assert os.environ.get("PYTEST_CURRENT_TEST") == current_test


def test_substituted_wraps_static_methods_and_restores():
    """A plain function replacing a static method is wrapped in staticmethod, and put back afterwards."""
    import solutions.sampling

    def my_top_p(logits, top_p, min_tokens_to_keep=1):
        return "mine"

    original = vars(solutions.sampling.TransformerSampler)["sample_top_p"]
    with substituted("solutions", "sample_top_p", my_top_p):
        assert solutions.sampling.TransformerSampler.sample_top_p(None, 0.5) == "mine"
        assert isinstance(vars(solutions.sampling.TransformerSampler)["sample_top_p"], staticmethod)
    assert vars(solutions.sampling.TransformerSampler)["sample_top_p"] is original


def test_substituted_replaces_a_class_everywhere_it_is_imported():
    """A module-level class is replaced in every module of the package that imported it."""
    import solutions.beams
    import solutions.sampling
    import solutions.transformer

    class MyCache(torch.Tensor):
        pass

    original = solutions.transformer.KeyValueCache
    with substituted("solutions", "KeyValueCache", MyCache):
        assert solutions.transformer.KeyValueCache is MyCache
        assert solutions.sampling.KeyValueCache is MyCache and solutions.beams.KeyValueCache is MyCache
    assert solutions.transformer.KeyValueCache is original and solutions.sampling.KeyValueCache is original


def test_nested_session_sees_a_terminal_not_jupyter(monkeypatch):
    """In a notebook kernel, tqdm.auto and rich render widgets/HTML that bypass pytest's capture;
    during a check they must behave as in a terminal, and be put back afterwards."""
    import rich.console
    import tqdm.asyncio
    import tqdm.auto

    class NotebookBar:  # stands in for tqdm's notebook widget class
        pass

    monkeypatch.setattr(rich.console, "_is_jupyter", lambda: True)
    monkeypatch.setattr(tqdm.auto, "tqdm", NotebookBar)
    with terminal_like():
        assert tqdm.auto.tqdm is tqdm.asyncio.tqdm
        assert not Console(file=io.StringIO()).is_jupyter
    assert tqdm.auto.tqdm is NotebookBar and rich.console._is_jupyter()


# ---------------------------------------------------------------------------------------
# Hints on the command line and in the notebook
# ---------------------------------------------------------------------------------------


@pytest.fixture()
def fresh_hints(tmp_path, monkeypatch):
    """An empty course cache folder: no hint shown yet."""
    monkeypatch.setenv("SAMPLING_COURSE_HOME", str(tmp_path))
    return tmp_path


def _levels_shown(out: str) -> list[int]:
    return [i for i in (1, 2, 3) if f"Hint {i}/3" in out]


def test_cli_hint_levels(capsys, fresh_hints):
    """The CLI shows the next level at each run (remembered per exercise), one chosen level with --level, all with
    --all, starts again after --reset; 2 and one line for an unknown name or level."""
    ex = get_exercise("LayerNorm")
    shown = []
    for _ in range(4):
        assert hint_main(["layernorm"]) == 0
        shown.append(_levels_shown(capsys.readouterr().out))
    assert shown == [[1], [2], [3], [3]]
    assert hint_main(["Embed"]) == 0 and _levels_shown(capsys.readouterr().out) == [1], "levels are per exercise"
    assert hint_main(["LayerNorm", "--level", "3"]) == 0
    out = capsys.readouterr().out
    assert "Hint 3/3" in out and "Hint 1/3" not in out and "biased" not in out.split("Hint 3/3")[0]
    assert "layer_norm_eps" in out
    assert hint_main(["LayerNorm", "--all"]) == 0
    out = capsys.readouterr().out
    assert all(f"Hint {i}/3" in out for i in (1, 2, 3)) and ex.task[:30] in out
    assert hint_main(["LayerNorm", "--reset"]) == 0
    capsys.readouterr()
    assert hint_main(["LayerNorm"]) == 0 and _levels_shown(capsys.readouterr().out) == [1]
    assert hint_main(["Embed"]) == 0 and _levels_shown(capsys.readouterr().out) == [2], "--reset NAME resets NAME only"
    for bad in (["NoSuchExercise"], ["LayerNorm", "--level", "5"], ["LayerNorm", "--level", "x"], []):
        assert hint_main(bad) == 2, bad
    assert hint_main(["--reset"]) == 0
    capsys.readouterr()
    assert hint_main(["Embed"]) == 0 and _levels_shown(capsys.readouterr().out) == [1]


def test_hint_reveals_one_more_level_per_call(fresh_hints):
    """hint(name) without a level shows hint 1, then 2, then 3, then stays at 3; a new process goes on."""
    seen = []
    for _ in range(4):
        console = recording_console()
        hint("Embed", console=console)
        seen.append(_levels_shown(console.export_text()))
    assert seen == [[1], [2], [3], [3]]
    with pytest.raises(ValueError, match="level"):
        hint("Embed", level=7)
    assert json.loads((fresh_hints / "hints.json").read_text()) == {"Embed": 3}


def test_damaged_hint_levels_start_again(fresh_hints, capsys, monkeypatch):
    """An unreadable hints.json is said in one line and hints start again at level 1."""
    from sampling_course import files

    monkeypatch.setattr(files, "NOTICES", [])
    (fresh_hints / "hints.json").write_text("{not json")
    console = recording_console()
    hint("Embed", console=console)
    assert _levels_shown(console.export_text()) == [1]
    err = capsys.readouterr().err
    assert "hint levels" in err and err.count("\n") == 1


# ---------------------------------------------------------------------------------------
# compare
# ---------------------------------------------------------------------------------------


def test_compare_unimplemented_learner_side():
    """With the generated stubs, compare shows the solution's text and 'not implemented yet' for yours."""
    exercises_untouched()
    console = recording_console()
    result = compare(prompt="The cat", reference="tiny", max_tokens_generated=4, console=console, temperature=0.0)
    assert result.match is None and result.learner.status == "not implemented yet"
    assert result.solution.status == "ok" and result.solution.output.startswith("The cat")
    assert "not implemented yet" in console.export_text()


def test_compare_identical_outputs_and_random_state():
    """The solutions against themselves match, for sampling and beam search, and the caller's RNG is untouched."""
    state = torch.random.get_rng_state()
    same = compare(prompt="The cat", reference="tiny", max_tokens_generated=6, impl="solutions", display=False)
    assert same.match is True and same and same.learner.output == same.solution.output
    assert torch.equal(torch.random.get_rng_state(), state), "compare must not change the caller's random state"

    beams = compare(prompt="The cat", reference="tiny", method="beam_search", impl="solutions", display=False,
                    num_beams=3, num_return_sequences=2, max_new_tokens=4, no_repeat_ngram_size=2)
    assert beams.match is True and len(beams.solution.output) == 2
    assert all(isinstance(lp, float) and text.startswith("The cat") for lp, text in beams.solution.output)


def test_compare_reports_the_first_difference(monkeypatch):
    """When the learner's sampler draws differently (here: another seed), compare says where they part."""
    real = compare_module._run_sampler
    calls = []

    def learner_uses_another_seed(package, transformer, reference, method, prompt, seed, *rest):
        calls.append(package)
        return real(package, transformer, reference, method, prompt, seed + (len(calls) == 1), *rest)

    monkeypatch.setattr(compare_module, "_run_sampler", learner_uses_another_seed)
    console = recording_console()
    result = compare(prompt="The cat", reference="tiny", max_tokens_generated=12, impl="solutions", console=console)
    assert len(calls) == 2
    assert result.match is False and not result
    assert result.first_difference.startswith("generated token ")
    assert "they differ, first at generated token" in console.export_text()
