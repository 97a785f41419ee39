"""One device rule, one message when two devices disagree, and the loaders and caches on a device.

Everything here runs on the CPU. GPUs are stood in for in two ways: the rule is checked by
telling it which devices exist (torch's availability checks replaced for the test), and a
model on torch's "meta" device (tensors with shapes and no data) stands for a model on
another device than its inputs, so the course's messages can be checked where the only
real device is the CPU. Where running cannot show it, the text is read: the grading tests and
the notebooks hand the course's draws a generator on the model's device (``cpu_generator_misuses``).
The tests that need a real GPU skip with a one-line reason.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from sampling_course import devices
from sampling_course.config import Config
from sampling_course.devices import DeviceMismatchError, DeviceUnavailable, pick_device
from sampling_course.grading.tolerances import parity
from sampling_course.implementation import Impl, load_demo
from sampling_course.reference import load_reference

SMALL = Config(d_model=16, d_vocab=40, n_ctx=12, d_head=4, d_mlp=32, n_heads=4, n_layers=2)


@pytest.fixture
def machine(monkeypatch):
    """``machine(cuda=..., mps=...)``: the rule sees these devices (and no session device, no $SAMPLING_COURSE_DEVICE)."""
    monkeypatch.delenv(devices.DEVICE_ENV, raising=False)
    monkeypatch.setattr(devices, "_session_device", None)

    def have(cuda: bool = False, mps: bool = False) -> None:
        monkeypatch.setattr(devices, "cuda_available", lambda: cuda)
        monkeypatch.setattr(devices, "mps_available", lambda: mps)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1 if cuda else 0)

    return have


# ---------------------------------------------------------------------------------------
# The rule
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("cuda, mps, expected", [(True, True, "cuda:0"), (False, True, "mps"), (False, False, "cpu")])
def test_the_rule_prefers_cuda_then_mps_then_cpu(machine, cuda, mps, expected):
    machine(cuda=cuda, mps=mps)
    assert pick_device() == pick_device("auto") == torch.device(expected)


def test_the_environment_overrides_the_rule_and_a_named_device_overrides_both(machine, monkeypatch):
    machine(cuda=True, mps=True)
    monkeypatch.setenv(devices.DEVICE_ENV, "cpu")
    assert pick_device() == torch.device("cpu")
    assert pick_device("mps") == torch.device("mps")
    monkeypatch.setenv(devices.DEVICE_ENV, "auto")
    assert pick_device() == torch.device("cuda:0")


def test_a_session_device_comes_first_and_goes_away_after(machine, monkeypatch):
    machine(cuda=True)
    monkeypatch.setenv(devices.DEVICE_ENV, "cuda")
    with devices.use_device("cpu") as chosen:
        assert chosen == pick_device() == torch.device("cpu")
    assert pick_device() == torch.device("cuda:0")


def test_a_device_this_machine_lacks_is_refused_in_one_line(machine, monkeypatch):
    machine(cuda=False, mps=False)
    for name in ("cuda", "cuda:1", "mps"):
        with pytest.raises(DeviceUnavailable, match=r"is not available here: .*; devices here: cpu") as info:
            pick_device(name)
        assert "\n" not in str(info.value)
    monkeypatch.setenv(devices.DEVICE_ENV, "cuda")
    with pytest.raises(DeviceUnavailable, match=r"\$SAMPLING_COURSE_DEVICE=cuda: cuda is not available here"):
        pick_device()


@pytest.mark.parametrize("name", ["tpu", "meta", "gpu", ""])
def test_a_name_that_is_no_device_is_a_value_error(name):
    with pytest.raises(ValueError, match="device must be one of auto, cpu, cuda, mps"):
        pick_device(name)
    with pytest.raises(TypeError, match="device must be a string"):
        pick_device(3)  # type: ignore[arg-type]


def test_same_device_reads_cuda_as_the_current_gpu(machine):
    machine(cuda=True)
    assert devices.same_device("cuda", "cuda:0") and devices.same_device(torch.device("cpu"), "cpu")
    assert not devices.same_device("cuda:0", "cuda:1") and not devices.same_device("cpu", "meta")


# ---------------------------------------------------------------------------------------
# One line naming both devices
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def meta_model():
    """The solutions' DemoTransformer with its weights on the meta device: another device than the CPU."""
    with torch.device("meta"):
        return Impl("solutions").transformer.DemoTransformer(SMALL)


def one_line_naming(info, *names: str) -> None:
    message = str(info.value)
    assert "\n" not in message and all(name in message for name in names), message


def test_tokens_on_another_device_than_the_model(meta_model):
    with pytest.raises(DeviceMismatchError, match="the tokens are on cpu but the model is on meta") as info:
        meta_model(torch.zeros(1, 3, dtype=torch.long))
    one_line_naming(info, "cpu", "meta")
    mask = torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(DeviceMismatchError, match="the attention_mask is on cpu"):
        meta_model(torch.zeros(1, 3, dtype=torch.long, device="meta"), attention_mask=mask)


def test_an_empty_cache_follows_the_model_and_a_filled_one_must_be_there(meta_model):
    kvc = Impl("solutions").kv_cache.KeyValueCache
    tokens = torch.zeros(2, 3, dtype=torch.long, device="meta")
    logits, cache = meta_model(tokens, kvc.new_empty(SMALL, batch=2))  # made on the CPU, empty: it moves
    assert cache.device.type == "meta" and cache.seq_len == 3 and logits.shape == (2, 3, SMALL.d_vocab)
    filled = kvc(torch.zeros(SMALL.n_layers, 2, 2, 3, SMALL.n_heads, SMALL.d_head))
    with pytest.raises(DeviceMismatchError, match="the KeyValueCache is on cpu but the model is on meta") as info:
        meta_model(torch.zeros(2, 4, dtype=torch.long, device="meta"), filled)
    one_line_naming(info, "cpu", "meta", "new_empty")


def test_part_6_caches_follow_the_model_unless_told_a_device(meta_model):
    caches = Impl("solutions").caches
    sink_cache = Impl("solutions").sink_cache
    tokens = torch.zeros(1, 3, dtype=torch.long, device="meta")
    static = caches.StaticKeyValueCache.new_empty(SMALL, max_len=8)
    sink = sink_cache.SinkCache.new_empty(SMALL, window_length=6)
    for cache in (static, sink):
        assert cache.device == torch.device("cpu")  # the course's device here
        logits, same = meta_model(tokens, cache)
        assert same is cache and cache.device.type == "meta" and logits.shape == (1, 3, SMALL.d_vocab)
    for cache in (caches.StaticKeyValueCache.new_empty(SMALL, max_len=8, device="cpu"),
                  sink_cache.SinkCache.new_empty(SMALL, window_length=6, device="cpu")):
        with pytest.raises(DeviceMismatchError, match=f"the {type(cache).__name__} is on cpu but the model is on meta") as info:
            meta_model(tokens, cache)
        one_line_naming(info, "cpu", "meta")


def test_a_cache_in_another_dtype_follows_or_is_refused():
    solutions = Impl("solutions")
    model = solutions.transformer.DemoTransformer(SMALL).to(torch.bfloat16)
    tokens = torch.zeros(1, 3, dtype=torch.long)
    _, dynamic = model(tokens, solutions.kv_cache.KeyValueCache.new_empty(SMALL))
    _, static = model(tokens, solutions.caches.StaticKeyValueCache.new_empty(SMALL, max_len=8))
    assert dynamic.dtype == static.buffer.dtype == torch.bfloat16
    told = solutions.caches.StaticKeyValueCache.new_empty(SMALL, max_len=8, dtype=torch.float32)
    with pytest.raises(ValueError, match="holds torch.float32 but the model computes in torch.bfloat16"):
        model(tokens, told)


def test_a_generator_on_another_device_than_the_logits():
    solutions = Impl("solutions")
    logits = torch.zeros(2, 5, device="meta")
    with pytest.raises(DeviceMismatchError, match="the generator is on cpu but the model is on meta") as info:
        solutions.batched_sampling.sample(logits, generator=torch.Generator())
    one_line_naming(info, "torch.Generator(device='meta')")
    p, q = torch.full((2, 5), 0.2, device="meta"), torch.full((1, 5), 0.2, device="meta")
    with pytest.raises(DeviceMismatchError, match="the generator is on cpu"):
        solutions.speculative.accept_or_resample(p, q, torch.zeros(1, dtype=torch.long, device="meta"), torch.Generator())
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        solutions.batched_sampling.sample(torch.zeros(2, 5), generator=7)


def test_draft_tokens_refuses_a_prompt_or_generator_away_from_the_draft(meta_model):
    speculative = Impl("solutions").speculative
    kvc = Impl("solutions").kv_cache.KeyValueCache
    with pytest.raises(DeviceMismatchError, match="the tokens are on cpu but the model is on meta"):
        speculative.draft_tokens(meta_model, torch.zeros(3, dtype=torch.long), kvc.new_empty(SMALL), 2)
    with pytest.raises(DeviceMismatchError, match="the generator is on cpu"):
        speculative.draft_tokens(meta_model, torch.zeros(3, dtype=torch.long, device="meta"), kvc.new_empty(SMALL), 2,
                                 generator=torch.Generator())


# ---------------------------------------------------------------------------------------
# Loaders on a device and in a dtype
# ---------------------------------------------------------------------------------------


def test_load_reference_and_load_demo_take_a_device_and_a_dtype():
    ref = load_reference("tiny", "cpu", torch.bfloat16)
    assert ref is load_reference("tiny", "cpu", "bfloat16") and ref is not load_reference("tiny", "cpu")
    assert ref.device == torch.device("cpu") and ref.dtype == torch.bfloat16
    assert next(ref.hf_model.parameters()).dtype == torch.bfloat16
    model = load_demo(ref)  # follows the reference
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    full = load_reference("tiny", "cpu")
    tokens = torch.randint(0, ref.cfg.d_vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).float(), full.hf_model(tokens).logits, **parity("cpu", torch.bfloat16))
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_reference("tiny", "cpu", torch.int64)
    assert load_demo(full, dtype=torch.float16).embed.W_E.dtype == torch.float16


def test_a_reference_left_to_its_default_follows_the_session(device):
    assert load_reference("tiny").device == device == pick_device()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run pytest --device cuda on a machine with one)")
def test_on_a_gpu_the_reference_and_the_demo_agree_with_the_cpu():
    cpu, gpu = load_reference("tiny", "cpu"), load_reference("tiny", "cuda")
    tokens = torch.randint(0, cpu.cfg.d_vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), devices.full_fp32_precision():
        expected = cpu.hf_model(tokens).logits
        torch.testing.assert_close(load_demo(gpu)(tokens.cuda()).cpu(), expected, **parity("cuda"))
        torch.testing.assert_close(gpu.hf_model(tokens.cuda()).logits.cpu(), expected, **parity("cuda"))


# ---------------------------------------------------------------------------------------
# Grading on a device: pytest --device
# ---------------------------------------------------------------------------------------


class _Config:
    """What the plugin's session setup reads from a pytest config: ``--device`` and a stash."""

    def __init__(self, device: str | None):
        self.device, self.stash = device, pytest.Stash()

    def getoption(self, name: str):
        assert name == "--device"
        return self.device


def test_pytest_refuses_a_device_this_machine_lacks_in_one_line(machine):
    from sampling_course.grading.pytest_plugin import start_device_session

    machine(cuda=False)
    with pytest.raises(pytest.UsageError, match="^--device cuda: cuda is not available here: .*devices here: cpu$"):
        start_device_session(_Config("cuda"))


def test_a_session_on_a_device_is_undone_afterwards(machine, monkeypatch):
    from sampling_course.grading import pytest_plugin

    machine(cuda=False)
    monkeypatch.setenv(devices.DEVICE_ENV, "cpu")
    config = _Config(None)  # no --device: $SAMPLING_COURSE_DEVICE, else the CPU
    pytest_plugin.start_device_session(config)
    try:
        assert pytest_plugin.session_device(config) == pick_device() == torch.device("cpu")
    finally:
        for context in reversed(config.stash[pytest_plugin._device_contexts_key]):
            context.__exit__(None, None, None)
    assert devices._session_device is None


def test_tensors_a_test_makes_land_on_the_session_device_and_seeded_draws_stay_the_same():
    from sampling_course.grading.device_session import DeviceSession

    expected = torch.randn(3, generator=torch.Generator().manual_seed(4))
    with DeviceSession(torch.device("meta")):
        assert torch.zeros(2).device.type == torch.tensor([1, 2]).device.type == "meta"
        assert torch.zeros(2, device="cpu").device.type == "cpu"  # a device named stays
        drawn = torch.randn(3, generator=torch.Generator().manual_seed(4))  # drawn on the CPU, then moved
    assert drawn.device.type == "meta" and drawn.shape == expected.shape
    with DeviceSession(torch.device("cpu")):
        torch.testing.assert_close(torch.randn(3, generator=torch.Generator().manual_seed(4)), expected, rtol=0, atol=0)
    assert torch.zeros(1).device.type == "cpu"


def test_a_module_whose_oracle_runs_on_the_cpu_gets_the_cpu_back_inside_a_session_on_another_device():
    from sampling_course.grading.device_session import DeviceSession, on_the_cpu

    with DeviceSession(torch.device("meta")), torch.device("meta"):
        assert torch.zeros(2).device.type == "meta"
        with on_the_cpu():
            assert torch.zeros(2).device.type == torch.tensor([1]).device.type == "cpu"
            assert torch.get_default_device().type == "cpu" and pick_device().type == "cpu"  # loaders too
            assert torch.nn.Linear(2, 2).weight.device.type == "cpu"
        assert torch.zeros(2).device.type == "meta"


def test_the_toy_models_answer_where_their_tokens_are_whatever_the_default_device():
    """In a grading session on a GPU, a loop hands a parameter-free toy model its tokens on the CPU (a
    model without parameters gives it no device to move them to); its logits must be there too, not on
    the default device.
    (BigramModel's table is a buffer made on the default device: no device here can show it answering
    elsewhere, since a meta table holds no numbers to copy.)"""
    from sampling_course.grading.device_session import DeviceSession
    from sampling_course.toy_models import NeverEOSModel, SuccessorModel

    cfg = Config(d_model=4, d_head=4, n_heads=1, n_layers=1, d_mlp=4, d_vocab=16, n_ctx=8)
    tokens = torch.tensor([[1, 2, 3]], device="cpu")
    with DeviceSession(torch.device("meta")), torch.device("meta"):
        models = [SuccessorModel(KeyValueCache=lambda cache: cache, d_vocab=16), NeverEOSModel(cfg, eos=15)]
        for model in models:
            logits = model(tokens)
            assert logits.device.type == "cpu" and logits.shape == (1, 3, 16), type(model).__name__
        empty_cache = type("EmptyCache", (), {"seq_len": 0})()
        logits, cache = models[0](tokens, empty_cache)  # SuccessorModel's cached call: its cache there too
        assert logits.device.type == cache.device.type == "cpu"


def test_check_grades_on_the_device_it_is_given(monkeypatch):
    """check(..., device=...) hands --device to the tests it runs; a device this machine lacks is one line, no tests."""
    import pytest as pytest_module

    from sampling_course.grading.checking import check

    seen = []
    monkeypatch.setattr(pytest_module, "main", lambda args, plugins: seen.append(args) or pytest_module.ExitCode.OK)
    check("LayerNorm", impl="solutions", device="cpu", display=False)
    assert seen and seen[0][seen[0].index("--device") + 1] == "cpu"
    if not torch.cuda.is_available():
        report = check("LayerNorm", impl="solutions", device="cuda", display=False)
        assert report.error.startswith("cuda is not available here") and len(seen) == 1


def test_notebook_helpers_run_when_torchs_default_device_is_another(tiny_demo, impl):
    """The first cells of the notebooks put torch's default device on the GPU; the helpers they call keep
    their tensors where their inputs are (here the model is on the CPU and the default device is meta)."""
    from sampling_course.apps import bench_gpu, long_text_nll, long_text_results
    from sampling_course.apps.notebook import time_per_token

    nll = torch.rand(2, 40)
    tokens = torch.randint(0, tiny_demo.cfg.d_vocab, (2, 12))
    with torch.device("meta"):
        assert long_text_results.smoothed_nll(nll, width=8).device.type == "cpu"
        assert long_text_nll.full_attention_nll(tiny_demo, tokens).device.type == "cpu"  # results on the CPU
        assert bench_gpu.eager_step_costs(tiny_demo, impl.caches, batches=(1,), context=4, repeats=1)[0].ms > 0
        assert len(time_per_token(tiny_demo, impl.kv_cache.KeyValueCache, [4, 8], repeats=1)["cached"]) == 2


# ---------------------------------------------------------------------------------------
# Seeded generators in the grading tests and the notebooks
# ---------------------------------------------------------------------------------------
# A torch.Generator draws on its own device only. A test's seeded CPU generator may make the test's
# inputs (a tensor constructor: the grading session draws on the CPU and moves the result, so every
# device grades on the same numbers), but a draw made by the code under test happens on the model's
# device and needs a generator there. No GPU here, so the rule is checked on the tests' text.

TESTS = Path(__file__).resolve().parents[1]


def _constructor_names() -> frozenset[str]:
    """The names ``torch.<name>`` of the functions that make a tensor on a device (what DeviceSession places)."""
    from sampling_course.grading.device_session import device_constructors

    functions = {name: getattr(torch, name) for name in dir(torch)}
    return frozenset(name for name, value in functions.items() if callable(value) and value in device_constructors())


def _is_cpu_generator(node: ast.AST) -> bool:
    """``torch.Generator()``: a generator made without naming a device, so on the CPU."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "Generator"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
            and not node.args and not any(k.arg == "device" for k in node.keywords))


def cpu_generator_misuses(source: str, cpu_inputs_only: bool = False) -> list[int]:
    """Lines where a CPU generator (``torch.Generator()``, seeded or not, or a name bound to one) is passed
    anywhere but as ``generator=`` of a ``torch.<constructor>(...)``. With ``cpu_inputs_only`` (a notebook:
    no grading session moves the draw) that constructor must also say ``device="cpu"``."""
    tree = ast.parse(source)
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    constructors = _constructor_names()

    def seeded(expr: ast.AST) -> ast.AST:  # torch.Generator().manual_seed(s) is the same generator
        while (isinstance(parent.get(expr), ast.Attribute) and parent[expr].attr == "manual_seed"
               and isinstance(parent.get(parent[expr]), ast.Call)):
            expr = parent[parent[expr]]
        return expr

    def makes_an_input(expr: ast.AST) -> bool:
        keyword, call = parent.get(expr), parent.get(parent.get(expr))
        if not (isinstance(keyword, ast.keyword) and keyword.arg == "generator" and isinstance(call, ast.Call)):
            return False
        func = call.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "torch"
                and func.attr in constructors):
            return False
        on_cpu = any(k.arg == "device" and isinstance(k.value, ast.Constant) and k.value.value == "cpu" for k in call.keywords)
        return on_cpu or not cpu_inputs_only

    def scope_of(node: ast.AST) -> ast.AST:
        while node in parent and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            node = parent[node]
        return node

    bad = []
    for node in ast.walk(tree):
        if not _is_cpu_generator(node):
            continue
        expr = seeded(node)
        holder = parent.get(expr)
        if isinstance(holder, ast.Assign) and len(holder.targets) == 1 and isinstance(holder.targets[0], ast.Name):
            name = holder.targets[0].id
            uses = [use for use in ast.walk(scope_of(holder)) if isinstance(use, ast.Name) and use.id == name
                    and isinstance(use.ctx, ast.Load)]
            bad += [use.lineno for use in uses if not makes_an_input(seeded(use))]
        elif not makes_an_input(expr):
            bad.append(node.lineno)
    return sorted(bad)


def test_the_generator_rule_catches_a_cpu_generator_given_to_the_code_under_test():
    """The rule itself: inputs from CPU generators pass, a CPU generator handed to a draw does not."""
    fine = """
def test(gen, device):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 9, generator=generator)
    ids = torch.randint(0, 9, (3,), generator=torch.Generator().manual_seed(1))
    gen.sample(logits, generator=torch.Generator(device=device).manual_seed(2))
"""
    assert cpu_generator_misuses(fine) == []
    assert cpu_generator_misuses(fine, cpu_inputs_only=True) == [4, 5]  # a notebook must say device="cpu"
    wrong = """
def test(gen, q):
    generator = torch.Generator().manual_seed(0)
    gen.sample(torch.randn(4, 9, generator=generator), generator=generator)
    gen.xtc_filter(q, 0.1, 1.0, generator=torch.Generator().manual_seed(3))
    torch.multinomial(q, 5, generator=torch.Generator())
"""
    assert cpu_generator_misuses(wrong) == [4, 5, 6]


@pytest.mark.parametrize("path", sorted((TESTS / "grading").glob("test_*.py")) + [TESTS / "doubles.py"],
                         ids=lambda p: p.name)
def test_grading_tests_give_the_code_under_test_a_generator_on_the_grading_device(path):
    """Seeded draws that the code under test makes (sample, draft_tokens, race_sample, ...) take
    torch.Generator(device=device) (the ``device`` fixture); a CPU generator only makes the test's inputs."""
    bad = cpu_generator_misuses(path.read_text())
    assert not bad, (f"{path.name}, lines {bad}: a CPU torch.Generator() goes to a draw on the grading device; "
                     "make it with torch.Generator(device=device) (the `device` fixture)")


@pytest.mark.parametrize("path", sorted((TESTS.parent / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebook_cells_give_draws_a_generator_on_the_notebooks_device(path):
    """On a GPU a notebook makes its device torch's default, so a CPU generator may only make inputs with
    device="cpu" (then moved); a draw in the course's code takes torch.Generator(device=DEVICE)."""
    cells = [cell for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "code"]
    for index, cell in enumerate(cells):
        source = "".join(cell["source"])
        python = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
        bad = cpu_generator_misuses(python, cpu_inputs_only=True)
        assert not bad, (f"{path.name}, code cell {index}, lines {bad}: a CPU torch.Generator() is used where the "
                         "draw happens on DEVICE; use torch.Generator(device=DEVICE), or device=\"cpu\" then .to(DEVICE)")
