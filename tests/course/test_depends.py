"""What a verdict of ``progress`` depends on: every file that can change its tests' outcome, and little more."""

from __future__ import annotations

import importlib
import sys

import pytest

from sampling_course.grading.course import get_exercise
from sampling_course.grading.depends import RootRecorder, file_imports, import_closure
from sampling_course.grading.results import DONE
from sampling_course.grading.runner import run_report
from sampling_course.grading.verdicts import VerdictStore


def closure(sources: dict[str, str], *roots: str) -> set[str] | None:
    found = import_closure("pkg", {f"pkg.{r}" for r in roots}, {k: v.encode() for k, v in sources.items()})
    return None if found is None else {f for f, there in found.items() if there}


def test_an_import_inside_a_function_and_what_it_imports_count():
    sources = {"__init__.py": "", "model.py": "def run():\n    from .helper import h\n    return h()\n",
               "helper.py": "from . import table\n", "table.py": "ROWS = 3\n", "other.py": "X = 1\n"}
    assert closure(sources, "model") == {"__init__.py", "model.py", "helper.py", "table.py"}
    assert closure(sources, "other") == {"__init__.py", "other.py"}


def test_a_module_asked_for_but_absent_is_kept_as_absent():
    found = import_closure("pkg", {"pkg.model"}, {"__init__.py": b"", "model.py": b"from .later import f\n"})
    assert found == {"__init__.py": True, "model.py": True, "later.py": False, "later/__init__.py": False}


@pytest.mark.parametrize("source", [
    "import importlib\n", "from importlib import import_module\n", "m = __import__('pkg.x')\n",
    "import sys\nm = sys.modules['pkg.' + name]\n", "from sys import modules\n", "import pkg.other\n",
    "from .other import *\n", "exec(code)\n", "def f(:\n",
])
def test_a_module_chosen_at_run_time_means_every_file(source):
    assert closure({"__init__.py": "", "model.py": source, "other.py": ""}, "model") is None


def test_the_module_of_an_objects_class_and_model_eval_are_not_dynamic():
    source = ("import sys\ndef f(model, cache):\n    model.eval()\n"
              "    c = getattr(sys.modules.get(type(model).__module__), 'Cache', None)\n"
              "    return sys.modules[type(cache).__module__]\n")
    assert file_imports("pkg", "pkg.model", source.encode()) == set()


def test_requests_of_a_loaded_module_count_for_the_test_file_that_makes_them(tmp_path, monkeypatch):
    (tmp_path / "recpkg").mkdir()
    (tmp_path / "recpkg" / "__init__.py").write_text("")
    (tmp_path / "recpkg" / "a.py").write_text("A = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    recorder = RootRecorder("recpkg")
    try:
        with recorder.recording():  # as the runner does: None between two tests
            recorder.enter(None)
            recorder.enter("test_one.py")
            importlib.import_module("recpkg.a")
            recorder.enter(None)
            recorder.enter("test_two.py")
            importlib.import_module("recpkg.a")  # loaded already: asked for all the same
            recorder.enter(None)
            recorder.enter("test_three.py")
            from recpkg import a  # noqa: F401
            recorder.enter(None)
            recorder.enter("test_four.py")
            recorder.enter(None)
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "recpkg"]:
            del sys.modules[name]
    for file in ("test_one.py", "test_two.py", "test_three.py"):
        assert "recpkg.a" in recorder.roots({file})
    assert "recpkg.a" not in recorder.roots({"test_four.py"})  # nor outside the tests


def test_verdicts_depend_on_what_their_tests_reach_not_on_what_ran_before_them(tmp_path):
    # Part 8's index runs first in this session, so token_index was imported before part 9's and part 11's
    # tests ran: the former rule (every module imported by then) made them depend on it.
    report = run_report(["build_index", "masked_forward", "LlamaTransformer", "quantise_int8"], "solutions",
                        diagnose=False)
    assert [r.status for r in report.results] == [DONE] * 4, [(r.name, r.message) for r in report.results]
    depends = report.imported
    assert "token_index.py" in depends["build_index"]
    assert "token_index.py" not in depends["LlamaTransformer"]
    assert "token_index.py" not in depends["quantise_int8"]
    assert "transformer.py" in depends["masked_forward"]  # part 5 runs the learner's part-1 model
    # And so, stored, then read back after an edit:
    digests = {f: "0" * 64 for names in depends.values() for f in names}
    store = VerdictStore("k", digests, tmp_path)
    for r in report.results:
        store.put(r, depends[r.name])

    def reused(edited: str) -> set[str]:
        after = VerdictStore("k", {**digests, edited: "1" * 64}, tmp_path)
        return {r.name for r in report.results if after.get(get_exercise(r.name)) is not None}

    assert reused("token_index.py") == {"masked_forward", "LlamaTransformer", "quantise_int8"}
    assert reused("transformer.py") == {"build_index", "quantise_int8"}
