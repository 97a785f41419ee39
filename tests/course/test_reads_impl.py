"""``pytest --reads-impl``: only the tests that read the implementation under test.

CI runs the suite against the untouched stubs to prove that every test of an exercise can
fail; a test that never reads the implementation gives the same result as in the main run,
so that run keeps only the tests whose fixtures include ``impl``, directly or through
another fixture.
"""

from __future__ import annotations

import sys

import pytest

TESTS = '''
import pytest

@pytest.fixture(scope="session")
def impl():
    return "the implementation"

@pytest.fixture
def model(impl):
    return impl + "'s model"

@pytest.fixture
def data():
    return 1

def test_reads_impl(impl):
    assert impl

def test_reads_impl_through_a_fixture(model):
    assert model

def test_plain(data):
    assert data

def test_nothing():
    assert True
'''


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(
        "[tool.pytest.ini_options]\n"
        'addopts = "-p no:cacheprovider --import-mode=importlib -p sampling_course.grading.pytest_plugin"\n'
    )
    (tmp_path / "test_selection.py").write_text(TESTS)
    monkeypatch.setattr(sys, "path", list(sys.path))  # whatever the nested session adds goes away
    return tmp_path


def collected(folder, *options: str, capsys) -> list[str]:
    code = pytest.main([str(folder / "test_selection.py"), "--collect-only", "-q", *options,
                        "-c", str(folder / "pyproject.toml")])
    out = capsys.readouterr().out
    assert code == pytest.ExitCode.OK, out
    return sorted(line.split("::")[1] for line in out.splitlines() if "::" in line)


def test_reads_impl_keeps_exactly_the_tests_whose_fixtures_include_impl(folder, capsys):
    assert collected(folder, capsys=capsys) == ["test_nothing", "test_plain", "test_reads_impl",
                                                "test_reads_impl_through_a_fixture"]
    assert collected(folder, "--reads-impl", capsys=capsys) == ["test_reads_impl",
                                                                "test_reads_impl_through_a_fixture"]
