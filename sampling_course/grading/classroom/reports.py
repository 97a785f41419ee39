"""What a grading run writes: a CSV of points, a feedback file per student, and one class report.

``write_reports(results, settings, out)`` writes into ``out``:

* ``grades.csv``: one row per student, one column per exercise (points earned), the total,
  and the flags;
* ``feedback/<student>.md``: each exercise passed or not, the classic mistake a failure
  matches, the first hint, and what the grader noticed (flags); a hidden test's message is
  never shown, only that a hidden test failed;
* ``class_report.html``: one page that opens offline (plots embedded as PNG): the pass rate
  of every exercise in course order, the most frequent named mistakes, the distribution of
  scores, and the flagged submissions;
* ``results.json``: every result as data, for other tools.

Everything a submission could have written (its name, its messages, the names of files it
made) is shown escaped: a control character (a terminal escape, a carriage return, a bidi
override) as ``\x1b`` or ``\u202e``, a byte of a file name that is not UTF-8 as ``\xff``
(``escaped``, ``cleaned``). A report that cannot be written for one student is written for
every other, and what could not be written is listed in ``report_problems.txt``.
"""

from __future__ import annotations

import base64
import csv
import datetime
import html
import io
import json
import hashlib
import re
import unicodedata
from collections import Counter
from pathlib import Path
from statistics import mean, median
from typing import Any

from sampling_course.grading.classroom.settings import GradeSettings
from sampling_course.grading.course import PARTS, get_exercise

__all__ = ["UNSAFE", "UNVERIFIED", "cleaned", "csv_cell", "escaped", "feedback_text", "md_escape", "safe_name", "unsafe",
           "write_reports"]

_MISTAKE_PREFIX = "This matches a classic mistake: "
_STATUS_WORDS = {"done": "passed", "failing": "failing", "not implemented yet": "not implemented yet",
                 "took too long": "took too long", "no tests yet": "no tests", "not graded": "not graded"}


def safe_name(student: str) -> str:
    """A file name for a student's id: letters, digits, ``-``, ``_`` and ``.`` only, one per student.

    An id that is such a name already is its own file name; any other gets a digest of the id added
    (``zz control2`` is ``zz_control2-<digest>``, never the ``zz_control2`` of a classmate), so the
    name depends on the id alone, not on who else is in the class.
    """
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", student).strip("._-") or "student"
    if name == student and len(name) <= 100:
        return name
    digest = hashlib.sha256(student.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{name[:80]}-{digest}"


_SHOWN_RAW = {"\n", "\t"}  # kept as they are where lines are kept (a message's lines)


def escaped(text: Any, newlines: bool = True) -> str:
    """``text`` with every control character escaped (``\x1b``, ``\r``, ``\u202e``; newlines and tabs too unless
    ``newlines``) and each byte of a name that was not UTF-8 (a surrogate escape) written ``\xff``."""
    out = []
    for char in str(text):
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # a byte os.listdir could not decode
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char in _SHOWN_RAW and newlines:
            out.append(char)
        elif unicodedata.category(char) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


def cleaned(value: Any) -> Any:
    """``value`` (a result, or any part of one) with every string in it ``escaped``; a student's name on one line."""
    if isinstance(value, str):
        return escaped(value)
    if isinstance(value, dict):
        return {cleaned(k): escaped(v, newlines=False) if k in ("student", "submission") and isinstance(v, str)
                else cleaned(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [cleaned(v) for v in value]
    return value


def graded_without_a_record_html(results: list[dict[str, Any]]) -> str:
    """The class report's list of the exercises graded without a record the submission could change: where a
    test's verdict rests on a record kept in the submission's own process, and what that verdict may do."""
    graded = {e["exercise"] for r in results for e in r["exercises"]}
    own = sorted({e["exercise"] for r in results for e in r["exercises"] if e.get("unverified")})
    items = []
    if own:
        items.append(f"<li>{html.escape(', '.join(own))}: tests checked on a record the code's own process kept "
                     "(OpRecorder's tensor operations, MethodCalls' calls, PlannedSteps' blocks). A failure there counts; a pass earns "
                     "nothing: the exercise is earned on its other tests.</li>")
    for name, what in OWN_PROCESS_BOUNDS.items():
        if name in graded:
            items.append(f"<li>{html.escape(name)}: {html.escape(what)}, recorded in the submission's own process, which could "
                         "change it: a failure there counts, a pass earns nothing (its outputs and the positions of "
                         "each forward pass, counted in the double host, are checked apart from it).</li>")
    if not items:
        return ""
    return f"<h2>Graded without a record the submission could change</h2><ul>{''.join(items)}</ul>"


def _points(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.2f}"


UNVERIFIED = ("test(s) checked on a record your own process kept (tensor operations, method calls or KV blocks held, as "
              "it recorded them; your code could change that record): a failure there counts, a pass earns nothing, "
              "so the exercise is earned on its other tests")
# Part 10's exercises whose tests also read a record kept in the submission's process, and what it records.
OWN_PROCESS_BOUNDS = {
    "Engine.step": "the calls of BlockTable.slots (MethodCalls) and the blocks held at each step (PlannedSteps)",
    "block_hashes": "the blocks held at each step (PlannedSteps)",
}
UNSAFE = "Graded WITHOUT a sandbox (--unsafe-no-sandbox): the submissions' code ran unconfined."
_MARKDOWN = re.compile(r"([\\`*_{}\[\]#|~])")  # marks that act anywhere in a line
_LINE_START = re.compile(r"^(\s*\d*)([-+>=.)])", re.MULTILINE)  # marks that act at a line's start (1. is a list)


def unsafe(result: dict[str, Any]) -> bool:
    """Whether ``result`` was graded without bubblewrap (the instructor's ``--unsafe-no-sandbox``)."""
    return str(result.get("sandbox", {}).get("sandbox", "")).startswith("NONE")


def md_escape(text: Any) -> str:
    """``text`` as literal Markdown: HTML escaped, Markdown's marks backslashed, lines kept."""
    escaped = _MARKDOWN.sub(r"\\\1", html.escape(str(text), quote=False))
    escaped = _LINE_START.sub(lambda m: m.group(1) + "\\" + m.group(2), escaped)
    return "  \n".join(escaped.splitlines())


def csv_cell(value: Any) -> str:
    """A CSV cell that a spreadsheet will not run: one starting with = + - @ (or a tab or return) gets a quote."""
    text = str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def feedback_text(result: dict[str, Any]) -> str:
    """One student's feedback, in Markdown; everything quoted from the grading is escaped, never fenced."""
    result = cleaned(result)
    lines = [f"**{UNSAFE}**", ""] if unsafe(result) else []
    lines += [f"# Feedback for {md_escape(result['student'])}", "",
              f"Score: **{_points(result['score'])} / {_points(result['max_score'])}**", ""]
    if result.get("error"):
        lines += [f"Your submission could not be graded: {md_escape(result['error'])}", ""]
    lines += ["| exercise | result | points |", "|---|---|---|"]
    for e in result["exercises"]:
        lines.append(f"| {e['exercise']} | {_STATUS_WORDS.get(e['status'], e['status'])} | "
                     f"{_points(e['points'])} / {_points(e['max_points'])} |")
    todo = [e for e in result["exercises"] if e["status"] not in ("done", "not graded")]  # why not graded: said once
    if todo:
        lines += ["", "## What to look at", ""]
    for e in todo:
        lines += [f"### {e['exercise']}: {_STATUS_WORDS.get(e['status'], e['status'])}", ""]
        if e.get("mistake"):
            lines += [md_escape(e["mistake"]), ""]
        if e["status"] == "not implemented yet":
            stubs = ", ".join(e.get("stubs") or []) or "the stub"
            lines += [f"{md_escape(stubs)} still raises NotImplementedError.", ""]
        elif e.get("message"):
            shown = "A hidden test failed (its inputs stay hidden)." if e.get("hidden_failure") else e["message"]
            lines += [md_escape(shown.strip()), ""]
        counted = e["ran"] + e.get("not_run", 0)
        if e.get("partial") and counted:
            lines += [f"{e['passed']} of {counted} tests passed"
                      + (f" ({e['not_run']} not run: they count as not passed)." if e.get("not_run") else "."), ""]
        if e.get("hint"):
            lines += [f"Hint: {md_escape(e['hint'])}", ""]
    unverified = [e for e in result["exercises"] if e.get("unverified")]
    if unverified:
        lines += ["## Checked on your own record", ""]
        lines += [f"- {e['exercise']}: {e['unverified']} {md_escape(UNVERIFIED)}" for e in unverified] + [""]
    if result.get("flags"):
        lines += ["## Noticed while grading", ""] + [f"- {md_escape(f['reason'])}" for f in result["flags"]] + [""]
    if result.get("notes"):
        lines += ["## Notes", ""] + [f"- {md_escape(n)}" for n in result["notes"]] + [""]
    return "\n".join(lines).rstrip() + "\n"


def _write_csv(results: list[dict[str, Any]], names: list[str], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", *names, "score", "max_score", "flags", "error"])
        for r in results:
            by_name = {e["exercise"]: e["points"] for e in r["exercises"]}
            writer.writerow([csv_cell(r["student"]), *(_points(by_name.get(n, 0.0)) for n in names),
                             _points(r["score"]), _points(r["max_score"]),
                             csv_cell("; ".join(dict.fromkeys(f["kind"] for f in r.get("flags", [])))),
                             csv_cell(r.get("error") or "")])


# ---------------------------------------------------------------------------------------
# The class report
# ---------------------------------------------------------------------------------------


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _mistake_label(exercise: str, sentence: str) -> str:
    text = sentence.removeprefix(_MISTAKE_PREFIX).strip()
    text = text.split(", where ")[0].split(" (")[0].rstrip(".")
    return f"{exercise}: {text[:70]}{'...' if len(text) > 70 else ''}"


def _plots(results: list[dict[str, Any]], names: list[str], settings: GradeSettings) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(results))
    rates = [sum(1 for r in results for e in r["exercises"] if e["exercise"] == name and e["status"] == "done") / n
             for name in names]
    colors = plt.get_cmap("tab10")
    parts = [get_exercise(name).part for name in names]
    plots = {}

    fig, ax = plt.subplots(figsize=(max(6.0, 0.28 * len(names) + 2), 4.2))
    ax.bar(range(len(names)), [100 * r for r in rates], color=[colors(p - 1) for p in parts])
    ax.set_xticks(range(len(names)), names, rotation=70, ha="right", fontsize=8)
    ax.set_ylabel("submissions passing (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Pass rate per exercise, in course order (colour: part)")
    from matplotlib.patches import Patch

    handles = [Patch(color=colors(part - 1), label=f"{part}. {PARTS[part]}") for part in sorted(set(parts))]
    ax.legend(handles=handles, fontsize=7, ncol=2, loc="upper right", framealpha=0.9)
    plots["pass_rate"] = _png(fig)
    plt.close(fig)

    mistakes = Counter(_mistake_label(e["exercise"], e["mistake"])
                       for r in results for e in r["exercises"] if e.get("mistake"))
    top = mistakes.most_common(15)
    fig, ax = plt.subplots(figsize=(9, 0.35 * max(3, len(top)) + 1))
    if top:
        labels, counts = zip(*reversed(top))
        ax.barh(range(len(top)), counts, color="#c0504d")
        ax.set_yticks(range(len(top)), labels, fontsize=8)
        ax.set_xlabel("submissions")
    else:
        ax.text(0.5, 0.5, "no failure matched a classic mistake", ha="center", va="center")
        ax.set_axis_off()
    ax.set_title("Most frequent named mistakes")
    plots["mistakes"] = _png(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.6))
    scores = [r["score"] for r in results]
    top_score = settings.max_score or 1.0
    ax.hist(scores, bins=min(20, max(5, int(top_score) + 1)), range=(0, top_score), color="#4f81bd", edgecolor="white")
    ax.set_xlabel(f"score (out of {_points(top_score)})")
    ax.set_ylabel("submissions")
    ax.set_title("Distribution of scores")
    plots["scores"] = _png(fig)
    plt.close(fig)
    return plots


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; padding: 0 1em; }
h1 { margin-bottom: 0.2em; } .muted { color: #666; }
table { border-collapse: collapse; margin: 1em 0; font-size: 14px; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: left; } th { background: #f4f4f4; }
.stats { display: flex; gap: 2em; margin: 1em 0; } .stat { background: #f4f6fa; padding: 0.8em 1.2em; border-radius: 6px; }
.stat b { display: block; font-size: 1.6em; } img { max-width: 100%; } .flag { color: #a33; }
"""


def class_report_html(results: list[dict[str, Any]], settings: GradeSettings, title: str = "Class report") -> str:
    """The class report as one self-contained HTML page."""
    names = list(settings.exercises)
    plots = _plots(results, names, settings)
    scores = [r["score"] for r in results] or [0.0]
    esc = html.escape
    flagged = [r for r in results if r.get("flags")]  # what the grader saw a submission do
    refused = [r for r in results if r.get("error")]  # submissions that could not be graded at all
    rows = []
    for name in names:
        entries = [e for r in results for e in r["exercises"] if e["exercise"] == name]
        counts = Counter(e["status"] for e in entries)
        rows.append(f"<tr><td>{esc(name)}</td><td>{get_exercise(name).part}</td><td>{counts['done']}</td>"
                    f"<td>{counts['failing']}</td><td>{counts['not implemented yet']}</td>"
                    f"<td>{counts['took too long']}</td></tr>")
    flag_rows = "".join(
        f"<tr><td>{esc(r['student'])}</td><td>{_points(r['score'])}</td><td class='flag'>"
        + esc("; ".join(f["reason"] for f in r.get("flags", []))) + "</td></tr>" for r in flagged)
    apart_text = graded_without_a_record_html(results)
    refused_rows = "".join(f"<tr><td>{esc(r['student'])}</td><td>{esc(r['error'])}</td></tr>" for r in refused)
    sandbox = next((r["sandbox"] for r in results if r.get("sandbox")), {})
    sandbox_rows = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in sandbox.items())
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title><style>{_STYLE}</style></head>
<body>
{f'<p class="flag"><b>{esc(UNSAFE)}</b></p>' if any(unsafe(r) for r in results) else ''}
<h1>{esc(title)}</h1>
<p class="muted">{len(results)} submissions graded on {when}; {len(names)} exercises, {_points(settings.max_score)} points.</p>
<div class="stats">
<div class="stat"><b>{_points(round(mean(scores), 2))}</b>mean score</div>
<div class="stat"><b>{_points(median(scores))}</b>median score</div>
<div class="stat"><b>{sum(1 for s in scores if s >= settings.max_score)}</b>full marks</div>
<div class="stat"><b>{len(flagged)}</b>flagged</div>
</div>
<h2>Pass rate per exercise</h2><img alt="pass rate per exercise" src="{plots['pass_rate']}">
<h2>Most frequent named mistakes</h2><img alt="most frequent named mistakes" src="{plots['mistakes']}">
<h2>Scores</h2><img alt="distribution of scores" src="{plots['scores']}">
<h2>Exercises</h2>
<table><tr><th>exercise</th><th>part</th><th>passed</th><th>failing</th><th>not implemented</th><th>too long</th></tr>
{''.join(rows)}</table>
<h2>Flagged submissions</h2>
{'<table><tr><th>student</th><th>score</th><th>why</th></tr>' + flag_rows + '</table>' if flagged else '<p>None.</p>'}
<h2>Not graded</h2>
{'<table><tr><th>student</th><th>why</th></tr>' + refused_rows + '</table>' if refused else '<p>None.</p>'}
{apart_text}
<h2>How submissions were isolated</h2>
<table>{sandbox_rows}</table>
</body></html>
"""


def write_reports(results: list[dict[str, Any]], settings: GradeSettings, out: Path,
                  title: str = "Class report") -> dict[str, Path]:
    """Write the CSV, the feedback files, the class report and results.json into ``out``; return their paths."""
    out = Path(out)
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    names = {id(r): safe_name(str(r.get("student", ""))) for r in results}  # from the id as given, escaped or not
    results = sorted(results, key=lambda r: str(r.get("student", "")))
    shown = [cleaned(r) for r in results]
    paths = {"csv": out / "grades.csv", "html": out / "class_report.html", "json": out / "results.json",
             "feedback": out / "feedback"}
    problems: list[str] = []

    def attempt(what: str, write: Any) -> None:
        try:
            write()
        except Exception as exc:  # noqa: BLE001 - one report that cannot be written never stops the others
            problems.append(f"{what}: {type(exc).__name__}: {escaped(exc, newlines=False)}")

    attempt("grades.csv", lambda: _write_csv(shown, list(settings.exercises), paths["csv"]))
    used: set[str] = set()
    for original, result in zip(results, shown):
        name = names[id(original)]
        while name.lower() in used:  # a second id with the same name (on a case-blind disk too): still one each
            name += "_"
        used.add(name.lower())
        attempt(f"feedback for {result.get('student')}",
                lambda: (out / "feedback" / f"{name}.md").write_text(feedback_text(result), encoding="utf-8"))
    attempt("class_report.html", lambda: paths["html"].write_text(class_report_html(shown, settings, title),
                                                                  encoding="utf-8"))
    attempt("results.json", lambda: paths["json"].write_text(json.dumps(shown, indent=1), encoding="utf-8"))
    if problems:
        paths["problems"] = out / "report_problems.txt"
        paths["problems"].write_text("\n".join(problems) + "\n", encoding="utf-8")
    return paths
