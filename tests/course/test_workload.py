"""The workload tables (``grading/workload.py``): the lines each exercise's solution regions hold, counted
right and kept current by ``make-exercises``; a clear error for a part that does not exist; the table in
every notebook, listing the exercises that notebook checks; and the table in the student release, which
has no ``solutions/``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from sampling_course.apps.course_commands import make_exercises_main
from sampling_course.grading import workload as workload_module
from sampling_course.grading.classroom.release import make_release
from sampling_course.grading.course import EXERCISES
from sampling_course.grading.lean_imports import import_jsonschema
from sampling_course.grading.planting import solution_sources
from sampling_course.grading.stubs import BEGIN_MARKER
from sampling_course.grading.workload import LINES_FILE, TIMES_FILE, lines_json, workload

import_jsonschema()  # nbformat imports jsonschema: this makes that import lean
import nbformat  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

# A tiny solutions tree, its lines counted by hand (the numbers in EXPECTED, not computed by the code under test).
TINY_SAMPLING = '''
class TransformerSampler:
    @staticmethod
    def apply_temperature(logits, temperature):
        """Docstrings outside a region are not the learner's."""
        ### BEGIN SOLUTION
        # Hint: divide.
        scaled = logits / temperature

        return scaled  # a comment after code still leaves a line of code
        ### END SOLUTION

    @staticmethod
    def greedy_search(logits):
        ### BEGIN SOLUTION
        return int(
            logits.argmax()
        )
        ### END SOLUTION


def helper():
    ### BEGIN SOLUTION
    return 1
    ### END SOLUTION
'''
TINY_BEAMS = '''
class Beams:
    def generate(self, k):
        ### BEGIN SOLUTION
        logits = self.model(self.tokens)
        # the cached branch
        if self.kv_cache is not None:
            logits = logits[:, -1]
        return logits
        ### END SOLUTION

    def filter(self, k):
        if k:
            ### BEGIN SOLUTION
            a = 1
            ### END SOLUTION
        ### BEGIN SOLUTION
        return a, a
        ### END SOLUTION
'''
EXPECTED = {
    "apply_temperature": {"lines": 2, "regions": 1},
    "greedy_search": {"lines": 3, "regions": 1},
    "Beams.generate": {"lines": 4, "regions": 1},
    "Beams.filter": {"lines": 2, "regions": 2},
    "cached_beam_search": {"lines": 0, "regions": 0, "written_in": ["Beams.generate"]},
}


def test_lines_are_counted_from_the_regions_and_checked_by_make_exercises(tmp_path):
    """make-exercises --lines writes each exercise's lines (code in its regions, not comments, blanks or markers),
    --check passes on it, and fails (writing nothing) once a region gains a line."""
    solutions, exercises, lines = tmp_path / "solutions", tmp_path / "exercises", tmp_path / "lines.json"
    solutions.mkdir()
    (solutions / "sampling.py").write_text(TINY_SAMPLING)
    (solutions / "beams.py").write_text(TINY_BEAMS)
    dirs = ["--solutions", str(solutions), "--exercises", str(exercises), "--lines", str(lines)]
    assert make_exercises_main(dirs) == 0
    counted = json.loads(lines.read_text())["exercises"]
    assert list(counted) == [e.name for e in EXERCISES]
    for name, entry in counted.items():
        if name in EXPECTED:
            assert entry == EXPECTED[name], name
        else:
            assert entry["lines"] == 0 and entry["regions"] == 0, name
    assert make_exercises_main(["--check", *dirs]) == 0
    before = lines.read_text()
    (solutions / "sampling.py").write_text(TINY_SAMPLING.replace("        scaled = logits", "        x = 1\n        scaled = logits"))
    assert make_exercises_main(["--check", *dirs]) == 1
    assert lines.read_text() == before
    assert make_exercises_main(dirs) == 0
    assert json.loads(lines.read_text())["exercises"]["apply_temperature"] == {"lines": 3, "regions": 1}


def test_make_exercises_leaves_the_course_s_file_alone_for_other_solutions(tmp_path):
    """Without --lines, only the course's own solutions/ write the course's file."""
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    (solutions / "sampling.py").write_text(TINY_SAMPLING)
    before = LINES_FILE.read_bytes()
    assert make_exercises_main(["--solutions", str(solutions), "--exercises", str(tmp_path / "ex")]) == 0
    assert LINES_FILE.read_bytes() == before


def test_the_course_s_lines_file_is_current_and_goes_stale_when_a_region_changes():
    sources = solution_sources()
    assert LINES_FILE.read_text() == lines_json(sources), "run `sampling-course make-exercises`"
    recorded = json.loads(LINES_FILE.read_text())["exercises"]
    lines = sources["transformer"].splitlines(keepends=True)
    begin = next(i for i, line in enumerate(lines) if line.strip() == BEGIN_MARKER)  # LayerNorm's region
    lines.insert(begin + 1, lines[begin].replace(BEGIN_MARKER, "unused = 0"))
    changed = json.loads(lines_json({**sources, "transformer": "".join(lines)}))["exercises"]
    assert changed["LayerNorm"]["lines"] == recorded["LayerNorm"]["lines"] + 1
    assert {k: v for k, v in changed.items() if k != "LayerNorm"} == {k: v for k, v in recorded.items() if k != "LayerNorm"}


@pytest.mark.walk
def test_the_walk_times_each_graded_exercise_s_tests():
    """What time_checks.py --record keeps: the seconds of the graded exercise's tests in a step of the walk."""
    from sampling_course.grading.mistakes import walk_course
    from sampling_course.grading.walk import Step

    untouched, first = walk_course([Step(-1), Step(0)], jobs=1)
    assert untouched.seconds is None and untouched.cpu_seconds is None  # grades nothing
    assert first.ok and first.seconds > 0 and first.cpu_seconds > 0, first


def test_the_recorded_check_times_say_where_and_when_and_name_only_exercises():
    record = json.loads(TIMES_FILE.read_text())
    assert {"command", "date", "machine", "load", "workers", "seconds"} <= set(record)
    assert set(record["seconds"]) <= {e.name for e in EXERCISES}
    assert all(entry["wall"] > 0 and entry["cpu"] > 0 for entry in record["seconds"].values())


@pytest.mark.parametrize("part", ["12", "5c", "", 0, True, None, 5.0])
def test_an_unknown_part_is_refused_with_the_parts_that_exist(part):
    with pytest.raises(ValueError, match=re.escape(f"there is no part {part!r}; the parts are 1, 2, 3, 4, 5, 5b, 6, 6b, "
                                                   "7, 8, 9, 10, 11")):
        workload(part, display=False)


def test_the_table_shows_the_recorded_times_and_says_what_its_numbers_are_not(tmp_path, monkeypatch):
    times = tmp_path / "check_times.json"
    monkeypatch.setattr(workload_module, "TIMES_FILE", times)
    console = Console(record=True, width=200)
    rows = workload(2, console=console)
    assert [r.exercise for r in rows] == [e.name for e in EXERCISES if e.part == 2]
    assert all(r.check_seconds is None and r.hints == 3 for r in rows)
    text = console.export_text()
    assert "none recorded yet" in text and "the course does not measure that" in text
    times.write_text(json.dumps({"date": "a date", "machine": "a machine", "load": "a load",
                                 "seconds": {"sample_top_p": {"wall": 2.31, "cpu": 1.5}}}))
    console = Console(record=True, width=200)
    rows = workload("2", console=console)
    timed = {r.exercise: (r.check_seconds, r.check_cpu_seconds) for r in rows if r.check_seconds is not None}
    assert timed == {"sample_top_p": (2.31, 1.5)}
    text = console.export_text()
    assert re.search(r"sample_top_p\s+\d+\s+3\s+2\.3\s+1\.5", text) and "a date, a machine, a load" in text, text


def test_the_optional_exercises_are_those_the_notebooks_mark_optional():
    assert sorted(e.name for e in EXERCISES if e.optional) == sorted([
        "top_n_sigma_filter", "xtc_filter", "mirostat_step", "apply_dry_penalty", "double_quantise", "gptq_quantise"])


CHECK_CALL = re.compile(r"""\bcheck\(\s*["']([^"']+)["']""")
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_shows_its_part_s_workload_after_its_setup(path):
    """Right after the setup cell: a sentence saying what the numbers are not, then one cell calling workload(part),
    whose exercises are exactly those the notebook checks."""
    nb = nbformat.read(path, as_version=4)
    code = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    label = re.match(r"0?(\d+b?)_", path.name).group(1)
    cell = nb.cells[code[1]]
    assert cell.source.strip().endswith(f'workload("{label}");'), cell.source
    assert code[1] == code[0] + 2 and nb.cells[code[0] + 1].cell_type == "markdown"
    assert "does\nnot measure that" in nb.cells[code[0] + 1].source
    checked = {name for c in nb.cells if c.cell_type == "code" for name in CHECK_CALL.findall(c.source)}
    assert {row.exercise for row in workload(label, display=False)} == checked


def test_the_student_release_shows_the_table_without_solutions(tmp_path):
    """The release ships both files; its workload() needs no solutions/, and counts the two hints it can show."""
    out = tmp_path / "release"
    make_release(out)
    assert not (out / "solutions").exists()
    assert (out / "sampling_course" / "assets" / LINES_FILE.name).read_text() == LINES_FILE.read_text()
    code = ("import sys; sys.modules['solutions'] = None; "  # importing solutions now fails
            "from sampling_course import workload; rows = workload('1', display=False); "
            "import sampling_course; assert sampling_course.__file__.startswith(sys.argv[1]), sampling_course.__file__; "
            "assert rows[0].lines is not None and {r.hints for r in rows} == {2}, rows; workload('8')")
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=out, env={"PYTHONPATH": str(out), "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "build_index" in done.stdout and "the course does not measure that" in " ".join(done.stdout.split())
