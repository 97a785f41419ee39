"""What a submission's code tries against the sandbox, from inside it: each way out, by raw system call (ctypes).

``run(target)`` is imported by name in the sandbox (the test puts this file in the submission's copy) and returns
``{probe: outcome}``, plain data: ``"ok"`` when the call succeeded, else the name of the errno it failed with.
``target`` is a file of the course's runtime, bound read-only: the probes try to make it writable and append to it.
The system call numbers are written here from the kernel's tables (``asm/unistd_64.h``, ``asm-generic/unistd.h``),
not taken from the code under test. Probes that change the process itself (new namespaces) run last.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import threading

# name: (x86_64, aarch64)
NUMBERS = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "mount": (165, 40),
    "umount2": (166, 39), "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "unshare": (272, 97), "setns": (308, 268), "keyctl": (250, 219), "add_key": (248, 217),
    "request_key": (249, 218), "personality": (135, 92), "bpf": (321, 280), "perf_event_open": (298, 241),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "userfaultfd": (323, 282), "pidfd_open": (434, 434), "pidfd_getfd": (438, 438),
    "pidfd_send_signal": (424, 424), "process_madvise": (440, 440), "open_by_handle_at": (304, 265),
    "memfd_create": (319, 279), "pivot_root": (155, 41), "chroot": (161, 51),
}
MS_REMOUNT, MS_BIND = 32, 4096
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
AT_FDCWD = -100

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _call(name: str, *args) -> tuple[int, str]:
    """(return value, outcome) of the raw system call ``name``."""
    number = NUMBERS[name][0 if platform.machine() == "x86_64" else 1]
    ctypes.set_errno(0)
    result = _libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    if result < 0:
        return result, errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
    return result, "ok"


def _close(fd: int) -> None:
    if fd >= 0:
        os.close(fd)


def _outcome(action) -> str:
    try:
        action()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))


def _threads(count: int) -> str:
    """Start up to ``count`` threads that wait; "ok" when all started, else how many did."""
    gate, started = threading.Event(), []
    try:
        for _ in range(count):
            thread = threading.Thread(target=gate.wait, daemon=True)
            thread.start()
            started.append(thread)
        return "ok"
    except RuntimeError:
        return f"stopped at {len(started)}"
    finally:
        gate.set()
        for thread in started:
            thread.join()


def run(target: str) -> dict[str, str]:
    """Try every way out; ``{probe: "ok" or the errno's name}``."""
    out: dict[str, str] = {}
    path = target.encode()
    out["remount_rw"] = _call("mount", None, ctypes.c_char_p(path), None, MS_REMOUNT | MS_BIND, None)[1]
    out["append_to_runtime"] = _outcome(lambda: open(target, "a").write("# appended from a sandbox\n"))
    out["write_root"] = _outcome(lambda: open("/escape.txt", "w").close())
    out["write_proc_sys"] = _outcome(lambda: open("/proc/sys/kernel/hostname", "w").close())
    out["read_pid1_memory"] = _outcome(lambda: open("/proc/1/mem", "rb").close())
    result, out["ptrace_attach"] = _call("ptrace", 16, 1, 0, 0)  # PTRACE_ATTACH
    if result == 0:
        try:  # the tracer waits for pid 1 to stop, then lets it go
            os.waitpid(1, 0x40000000)  # __WALL
        except OSError:
            pass
        _call("ptrace", 17, 1, 0, 0)  # PTRACE_DETACH
    buffer = ctypes.create_string_buffer(8)
    local = (ctypes.c_void_p * 2)(ctypes.cast(buffer, ctypes.c_void_p), 8)
    remote = (ctypes.c_void_p * 2)(ctypes.cast(buffer, ctypes.c_void_p), 8)  # the same address in pid 1
    out["process_vm_readv"] = _call("process_vm_readv", 1, local, 1, remote, 1, 0)[1]
    out["process_vm_writev"] = _call("process_vm_writev", 1, local, 1, remote, 0, 0)[1]  # zero vectors: writes nothing
    out["umount2"] = _call("umount2", ctypes.c_char_p(path), 2)[1]  # MNT_DETACH
    fd, out["open_tree"] = _call("open_tree", AT_FDCWD, ctypes.c_char_p(b"/course"), 1)  # OPEN_TREE_CLONE
    _close(fd)
    out["move_mount"] = _call("move_mount", -1, ctypes.c_char_p(b""), AT_FDCWD, ctypes.c_char_p(b"/tmp"), 4)[1]
    fd, out["fsopen"] = _call("fsopen", ctypes.c_char_p(b"tmpfs"), 0)
    _close(fd)
    out["fsconfig"] = _call("fsconfig", -1, 6, None, None, 0)[1]  # FSCONFIG_CMD_CREATE on no context
    out["fsmount"] = _call("fsmount", -1, 0, 0)[1]
    fd, out["fspick"] = _call("fspick", AT_FDCWD, ctypes.c_char_p(b"/tmp"), 0)
    _close(fd)
    out["mount_setattr"] = _call("mount_setattr", AT_FDCWD, ctypes.c_char_p(b"/tmp"), 0, None, 0)[1]
    out["keyctl"] = _call("keyctl", 0, -3, 1)[1]  # KEYCTL_GET_KEYRING_ID of the session keyring, made if missing
    out["add_key"] = _call("add_key", ctypes.c_char_p(b"user"), ctypes.c_char_p(b"probe"), ctypes.c_char_p(b"x"), 1,
                           -2)[1]
    out["request_key"] = _call("request_key", ctypes.c_char_p(b"user"), ctypes.c_char_p(b"probe"), None, 0)[1]
    out["personality"] = _call("personality", 0xFFFFFFFF)[1]  # only asks; changes nothing
    attr = ctypes.create_string_buffer(128)
    out["bpf"] = _call("bpf", 0, attr, 128)[1]  # BPF_MAP_CREATE with an empty description
    attr[4:8] = (128).to_bytes(4, "little")  # perf_event_attr.size; type 0, config 0: CPU cycles of this process
    fd, out["perf_event_open"] = _call("perf_event_open", attr, 0, -1, -1, 0)
    _close(fd)
    params = ctypes.create_string_buffer(120)
    fd, out["io_uring_setup"] = _call("io_uring_setup", 1, params)
    _close(fd)
    out["io_uring_enter"] = _call("io_uring_enter", -1, 0, 0, 0, None, 0)[1]
    out["io_uring_register"] = _call("io_uring_register", -1, 0, None, 0)[1]
    fd, out["userfaultfd"] = _call("userfaultfd", 1)  # UFFD_USER_MODE_ONLY: allowed to anyone by the kernel
    _close(fd)
    fd, out["memfd_create"] = _call("memfd_create", ctypes.c_char_p(b"probe"), 0)
    _close(fd)
    pidfd, out["pidfd_open"] = _call("pidfd_open", 1, 0)
    out["pidfd_getfd"] = _call("pidfd_getfd", pidfd, 0, 0)[1]
    fd, _ = _call("pidfd_getfd", pidfd, 0, 0)
    _close(fd)
    out["pidfd_send_signal"] = _call("pidfd_send_signal", pidfd, 0, None, 0)[1]  # signal 0: only asks
    _close(pidfd)
    out["process_madvise"] = _call("process_madvise", -1, None, 0, 0, 0)[1]
    out["open_by_handle_at"] = _call("open_by_handle_at", AT_FDCWD, attr, 0)[1]
    try:
        namespace = os.open("/proc/self/ns/net", os.O_RDONLY)
    except OSError:  # no namespace files to open: the call is still tried, on no descriptor
        namespace = -1
    out["setns"] = _call("setns", namespace, 0)[1]
    _close(namespace)
    out["pivot_root"] = _call("pivot_root", ctypes.c_char_p(b"/tmp"), ctypes.c_char_p(b"/tmp"))[1]
    out["chroot"] = _call("chroot", ctypes.c_char_p(b"/tmp"))[1]
    for flag, name in ((CLONE_NEWNET, "net"), (CLONE_NEWNS, "mount"), (CLONE_NEWUSER, "user")):
        out[f"unshare_{name}"] = _call("unshare", flag)[1]
    return out


def threads(count: int) -> str:
    """Start ``count`` threads at once (the process and thread limit)."""
    return _threads(count)


def fill(folder: str, megabytes: int) -> dict[str, object]:
    """Write up to ``megabytes`` MiB into ``folder``, 1 MiB a file; how many MiB fit and how the writing ended."""
    chunk = b"x" * (1 << 20)
    written = 0
    try:
        for i in range(megabytes):
            with open(os.path.join(folder, f"fill{i}.bin"), "wb") as f:
                f.write(chunk)
            written += 1
        end = "ok"
    except OSError as exc:
        end = errno.errorcode.get(exc.errno, str(exc.errno))
    for i in range(written + 1):
        try:
            os.remove(os.path.join(folder, f"fill{i}.bin"))
        except OSError:
            pass
    return {"mib": written, "end": end}


def status() -> dict[str, str]:
    """Who the process is, its capabilities and its thread limit, as the kernel reports them."""
    lines = open("/proc/self/status").read().splitlines()
    out = {line.split(":")[0]: line.split(":", 1)[1].strip() for line in lines
           if line.startswith(("Uid", "Gid", "Groups", "Cap", "NoNewPrivs", "Seccomp", "Threads", "Vm"))}
    out["uid_map"] = open("/proc/self/uid_map").read().strip()
    out["nproc"] = [line for line in open("/proc/self/limits") if line.startswith("Max processes")][0].strip()
    return out
