"""``sampling-course watch``: check each exercise again whenever its file is saved, in one warm process.

A first ``sampling-course check`` pays for starting Python, importing torch and pytest and
loading the reference models; every later check in the same process reuses all of that (the
references and their stored outputs are kept per process, see ``reference.load_reference`` and
``grading.oracle.shared_store``). A notebook's kernel gets this for free; ``watch`` gives the
command line the same, as rustlings' ``watch`` does: leave it running beside the editor, save,
and the verdict appears.

What is checked after a save: the exercises the saved file holds whose code changed since the
last save (all of the file's exercises when something else in it changed, a helper or an
import), each through ``grading.checking.check``, so the panel is the one ``check`` prints.
With ``--dependents``, also the exercises of other files that use the saved one: those whose
tests imported it when this process last checked them, or, before that, whose file imports it.
A file that does not compile is reported in one line (where, and what) and the watch goes on.
Changes are noticed by polling the files' modification times and sizes: no extra dependency,
and it works on every file system an editor saves to.
"""

from __future__ import annotations

import ast
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from sampling_course.apps.options import OneLineParser, UsageError, command, parse

__all__ = ["Watcher", "changed_names", "watch_main"]


def definitions(source: str) -> dict[str, str]:
    """``{qualified name: source}`` of a module's top-level functions and classes and of each class's methods.

    A class's own entry is its source without its methods' bodies (its header, attributes and
    docstring), so that editing one method changes only that method's entry. ``""`` holds what
    is outside every definition (imports, constants)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)

    def text(node: ast.AST) -> str:
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        return "".join(lines[start - 1:node.end_lineno])

    found: dict[str, str] = {}
    outside = list(lines)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            whole = text(node)
            if isinstance(node, ast.ClassDef):
                own = whole
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        found[f"{node.name}.{item.name}"] = text(item)
                        own = own.replace(text(item), f"<{item.name}>\n", 1)
                whole = own
            found[node.name] = whole
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            outside[start - 1:node.end_lineno] = [""] * (node.end_lineno - start + 1)
        # module-level statements stay in ``outside``
    found[""] = "".join(outside)
    return found


def changed_names(before: str | None, after: str) -> set[str] | None:
    """The qualified names whose source differs between two versions of a module (added and removed
    ones included); None when it cannot tell (no earlier version, or one that does not parse)."""
    if before is None:
        return None
    try:
        old, new = definitions(before), definitions(after)
    except SyntaxError:
        return None
    return {name for name in old.keys() | new.keys() if old.get(name) != new.get(name)}


def _touches(target: str, name: str) -> bool:
    """Whether a change to ``name`` can change exercise ``target``: the same definition, a method of a
    class the target is, or the class that holds a target method (its attributes, its header)."""
    return name == target or name.startswith(target + ".") or target.startswith(name + ".")


def _relative_imports(source: str) -> set[str]:
    """The sibling modules a module of the implementation's package imports (``from .x import y``, ``from . import x``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


@dataclass
class Watcher:
    """The files of an implementation's package and what a save of each means for the exercises.

    ``folder``: the package (``exercises/``); ``exercises``: every exercise of the course, in course
    order; ``only``: the names of those to check (None: all); ``dependents``: also name the exercises
    of other files that use a saved one."""

    folder: Path
    exercises: Sequence = ()
    only: frozenset[str] | None = None
    dependents: bool = False
    # file name -> (mtime_ns, size); file name -> its source when last checked; exercise -> files its tests imported
    stamps: dict[str, tuple[int, int]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    imported: dict[str, frozenset[str]] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)  # saved, not yet checked (a file did not compile)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        self.stamps = self._stamps()
        for name in self.stamps:
            self.sources[name] = self._read(name)

    def _stamps(self) -> dict[str, tuple[int, int]]:
        stamps = {}
        for path in self.folder.glob("*.py"):
            try:
                stat = path.stat()
            except OSError:  # removed between listing and stat (an editor's save by rename)
                continue
            stamps[path.name] = (stat.st_mtime_ns, stat.st_size)
        return stamps

    def _read(self, name: str) -> str:
        try:
            return (self.folder / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return ""

    def saved(self) -> list[str]:
        """The files saved (or created) since the last call, with those saved earlier and not checked yet."""
        stamps = self._stamps()
        saved = {name for name, stamp in stamps.items() if self.stamps.get(name) != stamp}
        self.stamps = stamps
        return sorted(saved | self.pending)

    def problem(self, name: str) -> str | None:
        """One line when a saved file does not compile (a syntax error), else None."""
        source = self._read(name)
        try:
            compile(source, str(self.folder / name), "exec", dont_inherit=True)
        except SyntaxError as exc:
            where = f"line {exc.lineno}" if exc.lineno else "somewhere"
            return f"{self.folder.name}/{name}, {where}: {type(exc).__name__}: {exc.msg}"
        except ValueError as exc:  # e.g. a null byte in the file
            return f"{self.folder.name}/{name}: {exc}"
        return None

    def to_check(self, saved: Iterable[str]) -> list:
        """The exercises to check now that ``saved`` were saved, in course order; their sources become the
        ones the next save is compared with."""
        chosen: set[str] = set()
        for name in saved:
            source = self._read(name)
            changed = changed_names(self.sources.get(name), source)
            self.sources[name] = source
            module = name.removesuffix(".py")
            own = [e for e in self.exercises if e.module == module]
            if changed == set():
                continue  # saved without a change
            if changed is not None and all(any(_touches(e.target, n) for e in own) for n in changed):
                own = [e for e in own if any(_touches(e.target, n) for n in changed)]
            # else: a helper, an import or a constant changed (or it cannot tell): every exercise of the file
            chosen.update(e.name for e in own)
            if self.dependents:
                chosen.update(e.name for e in self.exercises if e.module != module and self._uses(e, name))
        self.pending.clear()
        return [e for e in self.exercises if e.name in chosen and (self.only is None or e.name in self.only)]

    def _uses(self, exercise, file: str) -> bool:
        """Whether ``exercise`` uses ``file``: its tests imported it when last checked here, or its own file
        imports it (directly or through other files of the package) when it was not checked yet."""
        if exercise.name in self.imported:
            return file in self.imported[exercise.name]
        seen, todo = set(), [exercise.module]
        while todo:
            module = todo.pop()
            if module in seen:
                continue
            seen.add(module)
            try:
                todo += _relative_imports(self.sources.get(f"{module}.py", ""))
            except SyntaxError:
                continue
        return file.removesuffix(".py") in seen - {exercise.module}

    def learn(self, report) -> None:
        """Remember which files each checked exercise's tests imported (``CheckReport.imported``)."""
        self.imported.update(getattr(report, "imported", None) or {})


def pause(seconds: float) -> None:
    """The wait between two looks at the files (a function of its own so that tests can stand in for it)."""
    time.sleep(seconds)


def watched_folder(impl: str) -> Path:
    """The implementation's package in the checkout whose tests grade it (``exercises/`` or ``solutions/``)."""
    from sampling_course.grading.runner import TestsNotFoundError, tests_dir

    try:
        return tests_dir().parent / impl
    except TestsNotFoundError as exc:
        raise UsageError(str(exc)) from None


def watch(watcher: Watcher, check: Callable[[list], object], console: Console, *, interval: float = 0.5,
          rounds: int | None = None) -> None:
    """Poll ``watcher`` every ``interval`` seconds and ``check`` what each save calls for; ``rounds``: stop after
    that many polls (None: until Ctrl-C, whose KeyboardInterrupt goes to the caller)."""
    polls = 0
    while rounds is None or polls < rounds:
        pause(interval)
        polls += 1
        saved = watcher.saved()
        if not saved:
            continue
        broken = [line for line in map(watcher.problem, saved) if line]
        if broken:
            # Its exercises cannot run, nor can those that import it: wait for the fix, then check all that was saved.
            for line in broken:
                console.print(f"[red]does not compile:[/] {escape(line)}", soft_wrap=True)
            watcher.pending.update(saved)
            console.print("[dim]fix it and save again; still watching (Ctrl-C to stop)[/]")
            continue
        exercises = watcher.to_check(saved)
        files = ", ".join(f"{watcher.folder.name}/{name}" for name in saved)
        if not exercises:
            console.print(f"[dim]{escape(files)} saved: no exercise to check changed; still watching[/]")
            continue
        console.rule(f"{escape(files)} saved: checking {escape(', '.join(e.name for e in exercises))}")
        watcher.learn(check(exercises))
        console.print("[dim]watching for the next save (Ctrl-C to stop)[/]")


@command("sampling-course watch")
def watch_main(argv: Sequence[str] | None = None) -> int:
    """``sampling-course watch [EXERCISE ...] [--dependents] [--impl ...] [--threads N] [--interval S]``."""
    from sampling_course.apps.course_commands import GRADE_DEVICE_HELP
    from sampling_course.apps.options import add_device_option, add_threads_option, device_from
    from sampling_course.grading.course import EXERCISES, UnknownExerciseError, get_exercise
    from sampling_course.implementation import resolve_impl

    parser = OneLineParser(
        prog="sampling-course watch",
        description="Keep the course loaded and check an exercise again each time you save its file "
        "(the same panel as `sampling-course check`); Ctrl-C stops.",
    )
    parser.add_argument("exercise", nargs="*", help="only these exercises (default: every exercise of a saved file)")
    parser.add_argument("--dependents", action="store_true",
                        help="also check the exercises of other files that use the saved one")
    parser.add_argument("--impl", choices=["exercises", "solutions"], default=None,
                        help="implementation to watch: exercises (default) or solutions; also SAMPLING_COURSE_IMPL")
    add_device_option(parser, default=None, help=GRADE_DEVICE_HELP)
    add_threads_option(parser)
    parser.add_argument("--interval", type=float, default=0.5, metavar="S",
                        help="seconds between looks at the files' modification times (default 0.5)")
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    if not 0.05 <= args.interval <= 60:
        raise UsageError(f"--interval must be between 0.05 and 60 seconds, got {args.interval}")
    try:
        chosen = [get_exercise(name) for name in args.exercise]
    except UnknownExerciseError as exc:
        raise UsageError(str(exc)) from None
    try:
        impl = resolve_impl(args.impl)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    device = str(device_from(parser, args)) if args.device is not None else None
    console = Console()
    folder = watched_folder(impl)
    watcher = Watcher(folder, EXERCISES, only=frozenset(e.name for e in chosen) if chosen else None,
                      dependents=args.dependents)
    from sampling_course.grading.checking import check

    def run(selected: list):
        return check([e.name for e in selected], impl=impl, device=device, console=console, threads=args.threads)

    try:
        if chosen:  # as rustlings does: the exercises named are checked at once, which also warms the process
            watcher.learn(run(chosen))
        else:
            warm_up(console)
        console.print(f"watching {escape(str(folder))}: save a file to check its exercises (Ctrl-C to stop)")
        watch(watcher, run, console, interval=args.interval)
    except KeyboardInterrupt:
        # One line, and the usual exit code of an interrupted command.
        print(f"{chr(10) if sys.stderr.isatty() else ''}sampling-course watch: stopped", file=sys.stderr, flush=True)
        return 130
    return 0


def warm_up(console: Console) -> None:
    """Import what every check needs (pytest, torch, the grader) and load the offline reference models once,
    so that the first save is checked as fast as the later ones."""
    with console.status("loading torch and the reference models once..."):
        import sampling_course.grading.runner  # noqa: F401  (pytest, torch, the plugin)
        from sampling_course.reference import load_reference

        for name in ("tiny", "story"):
            try:
                load_reference(name)
            except Exception:  # noqa: BLE001 - a check that needs it reports the problem in its own words
                pass
