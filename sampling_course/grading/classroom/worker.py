"""The submission's process: started in the sandbox (``jail.py``), then serving the grader's requests.

``Worker.start`` starts ``python -I -S worker.py FD PATHS`` inside bubblewrap, one process per
submission (started again after a process had to be stopped). The process's import path is
exactly ``PATHS`` (Python's standard library, the allowed packages, the course's runtime and
the submission's copy): never the grader's folder, never the current folder. First of all it
becomes the sandbox's unprivileged user when the grader is root (``become``) and limits its
threads (``limit_threads``), as the command line tells it; then it imports torch,
puts the copy on its path and answers requests over the bridge (``bridge.py``) until the grader
hangs up. It holds a second connection, to the double host (``host.py``): the same program started
as ``worker.py FD PATHS host PEER_FD``, with no copy of a submission, serving the grader on ``FD``
and the submission on ``PEER_FD``.

Nothing the process says about itself is believed: the grader knows which measures are in
force because it wrote the command line, and it flags a submission only for what it saw
itself (the time a call took, the process ending, running out of memory).

Without bubblewrap (``grade --unsafe-no-sandbox``) the same process starts unconfined, with the
same limits but threads, and every report says so; its import path holds the grader's
site-packages and the course's folder, after the submission's copy (the course's folder holds
the stubs in ``exercises/`` too).
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["THREADS_ENV", "USER_ENV", "Worker", "become", "limit_threads"]

THREADS_ENV = "SAMPLING_COURSE_MAX_THREADS"  # how the sandbox's command line tells the process its thread limit
USER_ENV = "SAMPLING_COURSE_USER"  # ... and, when the grader is root, the user it becomes (``jail.identity``)


def become() -> None:
    """In the sandbox of a grader that is root, first of all: become the unprivileged user ``USER_ENV`` names,
    with no supplementary group. Changing from root to another user, the process loses the only two capabilities
    bubblewrap left it (to do this), and no execution can give any back (bubblewrap sets no_new_privs)."""
    value = os.environ.pop(USER_ENV, None)
    if value is not None:
        os.setgroups([])
        os.setresgid(int(value), int(value), int(value))
        os.setresuid(int(value), int(value), int(value))


def limit_threads() -> None:
    """In the sandbox, before the submission's code runs: at most as many threads as ``THREADS_ENV`` says.

    The kernel counts RLIMIT_NPROC per user in each user namespace, and every sandbox has a namespace of its own,
    so the count is this process's threads and bubblewrap's (no process can be made: the seccomp filter refuses
    it). It is set here, inside: set before bubblewrap starts, the limit would also count, where bubblewrap makes
    its namespace, every process the grader's user runs. Without the sandbox nothing is set, for the same reason.
    """
    value = os.environ.pop(THREADS_ENV, None)
    if value is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (int(value), int(value)))


def _main(fd: int, paths: str, role: str = "submission", peer_fd: int | None = None) -> None:
    """In the sandbox: serve the grader on ``fd`` (the submission's process, or the double host's)."""
    sys.path[:] = paths.split(":")
    become()
    limit_threads()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the grader's interruption of a call that ran too long
    import torch

    from sampling_course.grading.classroom.bridge import Endpoint
    from sampling_course.grading.classroom.wire import write_frame

    torch.set_num_threads(1)
    sock = socket.socket(fileno=fd)
    write_frame(sock, {"hello": os.getpid()}, [])
    peer = None if peer_fd is None else socket.socket(fileno=peer_fd)
    if role == "host":
        from sampling_course.grading.classroom.host import serve

        serve(sock, peer)
        return
    endpoint = Endpoint(sock, peer_trusted=True, owns_modules=True)
    if peer is not None:  # its connection to the double host, which it reads only while it waits for an answer
        endpoint.host = Endpoint(peer, peer_trusted=True, owns_modules=True, random_state=False)
    endpoint.serve_forever()


class Worker:
    """A running submission process, from the grader's side."""

    def __init__(self, process: subprocess.Popen, sock: socket.socket, measures: dict[str, str]):
        self.process = process
        self.sock = sock
        self.measures = measures

    @classmethod
    def start(cls, copy: Path | None, limits: dict[str, int], bwrap: str | None, timeout: float = 120, *,
              peer_fd: int | None = None) -> "Worker":
        """A new process for the submission copied to ``copy`` (in ``bwrap``'s sandbox unless it is None),
        connected to the double host on ``peer_fd``; with no ``copy``, the double host, connected to the
        submission's process on ``peer_fd``."""
        from sampling_course.grading.classroom import jail
        from sampling_course.grading.classroom.wire import Deadline, WireError, read_frame

        ours, theirs = socket.socketpair()
        fds = [theirs.fileno()] + ([] if peer_fd is None else [peer_fd])
        role = ["submission" if copy is not None else "host"] + ([] if peer_fd is None else [str(peer_fd)])
        program = jail.seccomp_filter() if bwrap else None
        read_end, files, held = None, [], []
        memory = address_space = limits["memory_bytes"]
        if bwrap:
            read_end, write_end = os.pipe()
            if program is not None:
                os.write(write_end, program)
            os.close(write_end)
            files = [] if copy is None else jail.copy_files(copy)
            who, held, user = jail.identity()
            fds += [read_end, *(descriptor for descriptor, _ in files), *held]
            first = {THREADS_ENV: str(jail.MAX_THREADS), **({} if user is None else {USER_ENV: user})}
            argv = jail.command(bwrap, None if copy is None else files, theirs.fileno(), read_end, memory,
                                who, first) + role
            if program is None:
                i = argv.index("--seccomp")
                del argv[i:i + 2]
            scratch = jail.scratch_bytes(memory)
            # /tmp and the copy's room are memory too: the address space gives them up, so the three together
            # stay within the memory limit
            address_space -= scratch * (1 if copy is None else 2)
            measures = {"sandbox": "bubblewrap", "user": "unprivileged, a user namespace of its own, no capabilities",
                        "files": f"the course's runtime read-only; its own copy and /tmp, {scratch >> 20} MiB each",
                        "network": "none", "processes": "refused (seccomp)" if program else "pid namespace only",
                        "threads": str(jail.MAX_THREADS)}
        else:
            import sampling_course

            prefix, stdlib = jail.python_paths()
            site = [p for p in sys.path if p.endswith("site-packages")]
            # The copy before the course's folder, which holds the stubs in exercises/ too: the submission's code
            # is what is imported
            paths = ":".join([*stdlib, *site, *([] if copy is None else [str(copy)]),
                              str(Path(sampling_course.__file__).resolve().parents[1])])
            argv = [str(Path(sys.executable).resolve()), "-I", "-S", "-B", str(Path(__file__).resolve()),
                    str(theirs.fileno()), paths, *role]
            measures = {"sandbox": "NONE (--unsafe-no-sandbox)"}

        def limit() -> None:
            os.setsid()  # one process group: the grader stops every process of the submission at once
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # bwrap's own processes ignore it; Python restores it
            jail.rlimits(address_space, limits["cpu_seconds"], limits["file_bytes"], limits["open_files"])

        env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        if not bwrap and jail.gpt2_tokenizer_files():  # GPT-2's tokenizer, from its snapshot (the sandbox binds its files)
            from sampling_course.recording_tokenizer import GPT2_TOKENIZER_ENV, tokenizer_folder

            env[GPT2_TOKENIZER_ENV] = str(tokenizer_folder("gpt2"))
        try:
            process = subprocess.Popen(argv, pass_fds=fds, env=env, cwd=copy or "/", stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=limit)
        finally:
            theirs.close()
            for descriptor in [*(d for d, _ in files), *held, *([] if read_end is None else [read_end])]:
                os.close(descriptor)
        import time

        try:
            read_frame(ours, Deadline(time.monotonic() + timeout))
        except WireError:
            _kill(process)
            ours.close()
            raise
        measures.update({"memory": f"{memory >> 20} MiB", "cpu": f"{limits['cpu_seconds']} s"})
        return cls(process, ours, measures)

    def interrupt(self) -> None:
        """Raise KeyboardInterrupt in the submission's code (a call that ran out of time)."""
        _signal(self.process, signal.SIGINT)

    def stop(self) -> None:
        """End the submission's processes and close the connection."""
        from sampling_course.grading.classroom.wire import forget

        _kill(self.process)
        forget(self.sock)
        self.sock.close()


def _signal(process: subprocess.Popen, sig: int) -> None:
    """Signal the process; inside bubblewrap the Python process is bwrap's child, in the same group."""
    try:
        os.killpg(process.pid, sig)
    except OSError:
        pass


def _kill(process: subprocess.Popen) -> None:
    _signal(process, signal.SIGKILL)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


if __name__ == "__main__":
    _main(int(sys.argv[1]), sys.argv[2], *sys.argv[3:4], *[int(fd) for fd in sys.argv[4:5]])
