"""Tests for the exercise stub generator (``sampling_course.grading.stubs``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sampling_course.apps.course_commands import make_exercises_main
from sampling_course.grading.stubs import (
    OUT_OF_DATE_MESSAGE,
    StubError,
    body_checksum,
    is_learner_edited,
    make_exercise_file,
    make_exercises,
    make_stub_source,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def src(text: str) -> str:
    """Dedent a triple-quoted snippet (keeps the tests readable)."""
    return textwrap.dedent(text).lstrip("\n")


SOLUTION = src(
    '''
    """Temperature scaling."""

    from __future__ import annotations

    import math


    def apply_temperature(logits, temperature):
        """Divide logits by the temperature."""
        ### BEGIN SOLUTION
        # Hint: one line is enough.
        # this private note must not leak
        return logits / temperature
        ### END SOLUTION


    class Sampler:
        """Holds a temperature."""

        def __init__(self, t):
            self.t = t

        def sample(self, logits):
            """Nested method with a nested helper."""
            def helper(x):
                ### BEGIN SOLUTION
                return x * 2
                ### END SOLUTION
            ### BEGIN SOLUTION
            return helper(apply_temperature(logits, self.t))
            ### END SOLUTION


    CONSTANT = math.pi
    '''
)


def write_solutions(root: Path, files: dict[str, str]) -> Path:
    """Create ``root/solutions`` with the given files; return the directory."""
    solutions = root / "solutions"
    solutions.mkdir()
    for name, text in files.items():
        (solutions / name).write_text(text, encoding="utf-8")
    return solutions


def edit_body(generated: str, replacement: str) -> str:
    """Simulate a learner filling in the first stub (below the header, which also mentions it)."""
    header_end = generated.index("# stub-checksum:")
    header_end = generated.index("\n", header_end) + 1
    head, body = generated[:header_end], generated[header_end:]
    assert "raise NotImplementedError()" in body
    return head + body.replace("raise NotImplementedError()", replacement, 1)


# --------------------------------------------------------------------------- #
# make_stub_source
# --------------------------------------------------------------------------- #


def test_region_replaced_with_raise_at_marker_indentation():
    """Each region becomes one `raise` at its BEGIN line's indentation, incl. nested defs in a class."""
    out = make_stub_source(SOLUTION)
    raises = [line for line in out.splitlines() if line.strip() == "raise NotImplementedError()"]
    assert raises == [
        "    raise NotImplementedError()",  # top-level function body
        "            raise NotImplementedError()",  # helper defined inside the method
        "        raise NotImplementedError()",  # the method body itself
    ]
    assert "    def helper(x):\n            raise NotImplementedError()\n" in out
    assert "BEGIN SOLUTION" not in out and "END SOLUTION" not in out
    assert "logits / temperature" not in out
    assert "x * 2" not in out
    assert "return helper(" not in out


def test_exact_output_for_small_function():
    """The whole transformation of a small file matches the expected text exactly."""
    source = src(
        '''
        def f(x):
            """Doc."""
            ### BEGIN SOLUTION
            # Hint: add one.
            return x + 1
            ### END SOLUTION
        '''
    )
    expected = src(
        '''
        def f(x):
            """Doc."""
            # Hint: add one.
            raise NotImplementedError()
        '''
    )
    assert make_stub_source(source) == expected


def test_code_outside_regions_is_verbatim():
    """Every line outside a region survives unchanged and in order."""
    out = make_stub_source(SOLUTION)
    outside: list[str] = []
    inside = False
    for line in SOLUTION.splitlines():
        if line.strip() == "### BEGIN SOLUTION":
            inside = True
        elif line.strip() == "### END SOLUTION":
            inside = False
        elif not inside:
            outside.append(line)
    kept = [line for line in out.splitlines() if "raise NotImplementedError()" not in line
            and not line.strip().startswith("# Hint:")]
    assert kept == outside


def test_source_without_regions_is_unchanged():
    """A file with no markers (e.g. __init__.py) is returned byte for byte."""
    text = '"""Package."""\n\nfrom .a import b  # re-export\n'
    assert make_stub_source(text) == text


def test_hint_comments_kept_and_other_comments_dropped():
    """`# Hint:` comments in a region stay at their indentation; other comments go."""
    source = src(
        """
        def f(x):
            ### BEGIN SOLUTION
            # Hint: first hint
            y = x  # inline comment
            # not a hint
                # Hint: deeper hint
            return y
            ### END SOLUTION
        """
    )
    out = make_stub_source(source)
    assert out == (
        "def f(x):\n"
        "    # Hint: first hint\n"
        "        # Hint: deeper hint\n"
        "    raise NotImplementedError()\n"
    )
    assert "not a hint" not in out and "inline comment" not in out


def test_multiple_regions_in_one_function_and_file():
    """Several regions are each replaced, with code between them kept."""
    source = src(
        """
        def f(x):
            ### BEGIN SOLUTION
            a = 1
            ### END SOLUTION
            middle = 2
            ### BEGIN SOLUTION
            return a + middle
            ### END SOLUTION


        def g():
            ### BEGIN SOLUTION
            return 3
            ### END SOLUTION
        """
    )
    out = make_stub_source(source)
    assert out.count("raise NotImplementedError()") == 3
    assert "    middle = 2\n" in out
    assert "def g():\n    raise NotImplementedError()\n" in out


def test_end_marker_on_last_line_without_newline():
    """An END on the final line with no newline still yields a newline-terminated raise."""
    out = make_stub_source("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION")
    assert out == "def f():\n    raise NotImplementedError()\n"


@pytest.mark.parametrize(
    ("source", "line", "words"),
    [
        ("def f():\n    return 1\n    ### END SOLUTION\n", 3, "without a matching"),
        (
            "def f():\n    ### BEGIN SOLUTION\n    ### BEGIN SOLUTION\n"
            "    return 1\n    ### END SOLUTION\n",
            3,
            "nested",
        ),
        ("def f():\n    ### BEGIN SOLUTION\n    return 1\n", 2, "never closed"),
        (
            "def f():\n    ### BEGIN SOLUTION\n    return 1\n  ### END SOLUTION\n",
            4,
            "indented differently",
        ),
    ],
    ids=["end-without-begin", "nested-begin", "begin-without-end", "indentation-mismatch"],
)
def test_unbalanced_markers_raise_stub_error_naming_the_line(source, line, words):
    """Each malformed-marker case raises StubError with `filename:line` and the problem."""
    with pytest.raises(StubError) as info:
        make_stub_source(source, filename="solutions/bad.py")
    message = str(info.value)
    assert message.startswith(f"solutions/bad.py:{line}:"), message
    assert words in message


def test_stub_error_is_value_error():
    """StubError subclasses ValueError so generic handlers still catch it."""
    assert issubclass(StubError, ValueError)


def test_generated_python_compiles():
    """Both the stub body and the full generated file (header + body) are valid Python."""
    compile(make_stub_source(SOLUTION), "stub.py", "exec")
    full = make_exercise_file(SOLUTION, "temperature.py")
    code = compile(full, "exercises/temperature.py", "exec")
    # The docstring is still the module docstring and __future__ is still legal.
    namespace: dict = {}
    exec(code, namespace)
    assert namespace["__doc__"] == "Temperature scaling."
    with pytest.raises(NotImplementedError):
        namespace["apply_temperature"](1.0, 2.0)


def test_header_and_checksum_present():
    """The generated file names its solution and command, and records the body checksum."""
    full = make_exercise_file(SOLUTION, "temperature.py")
    lines = full.splitlines(keepends=True)
    assert "solutions/temperature.py" in lines[0]
    assert "sampling-course make-exercises" in lines[0]
    assert "raise NotImplementedError()" in lines[1]
    body = "".join(lines[3:])
    assert body == make_stub_source(SOLUTION)
    assert lines[2] == f"# stub-checksum: {body_checksum(body)}\n"


# --------------------------------------------------------------------------- #
# is_learner_edited / make_exercises
# --------------------------------------------------------------------------- #


def test_is_learner_edited(tmp_path):
    """Fresh output is not edited; a changed body or a missing header counts as edited."""
    path = tmp_path / "ex.py"
    path.write_text(make_exercise_file(SOLUTION, "ex.py"), encoding="utf-8")
    assert not is_learner_edited(path)

    path.write_text(edit_body(path.read_text(), "return 0"))
    assert is_learner_edited(path)

    path.write_text("def f():\n    return 0\n")
    assert is_learner_edited(path)


def test_make_exercises_writes_files(tmp_path):
    """Every solution *.py gets a generated exercise; other files and subdirs are ignored."""
    solutions = write_solutions(
        tmp_path, {"__init__.py": '"""Pkg."""\n', "temperature.py": SOLUTION, "notes.txt": "x"}
    )
    (solutions / "__pycache__").mkdir()
    (solutions / "__pycache__" / "temperature.cpython-311.py").write_text("junk")
    exercises = tmp_path / "exercises"

    report = make_exercises(solutions, exercises)

    assert sorted(p.name for p in report.written) == ["__init__.py", "temperature.py"]
    assert sorted(p.name for p in exercises.iterdir()) == ["__init__.py", "temperature.py"]
    text = (exercises / "temperature.py").read_text()
    assert text == make_exercise_file(SOLUTION, "temperature.py")
    assert report.ok


def test_second_run_reports_unchanged(tmp_path):
    """Running again without changes writes nothing and lists every file as unchanged."""
    solutions = write_solutions(tmp_path, {"__init__.py": "", "temperature.py": SOLUTION})
    exercises = tmp_path / "exercises"
    make_exercises(solutions, exercises)
    mtime = (exercises / "temperature.py").stat().st_mtime_ns

    report = make_exercises(solutions, exercises)

    assert report.written == []
    assert sorted(p.name for p in report.unchanged) == ["__init__.py", "temperature.py"]
    assert (exercises / "temperature.py").stat().st_mtime_ns == mtime


def test_untouched_exercise_is_regenerated_when_solution_changes(tmp_path):
    """An exercise the learner never touched is silently updated after a solution change."""
    solutions = write_solutions(tmp_path, {"temperature.py": SOLUTION})
    exercises = tmp_path / "exercises"
    make_exercises(solutions, exercises)

    changed = SOLUTION.replace("CONSTANT = math.pi", "CONSTANT = math.e")
    (solutions / "temperature.py").write_text(changed)
    report = make_exercises(solutions, exercises)

    assert [p.name for p in report.written] == ["temperature.py"]
    assert "CONSTANT = math.e" in (exercises / "temperature.py").read_text()


def test_learner_edited_file_refused_without_force_and_overwritten_with_force(tmp_path):
    """A learner-edited exercise is kept (and reported) unless force=True overwrites it."""
    solutions = write_solutions(tmp_path, {"temperature.py": SOLUTION})
    exercises = tmp_path / "exercises"
    make_exercises(solutions, exercises)
    target = exercises / "temperature.py"
    edited = edit_body(target.read_text(), "return logits / temperature  # my work")
    target.write_text(edited)
    # The solution changes, so regeneration would produce different content.
    (solutions / "temperature.py").write_text(SOLUTION + "\nEXTRA = 1\n")

    report = make_exercises(solutions, exercises)
    assert report.skipped_edited == [target]
    assert report.written == []
    assert not report.ok
    assert target.read_text() == edited

    report = make_exercises(solutions, exercises, force=True)
    assert report.written == [target]
    assert "my work" not in target.read_text()
    assert "EXTRA = 1" in target.read_text()


def test_foreign_file_without_header_is_not_overwritten(tmp_path):
    """A hand-written exercise file with no generated header is treated as learner work."""
    solutions = write_solutions(tmp_path, {"temperature.py": SOLUTION})
    exercises = tmp_path / "exercises"
    exercises.mkdir()
    (exercises / "temperature.py").write_text("MINE = 1\n")

    report = make_exercises(solutions, exercises)

    assert report.skipped_edited == [exercises / "temperature.py"]
    assert (exercises / "temperature.py").read_text() == "MINE = 1\n"


def test_check_mode_reports_stale_and_missing_and_writes_nothing(tmp_path):
    """check=True lists missing and differing exercises but does not touch the disk."""
    solutions = write_solutions(
        tmp_path, {"__init__.py": "", "a.py": SOLUTION, "b.py": SOLUTION}
    )
    exercises = tmp_path / "exercises"
    make_exercises(solutions, exercises)
    (exercises / "b.py").unlink()  # missing
    (solutions / "a.py").write_text(SOLUTION + "\nEXTRA = 1\n")  # now differs
    before = {p.name: p.read_text() for p in exercises.iterdir()}

    report = make_exercises(solutions, exercises, check=True)

    assert sorted(p.name for p in report.stale) == ["a.py", "b.py"]
    assert [p.name for p in report.unchanged] == ["__init__.py"]
    assert report.written == []
    assert {p.name: p.read_text() for p in exercises.iterdir()} == before


def test_check_mode_on_missing_exercises_dir_creates_nothing(tmp_path):
    """check=True with no exercises dir reports everything stale and creates no directory."""
    solutions = write_solutions(tmp_path, {"a.py": SOLUTION})
    exercises = tmp_path / "exercises"

    report = make_exercises(solutions, exercises, check=True)

    assert [p.name for p in report.stale] == ["a.py"]
    assert not exercises.exists()


def test_orphans_reported_not_deleted(tmp_path):
    """Exercise .py files without a solution are reported as orphans and left in place."""
    solutions = write_solutions(tmp_path, {"a.py": SOLUTION})
    exercises = tmp_path / "exercises"
    exercises.mkdir()
    (exercises / "scratch.py").write_text("x = 1\n")

    report = make_exercises(solutions, exercises)

    assert report.orphans == [exercises / "scratch.py"]
    assert (exercises / "scratch.py").read_text() == "x = 1\n"


def test_bad_solution_writes_nothing(tmp_path):
    """A malformed solution raises StubError before any exercise is written."""
    solutions = write_solutions(
        tmp_path, {"a.py": SOLUTION, "b.py": "def f():\n    ### BEGIN SOLUTION\n"}
    )
    exercises = tmp_path / "exercises"

    with pytest.raises(StubError, match="b.py:2"):
        make_exercises(solutions, exercises)
    assert not (exercises / "a.py").exists()


# --------------------------------------------------------------------------- #
# make_exercises_main()
# --------------------------------------------------------------------------- #


def test_main_exit_codes_and_messages(tmp_path, capsys):
    """make_exercises_main() returns 0 when in sync, 1 with the advice message when stale or edited."""
    solutions = write_solutions(tmp_path, {"a.py": SOLUTION})
    exercises = tmp_path / "exercises"
    dirs = ["--solutions", str(solutions), "--exercises", str(exercises)]

    assert make_exercises_main(["--check", *dirs]) == 1
    out = capsys.readouterr()
    assert "sampling-course make-exercises" in " ".join((out.out + out.err).split())
    assert not exercises.exists()

    assert make_exercises_main(dirs) == 0
    assert make_exercises_main(["--check", *dirs]) == 0

    (exercises / "a.py").write_text("MINE = 1\n")
    (solutions / "a.py").write_text(SOLUTION + "\nEXTRA = 1\n")
    capsys.readouterr()
    assert make_exercises_main(dirs) == 1
    out = capsys.readouterr()
    combined = " ".join((out.out + out.err).split())
    assert "a.py" in combined and "--force" in combined
    assert (exercises / "a.py").read_text() == "MINE = 1\n"

    assert make_exercises_main(["--force", *dirs]) == 0
    assert "EXTRA = 1" in (exercises / "a.py").read_text()


def test_main_reports_stub_error(tmp_path, capsys):
    """make_exercises_main() turns a StubError into an error message and exit code 1."""
    solutions = write_solutions(tmp_path, {"b.py": "    ### END SOLUTION\n"})
    assert make_exercises_main(["--solutions", str(solutions), "--exercises", str(tmp_path / "ex")]) == 1
    assert "b.py:1" in capsys.readouterr().err


def test_out_of_date_message_text():
    """The check-mode advice tells the user exactly which command to run."""
    assert OUT_OF_DATE_MESSAGE == (
        "exercises/ is out of date with solutions/: run `sampling-course make-exercises`"
    )


# --------------------------------------------------------------------------- #
# The real repository
# --------------------------------------------------------------------------- #


def test_repo_exercises_in_sync():
    """The committed exercises/ is exactly what make-exercises generates from solutions/."""
    report = make_exercises(REPO_ROOT / "solutions", REPO_ROOT / "exercises", check=True)
    assert report.stale == [], OUT_OF_DATE_MESSAGE
    assert report.orphans == [], "exercise files without a solution: " + ", ".join(
        p.name for p in report.orphans
    )
    assert report.unchanged, "solutions/ should contain at least __init__.py"


def test_header_says_fill_in_only_where_there_is_a_stub():
    """A file with a solution region asks for each `raise NotImplementedError()` to be filled in; a file
    without one (given code) says there is nothing to fill in."""
    from sampling_course.grading.stubs import FILL_IN_LINE, GIVEN_LINE

    with_region = "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n"
    given = "def f():\n    return 1\n"
    assert make_exercise_file(with_region, "a.py").splitlines(keepends=True)[1] == FILL_IN_LINE
    assert make_exercise_file(given, "b.py").splitlines(keepends=True)[1] == GIVEN_LINE
