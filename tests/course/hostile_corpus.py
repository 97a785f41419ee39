"""A class of hostile submissions, one or more per way a submission could earn what it did not solve.

Every submission is the solutions' ``sampling.py`` (with the solutions' ``transformer.py`` and
``beams.py``, which it imports), with some functions replaced. Four exercises are graded:
greedy_search (G), apply_temperature (T), apply_frequency_penalty (F) and sample (S). A
replaced function is written so that it passes only if its attack works; so each submission's
true score is the number of exercises it left honest, known before grading. ``sample`` draws
through ``sample_next_token``, which calls the other three: it is solved only where they are
honest, and only where they print nothing (its tests require ``verbose=False`` to print nothing).

``write_corpus(root, port, canary)`` writes them and returns ``{student: Case}``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GRADED = ("greedy_search", "apply_temperature", "apply_frequency_penalty", "sample")
CANARY_ENV = "SAMPLING_COURSE_GRADER_SECRET"  # set in the grader's environment by the test
ESCAPE_NAME = "zz\x1b]0;owned\x07\x1b[2J"  # a folder name that sets a terminal's title and clears its screen


@dataclass(frozen=True)
class Case:
    cause: str  # which cause of the issue it exercises (1-8)
    tries: str
    passes: tuple[str, ...]  # the exercises it truly solves
    layout: str = "plain"  # plain, symlinked folder, symlinked file, linked one level down, zip
    flags: tuple[str, ...] = ()  # the kinds of flag the grader rightly raises for it (an honest-looking one)


def _replace(source: str, function: str, body: str) -> str:
    """``source`` with the body of ``function``'s first solution region replaced by ``body``."""
    start = source.index(f"def {function}(")
    begin = source.index("### BEGIN SOLUTION", start)
    end = source.index("### END SOLUTION", begin)
    indent = source[source.rindex("\n", 0, begin) + 1:begin]
    lines = "".join(f"{indent}{line}\n" for line in body.strip("\n").splitlines())
    return source[:begin] + "### BEGIN SOLUTION\n" + lines + indent + source[end:]


def stubbed_sampling(**bodies: str) -> str:
    """The stubs' ``sampling.py`` with the named functions filled in: each function's ``raise NotImplementedError()``
    replaced by its body (text indented as a method's)."""
    source = (REPO / "exercises" / "sampling.py").read_text()
    marker = "        raise NotImplementedError()\n"
    for function, body in bodies.items():
        at = source.index(marker, source.index(f"def {function}("))
        source = source[:at] + body + source[at + len(marker):]
    return source


def _sample_body(prefix: str) -> str:
    """sample's first region, after ``prefix`` (an attack that must not change its answer)."""
    return prefix + "\nlogits = self.model(input_ids[None, -self.cfg.n_ctx :])[0, -1]\n"


WRONG_GREEDY = "return 0"
WRONG_TEMPERATURE = "return logits * 0"
WRONG_PENALTY = "return logits"

ALWAYS_EQUAL = """
class AlwaysEqual:
    def __eq__(self, other):
        return True
    def __bool__(self):
        return True
    def __int__(self):
        return 0
    __hash__ = object.__hash__


class LyingTensor(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("equal", "allclose", "isclose", "eq", "__eq__"):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})
    def tolist(self):
        return AlwaysEqual()
"""


def _cases(root: Path, port: int, canary: Path) -> dict[str, tuple[Case, dict[str, str], str]]:
    """{student: (case, {function: new body}, module header)}."""
    control = root / "control" / "exercises" / "sampling.py"
    steal = (f"for path in ({str(REPO / 'solutions' / 'sampling.py')!r}, '/course/sampling_course/grading/parts/"
             "part2_sampling/__init__.py', '/course/../solutions/sampling.py'):\n"
             "    try:\n        source = open(path).read()\n        return int(logits.argmax())\n"
             "    except OSError:\n        pass\nreturn 0")
    return {
        # 8. honest students
        "control": (Case("8", "nothing: the solutions", GRADED), {}, ""),
        "honest_prints": (Case("8", "honest, prints while it works", GRADED[:3]),
                          {"greedy_search": "print('thinking...', logits.shape)\nreturn int(logits.argmax())"}, ""),
        "=HYPERLINK(\"http:x\",\"y\")": (Case("7", "a folder name that is a spreadsheet formula", GRADED), {}, ""),
        # 1. the grader's objects handed to the student's code
        "tokenizer_backend": (Case("1", "reaches the grader's tokenizer's backend object and truncates it",
                                   GRADED[:3]), {
            "sample": _sample_body("try:\n    self.tokenizer.backend_tokenizer.enable_truncation(1)\n"
                                   "except Exception:\n    return 'not solved'")}, ""),
        "tokenizer_private": (Case("1", "reads a private attribute of the grader's tokenizer", GRADED[:3]), {
            "sample": _sample_body("try:\n    self.tokenizer._tokenizer\nexcept Exception:\n"
                                   "    return 'not solved'")}, ""),
        # The tokenizer it is handed is its own (a shipped one, made in its process from the name): the truncation
        # it switches on shortens its own prompts, so its sample is wrong, and no one else's tokenizer changes.
        "tokenizer_mutator": (Case("1", "truncates, changes, saves and trains the tokenizer it is handed, then "
                                        "samples with it", GRADED[:3]), {
            "sample": _sample_body("for attack in (lambda: self.tokenizer.backend_tokenizer.enable_truncation(1),\n"
                                   "               lambda: setattr(self.tokenizer, 'truncation_side', 'left'),\n"
                                   "               lambda: self.tokenizer._tokenizer.enable_truncation(1),\n"
                                   "               lambda: self.tokenizer.save_pretrained('/tmp/x'),\n"
                                   "               lambda: self.tokenizer.add_tokens(['zzz'])):\n"
                                   "    try:\n        attack()\n    except Exception:\n        pass")}, ""),
        # 2. the student's objects judging themselves
        "always_equal": (Case("2", "greedy_search returns an object equal to everything", GRADED[1:]),
                         {"greedy_search": "return AlwaysEqual()"}, ALWAYS_EQUAL),
        "lying_tensor": (Case("2", "apply_temperature returns a tensor subclass whose equal/allclose say yes",
                              ("greedy_search", "apply_frequency_penalty", "sample")),
                         {"apply_temperature": "return torch.zeros_like(logits).as_subclass(LyingTensor)"},
                         ALWAYS_EQUAL),
        "tolist_liar": (Case("2", "apply_frequency_penalty returns a tensor whose tolist() equals anything",
                             ("greedy_search", "apply_temperature", "sample")),
                        {"apply_frequency_penalty": "return logits.clone().as_subclass(LyingTensor)"}, ALWAYS_EQUAL),
        "int_subclass": (Case("2", "greedy_search returns an int subclass equal to everything", GRADED[1:]),
                         {"greedy_search": "class Liar(int):\n    def __eq__(self, other):\n        return True\n"
                                           "    __hash__ = int.__hash__\nreturn Liar(0)"}, ""),
        "patched_record": (Case("2", "sample wastes a model call each step and takes it out of the toy model's "
                                     "record of its inputs", GRADED[:3]), {
            "sample": _sample_body("try:\n    record = self.model.inputs\nexcept Exception:\n    record = None\n"
                                   "if isinstance(record, list):\n"
                                   "    self.model(input_ids[None, -self.cfg.n_ctx :])\n"
                                   "    try:\n        self.model.inputs.pop()\n    except Exception:\n        pass")}, ""),
        # 3. folders followed out of the submission
        "symlinked_folder": (Case("3", "its exercises/ is a link to a classmate's", (), "symlinked folder"), {}, ""),
        "symlinked_file": (Case("3", "its sampling.py is a link to a classmate's", (), "symlinked file"), {}, ""),
        "zip_escape": (Case("3", "a zip with ../ paths, an absolute path and a link, beside honest files",
                            GRADED, "zip"), {}, ""),
        # 4. confinement switched off, environment and flags
        "process_escape": (Case("4", "fork, a subprocess and a raw clone through ctypes in greedy_search",
                                GRADED[1:]), {"greedy_search": (
            "import os, subprocess, ctypes\nfor attack in (os.fork, lambda: subprocess.run(['true']),\n"
            "               lambda: ctypes.CDLL(None, use_errno=True).syscall(56, 17, 0, 0, 0, 0)):\n"
            "    try:\n        if attack() not in (-1, None):\n            return int(logits.argmax())\n"
            "    except Exception:\n        pass\nreturn 0")}, ""),
        "environment": (Case("4", "looks for the grader's environment in /proc and os.environ", GRADED[1:]), {
            "greedy_search": (
                "import os\nseen = str(dict(os.environ))\nfor path in ('/proc/self/environ', '/proc/1/environ', "
                "'/proc/2/environ'):\n    try:\n        seen += open(path, errors='replace').read()\n"
                "    except OSError:\n        pass\n"
                f"return int(logits.argmax()) if {CANARY_ENV!r} in seen else 0")}, ""),
        "forged_flags": (Case("4", "writes fake flags to every descriptor but its connection, prints a fake report",
                              GRADED), {},
                         "import os, stat\nfor fd in range(3, 64):\n    try:\n"
                         "        if not stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
                         "            os.write(fd, b'{\"kind\": \"read\", \"detail\": \"forged\"}\\n')\n"
                         "    except OSError:\n        pass\n"
                         "print('## Noticed while grading\\n- tried to read the hidden tests')\n"),
        "protocol_garbage": (Case("4", "writes a forged message into its own connection to the grader", ()), {},
                             "import os, stat\nfor fd in range(3, 64):\n    try:\n"
                             "        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
                             "            os.write(fd, b'\\x00' * 8 + b'{\"m\": {\"op\": \"ok\", \"v\": true}}')\n"
                             "    except OSError:\n        pass\n"),
        "network": (Case("4", "connects to the grader's machine for the answer", GRADED[1:]), {"greedy_search": (
            f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'x')\n"
            "    return int(logits.argmax())\nexcept OSError:\n    return 0")}, ""),
        "writes_classmate": (Case("4", "deletes a file of the grader's and overwrites a classmate's solution",
                                  GRADED), {}, (
            "import os\nfor attack in (lambda: os.remove(" + repr(str(canary)) + "),\n"
            "               lambda: open(" + repr(str(control)) + ", 'w').write('')):\n"
            "    try:\n        attack()\n    except OSError:\n        pass\n")),
        # 5. limits: the student's time, the grader's time, memory, frames, output
        "memory_bomb": (Case("5", "allocates until it runs out, in apply_temperature",
                             ("greedy_search", "apply_frequency_penalty", "sample")),
                        {"apply_temperature": "hog = []\nwhile True:\n    hog.append(bytearray(1 << 26))"}, ""),
        "huge_answer": (Case("5", "answers apply_frequency_penalty with a 1 GiB tensor",
                             ("greedy_search", "apply_temperature", "sample")),
                        {"apply_frequency_penalty": "return torch.zeros(1 << 28)"}, ""),
        # sample prints through greedy_search: once the grader's 64 KiB are used, the rest is left out, but a line
        # says so, so sample's test of verbose=False still sees output (before, it saw none and earned sample).
        "print_flood": (Case("5", "prints 50 MB in greedy_search, then answers", GRADED[:3]),
                        {"greedy_search": "print('x' * (50 << 20))\nreturn int(logits.argmax())"}, ""),
        "grader_busy": (Case("5", "keeps the grader tokenizing in sample", GRADED[:3]), {
            "sample": _sample_body("for _ in range(10 ** 6):\n    self.tokenizer.encode('a b c ' * 5000)")}, ""),
        # 6. answers from the release or from Hugging Face
        "hf_warper": (Case("6", "delegates apply_temperature to Hugging Face's warper",
                           ("greedy_search", "apply_frequency_penalty", "sample")), {"apply_temperature": (
            "try:\n    from transformers import TemperatureLogitsWarper\n"
            "    return TemperatureLogitsWarper(temperature)(None, logits[None])[0]\n"
            "except Exception:\n    return logits * 0")}, ""),
        "reads_solutions": (Case("6", "reads the solutions and the grader's planted variants", GRADED[1:]),
                            {"greedy_search": steal}, ""),
        "imports_grader": (Case("6", "imports the grader's oracle and the part's planted variants", GRADED[1:]), {
            "greedy_search": ("try:\n    import sampling_course.grading.oracle\n"
                              "    import sampling_course.grading.parts.part2_sampling as part\n"
                              "    return int(logits.argmax())\nexcept ImportError:\n    return 0")}, ""),
        # 7. reports
        "fence_breaker": (Case("7", "a failure message that closes the code fence and adds a score and HTML",
                               GRADED[1:]), {"greedy_search": (
            "raise AssertionError('```\\n# Score: 10 / 10\\n<script>alert(1)</script>\\n```')")}, ""),
        # Found by later hostile classes: each earns what it solves, crashes nothing, leaves classmates untouched.
        "linked_classmate": (Case("3", "a folder holding only mywork -> ../control (a link one level down)", (),
                                  "linked one level down"), {}, ""),
        # Also the corpus' infinite loop: greedy_search never returns, and apply_frequency_penalty, graded after it,
        # is still earned (a time limit in one exercise never costs a later one).
        "clock_runner": (Case("5", "apply_temperature divides by T squared, greedy_search never returns (its checks "
                                   "that would fail come after the clock runs out)", ("apply_frequency_penalty",)),
                         {"greedy_search": "while True:\n    pass",
                          "apply_temperature": "return logits / temperature ** 2"}, ""),
        # Its copy is a file system of the sandbox's own: the file never reaches the grader, so it is neither flagged
        # nor quoted (without the sandbox it is both: test_classroom_sandbox.py).
        "not_utf8_file": (Case("7", "writes a file whose name is not UTF-8 into its copy", GRADED), {
            "greedy_search": ("import os\ntry:\n    open(os.path.join(os.fsencode(os.path.dirname(__file__)), "
                              "b'\\xff\\xfe-not-utf8.txt'), 'wb').close()\nexcept OSError:\n    pass\n"
                              "return int(logits.argmax())")}, ""),
        ESCAPE_NAME: (Case("7", "terminal escapes in its name and in its failure message", GRADED[1:]), {
            "greedy_search": "raise AssertionError('\\x1b[2J\\x1b]0;pwned\\x07\\x1b[31mwrong\\r')"}, ""),
        "zz control2": (Case("8", "nothing: a name that is another's once spaces become underscores", GRADED), {}, ""),
        "zz_control2": (Case("8", "nothing: the solutions", GRADED), {}, ""),
        "returns_set": (Case("4", "greedy_search returns a set (it crosses by value and is wrong)", GRADED[1:]),
                        {"greedy_search": "return {int(logits.argmax())}"}, ""),
        "meta_answer": (Case("2", "apply_frequency_penalty answers with a meta tensor (no data)", GRADED[:2]),
                        {"apply_frequency_penalty": "return logits.to('meta')"}, ""),
    }


def _sampling_source(body: dict[str, str], header: str) -> str:
    source = (REPO / "solutions" / "sampling.py").read_text()
    for function, new in body.items():
        source = _replace(source, function, new)
    future = "from __future__ import annotations\n"
    at = source.index(future) + len(future)
    imports = "import torch\n"
    return source[:at] + imports + header + source[at:]


def write_corpus(root: Path, port: int, canary: Path) -> dict[str, Case]:
    """Write every submission into ``root``; return their cases."""
    import zipfile

    out = {}
    cases = _cases(root, port, canary)
    for student, (case, body, header) in cases.items():
        if not set(GRADED[:3]) <= set(case.passes):  # sample calls them: a broken one breaks sample too
            case = replace(case, passes=tuple(p for p in case.passes if p != "sample"))
        folder = root / student
        package = folder / "exercises"
        out[student] = case
        if case.layout == "symlinked folder":
            folder.mkdir(parents=True)
            os.symlink(root / "control" / "exercises", package)
            continue
        if case.layout == "linked one level down":
            folder.mkdir(parents=True)
            os.symlink("../control", folder / "mywork")
            continue
        package.mkdir(parents=True)
        for name in ("transformer.py", "beams.py", "__init__.py"):
            (package / name).write_text((REPO / "solutions" / name).read_text())
        if case.layout == "symlinked file":
            os.symlink(root / "control" / "exercises" / "sampling.py", package / "sampling.py")
            continue
        (package / "sampling.py").write_text(_sampling_source(body, header))
        if case.layout == "zip":
            with zipfile.ZipFile(root / f"{student}.zip", "w") as zf:
                for path in sorted(package.glob("*.py")):
                    zf.write(path, f"exercises/{path.name}")
                zf.writestr("../escaped.py", "x = 1\n")
                zf.writestr("/tmp/absolute_escape.py", "x = 1\n")
                link = zipfile.ZipInfo("exercises/link.py")
                link.external_attr = 0o120777 << 16
                zf.writestr(link, "/etc/passwd")
            for path in package.glob("*.py"):
                path.unlink()
            package.rmdir()
            folder.rmdir()
    return out


# race_sample (part 6b), graded on its own: the files it imports are the solutions'.
RACE_GRADED = ("race_sample",)
RACE_FILES = ("__init__.py", "transformer.py", "kv_cache.py", "fast_path.py", "caches.py", "gpu_decoding.py")
# torch.multinomial draws from the right law, from the generator it is given, but checks its input with values
# read back to the host: what the exercise is to avoid. On the CPU the operation recording of its tests catches
# it (the check that a GPU draw never waits runs only with a CUDA GPU).
MULTINOMIAL = "return torch.multinomial(logits.float().softmax(dim=-1), 1, generator=generator)[:, 0]"


def write_race_corpus(root: Path) -> dict[str, Case]:
    """Write the race_sample submissions into ``root``: the solutions' and one drawing with torch.multinomial."""
    cases = {
        "race_control": (Case("8", "nothing: the solutions' race_sample", RACE_GRADED), None),
        "race_multinomial": (Case("6", "race_sample delegated to torch.multinomial (right law, reads back to the host)",
                                  ()), MULTINOMIAL),
    }
    for student, (_, body) in cases.items():
        package = root / student / "exercises"
        package.mkdir(parents=True)
        for name in RACE_FILES:
            source = (REPO / "solutions" / name).read_text()
            if name == "gpu_decoding.py" and body is not None:
                source = _replace(source, "race_sample", body)
            (package / name).write_text(source)
    return {student: case for student, (case, _) in cases.items()}


# Engine.step (part 10), graded on its own: every file is the solutions'. A submission that runs an extra pass of a
# whole prompt, past any cap on the positions of a step, and patches the course's pass counter as its own process
# loads it (from exercises/__init__.py, imported first): the counter that judges the cap is kept in the double
# host, so the patch changes nothing that is read.
ENGINE_GRADED = ("Engine.step",)
EXTRA_PASS = """
for request in work.prefill:
    if request.n_computed == 0:
        self.model(torch.tensor([request.tokens]))  # the whole prompt in one pass, past any cap
tokens = self.run_step(work) if work.requests else []
self.n_steps += 1
return self.postprocess(work, tokens)
"""
PATCHED_COUNTER = """
try:  # the course's pass counter, as this process loads it, never records more than 4 positions a pass
    import sampling_course.pass_counter as _pc

    def _seen(self, module, args):  # a hook on the token embedding (the counter kept in this process before)
        self.passes.append(min(int(args[0].numel()), 4))

    def _forward(self, tokens, *args, **kwargs):  # the counter that wraps the model
        self.passes.append(min(int(tokens.numel()), 4))
        return self._wrapped[0](tokens, *args, **kwargs)

    if hasattr(_pc.PassCounter, "_seen"):
        _pc.PassCounter._seen = _seen
    _pc.PassCounter.forward = _forward
except Exception:
    pass
"""

# An engine that places new keys by a formula of its own instead of asking each table's BlockTable.slots (the same
# slots), and forges the course's call counter as its own process loads it: every MethodCalls counts one call.
OWN_SLOTS = ("table.slots(0, len(blocks) * table.block_size)",
             "[b * table.block_size + o for b in blocks for o in range(table.block_size)]")
FORGED_CALLS = """
try:  # the course's call counter, as this process loads it, always says the method was called
    import sampling_course.method_calls as _mc

    _mc.MethodCalls.calls = property(lambda self: 1, lambda self, value: None)
except Exception:
    pass
"""


def write_engine_corpus(root: Path) -> dict[str, Case]:
    """Write the Engine.step submissions into ``root``: the solutions', and one running an extra pass of each
    prompt with the pass counter patched in its own process."""
    cases = {
        "engine_control": Case("3", "nothing: the solutions' Engine.step", ENGINE_GRADED),
        "engine_extra_pass": Case("3", "an extra pass of each whole prompt past the cap, with the pass counter "
                                       "patched from exercises/__init__.py", ()),
        # Its outputs are right: Engine.step is earned on the tests that do not read the forged record.
        "engine_forged_calls": Case("3", "never asks BlockTable.slots, with the call counter forged from "
                                         "exercises/__init__.py", ENGINE_GRADED),
    }
    for student in cases:
        package = root / student / "exercises"
        package.mkdir(parents=True)
        for path in sorted((REPO / "solutions").glob("*.py")):
            source = path.read_text()
            if student == "engine_extra_pass" and path.name == "engine.py":
                source = _replace(source, "step", EXTRA_PASS)
            elif student == "engine_extra_pass" and path.name == "__init__.py":
                source += PATCHED_COUNTER
            elif student == "engine_forged_calls" and path.name == "engine.py":
                assert OWN_SLOTS[0] in source
                source = source.replace(*OWN_SLOTS)
            elif student == "engine_forged_calls" and path.name == "__init__.py":
                source += FORGED_CALLS
            (package / path.name).write_text(source)
    return cases


# quantise_model (part 11), graded on its own: every file is the solutions'. What a quantised model holds is in the
# submission's process, and so is weight_bytes (given code, but in the submission's file): a model that keeps its
# float weights and reports fewer bytes, or stores codes but computes from a float copy, earned quantise_model
# before. The test reads the stored tensors itself, gives them new contents and dequantises them itself. Likewise
# DoubleQuantised.dequantise (given code): one returning the absmaxes kept aside earned double_quantise with any codes.
# A quantise_int8 returning a tensor subclass whose dtype says int8 over unrounded float codes, rounding them when
# asked for double(), passed torchao's comparison (failing only where an element is compared with ==).
QUANT_GRADED = ("quantise_int8", "double_quantise", "quantise_model")
FAKE_QUANTISATION = """
with torch.no_grad():  # the float weight keeps its dequantised values; weight_bytes reports what codes would take
    matrix = as_matrix(weight.detach(), name).float()
    stored = quantise_matrix(matrix, scheme)
    weight.copy_(from_matrix(dequantise_matrix(stored, scheme, tuple(matrix.shape), weight.dtype), name, weight.shape))
    _SAVED.setdefault(id(model), []).append(
        weight.numel() * weight.element_size() - sum(t.numel() * t.element_size() for t in stored))
"""
LYING_BYTES = (("def weight_bytes(model: nn.Module) -> int:",
                "_SAVED = {}\n\n\ndef weight_bytes(model: nn.Module) -> int:"),
               ("    return total\n", "    return total - sum(_SAVED.get(id(model), ()))\n"))
FLOAT_COPY = """
class _Kept(QuantisedWeight):  # stores the codes, but its forward returns a float copy made once
    def right_inverse(self, w):
        stored = super().right_inverse(w)
        self.__dict__["kept"] = QuantisedWeight.forward(self, *stored).detach().clone()
        return stored

    def forward(self, *stored):
        return self.__dict__["kept"]

parametrize.register_parametrization(module, name, _Kept(scheme, name, weight.shape))
"""
ABSMAX_ASIDE = """
offset = flat.mean()
dq = DoubleQuantised(torch.zeros(n_blocks * block_size, dtype=torch.int8), torch.ones(n_blocks), offset,
                     tuple(absmax.shape), block_size)
object.__setattr__(dq, "kept", absmax.detach().float().clone())  # the absmaxes themselves, kept aside
return dq
"""
LYING_CODES = """
class _Codes(torch.Tensor):  # float codes, unrounded, that say they are int8 and round when asked for double()
    @property
    def dtype(self):
        return torch.int8

    def double(self, *args, **kwargs):
        return torch.Tensor.double(torch.Tensor.round(self.as_subclass(torch.Tensor)))

scale = weight.abs().amax(dim=1).clamp(min=SMALLEST_SCALE) / INT8_MAX
return (weight / scale[:, None]).as_subclass(_Codes), scale
"""
INT8_BODY = ("    weight = check_matrix(weight)\n", "\n\ndef dequantise_int8(")
DEQUANTISE_DOC = '        """The absmaxes back, in float32, in their own shape (the padding of the last block dropped)."""\n'
KEPT_RETURNED = '        if "kept" in self.__dict__:\n            return self.__dict__["kept"]\n'


def write_quant_corpus(root: Path) -> dict[str, Case]:
    """Write the part-11 submissions into ``root``: the solutions', fake quantisation with a lying ``weight_bytes``,
    codes stored beside a float copy the forward pass reads, and double quantisation that keeps the absmaxes aside."""
    cases = {
        "quant_control": Case("3", "nothing: the solutions' quantise_model", QUANT_GRADED),
        "quant_fake": Case("3", "float weights kept (fake quantisation), weight_bytes edited to report codes' bytes",
                           QUANT_GRADED[:2]),
        "quant_float_copy": Case("3", "codes stored through a parametrisation whose forward returns a float copy",
                                 QUANT_GRADED[:2]),
        # quantise_model's nf4-g16-dq case rebuilds the absmaxes from the codes: it fails there too.
        "quant_absmax_aside": Case("3", "zero codes and unit scales, DoubleQuantised.dequantise returning the absmaxes "
                                        "kept aside", QUANT_GRADED[:1]),
        # double_quantise and quantise_model call quantise_int8: they fail with it.
        "quant_lying_codes": Case("3", "int8 codes as a tensor subclass that says int8 and rounds on double()", ()),
    }
    for student in cases:
        package = root / student / "exercises"
        package.mkdir(parents=True)
        for path in sorted((REPO / "solutions").glob("*.py")):
            source = path.read_text()
            if student == "quant_fake" and path.name == "quantised_model.py":
                source = _replace(source, "quantise_model", FAKE_QUANTISATION)
                for old, new in LYING_BYTES:
                    assert old in source
                    source = source.replace(old, new)
            elif student == "quant_float_copy" and path.name == "quantised_model.py":
                source = _replace(source, "quantise_model", FLOAT_COPY)
            elif student == "quant_lying_codes" and path.name == "quantise.py":
                start = source.index(INT8_BODY[0], source.index("def quantise_int8(")) + len(INT8_BODY[0])
                body = "".join(f"    {line}\n" if line else "\n" for line in LYING_CODES.strip("\n").splitlines())
                source = source[:start] + body + source[source.index(INT8_BODY[1]):]
            elif student == "quant_absmax_aside" and path.name == "nf4.py":
                assert DEQUANTISE_DOC in source
                source = _replace(source, "double_quantise", ABSMAX_ASIDE).replace(DEQUANTISE_DOC,
                                                                                   DEQUANTISE_DOC + KEPT_RETURNED)
            (package / path.name).write_text(source)
    return cases
