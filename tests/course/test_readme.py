"""The README's quickstart is what CI runs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bash_blocks(text: str) -> list[str]:
    blocks, inside = [], False
    for line in text.splitlines():
        if line.strip() == "```bash":
            inside, current = True, []
        elif line.strip() == "```" and inside:
            inside = False
            blocks.append("\n".join(current))
        elif inside:
            current.append(line)
    return blocks


def test_quickstart_is_two_commands_and_ci_runs_the_test_one():
    """The quickstart has exactly two one-line commands (demo, tests) and .ci/run runs the second verbatim."""
    readme = (ROOT / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    demo, tests = _bash_blocks(quickstart)
    assert "\n" not in demo and "\n" not in tests
    assert demo.endswith("sampling-course demo") and tests.endswith("python -m pytest -n auto --maxprocesses 4")
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci_lines, ".ci/run must run the README's test command exactly"
