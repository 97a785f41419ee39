"""Class grading, the quick part: release, settings, the wire, and a six-student synthetic class.

The six students are built from the planted mistakes and correct variants
(``grading.classroom.synthetic``), so their true grades are known before grading; grading
them (two at a time, in a process pool) runs each in a confined process and must reproduce
every grade. The 200-student class, the hostile submissions, Dask and the Gradescope bundle
are in ``test_classroom_slow.py`` (``python -m pytest -m classroom``).
"""

from __future__ import annotations

import ast
import csv
import json
import socket
import tomllib
from pathlib import Path

import pytest
import torch

from sampling_course.grading.classroom import wire
from sampling_course.grading.classroom.executors import grade_all
from sampling_course.grading.classroom.release import file_is_hidden, make_release, strip_hidden
from sampling_course.grading.classroom.gradescope import gradescope_results
from sampling_course.grading.classroom.reports import feedback_text, safe_name, write_reports
from sampling_course.grading.classroom.settings import Points, load_settings
from sampling_course.grading.classroom.submission import find_submissions
from sampling_course.grading.classroom.synthetic import make_class
from sampling_course.grading.course import get_exercise

REPO = Path(__file__).resolve().parents[2]

HIDDEN_TESTS = '''import pytest


@pytest.mark.exercise("apply_temperature")
def test_public():
    assert True


@pytest.mark.hidden
@pytest.mark.exercise("apply_temperature")
def test_secret_inputs():
    assert 1.2345 > 0


@pytest.mark.parametrize("x", [1, pytest.param(99, marks=pytest.mark.hidden), 3])
def test_cases(x):
    assert x


@pytest.mark.hidden
class TestHiddenClass:
    def test_a(self):
        assert True
'''


# ---------------------------------------------------------------------------------------
# Release
# ---------------------------------------------------------------------------------------


def test_strip_hidden_removes_hidden_tests_cases_and_classes():
    """Hidden functions, classes and pytest.param cases go; public tests and the rest stay."""
    stripped = strip_hidden(HIDDEN_TESTS)
    tree = ast.parse(stripped)
    names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert names == {"test_public", "test_cases"}
    assert "99" not in stripped and "1.2345" not in stripped and '"x", [1, 3]' in stripped
    assert "mark.hidden" not in stripped


def test_a_file_marked_hidden_is_left_out():
    """pytestmark = pytest.mark.hidden hides the whole file."""
    assert file_is_hidden(ast.parse("import pytest\npytestmark = [pytest.mark.hidden]\n"))
    assert strip_hidden("import pytest\npytestmark = pytest.mark.hidden\ndef test_x(): pass\n") is None
    assert not file_is_hidden(ast.parse("import pytest\npytestmark = pytest.mark.gpt2\n"))


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """One student release, made once for the tests that read it (making one takes seconds)."""
    out = tmp_path_factory.mktemp("release") / "release"
    make_release(out)
    return out


@pytest.mark.slow
def test_release_has_no_solutions_and_checks_the_exercises(release):
    """The release holds the stubs, the package and the grading tests; no solutions, no planted text."""
    out = release
    assert (out / "exercises" / "sampling.py").is_file() and (out / "tests" / "grading").is_dir()
    assert not (out / "solutions").exists() and not (out / "tests" / "course").exists()
    pyproject = tomllib.loads((out / "pyproject.toml").read_text())
    assert "--impl exercises" in pyproject["tool"]["pytest"]["ini_options"]["addopts"]
    assert "solutions*" not in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    part2 = (out / "sampling_course" / "grading" / "parts" / "part2_sampling" / "__init__.py").read_text()
    calls = {n.func.id for n in ast.walk(ast.parse(part2)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert not calls & {"Mistake", "Variant"} and "MISTAKES: list[Mistake] = []" in part2
    assert "return logits / temperature\n" not in part2  # a planted variant's text, copied from the solutions
    with pytest.raises(ValueError, match="not empty"):
        make_release(out)
    assert not list((out / "sampling_course" / "grading" / "parts").rglob("variants*.py"))
    assert not list((out / "sampling_course" / "grading" / "parts").rglob("mistakes*.py"))
    assert not list((out / "sampling_course" / "grading" / "parts").rglob("fixes*.py"))
    assert (out / "tests" / "doubles.py").is_file()  # the public tests import it
    # Every helper module a released test imports from the tests' folders is released beside it.
    helpers = {p.stem for folder in (REPO / "tests", REPO / "tests" / "grading") for p in folder.glob("*.py")}
    for test in (out / "tests" / "grading").glob("*.py"):
        for node in ast.walk(ast.parse(test.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in helpers:
                assert any((out / "tests" / folder / f"{node.module}.py").is_file() for folder in ("", "grading")), \
                    f"{test.name} imports {node.module}, which the release leaves out"


@pytest.mark.slow
def test_the_release_holds_no_level_three_hint_and_a_readme_for_students(release):
    """One rule for every exercise: its level-3 hint (which nearly spells out the code) is replaced, whatever its
    text; levels 1 and 2 stay. The README is written for students: no solutions, no instructor's commands."""
    from sampling_course.grading.classroom.release import LEVEL_THREE
    from sampling_course.grading.course import EXERCISES

    thirds, seconds = [], []
    for path in sorted((release / "sampling_course" / "grading" / "parts").glob("*/__init__.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "exercise":
                thirds.append(ast.literal_eval(node.args[7]))
                seconds.append(ast.literal_eval(node.args[6]))
    assert len(thirds) == len(EXERCISES) and set(thirds) == {LEVEL_THREE}
    assert seconds == [e.hints[1] for e in EXERCISES] or all(s != LEVEL_THREE for s in seconds)
    readme = (release / "README.md").read_text()
    assert "solutions" not in readme and "sampling-course demo" not in readme and "cp " not in readme
    assert "Python 3.11.5 or newer" in readme and "sampling-course check" in readme


def test_the_python_version_stated_is_one_every_pin_installs_on():
    """The Python version the README (the instructor's and the students') states satisfies the Requires-Python of
    every pinned distribution installed here (numpy 2.4.6 needs 3.11, soupsieve 4.1.2 3.11.5), and pyproject's
    requires-python floor is no higher."""
    import importlib.metadata
    import re

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from sampling_course.grading.classroom.release import STUDENT_README

    stated = {re.search(r"Python (3\.\d+(?:\.\d+)?) or newer", text).group(1)
              for text in ((REPO / "README.md").read_text(), STUDENT_README)}
    assert len(stated) == 1, stated
    (version,) = stated
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    floor = re.fullmatch(r">=\s*(3\.\d+(?:\.\d+)?)", pyproject["project"]["requires-python"].strip()).group(1)
    assert Version(floor) <= Version(version)
    refused = []
    for line in (REPO / "constraints.txt").read_text().splitlines():
        pin = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)", line)
        if not pin:
            continue
        try:
            meta = importlib.metadata.metadata(pin.group(1))
        except importlib.metadata.PackageNotFoundError:
            continue
        needs = meta.get("Requires-Python")
        if meta["Version"] == pin.group(2) and needs and not SpecifierSet(needs).contains(version):
            refused.append(f"{pin.group(1)}=={pin.group(2)} needs Python {needs}")
    assert not refused, f"the README says Python {version}, but " + "; ".join(refused)


def _regions_and_public() -> tuple[list[list[str]], set[str]]:
    """Each solution region as its stripped code lines, and the lines the stubs show (public)."""
    regions = []
    for path in sorted((REPO / "solutions").glob("*.py")):
        inside = None
        for line in path.read_text().splitlines():
            text = line.strip()
            if text.startswith("### BEGIN SOLUTION"):
                inside = []
            elif text.startswith("### END SOLUTION"):
                regions.append(inside)
                inside = None
            elif inside is not None and text and not text.startswith("#"):
                inside.append(text)
    public = {line.strip() for path in (REPO / "exercises").glob("*.py") for line in path.read_text().splitlines()}
    return [r for r in regions if r], public


def _leaks(release: Path) -> list[str]:
    """Where a whole solution region, or a line of one 25 characters or longer, appears in the release."""
    regions, public = _regions_and_public()
    found = []
    for path in sorted(p for p in release.rglob("*") if p.is_file() and p.suffix in (".py", ".ipynb", ".md", ".toml")):
        text = path.read_text()
        if path.suffix == ".ipynb":
            text = "\n".join("".join(cell["source"]) for cell in json.loads(text)["cells"])
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        joined, line_set = "\n".join(lines), set(lines)
        for region in regions:
            if "\n".join(region) in joined and "\n".join(region) not in public:
                found.append(f"{path.relative_to(release)}: {region[0]}")
            found += [f"{path.relative_to(release)}: {line}" for line in region
                      if len(line) >= 25 and line in line_set and line not in public]
    return found


@pytest.fixture(scope="module")
def release_leaks(release) -> list[str]:
    return _leaks(release)


@pytest.mark.slow
def test_no_text_of_a_solution_region_is_in_the_release(release_leaks):
    """Not a region, not a distinctive line of one, anywhere in the package, stubs, notebooks or README: the
    hints that spell out an answer are replaced, and planted mistakes and variants are left out."""
    leaks = [leak for leak in release_leaks if not leak.startswith("tests/grading/")]
    assert not leaks, "\n".join(leaks)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="three grading tests hold a reference computation written like the "
                                       "solution (part 6b's fused W_QKV, part 7's n-gram loop, part 8's automaton "
                                       "walk); a test cannot be scrubbed without changing it")
def test_no_text_of_a_solution_region_is_in_the_released_tests(release_leaks):
    leaks = [leak for leak in release_leaks if leak.startswith("tests/grading/")]
    assert not leaks, "\n".join(leaks)


# ---------------------------------------------------------------------------------------
# Settings and the wire
# ---------------------------------------------------------------------------------------


def test_settings_from_toml(tmp_path):
    """Points, partial credit and limits come from a small TOML file; mistakes in it are named."""
    config = tmp_path / "grading.toml"
    config.write_text('[grading]\nexercises = ["sample_top_p", "LayerNorm"]\nseconds_per_test = 5\n'
                      '[points]\nLayerNorm = 2\nsample_top_p = { points = 3, partial = true }\n')
    settings = load_settings(config)
    assert settings.exercises == ("LayerNorm", "sample_top_p")  # course order
    assert settings.points_of("LayerNorm") == Points(2.0) and settings.max_score == 5.0
    assert settings.points_of("sample_top_p").score(passed=3, ran=4, done=False) == pytest.approx(2.25)
    assert Points(2.0).score(passed=3, ran=4, done=False) == 0.0
    config.write_text("[grading]\nminutes = 3\n")
    with pytest.raises(ValueError, match="minutes"):
        load_settings(config)
    config.write_text("[points]\nLayerNrom = 2\n")
    with pytest.raises(ValueError, match="LayerNorm"):
        load_settings(config)


def test_a_test_the_grader_did_not_run_counts_as_not_passed():
    """A test left not run (a time limit reached before it) keeps its exercise from being done and counts in partial
    credit as not passed; a test that skipped itself (no GPU here) is not one of the exercise's tests."""
    from sampling_course.grading.results import TOOK_TOO_LONG, TestOutcome, summarize

    exercise = get_exercise("apply_temperature")
    outcome = lambda kind, why="": TestOutcome(f"t::{kind}{why}", (exercise.name,), kind, why)  # noqa: E731
    cut = summarize(exercise, [outcome("passed"), outcome("passed"), outcome("not run", "not run: time"),
                               outcome("skipped", "needs a GPU")])
    assert cut.status == TOOK_TOO_LONG and not cut.done and cut.message == "not run: time"
    assert (cut.ran, cut.counted, cut.not_run) == (2, 3, 1)
    assert Points(3.0, partial=True).score(cut.passed, cut.counted, cut.done) == pytest.approx(2.0)
    assert Points(3.0).score(cut.passed, cut.counted, cut.done) == 0.0
    whole = summarize(exercise, [outcome("passed"), outcome("skipped", "needs a GPU")])
    assert whole.done and whole.counted == 1


def test_no_link_inside_a_submission_is_followed(tmp_path):
    """A folder that holds only a link to a classmate's (one level down, or two) is not graded on the classmate's work;
    a link beside real files is skipped, and the notes say which links were."""
    from sampling_course.grading.classroom.submission import SubmissionError, prepare_copy

    classmate = tmp_path / "class" / "ada" / "exercises"
    classmate.mkdir(parents=True)
    (classmate / "sampling.py").write_text("SOLVED = True\n")
    one = tmp_path / "class" / "one"
    one.mkdir()
    (one / "mywork").symlink_to("../ada")
    two = tmp_path / "class" / "two" / "deeper"
    two.mkdir(parents=True)
    (two / "mywork").symlink_to("../../ada")
    for student, link in (("one", "mywork"), ("two", "deeper/mywork")):
        with pytest.raises(SubmissionError, match=f"links are never followed, and it holds 1 link \\({link}\\)"):
            prepare_copy(tmp_path / "class" / student, tmp_path / f"work-{student}")
    mixed = tmp_path / "class" / "mixed" / "exercises"
    mixed.mkdir(parents=True)
    (mixed / "beams.py").write_text("OWN = True\n")
    (mixed / "sampling.py").symlink_to(classmate / "sampling.py")
    (mixed.parent / "notes").symlink_to("../ada")
    copy, notes = prepare_copy(mixed.parent, tmp_path / "work-mixed")
    assert (copy / "exercises" / "beams.py").read_text() == "OWN = True\n"
    assert "SOLVED" not in (copy / "exercises" / "sampling.py").read_text()
    assert not any(p.is_symlink() for p in copy.rglob("*"))
    assert notes[0] == "links are never followed: skipped 2 links (exercises/sampling.py, notes)", notes


def test_feedback_lists_only_what_was_graded(tmp_path):
    """A module missing from a submission is noted only when a graded exercise lives in it; a submission with no
    exercise file (a folder, or the zip a cluster's worker gets) gets one short reason, said once, naming no file
    of the grader's own, and is listed as not graded, not as flagged."""
    from sampling_course.grading.classroom.executors import grade_packed, pack
    from sampling_course.grading.classroom.grade import grade_submission
    from sampling_course.grading.classroom.reports import class_report_html
    from sampling_course.grading.classroom.submission import prepare_copy

    folder = tmp_path / "ada" / "exercises"
    folder.mkdir(parents=True)
    (folder / "sampling.py").write_text("X = 1\n")
    assert prepare_copy(folder.parent, tmp_path / "work", {"sampling"})[1] == []
    assert "beams.py was not in the submission: the course's stub counts in its place" in \
        prepare_copy(folder.parent, tmp_path / "work-all")[1]
    (tmp_path / "empty").mkdir()
    settings = load_settings(None, exercises=["greedy_search", "apply_temperature", "sample_top_k"])
    for result in (grade_submission(tmp_path / "empty", settings, student="empty"),
                   grade_packed("empty", pack(tmp_path / "empty"), settings)):
        assert result["error"].startswith("no exercise files found") and "submission.zip" not in result["error"]
        assert "beams.py" not in result["error"] and result["score"] == 0
        assert all(e["message"] == "not graded: the submission could not be graded" for e in result["exercises"])
        text = feedback_text(result)
        assert text.count("no exercise files found") == 1 and "What to look at" not in text
    page = class_report_html([result], settings)
    assert "<b>0</b>flagged" in page and "<h2>Not graded</h2>\n<table>" in page


def test_a_check_on_the_submission_s_own_record_is_said_to_earn_nothing():
    """An exercise with tests checked on a record kept in the submission's process says that such a pass earns
    nothing, in the feedback, in Gradescope's output and in the class report; one with none says nothing of it.
    Part 10's bounds kept there are named in the class report when part 10 is graded, with the same rule."""
    entry = {"exercise": "race_sample", "part": 6, "status": "done", "points": 1.0, "max_points": 1.0, "partial": False,
             "passed": 4, "ran": 4, "failed": 0, "not_implemented": 0, "message": None, "hidden_failure": False,
             "mistake": None, "hint": None, "stubs": [], "unverified": 2, "hidden_tests": 0}
    result = {"student": "ada", "score": 1.0, "max_score": 1.0, "flags": [], "notes": [], "error": None,
              "sandbox": {"sandbox": "bubblewrap"}, "exercises": [entry]}
    assert "- race_sample: 2 test(s) checked on a record your own process kept (tensor" in feedback_text(result)
    assert "a pass earns nothing" in gradescope_results(result)["tests"][0]["output"]
    from sampling_course.grading.classroom.reports import class_report_html

    page = class_report_html([result], load_settings(None, exercises=["race_sample"]))
    assert "Graded without a record the submission could change</h2><ul><li>race_sample: tests checked on" in page
    assert "a pass earns nothing" in page and "blocks held at each step" not in page
    entry["unverified"] = 0
    assert "earns nothing" not in feedback_text(result) and gradescope_results(result)["tests"][0]["output"] == ""
    assert "Graded without a record" not in class_report_html([result], load_settings(None, exercises=["race_sample"]))
    entry["exercise"] = "Engine.step"
    page = class_report_html([result], load_settings(None, exercises=["Engine.step"]))
    assert "<li>Engine.step: the calls of BlockTable.slots (MethodCalls) and the blocks held" in page
    assert "unseen" not in page and page.count("a pass earns nothing") == 1


def test_a_pass_on_the_submission_s_own_record_earns_nothing():
    """A test whose verdict held on operations the submission's process recorded is left out of the count: the
    exercise is earned on its other tests, and with no other passed test it earns nothing (the grading rule)."""
    from types import SimpleNamespace

    from sampling_course.grading.classroom.grade import OWN_RECORD_ONLY, _exercise_entry
    from sampling_course.grading.course import get_exercise

    settings = load_settings(None, exercises=["race_sample"])
    for counted, own, earned in ((3, 1, 1.0), (1, 1, 0.0), (2, 2, 0.0), (2, 0, 1.0)):
        judge = SimpleNamespace(hidden=set(), exercises={f"t{i}": ("race_sample",) for i in range(counted)},
                                unverified={f"t{i}": 1 for i in range(own)})
        result = SimpleNamespace(name="race_sample", exercise=get_exercise("race_sample"), status="done", passed=counted,
                                 counted=counted, done=True, failing_test=None, message=None, ran=counted, not_run=0,
                                 failed=0, not_implemented=0, mistake=None, stubs=())
        entry = _exercise_entry(result, judge, settings)
        assert entry["points"] == earned and entry["unverified"] == own, (counted, own, entry)
        assert (entry["status"], entry["message"]) == (("done", None) if earned else ("failing", OWN_RECORD_ONLY))


def _entry(name: str, **changes) -> dict:
    entry = {"exercise": name, "part": 2, "status": "failing", "points": 0.0, "max_points": 1.0, "partial": False,
             "passed": 0, "ran": 1, "not_run": 0, "failed": 1, "not_implemented": 0, "message": "wrong",
             "hidden_failure": False, "mistake": None, "hint": "a hint", "stubs": [], "unverified": 0, "hidden_tests": 0}
    return {**entry, **changes}


def _result(student: str, **changes) -> dict:
    result = {"student": student, "submission": f"/class/{student}", "score": 0.0, "max_score": 1.0, "flags": [],
              "notes": [], "error": None, "sandbox": {"sandbox": "bubblewrap"}, "seconds": 1.0,
              "exercises": [_entry("apply_temperature")]}
    return {**result, **changes}


ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m\r\u202e"  # a window title, clear screen, a colour, a return, a bidi override


def test_reports_show_what_a_submission_wrote_escaped_and_never_fail_on_it(tmp_path):
    """A student name with terminal escapes, a failure message with escape bytes and a file name that is not UTF-8
    (as os.listdir gives it back) are written escaped everywhere (CSV, feedback, class report, results.json,
    Gradescope); a report that cannot be written for one student is written for every other."""
    not_utf8 = b"\xff\xfe-not-utf8.txt".decode("utf-8", "surrogateescape")
    hostile = _result(f"mallory{ESCAPES}", flags=[{"kind": "files", "reason": f"wrote {not_utf8} in its folder"}],
                      exercises=[_entry("apply_temperature", message=f"boom{ESCAPES}\nsecond line")])
    broken = _result("bob")
    del broken["exercises"][0]["status"]  # its feedback cannot be made
    honest = [_result(name) for name in ("ada", "zz control2", "zz_control2")]
    settings = load_settings(None, exercises=["apply_temperature"])
    paths = write_reports([hostile, broken, *honest], settings, tmp_path / "report")
    written = {p.name: p.read_bytes() for p in (tmp_path / "report").rglob("*") if p.is_file()}
    for name, data in written.items():
        text = data.decode("utf-8").replace("\r\n", "\n")  # all UTF-8 (CSV rows end in CRLF, as csv writes them)
        assert not any(c in text for c in "\x1b\x07\r\u202e"), name
    feedback = (paths["feedback"] / f"{safe_name(hostile['student'])}.md").read_text()
    # Markdown shows a backslash written twice as one: the reader sees \x1b]0;owned and \xff\xfe-not-utf8.txt
    assert "mallory\\\\x1b\\]0;owned\\\\x07" in feedback and "\\\\xff\\\\xfe-not-utf8.txt" in feedback
    assert "second line" in feedback  # a message keeps its lines
    assert {"ada.md", "zz_control2.md", f"{safe_name('zz control2')}.md"} <= set(written)
    assert len([n for n in written if n.endswith(".md")]) == 4  # every student but bob
    assert "feedback for bob: KeyError" in (tmp_path / "report" / "report_problems.txt").read_text()
    assert '"mallory\\\\x1b' in written["results.json"].decode()
    graded = json.dumps(gradescope_results(hostile), ensure_ascii=False)
    assert "\x1b" not in graded and "\\\\x1b" in graded


def test_feedback_file_names_are_one_per_student_and_depend_on_the_name_alone():
    """Two names that differ only in a character a file name cannot hold get two files; a plain name keeps its own;
    the file name does not depend on who else is in the class."""
    assert safe_name("zz_control2") == "zz_control2" and safe_name("zz control2") != "zz_control2"
    assert safe_name("zz control2") == safe_name("zz control2") != safe_name("zz/control2")
    assert safe_name("\x1b[2J") != safe_name("\x1b[3J") and "\x1b" not in safe_name("\x1b[2J")
    assert safe_name("a" * 150) != safe_name("a" * 151) and len(safe_name("a" * 150)) <= 100


def test_wire_refuses_malformed_frames():
    """A frame whose sizes disagree, or whose tensor does not fit its bytes, is refused, never built."""
    ours, theirs = socket.socketpair()
    blobs: list[bytes] = []
    spec = wire.encode_tensor(torch.arange(6, dtype=torch.float32).reshape(2, 3), blobs)
    wire.write_frame(theirs, {"x": spec}, blobs)
    header, received = wire.read_frame(ours, wire.Deadline.after(5))
    assert torch.equal(wire.decode_tensor(header["x"], received), torch.arange(6.0).reshape(2, 3))
    with pytest.raises(wire.WireError, match="needs 28 bytes, got 24"):
        wire.decode_tensor({**spec, "shape": [7]}, received)
    with pytest.raises(wire.WireError):
        wire.decode_tensor({**spec, "dtype": "object"}, received)
    theirs.sendall((10**12).to_bytes(8, "big") + (5).to_bytes(4, "big"))
    with pytest.raises(wire.WireError, match="refused a frame"):
        wire.read_frame(ours, wire.Deadline.after(5))
    with pytest.raises(wire.TimedOut):
        wire.read_frame(ours, wire.Deadline.after(0.2))
    ours.close()
    theirs.close()


# ---------------------------------------------------------------------------------------
# A synthetic class of six
# ---------------------------------------------------------------------------------------

SIX_EXERCISES = ("greedy_search", "apply_temperature", "apply_frequency_penalty")


def grade_synthetic_class(tmp_path: Path, size: int, seed: int, exercises: tuple[str, ...], **grading):
    students = make_class(tmp_path / "class", size, seed=seed, exercises=exercises, p_mistake=0.5)
    settings = load_settings(None, exercises=list(exercises), **grading.pop("settings", {}))
    results = grade_all(find_submissions(tmp_path / "class"), settings, **grading)
    return students, settings, results


def assert_true_grades(students, results):
    """Every exercise of every student passes exactly when no mistake was planted in it."""
    by_student = {r["student"]: r for r in results}
    wrong = []
    for student in students:
        result = by_student[student.name]
        assert result["error"] is None, result["error"]
        for entry in result["exercises"]:
            expected = student.passes[entry["exercise"]]
            if (entry["status"] == "done") != expected or entry["points"] != (entry["max_points"] if expected else 0):
                wrong.append(f"{student.name} {entry['exercise']}: planted {student.changes[entry['exercise']]}, "
                             f"graded {entry['status']} ({entry['message']})")
    assert not wrong, "\n".join(wrong)


@pytest.mark.classroom
def test_six_students_get_their_true_grades_and_reports(tmp_path):
    """Six synthetic submissions, each in its own confined process, in a process pool of two (``--jobs 2``): grades
    as planted; CSV, feedback, report."""
    students, settings, results = grade_synthetic_class(tmp_path, 6, seed=3, exercises=SIX_EXERCISES, jobs=2)
    assert {c.split(":")[0] for s in students for c in s.changes.values()} >= {"mistake", "variant"}
    assert_true_grades(students, results)
    for result in results:
        assert not result["flags"], result["flags"]
        assert result["sandbox"]["sandbox"] == "bubblewrap" and result["sandbox"]["network"] == "none"
        assert result["sandbox"]["memory"].startswith(f"{settings.memory_mb} MiB for the submission's work")

    paths = write_reports(results, settings, tmp_path / "report")
    rows = list(csv.DictReader(paths["csv"].open()))
    assert [r["student"] for r in rows] == sorted(s.name for s in students)
    for row, student in zip(rows, sorted(students, key=lambda s: s.name)):
        assert float(row["score"]) == sum(student.passes.values())
    failing = next(s for s in students if not all(s.passes.values()))
    feedback = (paths["feedback"] / f"{failing.name}.md").read_text()
    exercise = next(e for e, ok in failing.passes.items() if not ok)
    assert f"### {exercise}: failing" in feedback and get_exercise(exercise).hints[0] in feedback
    assert "This matches a classic mistake" in feedback  # each of these mistakes has a probe that names it
    page = paths["html"].read_text()
    assert page.count("data:image/png;base64,") == 3 and "http" not in page.replace("http-equiv", "")
    assert json.loads(paths["json"].read_text())[0]["student"] == rows[0]["student"]
