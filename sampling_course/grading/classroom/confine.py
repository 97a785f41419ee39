"""Confine a submission's process before its code loads: no network, its own files only, limits.

Each measure is taken when the kernel offers it, and ``confine`` says which are in force
(the grade report carries this, and ``sampling-course grade`` prints it):

* **network**: a network namespace of its own (no interface is up, so nothing can be reached,
  not even 127.0.0.1); needs root or unprivileged user namespaces. Landlock (Linux 6.7 and
  later) also refuses every TCP connect and bind. Without either, an audit hook refuses to
  create sockets (a hook can be got round from C, so the report says "audit hook only").
* **files**: Landlock (Linux 5.13 and later): the process may read the Python installation,
  the system libraries and the course package, read and write its own copy, and nothing
  else: not the course's tests (hidden ones included), not the solutions, not another
  submission, not the grader's reports. Without Landlock the audit hook refuses the same
  paths when Python opens them.
* **processes**: a process namespace of its own when the kernel allows (when its first process
  ends, the kernel ends every process started in it, so a fork bomb cannot outlive it); the
  audit hook refuses fork, exec and subprocess; Landlock allows executing no file, and
  (Linux 6.12 and later) keeps signals inside the sandbox; a process limit (``RLIMIT_NPROC``,
  counted from the user's processes) when the grader does not run as root, and every
  capability dropped when it does.
* **limits**: address space (memory), CPU seconds, size of a written file, open files.

The audit hook also records what the code tried (``Attempts``): a read of another path, a
network connection, a process, a write or deletion outside its copy. The grader flags the
submission with these; they never add credit.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Attempts", "Limits", "confine", "landlock_abi", "namespaces"]

_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_CLONE_NEWNET, _CLONE_NEWUSER, _CLONE_NEWPID = 0x40000000, 0x10000000, 0x20000000
_PR_SET_NO_NEW_PRIVS = 38

# Landlock filesystem rights by ABI version (each version adds some).
_FS_RIGHTS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
# Read a file, read a directory; never execute one, so no program can be started from the sandbox.
_READ = (1 << 2) | (1 << 3)
_FILE_ONLY = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)  # rights that apply to a file


@dataclass(frozen=True)
class Limits:
    """What one submission's process may use."""

    memory_bytes: int = 4 << 30  # on top of what the preloaded libraries already take
    cpu_seconds: int = 900
    file_bytes: int = 64 << 20
    processes: int = 32  # tasks (processes and threads) for the submission's own user id
    open_files: int = 256


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when it has none."""
    try:
        version = _libc().syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except (OSError, AttributeError):
        return 0
    return max(0, int(version))


def namespaces() -> str:
    """Leave the grader's network and process namespaces, as far as the kernel allows.

    Call in a fresh fork; with a process namespace, only the *next* child is inside it (as
    its process 1, whose end ends every process started in it). Returns what was done.
    """
    libc = _libc()
    if libc.unshare(_CLONE_NEWNET | _CLONE_NEWPID) == 0:
        return "network+pid"
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET | _CLONE_NEWPID) == 0:
        return "network+pid (user namespace)"
    if libc.unshare(_CLONE_NEWNET) == 0:
        return "network"
    return ""


def _drop_capabilities() -> bool:
    """As root: give up every capability (the user id stays, for the files root owns)."""
    libc = _libc()
    header = ctypes.create_string_buffer(struct.pack("=Ii", 0x20080522, 0), 8)
    data = ctypes.create_string_buffer(bytes(24), 24)
    number = {"x86_64": 126, "aarch64": 91}.get(os.uname().machine)
    return number is not None and libc.syscall(number, header, data) == 0


def _processes_of(uid: int) -> int:
    """Tasks (processes and threads) that ``uid`` runs now."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("Uid", "").split()[:1] == [str(uid)]:
            count += int(fields.get("Threads", "1").strip() or 1)
    return count


def _virtual_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _set_limits(limits: Limits) -> None:
    def cap(which: int, value: int) -> None:
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value if which != resource.RLIMIT_CPU else hard))

    cap(resource.RLIMIT_AS, _virtual_size() + limits.memory_bytes)
    cap(resource.RLIMIT_CPU, limits.cpu_seconds)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-long write fails instead of killing the process
    cap(resource.RLIMIT_FSIZE, limits.file_bytes)
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_NOFILE, limits.open_files)
    if os.getuid() != 0:  # root is exempt from RLIMIT_NPROC: there the process namespace and the hook hold
        cap(resource.RLIMIT_NPROC, _processes_of(os.getuid()) + limits.processes)


def _landlock(abi: int, readable: list[Path], writable: Path) -> str:
    """Allow reading ``readable`` and everything under ``writable``; nothing else. Returns what is in force."""
    libc = _libc()
    fs = _FS_RIGHTS[max(v for v in _FS_RIGHTS if v <= abi)]
    net = 0b11 if abi >= 4 else 0  # bind and connect over TCP
    scoped = 0b11 if abi >= 6 else 0  # abstract unix sockets and signals stay inside
    attr = struct.pack("=QQQ", fs, net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    buffer = ctypes.create_string_buffer(attr, len(attr))
    ruleset = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, buffer, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        return ""
    try:
        def allow(path: Path, rights: int) -> None:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                return
            try:
                if not os.path.isdir(path):
                    rights &= _FILE_ONLY
                rule = ctypes.create_string_buffer(struct.pack("=Qi", rights & fs, fd), 12)
                libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), rule, ctypes.c_uint32(0))
            finally:
                os.close(fd)

        for path in readable:
            allow(path, _READ)
        allow(writable, fs & ~1)  # its own files, but none of them executable
        allow(Path("/dev/null"), _READ | (1 << 1))
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return ""
        if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return ""
    finally:
        os.close(ruleset)
    return f"landlock (ABI {abi})"


class Attempts:
    """The audit hook: records what the submission tried, and refuses what no exercise needs.

    Records go to ``fd`` (a pipe the grader reads) as JSON lines, at most ``limit`` of them.
    """

    _PROCESS_EVENTS = frozenset({"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
                                 "subprocess.Popen", "pty.spawn", "os.startfile"})
    _DELETE_EVENTS = frozenset({"os.remove", "os.rmdir", "os.rename", "shutil.rmtree", "os.truncate", "os.chmod",
                                "os.chown", "os.link", "os.symlink", "shutil.move"})
    _CTYPES_EVENTS = frozenset({"ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function",
                                "ctypes.addressof", "ctypes.string_at", "ctypes.cdata"})

    def __init__(self, fd: int, copy: Path, readable: list[Path], enforce_files: bool, enforce_network: bool):
        self.fd = fd
        self.copy = str(copy)
        self.readable = tuple(str(p) for p in readable)
        self.enforce_files = enforce_files
        self.enforce_network = enforce_network
        self.count = 0
        self.limit = 50
        self.busy = False
        self.seen: set[tuple[str, str]] = set()
        os.set_blocking(fd, False)  # a full pipe drops records; it never blocks the submission

    def note(self, kind: str, detail: str) -> None:
        if self.count >= self.limit or (kind, detail) in self.seen:
            return
        self.seen.add((kind, detail))
        self.count += 1
        try:
            os.write(self.fd, (json.dumps({"kind": kind, "detail": detail[:300]}) + "\n").encode())
        except OSError:
            pass

    def _inside(self, path: str, roots: tuple[str, ...]) -> bool:
        return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)

    def __call__(self, event: str, args: tuple) -> None:
        if self.busy:
            return
        self.busy = True
        try:
            self._check(event, args)
        finally:
            self.busy = False

    def _check(self, event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            if not isinstance(path, (str, bytes)):
                return  # a file descriptor
            path = os.path.abspath(os.fsdecode(path))
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))
            if self._inside(path, (self.copy,)) or path == "/dev/null":
                return
            if writing:
                self.note("write", f"tried to write {path}")
                if self.enforce_files:
                    raise PermissionError(f"writing outside the submission's folder is not allowed: {path}")
            elif not self._inside(path, self.readable):
                self.note("read", f"tried to read {path}")
                if self.enforce_files:
                    raise PermissionError(f"reading outside the submission's folder is not allowed: {path}")
        elif event in ("os.listdir", "os.scandir") and args and isinstance(args[0], (str, bytes)):
            path = os.path.abspath(os.fsdecode(args[0]))
            # Python's own import machinery lists the folders above the ones it may read: not an attempt.
            above = any(root.startswith(path.rstrip("/") + "/") for root in (self.copy,) + self.readable)
            if not above and not self._inside(path, (self.copy,) + self.readable):
                self.note("read", f"tried to list {path}")
                if self.enforce_files:
                    raise PermissionError(f"reading outside the submission's folder is not allowed: {path}")
        elif event in self._PROCESS_EVENTS:
            self.note("process", f"tried to start a process ({event})")
            raise PermissionError("a submission may not start processes")
        elif event.startswith("socket.") and event != "socket.gethostname":
            self.note("network", f"tried to use the network ({event}{_short(args)})")
            raise PermissionError("a submission may not use the network")
        elif event in self._CTYPES_EVENTS:
            self.note("ctypes", f"tried to call C code directly ({event})")
            raise PermissionError("a submission may not use ctypes")
        elif event in self._DELETE_EVENTS:
            paths = [os.path.abspath(os.fsdecode(a)) for a in args if isinstance(a, (str, bytes))]
            outside = [p for p in paths if not self._inside(p, (self.copy,))]
            if outside:
                self.note("delete", f"tried to change or delete {outside[0]} ({event})")
                if self.enforce_files:
                    raise PermissionError(f"changing files outside the submission's folder is not allowed: {outside[0]}")
        elif event in ("os.kill", "os.killpg") and args and args[0] not in (0, os.getpid()):
            self.note("signal", f"tried to signal process {args[0]}")
            raise PermissionError("a submission may not signal other processes")


def _short(args: tuple) -> str:
    text = ", ".join(str(a) for a in args[1:3] if not hasattr(a, "fileno"))
    return f": {text[:80]}" if text else ""


def confine(copy: Path, readable: list[Path], limits: Limits, attempts_fd: int, spaces: str) -> dict[str, str]:
    """Confine this process to ``copy``; ``spaces`` is what ``namespaces()`` did. Returns the measures in force."""
    copy = Path(copy).resolve()
    root = os.geteuid() == 0
    _set_limits(limits)
    abi = landlock_abi()
    files = _landlock(abi, readable, copy) if abi else ""
    capabilities = _drop_capabilities() if root else False
    hook = Attempts(attempts_fd, copy, readable, enforce_files=not files, enforce_network="network" not in spaces)
    sys.addaudithook(hook)
    network = [f"a network namespace of its own{' (user namespace)' if 'user' in spaces else ''}"
               if "network" in spaces else "", "Landlock refuses TCP" if files and abi >= 4 else "",
               "audit hook refuses sockets"]
    processes = ["a process namespace of its own" if "pid" in spaces else "",
                 "" if root else f"RLIMIT_NPROC {limits.processes}", "audit hook refuses fork/exec/subprocess",
                 "Landlock allows executing no file" if files else "", "capabilities dropped" if capabilities else ""]
    return {
        "network": ", ".join(x for x in network if x),
        "files": files + ": reads Python, the system and the course package, writes its copy" if files
        else "audit hook only (Python-level opens)",
        "processes": ", ".join(x for x in processes if x),
        "memory": f"{limits.memory_bytes >> 20} MiB more address space (RLIMIT_AS)",
        "cpu": f"{limits.cpu_seconds} CPU seconds (RLIMIT_CPU)",
    }
