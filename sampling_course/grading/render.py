"""Rich panels and tables for check results, progress and hints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from sampling_course.grading.course import EXERCISES, SECTIONS, Exercise
from sampling_course.grading.results import (
    DONE,
    FAILING,
    NO_TESTS_YET,
    NOT_IMPLEMENTED_YET,
    TOOK_TOO_LONG,
    CheckReport,
    Result,
)

_STYLE = {DONE: "green", NOT_IMPLEMENTED_YET: "yellow", FAILING: "red", TOOK_TOO_LONG: "red", NO_TESTS_YET: "blue"}
_SYMBOL = {DONE: "✓", NOT_IMPLEMENTED_YET: "…", FAILING: "✗", TOOK_TOO_LONG: "✗", NO_TESTS_YET: "·"}


def _status_word(result: Result) -> str:
    """The status as the table shows it: "took longer than 60 s" says more than "took too long"."""
    return result.message if result.status == TOOK_TOO_LONG and result.message else result.status


def _tests_text(result: Result) -> str:
    if result.total == 0:
        return "-"
    text = f"{result.passed}/{result.ran}"
    return text + (f" ({result.skipped} skipped)" if result.skipped else "")


def stub_owner(stub: str) -> Exercise | None:
    """The exercise whose code a stub's qualified name (``LayerNorm.forward``) is in; the first in course order."""
    return next((e for e in EXERCISES if stub == e.target or stub.startswith(e.target + ".")), None)


def render_result(result: Result) -> Panel:
    """A panel for one exercise: green done, yellow not implemented yet, red failing."""
    ex = result.exercise
    body: list[Any] = []
    if result.status == DONE:
        tests = f"All {result.ran} tests" if result.ran != 1 else "The 1 test"
        body.append(Text(f"✓ {tests} passed.", style="bold green"))
        if result.skipped:
            reason = (result.message or "").removeprefix("Skipped: ").strip()
            body.append(Text(f"({result.skipped} skipped" + (f", e.g. {reason})" if reason else ")"), style="dim"))
    elif result.status == NOT_IMPLEMENTED_YET:
        stubs = ", ".join(result.stubs) or ex.target
        body.append(Text(f"… Not implemented yet: {stubs}", style="bold yellow"))
        # A stub of another exercise that this one calls: name that exercise and its file.
        others = [o for o in dict.fromkeys(stub_owner(stub) for stub in result.stubs) if o is not None and o != ex]
        if others and all(stub_owner(stub) != ex for stub in result.stubs):
            names = ", ".join(f"{o.name} ({o.location})" for o in others)
            body.append(Text(f"{ex.name} calls {names}: fill that in first, then run the check again."))
        else:
            body.append(Text(f"Fill it in ({ex.location}), then run the check again."))
        body.append(Text(f"Task: {ex.task}", style="dim"))
        if result.passed:
            body.append(Text(f"{result.passed}/{result.ran} tests already pass.", style="dim"))
    elif result.status == TOOK_TOO_LONG:
        body.append(Text(f"✗ {result.message[:1].upper()}{result.message[1:]} and was stopped: is there a loop "
                         "that never ends?", style="bold red"))
        if result.failing_test:
            body.append(Text(f"Stopped: {result.failing_test}", style="red"))
        if result.hint:
            body.append(Text("Hint: ", style="bold") + Text(result.hint))
    elif result.status == FAILING:
        if result.mistake:  # the classic mistake this output matches, said first and plainly
            body.append(Text(result.mistake, style="bold red"))
        body.append(Text(f"✗ {result.failed} of {result.ran} tests failing", style="bold red")
                    + Text(f"  ({result.passed} passed)", style="dim"))
        if result.failing_test:
            body.append(Text(f"First failure: {result.failing_test}", style="red"))
        if result.message:
            body.append(Text(_indent(result.message)))
        if result.hint and not result.mistake:  # a named mistake's own sentence says what to fix
            body.append(Text("Hint: ", style="bold") + Text(result.hint))
        body.append(Text(f'More hints, one level at a time: hint("{ex.name}")  or  sampling-course hint {ex.name}',
                         style="dim"))
    else:
        body.append(Text("· No tests for this exercise yet.", style="bold blue"))
        if result.message:
            body.append(Text(f"(all {result.total} tests skipped: {result.message})", style="dim"))
    title = f"[bold]{ex.name}[/]  [dim]part {ex.part_label}: {SECTIONS[ex.part_label]}[/]"
    return Panel(Group(*body), title=title, title_align="left", border_style=_STYLE[result.status], expand=False)


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def render_table(results: Sequence[Result], title: str | None = None) -> Table:
    """Every result as a row under its part's heading, in course order."""
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False, box=None, show_header=False)
    table.add_column("symbol", no_wrap=True)
    table.add_column("exercise", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("tests", justify="right", no_wrap=True, style="dim")
    part = None
    for result in results:
        if result.exercise.part_label != part:
            part = result.exercise.part_label
            table.add_row("", Text(f"Part {part}: {SECTIONS[part]}", style="bold"), "", "")
        style = _STYLE[result.status]
        table.add_row(
            Text(f"  {_SYMBOL[result.status]}", style=style),
            result.name,
            Text(_status_word(result), style=style),
            _tests_text(result),
        )
    return table


def _bar(done: int, total: int, width: int = 25) -> Text:
    """A plain-text progress bar; it reads the same in a terminal, a notebook and a log file."""
    filled = round(width * done / total) if total else 0
    return Text("[", style="dim") + Text("#" * filled, style="green") + Text("-" * (width - filled), style="dim") + Text("]", style="dim")


def _next_up(results: Sequence[Result]) -> Result | None:
    """The first exercise to work on: one with tests that is not done, else one with no tests."""
    pending = [r for r in results if r.status in (TOOK_TOO_LONG, FAILING, NOT_IMPLEMENTED_YET)]
    return pending[0] if pending else next((r for r in results if not r.done), None)


def render_progress(report: CheckReport | Sequence[Result]) -> Group:
    """The rustlings-style overview: a table of every exercise, a bar and 'N/M exercises done'."""
    results = list(report)
    n_done = sum(r.done for r in results)
    impl = report.impl if isinstance(report, CheckReport) else "exercises"
    parts: list[Any] = [render_table(results, title=f"Progress ({impl}/)")]
    parts.append(
        Text("Progress: ") + _bar(n_done, len(results))
        + Text(f" {n_done}/{len(results)} exercises done", style="bold green" if n_done == len(results) else "bold")
    )
    nxt = _next_up(results)
    if nxt is not None and nxt.status != NO_TESTS_YET:
        parts.append(Text(f"Next up: {nxt.name} ({_status_word(nxt)}): {nxt.exercise.task}", style=_STYLE[nxt.status]))
        parts.append(Text(f'  check("{nxt.name}")  ·  hint("{nxt.name}")  ·  sampling-course check {nxt.name}', style="dim"))
    elif results and n_done == len(results):
        parts.append(Text("Every exercise is done. Well done!", style="bold green"))
    if isinstance(report, CheckReport):
        parts.extend(_collection_warnings(report))
    return Group(*parts)


def _collection_warnings(report: CheckReport) -> list[Text]:
    return [Text(f"warning: a test file could not be collected: {error}", style="yellow") for error in report.collection_errors]


def render_report(report: CheckReport) -> Group:
    """One panel for one exercise; for several, the table plus the panel of the next one to fix."""
    results = list(report)
    parts: list[Any] = []
    if len(results) == 1:
        parts.append(render_result(results[0]))
    else:
        parts.append(render_table(results, title=f"Checked {len(results)} exercises ({report.impl}/)"))
        nxt = _next_up(results)
        if nxt is not None and nxt.status != NO_TESTS_YET:
            parts.append(render_result(nxt))
        n_done = sum(r.done for r in results)
        parts.append(Text(f"{n_done}/{len(results)} exercises done", style="bold"))
    parts.extend(_collection_warnings(report))
    return Group(*parts)


def render_hints(exercise: Exercise, levels: Sequence[int]) -> Panel:
    """A panel with the chosen hint levels of one exercise."""
    n = len(exercise.hints)
    body: list[Any] = [Text(exercise.task, style="italic"), Text("")]
    for level in levels:
        body.append(Text(f"Hint {level}/{n}", style="bold cyan"))
        body.append(Text(_indent(exercise.hint(level)) if level == n else exercise.hint(level)))
    if levels[-1] < n:
        body.append(Text(""))
        body.append(Text(f'Stuck? The next hint: hint("{exercise.name}") again, or sampling-course hint {exercise.name}',
                         style="dim"))
    return Panel(Group(*body), title=f"[bold]{exercise.name}[/]  [dim]{exercise.location}[/]", title_align="left",
                 border_style="cyan", expand=False)
