"""The stored verdicts of ``progress``: reused while nothing they depend on changed, and only then."""

from __future__ import annotations

from sampling_course.grading.course import get_exercise
from sampling_course.grading.results import DONE, FAILING, NOT_IMPLEMENTED_YET, TOOK_TOO_LONG, Result
from sampling_course.grading.verdicts import VerdictStore, course_key, package_digests, result_from_json, result_to_json

DIGESTS = {"transformer.py": "a" * 64, "sampling.py": "b" * 64, "generate/filters.py": "c" * 64}


def result(status: str, name: str = "sample_top_p") -> Result:
    return Result(get_exercise(name), status, passed=3, total=4, skipped=1, stubs=("f",) if status != DONE else (),
                  message="boom" if status == FAILING else None)


def test_a_result_survives_the_round_trip_through_json():
    for status in (DONE, FAILING, NOT_IMPLEMENTED_YET):
        assert result_from_json(result_to_json(result(status))) == result(status)


def test_a_verdict_is_reused_until_a_file_it_imported_changes(tmp_path):
    VerdictStore("k", DIGESTS, tmp_path).put(result(DONE), {"sampling.py", "transformer.py"})
    assert VerdictStore("k", DIGESTS, tmp_path).get(get_exercise("sample_top_p")) == result(DONE)
    # A file it did not import changes: still reused.
    assert VerdictStore("k", {**DIGESTS, "generate/filters.py": "d" * 64}, tmp_path).get(get_exercise("sample_top_p"))
    # One it imported changes, or disappears: run again.
    assert VerdictStore("k", {**DIGESTS, "transformer.py": "d" * 64}, tmp_path).get(get_exercise("sample_top_p")) is None
    assert VerdictStore("k", {"sampling.py": "b" * 64}, tmp_path).get(get_exercise("sample_top_p")) is None
    # Another course state (tests, libraries, settings): run again.
    assert VerdictStore("other", DIGESTS, tmp_path).get(get_exercise("sample_top_p")) is None
    # Another exercise has no verdict.
    assert VerdictStore("k", DIGESTS, tmp_path).get(get_exercise("LayerNorm")) is None


def test_a_failing_verdict_depends_on_every_file_of_the_package(tmp_path):
    VerdictStore("k", DIGESTS, tmp_path).put(result(FAILING), {"sampling.py"})
    assert VerdictStore("k", DIGESTS, tmp_path).get(get_exercise("sample_top_p")) == result(FAILING)
    changed = {**DIGESTS, "generate/filters.py": "d" * 64}  # e.g. a syntax error fixed in a module never imported
    assert VerdictStore("k", changed, tmp_path).get(get_exercise("sample_top_p")) is None


def test_unknown_imports_and_a_test_that_took_too_long(tmp_path):
    VerdictStore("k", DIGESTS, tmp_path).put(result(DONE), None)  # imports unknown: every file counts
    assert VerdictStore("k", {**DIGESTS, "sampling.py": "d" * 64}, tmp_path).get(get_exercise("sample_top_p")) is None
    VerdictStore("k", DIGESTS, tmp_path).put(result(TOOK_TOO_LONG, "LayerNorm"), {"transformer.py"})
    assert VerdictStore("k", DIGESTS, tmp_path).get(get_exercise("LayerNorm")) is None  # machine-dependent: not kept
    VerdictStore("k", DIGESTS, tmp_path).put(result(DONE, "MLP"), {"new.py"})  # a file with no digest: not kept
    assert VerdictStore("k", DIGESTS, tmp_path).get(get_exercise("MLP")) is None


def test_a_damaged_verdict_file_is_ignored(tmp_path):
    store = VerdictStore("k", DIGESTS, tmp_path)
    store.put(result(DONE), {"sampling.py"})
    (path,) = tmp_path.rglob("*.json")
    path.write_bytes(path.read_bytes()[:-5])
    assert store.get(get_exercise("sample_top_p")) is None


def test_the_course_key_follows_the_tests_and_the_settings(tmp_path, monkeypatch):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_a.py").write_text("def test_a(): pass\n")
    key = course_key("exercises", tests, None)
    assert course_key("exercises", tests, None) == key
    assert course_key("solutions", tests, None) != key
    assert course_key("exercises", tests, "cuda") != key
    monkeypatch.setenv("SAMPLING_COURSE_TEST_SEED", "3")
    assert course_key("exercises", tests, None) != key
    monkeypatch.delenv("SAMPLING_COURSE_TEST_SEED")
    (tests / "test_a.py").write_text("def test_a(): assert 0\n")
    assert course_key("exercises", tests, None) != key


def test_package_digests_cover_files_in_subpackages(tmp_path):
    (tmp_path / "generate").mkdir()
    (tmp_path / "generate" / "filters.py").write_text("x = 1\n")
    (tmp_path / "sampling.py").write_text("y = 2\n")
    assert sorted(package_digests(tmp_path)) == ["generate/filters.py", "sampling.py"]


def test_a_module_asked_for_but_absent_holds_the_verdict_until_it_is_created(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    store = VerdictStore("k", DIGESTS, tmp_path / "verdicts", package=package)
    store.put(result(DONE), {"sampling.py", "later.py"})  # later.py: imported by sampling.py, not there
    assert VerdictStore("k", DIGESTS, tmp_path / "verdicts").get(get_exercise("sample_top_p")) == result(DONE)
    created = {**DIGESTS, "later.py": "d" * 64}
    assert VerdictStore("k", created, tmp_path / "verdicts").get(get_exercise("sample_top_p")) is None
