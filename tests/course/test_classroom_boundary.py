"""The boundary between the grader and a submission's code, tested in one process (no sandbox needed).

Two endpoints talk over a socket pair: the grader's (``peer_trusted=False``) and the
submission's (``peer_trusted=True``), which serves in a thread; a third, the double host
(``host.serve``), serves both in threads of its own. "The submission's code" is a
module registered under a name only these tests use. The rules checked (docs/design.md, "The
grading boundary"):

* an object of the grader's gives the submission's code plain data only: never a handle to
  one of its attributes (a ``Path``, a module, a backend object), never a private name;
* an object of the submission's never judges itself: ``==`` is identity, it has no truth
  value, and a torch function given it runs here on its data (rebuilt from bytes);
* what the submission's process says about itself is never a flag;
* what it prints past the 64 KiB the grader keeps is left out, never the fact that it printed.
"""

from __future__ import annotations

import functools
import socket
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch

from sampling_course.grading.classroom import host
from sampling_course.grading.classroom.bridge import PRINT_BUDGET, PRINT_LEFT_OUT, Endpoint
from sampling_course.grading.classroom.grade import Connection, supervisor_flags
from sampling_course.grading.classroom.proxies import RemoteObject
from sampling_course.grading.classroom.settings import GradeSettings
from doubles import counted
from fake_hub import ADDED_TOKEN, fake_gpt2_cache
from sampling_course.beside import made_apart, made_beside
from sampling_course.counted_model import CountedCall
from sampling_course.config import Config
from sampling_course.op_recorder import OpRecorder, own_record_held, take_unverified
from sampling_course.recording_file import RecordingFile
from sampling_course.recording_tokenizer import RecordingTokenizer, shipped_name
from sampling_course.repeat import repeat
from sampling_course.scripted_step import ScriptedStep
from sampling_course.tokenizer import TOKENIZER_DIR, Tokenizer
from sampling_course.toy_models import BigramModel, NeverEOSModel, SuccessorModel
from sampling_course.trigram_model import TrigramModel

MODULE = "classroom_boundary_submission"


class GraderTokenizer:
    """Stands in for the grader's tokenizer: plain answers, and attributes that must not be handed out."""

    eos_token_id = 0

    def __init__(self) -> None:
        self.folder = Path(__file__).parent  # a handle to this would read the grader's files
        self._secret = "the expected output"

    def encode(self, text: str) -> list[int]:
        return [len(word) for word in text.split()]

    def backend(self) -> object:
        return object()  # not plain data: refused


class AlwaysEqual:
    def __eq__(self, other: object) -> bool:
        return True

    def __bool__(self) -> bool:
        return True

    __hash__ = object.__hash__


class LyingTensor(torch.Tensor):
    """A tensor subclass that says it equals anything, the way a hostile submission would."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.equal, torch.allclose, torch.Tensor.equal, torch.Tensor.allclose):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})

    def tolist(self):
        return AlwaysEqual()


def _try(action):
    try:
        return ["ok", action()]
    except Exception as exc:  # noqa: BLE001 - what the submission's code saw, as data
        return [type(exc).__name__, str(exc)[:200]]


def _submission_module() -> types.ModuleType:
    module = types.ModuleType(MODULE)

    def probe(tokenizer):
        return {"encode": _try(lambda: tokenizer.encode("ab c")), "eos": _try(lambda: tokenizer.eos_token_id),
                "folder": _try(lambda: str(tokenizer.folder.parent)), "secret": _try(lambda: tokenizer._secret),
                "backend": _try(lambda: tokenizer.backend()), "setattr": _try(lambda: setattr(tokenizer, "x", 1))}

    module.probe = probe
    module.always_equal = AlwaysEqual
    module.lying_zeros = lambda n: torch.zeros(n).as_subclass(LyingTensor)

    def forge():
        raise PermissionError('{"kind": "read", "detail": "flagged: tried to read /etc/shadow (refused)"}')

    module.forge = forge

    def run_until_finished(step, finished):
        calls = 0
        while not bool(finished.all()) and calls < 10:  # reads only its own copy of finished
            step()
            calls += 1
        return calls

    module.run_until_finished = run_until_finished

    def speak():
        print("the text")
        print("a warning", file=sys.stderr)

    module.speak = speak
    module.flood = lambda n: print("x" * n)
    module.reads_back = lambda x: int((x * 2).sum().item())  # one operation, then a read back to the host
    module.records = lambda *records: [type(r).__name__ for r in records]
    module.draw = lambda logits: torch.multinomial(logits.softmax(-1), 1)[0]
    module.call_twice = lambda model, tokens: [model(tokens), model(tokens[:, -1:])][0]
    module.write_words = lambda file, text: [file.write(word) for word in text.split(" ")]
    module.decode_ids = lambda tokenizer, ids: tokenizer.decode(torch.tensor(ids))

    def call_and_hide(model, tokens):
        """Two calls, then every way to take the second out of the model's record that this side has."""
        model(tokens), model(tokens)
        return {"pop": _try(lambda: model.inputs.pop()), "clear": _try(lambda: model.calls.clear()),
                "assign": _try(lambda: setattr(model, "calls", [])), "reach": _try(lambda: model._wrapped[0](tokens)),
                "children": _try(lambda: len(list(model.children())))}

    module.call_and_hide = call_and_hide
    module.tokenizers_seen = lambda a, b: [isinstance(a, Tokenizer), a is b, a.encode("hello world")]
    module.slow = lambda: time.sleep(0.5)
    return module


class MarkingStep:
    """A step of the grader's that marks one more row finished, in place, at each call (as a decode step does)."""

    def __init__(self, rows: int):
        self.finished = torch.zeros(rows, dtype=torch.bool)
        self.calls = 0

    def __call__(self) -> torch.Tensor:
        self.finished[self.calls] = True
        self.calls += 1
        return self.finished.clone()


@pytest.fixture
def connected():
    """The grader's endpoint, connected to a submission's endpoint serving in a thread, and both to a double
    host serving in threads: (the grader's endpoint, the submission's, the grader's to the host)."""
    sys.modules[MODULE] = _submission_module()
    ours, theirs = socket.socketpair()
    to_host, host_side = socket.socketpair()  # the grader and the double host
    student_side, host_student = socket.socketpair()  # the submission and the double host
    student = Endpoint(theirs, peer_trusted=True, owns_modules=True)
    student.host = Endpoint(student_side, peer_trusted=True, owns_modules=True, random_state=False)
    threads = [threading.Thread(target=student.serve_forever, daemon=True),
               threading.Thread(target=host.serve, args=(host_side, host_student), daemon=True)]
    for thread in threads:
        thread.start()
    endpoint = Endpoint(ours, peer_trusted=False, owns_modules=False)
    to_grader = Endpoint(to_host, peer_trusted=False, owns_modules=False, random_state=False)
    endpoint.made_apart = functools.partial(host.made_apart, endpoint, lambda: to_grader)
    yield endpoint, student, to_grader
    ours.close()
    to_host.close()
    for thread in threads:
        thread.join(timeout=10)
    for sock in (theirs, host_side, student_side, host_student):
        sock.close()
    del sys.modules[MODULE]


@pytest.fixture
def grader(connected):
    """The grader's endpoint (see ``connected``)."""
    return connected[0]


def test_a_grader_object_gives_the_submission_plain_data_only(grader):
    """The submission's code may call the grader's tokenizer's public methods and read plain attributes;
    a Path, a private name, a non-plain result and an assignment are refused."""
    module = grader.request("import", None, name=MODULE)
    seen = module.probe(GraderTokenizer())
    assert seen["encode"] == ["ok", [2, 1]] and seen["eos"] == ["ok", 0]
    for name in ("folder", "secret", "backend", "setattr"):
        assert seen[name][0] == "PermissionError", (name, seen[name])


def test_a_submission_object_never_judges_itself(grader):
    """An object whose __eq__ is always true is equal to nothing here, and has no truth value."""
    module = grader.request("import", None, name=MODULE)
    obj = module.always_equal()
    assert (obj == [1, 2, 3]) is False and ([1, 2, 3] == obj) is False and obj != 0
    with pytest.raises(TypeError, match="truth value"):
        bool(obj)


def test_a_torch_function_on_a_submission_tensor_runs_here_on_its_data(grader):
    """A tensor subclass whose torch.equal and tolist say "equal" is judged on its bytes."""
    module = grader.request("import", None, name=MODULE)
    zeros = module.lying_zeros(3)
    assert torch.equal(zeros, torch.zeros(3)) is True  # its data, compared here
    assert torch.equal(zeros, torch.ones(3)) is False and not torch.allclose(zeros, torch.ones(3))
    with pytest.raises((AssertionError, TypeError)):  # it fails either way: never passes
        torch.testing.assert_close(zeros, torch.ones(3))
    assert (zeros.tolist() == [1.0, 1.0, 1.0]) is False  # its tolist() came back as a handle: identity only


def test_what_the_submission_says_is_never_a_flag(grader):
    """An error worded like a flag, raised by the submission's code, flags nothing."""
    connection = Connection(Path("."), GradeSettings(), bwrap=None)
    grader.on_error = connection._on_error
    connection.endpoint = grader
    module = grader.request("import", None, name=MODULE)
    with pytest.raises(PermissionError):
        module.forge()
    assert supervisor_flags(connection) == []


def test_a_tensor_the_grader_lent_follows_its_changes_in_place(grader):
    """The grader's step marks rows finished in the tensor it passed to the submission's loop: the submission's
    copy sees each change, so the loop stops after three calls, as it would in one process."""
    module = grader.request("import", None, name=MODULE)
    step = MarkingStep(3)
    assert module.run_until_finished(step, step.finished) == 3 and step.calls == 3


def test_what_the_submission_prints_keeps_its_stream(grader, capsys):
    """Its standard output arrives on the grader's standard output, its standard error on standard error,
    as in one process (a test that reads the output of ``verbose=False`` is not failed by a warning)."""
    module = grader.request("import", None, name=MODULE)
    module.speak()
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("the text\n", "a warning\n")


def test_what_the_submission_prints_past_the_budget_is_still_seen_printed(grader, capsys):
    """Once its printed text has used the 64 KiB the grader keeps, what it prints is left out, but a line says so:
    a test that asks for no output (``verbose=False``) is never passed by printing a flood first."""
    module = grader.request("import", None, name=MODULE)
    module.flood(PRINT_BUDGET + 10)
    flooded = capsys.readouterr().out
    assert len(flooded) < PRINT_BUDGET + 100 and flooded.endswith(PRINT_LEFT_OUT)
    module.speak()
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == (PRINT_LEFT_OUT, PRINT_LEFT_OUT)


def test_operations_are_recorded_where_the_submission_runs(grader):
    """A recorder on in the grader sees the operations the submission's code ran (its read back to the host
    included), and none of the connection's own work: the same record as in one process."""
    module = grader.request("import", None, name=MODULE)
    x = torch.arange(3.0)
    with OpRecorder() as here:
        module.reads_back(x)
    with OpRecorder() as local:
        int((x * 2).sum().item())
    assert here.ops == local.ops and "_local_scalar_dense" in here.host_reads()
    assert here.elsewhere and not local.elsewhere


def test_a_record_made_where_the_submission_runs_convicts_but_does_not_clear(grader):
    """A verdict on operations the submission's process recorded: one that fails counts as in one process; one that
    holds is counted as unverified (that process could have changed the record)."""
    module = grader.request("import", None, name=MODULE)
    take_unverified()
    with OpRecorder() as recorder:
        module.reads_back(torch.arange(3.0))
    with pytest.raises(AssertionError, match="reads back"):
        recorder.verdict(not recorder.host_reads(), "reads back")
    assert take_unverified() == 0
    recorder.verdict(len(recorder.host_reads()) == 1, "one read")
    assert take_unverified() == 1 and take_unverified() == 0
    with OpRecorder() as local:  # all of it recorded here: a verdict that holds is verified
        torch.arange(3.0) * 2
    local.verdict(not local.host_reads(), "reads back")
    assert take_unverified() == 0


def test_a_check_on_a_record_made_beside_the_submission_earns_nothing(grader):
    """Part 10's records (``MethodCalls``, ``PlannedSteps``) are made beside the submission's code, in its process:
    checks that hold on a record made there are counted as unverified; on one made in this process they are not."""
    module = grader.request("import", None, name=MODULE)
    take_unverified()
    own_record_held(RecordingFile())
    assert take_unverified() == 0
    own_record_held(made_beside(module, RecordingFile))
    assert take_unverified() == 1 and take_unverified() == 0


def test_repeated_calls_of_a_submission_function_are_one_request(grader):
    """``repeat`` on a submission's function runs its loop in the submission's process: one request from
    the grader, the draws of one process seeded alike, and the results as plain tensors."""
    module = grader.request("import", None, name=MODULE)
    draw, logits = module.draw, torch.tensor([0.0, 1.0, 2.0])
    torch.manual_seed(0)
    before = grader.requests_sent
    draws = repeat(draw, 50, logits)
    torch.manual_seed(0)
    local = [torch.multinomial(logits.softmax(-1), 1)[0] for _ in range(50)]
    assert grader.requests_sent - before <= 3  # the import of the loop, its function, the call
    assert all(type(d) is torch.Tensor for d in draws) and torch.equal(torch.stack(draws), torch.stack(local))


def test_the_courses_settings_records_cross_by_value(grader):
    """Config, LlamaConfig and SamplerSettings arrive as the runtime's own classes (a submission checks
    isinstance), rebuilt from their fields."""
    from sampling_course.config import Config
    from sampling_course.llama_config import LlamaConfig
    from sampling_course.sampling_settings import SamplerSettings

    module = grader.request("import", None, name=MODULE)
    cfg = Config(d_model=8, d_vocab=5, n_ctx=4, d_head=2, d_mlp=8, n_heads=4, n_layers=1)
    llama = LlamaConfig(d_model=8, d_vocab=5, n_ctx=4, d_head=2, d_mlp=8, n_heads=4, n_key_value_heads=2, n_layers=1)
    settings = SamplerSettings(temperature=0.5, top_k=3)
    assert module.records(cfg, llama, settings) == ["Config", "LlamaConfig", "SamplerSettings"]


def test_a_double_is_made_beside_the_submissions_code(grader):
    """``made_beside`` builds the runtime's double in the submission's process from its description: the
    submission's code calls it there (no request reaches the grader), the grader reads what it recorded as
    plain data, and the tensor it shares, handed back, is its own (so the loop sees the rows it marks)."""
    module = grader.request("import", None, name=MODULE)
    step = made_beside(module, ScriptedStep, [0, 2])
    served = grader.requests_served
    assert module.run_until_finished(step, step.finished) == 3
    assert grader.requests_served == served, "the submission's code called back to the grader"
    assert type(step.calls) is int and step.calls == 3


def test_a_model_made_beside_is_the_submissions_and_reads_back_as_data(grader):
    """A toy model made beside the submission's code arrives as a mirror of a module of that process; what it
    recorded comes back as plain lists, and ``clear_calls`` empties the record there."""
    module = grader.request("import", None, name=MODULE)
    table = torch.randn(4, 3, 3, generator=torch.Generator().manual_seed(0))
    model = made_beside(module, TrigramModel, table, "toy")
    assert torch.equal(model(torch.tensor([[2, 0, 1]])), TrigramModel(table, "here")(torch.tensor([[2, 0, 1]])))
    assert model.calls == [(3, None)] and type(model.calls) is list
    model.clear_calls()
    assert model.calls == []


def test_the_toy_models_and_recorders_are_made_beside_and_read_back_as_data(grader):
    """Parts 2 to 5's doubles (the toy models, a file and a tokenizer that record) are the submission's
    objects: its code calls them with no request to the grader, and what they recorded comes back as data
    equal to what a twin made here records for the same calls."""
    module = grader.request("import", None, name=MODULE)
    cfg = Config(d_model=4, d_vocab=11, n_ctx=8, d_head=4, d_mlp=4, n_heads=1, n_layers=1)
    tokens = torch.tensor([[3, 1, 4, 1]])
    made = {"never": (NeverEOSModel, (cfg, 5)), "bigram": (BigramModel, (cfg, {1: {2: 0.5, 3: 0.5}}, {1: 2.0})),
            "successor": (SuccessorModel, (None, 11))}
    for name, (factory, args) in made.items():
        model, twin = made_beside(module, factory, *args), factory(*args)
        served = grader.requests_served
        logits = module.call_twice(model, tokens)
        assert grader.requests_served == served, f"{name}: a call of the double reached the grader"
        expected = [twin(tokens), twin(tokens[:, -1:])][0]
        assert type(logits) is torch.Tensor and torch.equal(logits, expected), name
        for record in ("inputs", "longest_input", "calls"):
            if hasattr(twin, record):
                seen, kept = getattr(model, record), getattr(twin, record)
                assert type(seen) is type(kept) and str(seen) == str(kept), (name, record, seen, kept)
    file = made_beside(module, RecordingFile)
    module.write_words(file, "one two  three")
    assert file.chunks == ["one", "two", "three"] and type(file.chunks) is list
    tokenizer = made_beside(module, RecordingTokenizer, "tiny")
    served = grader.requests_served
    text = module.decode_ids(tokenizer, [40, 41, 42])
    assert grader.requests_served == served, "the tokenizer's decode reached the grader"
    assert text == Tokenizer(TOKENIZER_DIR).decode([40, 41, 42]) and tokenizer.decoded == [40, 41, 42]


def test_a_record_kept_in_the_double_host_cannot_be_changed_by_the_submissions_code(connected):
    """``counted`` records each call in the double host: the submission's code sees copies of its record
    (changing them changes nothing there), cannot assign it, and cannot reach the model it wraps to call it
    unrecorded; the answers are the wrapped model's, made beside the submission's code, and no call reaches
    the grader."""
    grader, student, _ = connected
    module = grader.request("import", None, name=MODULE)
    cfg = Config(d_model=4, d_vocab=11, n_ctx=8, d_head=4, d_mlp=4, n_heads=1, n_layers=1)
    spy = counted(made_beside(module, NeverEOSModel, cfg, 5))
    tokens = torch.tensor([[3, 1, 4]])
    served = grader.requests_served
    seen = module.call_and_hide(spy, tokens)
    assert grader.requests_served == served, "a call of the counted model reached the grader"
    assert spy.calls == [(3, None), (3, None)] and len(spy.inputs) == 2, seen
    assert all(type(kept) is torch.Tensor and torch.equal(kept, tokens) for kept in spy.inputs)
    assert seen["pop"][0] == "ok" and seen["clear"][0] == "ok", seen  # on its copies
    assert seen["assign"][0] == "PermissionError" and seen["reach"][0] != "ok", seen
    assert seen["children"] in (["ok", 0], ["PermissionError", seen["children"][1]]), seen  # no child to reach
    assert module.call_twice(spy, tokens).shape == (1, 3, 11) and len(spy.calls) == 4


def test_a_grader_object_never_crosses_with_a_counted_model(connected):
    """The submission's process holds no handle to an object of the grader's: the grader handed out nothing,
    and every handle the submission's process holds names an object of its own or of the double host."""
    grader, student, _ = connected
    module = grader.request("import", None, name=MODULE)
    cfg = Config(d_model=4, d_vocab=11, n_ctx=8, d_head=4, d_mlp=4, n_heads=1, n_layers=1)
    spy = counted(made_beside(module, NeverEOSModel, cfg, 5))
    module.call_and_hide(spy, torch.tensor([[3, 1, 4]]))
    assert grader._exports == {}, "the grader handed the submission an object"
    held = [v for v in student._proxies.values() if isinstance(v, RemoteObject)]
    assert held == [], f"the submission's process holds handles to the grader's objects: {held}"
    through_host = [v for v in student.host._proxies.values() if isinstance(v, RemoteObject)]
    assert through_host and all(v._endpoint() is student.host for v in through_host)


def test_a_host_object_is_handed_only_to_the_process_it_was_made_for(connected):
    """A handle to an object of the double host that was not made for the submission is not handed on."""
    grader, _, to_host = connected
    module = grader.request("import", None, name=MODULE)
    elsewhere = to_host.request("import", None, name="sampling_course.counted_model")
    with pytest.raises(TypeError, match="made for"):
        module.records(elsewhere)


def test_a_shipped_tokenizer_is_made_again_by_name_where_it_is_sent(connected):
    """The grader's tokenizer, when it is a shipped one (wherever its files are), reaches the submission's code
    as a tokenizer of its own process, made from the name (one per name); one with anything added is not shipped."""
    grader, student, _ = connected
    module = grader.request("import", None, name=MODULE)
    ours = Tokenizer(TOKENIZER_DIR)
    assert module.tokenizers_seen(ours, ours) == [True, True, ours.encode("hello world")]
    assert grader._exports == {} and isinstance(student.by_name["tiny"], Tokenizer)
    changed = Tokenizer(TOKENIZER_DIR)
    changed.extra = 1
    assert module.tokenizers_seen(changed, ours)[:2] == [False, False]  # a handle to the grader's, as before


def test_gpt2s_tokenizer_is_made_again_by_name_where_it_is_sent(connected, tmp_path, monkeypatch):
    """With GPT-2 small cached, the grader's GPT-2 tokenizer (a stand-in here: the story tokenizer and one more
    token) crosses by name too, and the submission's side makes its own from its folder; without it cached, the
    same tokenizer is no shipped one."""
    folder = fake_gpt2_cache(tmp_path)
    ours = Tokenizer(folder)
    assert shipped_name(ours) is None  # GPT-2 is not cached here yet
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert shipped_name(ours) == "gpt2" and shipped_name(Tokenizer(TOKENIZER_DIR)) == "tiny"
    grader, student, _ = connected
    module = grader.request("import", None, name=MODULE)
    seen = module.tokenizers_seen(ours, ours)
    assert seen[:2] == [True, True] and seen[2] == ours.encode("hello world")
    theirs = student.by_name["gpt2"]
    assert isinstance(theirs, Tokenizer) and theirs is not ours and theirs.encode(ADDED_TOKEN) == ours.encode(ADDED_TOKEN)
    assert len(ours.encode(ADDED_TOKEN)) == 1 and grader._exports == {}


def test_made_beside_makes_only_the_runtimes_objects():
    """Here (an object of this process) ``made_beside`` and ``made_apart`` are plain calls; a factory outside the
    course's runtime is refused."""
    here = types.ModuleType("here")
    assert isinstance(made_beside(here, ScriptedStep, [1]), ScriptedStep)
    for factory in (dict, Path, _try):
        with pytest.raises(ValueError, match="sampling_course"):
            made_beside(here, factory)
        with pytest.raises(ValueError, match="sampling_course"):
            made_apart(here, factory)
    step = ScriptedStep([1])
    wrapped = made_apart(step, CountedCall)  # an object of this process: wrapped here
    assert isinstance(wrapped, CountedCall) and (wrapped(), wrapped.calls) == (step.out, 1)


def test_a_call_answered_after_its_time_limit_leaves_the_connection_to_a_fresh_process(grader):
    """A call that answers only after the time limit interrupted it fails as too long, and its connection is
    retired: its side may be out of step, so the next test gets a fresh process (a later exercise never pays)."""
    from sampling_course.grading.time_limit import TookTooLong

    module = grader.request("import", None, name=MODULE)

    def interrupt(endpoint):  # what the grader does when a call runs out of time (here nothing can be signalled)
        endpoint.interrupted, endpoint.allowance = True, 10.0

    grader.on_wait, grader.allowance = interrupt, 0.05
    with pytest.raises(TookTooLong):
        module.slow()
    assert not grader.alive
