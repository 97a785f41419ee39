"""The submission's process: started from a template that has torch loaded, confined, then serving.

Starting Python and importing torch takes seconds; grading a submission's exercise can take
less. So the grader starts one *template* process per grading process (``Template``): it
imports torch and the libraries the exercises use, then waits. For each submission it forks
a child that confines itself (``confine.py``: namespaces, limits, Landlock, audit hook) and
only then puts the submission's copy on ``sys.path`` and answers the grader's requests over
the bridge (``bridge.py``). The template never imports the submission, the tests or the
solutions, so the child has nothing of theirs in memory to read.

The child's first message says which measures are in force; what the audit hook records
arrives on a separate pipe (``Worker.attempts``).

Run as ``python -m sampling_course.grading.classroom.worker FD`` by ``Template`` only.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# What the template imports before it forks: torch and the exercises' own imports.
PRELOAD = ("torch", "torch.nn.functional", "einops", "jaxtyping", "tqdm.auto", "rich.console", "rich.table",
           "rich.text", "sampling_course.config", "sampling_course.grading.classroom.bridge",
           "sampling_course.grading.classroom.proxies", "sampling_course.grading.classroom.confine")

# Objects a submission might replace to fool a comparison made in its own process (which
# this design never does); replacing one is reported, for the instructor's information.
WATCHED = ("torch.allclose", "torch.equal", "torch.isclose", "torch.testing.assert_close", "torch.Tensor.__eq__",
           "torch.Tensor.allclose", "torch.Tensor.equal", "builtins.isinstance", "builtins.len")
_SNAPSHOT: dict[str, int] = {}


def _resolve(path: str) -> Any:
    module, *attrs = path.split(".")
    obj = importlib.import_module(module)
    for attr in attrs:
        obj = getattr(obj, attr)
    return obj


def integrity() -> list[str]:
    """Watched objects replaced in this process, and test machinery imported here (named, not judged)."""
    changed = [path for path, ident in _SNAPSHOT.items() if id(_resolve(path)) != ident]
    if any(name == "pytest" or name.startswith("_pytest") for name in sys.modules):
        changed.append("pytest (imported in its own process)")
    return changed


# ---------------------------------------------------------------------------------------
# In the template and its children
# ---------------------------------------------------------------------------------------


def _serve(sock_fd: int, attempts_fd: int, settings: dict[str, Any], spaces: str) -> None:
    """The child that runs the submission: confine, then answer requests until the grader hangs up."""
    import torch

    from sampling_course.grading.classroom.bridge import Endpoint
    from sampling_course.grading.classroom.confine import Limits, confine
    from sampling_course.grading.classroom.wire import write_frame

    sock = socket.socket(fileno=sock_fd)  # before the audit hook, which refuses new sockets
    copy = Path(settings["copy"])
    os.chdir(copy)
    home = copy / ".home"
    home.mkdir(exist_ok=True)
    os.environ.clear()  # nothing of the grader's environment (tokens, paths) reaches the submission
    os.environ.update(PATH="/usr/bin:/bin", HOME=str(home), TMPDIR=str(home), OMP_NUM_THREADS="1", LANG="C.UTF-8")
    for path in WATCHED:
        _SNAPSHOT[path] = id(_resolve(path))
    measures = confine(copy, [Path(p) for p in settings["readable"]], Limits(**settings["limits"]), attempts_fd,
                       spaces)
    torch.set_num_threads(1)
    sys.path.insert(0, str(copy))
    importlib.invalidate_caches()
    write_frame(sock, {"hello": measures, "pid": os.getpid()}, [])
    Endpoint(sock, peer_trusted=True, owns_modules=True).serve_forever()


def _child(sock_fd: int, attempts_fd: int, settings: dict[str, Any]) -> None:
    from sampling_course.grading.classroom.confine import namespaces

    os.setsid()  # one process group: the grader stops every process of the submission at once
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    spaces = namespaces()
    if "pid" not in spaces:
        _serve(sock_fd, attempts_fd, settings, spaces)
        return
    inner = os.fork()  # process 1 of the new namespace: when it ends, so does everything it started
    if inner == 0:
        _serve(sock_fd, attempts_fd, settings, spaces)
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interruption is meant for the inner process
    os.close(sock_fd)
    os.close(attempts_fd)
    _, status = os.waitpid(inner, 0)
    os._exit(min(255, max(0, os.waitstatus_to_exitcode(status))))


def template_main(control_fd: int) -> None:
    """The template: preload, then fork one confined child per request on ``control_fd``."""
    # Run as __main__: make `import ...classroom.worker` (integrity, asked by the grader) this same module.
    sys.modules.setdefault("sampling_course.grading.classroom.worker", sys.modules[__name__])
    for name in PRELOAD:
        importlib.import_module(name)
    import torch

    torch.set_num_threads(1)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    control = socket.socket(fileno=control_fd)
    control.sendall(b"ready\n")
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 1 << 16, 2)
        except OSError:
            return
        if not message:
            return  # the grader is gone
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            try:
                control.close()
                _child(fds[0], fds[1], json.loads(message))
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)
        control.sendall(json.dumps({"pid": pid}).encode() + b"\n")


# ---------------------------------------------------------------------------------------
# On the grader's side
# ---------------------------------------------------------------------------------------


class Worker:
    """A running submission process, from the grader's side."""

    def __init__(self, pid: int, sock: socket.socket, attempts: int, measures: dict[str, str]):
        self.pid = pid
        self.sock = sock
        self.attempts_fd = attempts
        self.measures = measures
        self._attempts: list[dict[str, str]] = []
        self._partial = b""

    def interrupt(self) -> None:
        """Raise KeyboardInterrupt in the submission's code (a call that ran out of time)."""
        try:
            os.killpg(self.pid, signal.SIGINT)
        except OSError:
            pass

    def attempts(self) -> list[dict[str, str]]:
        """What the audit hook recorded so far (untrusted text: it only ever flags)."""
        os.set_blocking(self.attempts_fd, False)
        try:
            while len(self._partial) < (1 << 20):
                chunk = os.read(self.attempts_fd, 1 << 16)
                if not chunk:
                    break
                self._partial += chunk
        except (BlockingIOError, OSError):
            pass
        *lines, self._partial = self._partial.split(b"\n")
        for line in lines[:500]:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("kind"), str) and isinstance(record.get("detail"), str):
                self._attempts.append({"kind": record["kind"][:20], "detail": record["detail"][:300]})
        return list(self._attempts)

    def stop(self) -> None:
        """End the submission's processes and close the connection."""
        from sampling_course.grading.classroom.wire import forget

        self.attempts()
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        forget(self.sock)
        self.sock.close()
        try:
            os.close(self.attempts_fd)
        except OSError:
            pass


class Template:
    """The template process of this grading process (started on first use, one per process)."""

    _current: "Template | None" = None

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "sampling_course.grading.classroom.worker", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        theirs.close()
        self.control = ours
        self.control.settimeout(300)
        if self._readline() != b"ready":
            raise RuntimeError("the grading template process did not start")

    @classmethod
    def get(cls) -> "Template":
        if cls._current is None or cls._current.process.poll() is not None:
            cls._current = cls()
        return cls._current

    def _readline(self) -> bytes:
        line = b""
        while not line.endswith(b"\n"):
            chunk = self.control.recv(1)
            if not chunk:
                raise RuntimeError("the grading template process ended")
            line += chunk
        return line.strip()

    def spawn(self, copy: Path, readable: list[Path], limits: dict[str, int], timeout: float = 120) -> Worker:
        """A new confined process for the submission copied to ``copy``."""
        from sampling_course.grading.classroom.wire import Deadline, read_frame

        ours, theirs = socket.socketpair()
        read_end, write_end = os.pipe()
        settings = {"copy": str(copy), "readable": [str(p) for p in readable], "limits": limits}
        socket.send_fds(self.control, [json.dumps(settings).encode()], [theirs.fileno(), write_end])
        theirs.close()
        os.close(write_end)
        pid = json.loads(self._readline())["pid"]
        try:
            hello, _ = read_frame(ours, Deadline(time.monotonic() + timeout))
        except Exception:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            ours.close()
            os.close(read_end)
            raise
        measures = hello.get("hello", {}) if isinstance(hello, dict) else {}
        return Worker(pid, ours, read_end, {str(k): str(v) for k, v in measures.items()})

    def close(self) -> None:
        self.control.close()
        self.process.kill()
        self.process.wait()


if __name__ == "__main__":
    template_main(int(sys.argv[1]))
