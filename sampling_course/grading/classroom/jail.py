"""The sandbox a submission's process runs in: bubblewrap (``bwrap``), the kernel's namespaces and limits.

We use a maintained tool instead of confinement of our own: ``bwrap`` is Flatpak's sandbox,
packaged by Debian as ``bubblewrap``. ``command`` builds its command line so that the
submission's process

* runs as an unprivileged user of a user namespace of its own, with every capability dropped,
  whoever starts the grader (root included: Gradescope's runner, containers, CI), and cannot make
  another user namespace: it cannot remount, unmount or mount anything;
* sees a file system made only of Python's installation (read-only), the packages the
  exercises import (an allow-list: torch, einops, jaxtyping, ... and nothing else, so not
  transformers or TransformerLens), the course's runtime under ``/course`` (the top of the
  ``sampling_course`` package and the few modules of the bridge's own side; not the grader,
  not the solutions, not the tests), GPT-2's two tokenizer files under ``/reference/gpt2`` when
  GPT-2 small is cached (read-only; a test's GPT-2 tokenizer is made again there from them), its
  own copy under ``/submission`` (writable, a file system of its own made for this process),
  ``/tmp``, a read-only ``/dev`` with null, zero, full, random and urandom, and a ``/proc`` of
  its own process namespace; the root is read-only;
* has an empty environment, no network (a network namespace with no interface), its own
  process namespace (when its first process ends, every process in it ends), and dies with
  the grader;
* cannot start a process: a seccomp filter refuses fork, vfork, clone3 and every clone that
  does not make a thread (or that makes a namespace); the same filter refuses the calls that
  reach other processes or the kernel's less guarded corners (``REFUSED``);
* is limited in address space, CPU seconds, size of a file and open files (``rlimits``), in
  threads (``limit_threads``), and in what it can write: ``/tmp`` and the room its copy has to
  grow are file systems of a fixed size (``scratch_bytes``), taken from its memory limit.

The grader asks the kernel nothing of its own: what is in force is this command line.
"""

from __future__ import annotations

import os
import platform
import resource
import shutil
import struct
import sys
from pathlib import Path

__all__ = ["ALLOWED_PACKAGES", "GPT2_TOKENIZER", "MAX_THREADS", "REFUSED", "WORKER_FILES", "available",
           "command", "copy_files", "gpt2_tokenizer_files", "identity", "python_paths", "rlimits", "scratch_bytes",
           "seccomp_filter"]

# What the exercises (and torch itself) import, and ``tokenizers`` (which imports nothing else), for the course's
# own tokenizer a test makes beside the submission's code; the only packages the sandbox holds.
ALLOWED_PACKAGES = ("torch", "torchgen", "functorch", "numpy", "numpy.libs", "einops", "jaxtyping", "wadler_lindig",
                    "typeguard", "typing_extensions.py", "tqdm", "rich", "markdown_it", "mdurl", "pygments",
                    "filelock", "fsspec", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "interegular",
                    "tokenizers")
# The grader's modules the submission's side of the bridge needs (everything else of grading/ stays out).
WORKER_FILES = ("grading/__init__.py", "grading/time_limit.py", "grading/classroom/__init__.py",
                "grading/classroom/bridge.py", "grading/classroom/codec.py", "grading/classroom/proxies.py",
                "grading/classroom/policy.py", "grading/classroom/wire.py", "grading/classroom/worker.py",
                "grading/classroom/host.py")
COURSE = "/course"  # where the course's runtime is, inside the sandbox
SUBMISSION = "/submission"  # where the submission's copy is, inside the sandbox
SITE = "/site-packages"  # where the allowed packages are, inside the sandbox
GPT2_TOKENIZER = "/reference/gpt2"  # where GPT-2's tokenizer files are, inside the sandbox, when GPT-2 is cached
SANDBOX_ID = "1000"  # the submission's user and group inside its user namespace: not root there
HOST_ID = 65534  # who that user is outside when the grader is root ("nobody"): never root, so every limit holds
# Who the submission is when the grader is not root: a user namespace of its own, an unprivileged user in it, no
# capability, and no further user namespace (one would give it every capability again, over mounts of its own).
UNPRIVILEGED = ("--unshare-all", "--unshare-user", "--disable-userns", "--uid", SANDBOX_ID, "--gid", SANDBOX_ID,
                "--cap-drop", "ALL")
_CLONE_NEWUSER = 0x10000000
MAX_THREADS = 64  # threads of a submission's process (an honest one runs a few; torch and tokenizers are told one)
SCRATCH_SHARE = 16  # /tmp, and the room the copy has to grow, are each this share of the memory limit


MIN_BWRAP = (0, 8)  # the oldest bubblewrap whose options ``command`` uses (--perms before --size and --tmpfs)


def available() -> str | None:
    """The path of ``bwrap`` when it is installed, is bubblewrap ``MIN_BWRAP`` or later and can make a sandbox here
    (user namespaces included), else None."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    import subprocess

    try:  # an older one (Ubuntu 22.04 ships 0.6) refuses the sandbox's options and every worker would fail to start
        said = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
        if bwrap_version(said) < MIN_BWRAP:
            return None
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        args, fds, _ = identity()
    except OSError:
        return None
    try:
        probe = subprocess.run([path, *args, "--die-with-parent", "--ro-bind", "/", "/", "true"], pass_fds=fds,
                               capture_output=True, timeout=30, check=False)
    finally:
        for fd in fds:
            os.close(fd)
    return path if probe.returncode == 0 else None


def bwrap_version(said: str) -> tuple[int, ...]:
    """The version in ``bwrap --version``'s answer ("bubblewrap 0.8.0"); () when it names none."""
    words = said.split()
    parts = words[1].split(".") if len(words) >= 2 and words[0] == "bubblewrap" else []
    return tuple(int(p) for p in parts) if parts and all(p.isdigit() for p in parts) else ()


def identity() -> tuple[list[str], list[int], str | None]:
    """bubblewrap's arguments that make the submission an unprivileged user of a user namespace of its own, with no
    capability; the descriptors they name (the caller closes them once bubblewrap has started); and the user the
    worker must become first (``worker.become``), or None when bubblewrap makes it that user.

    Started by root, bubblewrap makes a user namespace only when asked, and maps the user inside to root outside:
    without capabilities still root for the kernel's limits (it never counts root's threads), and the owner of
    root's files. So as root the grader makes the namespace itself (``_user_namespace``), mapping the sandbox's
    user to ``HOST_ID``; bubblewrap builds the sandbox in it as root there, keeps only the two capabilities that
    let the worker become that user (``worker.become``), which it does before anything else runs, losing them."""
    if os.geteuid() != 0:
        return list(UNPRIVILEGED), [], None
    fd = _user_namespace()
    args = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--userns", str(fd), "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    return args, [fd], SANDBOX_ID


def _user_namespace() -> int:
    """A descriptor of a new user namespace in which root is root (bubblewrap sets the sandbox up there, reading
    root's files) and ``SANDBOX_ID`` is ``HOST_ID``. Made by a forked child (a process with threads cannot make one);
    root writes its maps; the namespace lives on in the descriptor once the child has ended."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: makes the namespace, says so, waits to be told it may end
        try:
            os.close(ready_r)
            os.close(go_w)
            os.write(ready_w, b"1" if libc.unshare(_CLONE_NEWUSER) == 0 else b"0")
            os.read(go_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(go_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError("this machine does not let root make a user namespace")
        for kind in ("uid", "gid"):
            with open(f"/proc/{pid}/{kind}_map", "w") as out:
                out.write(f"0 0 1\n{SANDBOX_ID} {HOST_ID} 1\n")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(go_w)
        os.waitpid(pid, 0)


def python_paths() -> tuple[Path, list[str]]:
    """Python's installation prefix (bound read-only) and its standard library's folders on ``sys.path``."""
    prefix = Path(sys.base_prefix).resolve()
    stdlib = [os.path.dirname(os.__file__)] + [p for p in sys.path if p.endswith("lib-dynload")]
    return prefix, list(dict.fromkeys(str(Path(p).resolve()) for p in stdlib))


def gpt2_tokenizer_files() -> dict[str, Path]:
    """GPT-2's ``tokenizer.json`` and ``tokenizer_config.json`` in the local Hugging Face cache, links followed
    (the hub's snapshot links each file to a blob); empty when GPT-2 small is not cached."""
    from sampling_course.reference import gpt2_local_dir

    folder = gpt2_local_dir()
    if folder is None:
        return {}
    files = {name: (folder / name).resolve() for name in ("tokenizer.json", "tokenizer_config.json")}
    return files if all(path.is_file() for path in files.values()) else {}


def _site_packages() -> Path:
    import torch

    return Path(torch.__file__).resolve().parent.parent


def copy_files(copy: Path) -> list[tuple[int, str]]:
    """``(descriptor, path inside the copy)`` of each regular file of the submission's copy, opened for bubblewrap to
    copy into the sandbox's own copy (links are not followed: a link in the copy is left out). The caller closes
    them once the sandbox has started."""
    opened: list[tuple[int, str]] = []
    for path in sorted(copy.rglob("*")):
        if path.is_file() and not path.is_symlink():
            try:
                opened.append((os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), str(path.relative_to(copy))))
            except OSError:
                continue
    return opened


def scratch_bytes(memory_bytes: int) -> int:
    """The size of each of the sandbox's writable file systems, ``/tmp`` and the room the copy has to grow: a share
    of the memory limit (they are memory), taken out of the address space the process may use (``worker.py``)."""
    return memory_bytes // SCRATCH_SHARE


def command(bwrap: str, copy: list[tuple[int, str]] | None, fd: int, seccomp_fd: int, memory_bytes: int = 4 << 30,
            who: list[str] | None = None, env: dict[str, str] | None = None) -> list[str]:
    """The command that starts ``worker.py`` in the sandbox, serving on file descriptor ``fd``. ``copy`` is the
    submission's files (``copy_files``), copied into the sandbox's ``/submission``; with no ``copy`` (the double host),
    nothing is writable but its ``/tmp``. ``memory_bytes`` sizes the writable file systems (``scratch_bytes``); ``who``
    is ``identity()``'s arguments (those of a grader that is not root by default); ``env``, variables the worker
    reads first (``worker.py``)."""
    import sampling_course

    package = Path(sampling_course.__file__).resolve().parent
    prefix, stdlib = python_paths()
    site = _site_packages()
    scratch = scratch_bytes(memory_bytes)
    args = [bwrap, "--clearenv", *(UNPRIVILEGED if who is None else who), "--die-with-parent",
            "--ro-bind", str(prefix), str(prefix), "--proc", "/proc", "--perms", "1777", "--size", str(scratch),
            "--tmpfs", "/tmp", *_devices()]
    for system in ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/etc/ld.so.cache"):
        if os.path.exists(system):
            args += ["--ro-bind", system, system] if not os.path.islink(system) else \
                    ["--symlink", os.readlink(system), system]
    for name in ALLOWED_PACKAGES:
        if (site / name).exists():
            args += ["--ro-bind", str(site / name), f"{SITE}/{name}"]
        for info in site.glob(f"{name.removesuffix('.py').replace('_', '?')}-*.dist-info"):  # metadata some read
            args += ["--ro-bind", str(info), f"{SITE}/{info.name}"]
    for path in sorted(package.glob("*.py")) + [p for p in package.iterdir() if p.is_dir() and p.name not in
                                                ("grading", "apps", "__pycache__")]:
        args += ["--ro-bind", str(path), f"{COURSE}/sampling_course/{path.name}"]
    for relative in WORKER_FILES:
        args += ["--ro-bind", str(package / relative), f"{COURSE}/sampling_course/{relative}"]
    gpt2 = gpt2_tokenizer_files()
    for name, path in gpt2.items():
        args += ["--ro-bind", str(path), f"{GPT2_TOKENIZER}/{name}"]
    if gpt2:
        from sampling_course.recording_tokenizer import GPT2_TOKENIZER_ENV

        args += ["--setenv", GPT2_TOKENIZER_ENV, GPT2_TOKENIZER]
    home = SUBMISSION if copy is not None else "/tmp"
    if copy is not None:  # a file system of its own, its size fixed: what the submission writes there is bounded
        size = scratch + sum(os.fstat(descriptor).st_size for descriptor, _ in copy)
        args += ["--perms", "0777", "--size", str(size), "--tmpfs", SUBMISSION]
        for folder in sorted({str(Path(name).parent) for _, name in copy} - {"."}):
            args += ["--perms", "0777", "--dir", f"{SUBMISSION}/{folder}"]
        for descriptor, name in copy:
            args += ["--file", str(descriptor), f"{SUBMISSION}/{name}"]
    args += _opened_up(args)
    args += ["--remount-ro", "/", "--chdir", home, "--setenv", "HOME", home, "--setenv", "LANG", "C.UTF-8",
             "--seccomp", str(seccomp_fd)]
    for name, value in (env or {}).items():
        args += ["--setenv", name, value]
    for name in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS"):  # one thread each: torch's pool and tokenizers' (Rust)
        args += ["--setenv", name, "1"]
    paths = ":".join([*stdlib, SITE, COURSE, *([SUBMISSION] if copy is not None else [])])
    worker = f"{COURSE}/sampling_course/grading/classroom/worker.py"
    return args + [str(Path(sys.executable).resolve()), "-I", "-S", "-B", worker, str(fd), paths]


def _opened_up(args: list[str]) -> list[str]:
    """``--chmod 0755`` for each folder bubblewrap made on the way to a mount (``/root`` on the way to a Python
    under root's home): it copies the mode of the host's folder, and root's are often closed to other users, which
    the sandbox's user is."""
    made = {args[i + 1 if args[i] in ("--tmpfs", "--dir") else i + 2] for i in range(len(args))
            if args[i] in ("--ro-bind", "--bind", "--dev-bind", "--symlink", "--file", "--tmpfs", "--dir")}
    parents = {str(parent) for path in made for parent in Path(path).parents if str(parent) != "/"} - made
    return [part for folder in sorted(parents) for part in ("--chmod", "0755", folder)]


def _devices() -> list[str]:
    """A ``/dev`` that holds the few devices a program reads or writes and nothing to write into: a small file
    system of its own, made read-only (bubblewrap's ``--dev`` would be as large as the host lets a tmpfs be)."""
    args = ["--size", str(1 << 20), "--tmpfs", "/dev"]
    for name in ("null", "zero", "full", "random", "urandom"):
        args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        args += ["--symlink", f"/proc/self/fd/{number}", f"/dev/{name}"]
    return args + ["--symlink", "/proc/self/fd", "/dev/fd", "--dir", "/dev/shm", "--remount-ro", "/dev"]


def rlimits(memory_bytes: int, cpu_seconds: int, file_bytes: int = 64 << 20, open_files: int = 256) -> None:
    """Set the limits of this process (called in the child, before bwrap starts; they are inherited)."""
    for limit, value in ((resource.RLIMIT_AS, memory_bytes), (resource.RLIMIT_CPU, cpu_seconds),
                         (resource.RLIMIT_FSIZE, file_bytes), (resource.RLIMIT_NOFILE, open_files),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))


# seccomp: a classic BPF program (struct sock_filter: u16 code, u8 jt, u8 jf, u32 k).
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL, _EPERM = 0x7FFF0000, 0x80000000, 0x00050000 | 1
_ENOSYS = 0x00050000 | 38
_AUDIT = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_CLONE_THREAD = 0x00010000
_CLONE_NAMESPACES = 0x7E020000  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
# System call numbers, (x86_64, aarch64), from the kernel's asm/unistd_64.h and asm-generic/unistd.h.
_PROCESSES = {"clone": (56, 220), "fork": (57, None), "vfork": (58, None), "clone3": (435, 435)}
# What the filter refuses (EPERM), and why. Python, torch, numpy and tokenizers call none of them in a grading
# process (the class's honest solutions earn full marks under the filter).
REFUSED = {
    # another process's memory and state (the sandbox's pid 1 is bubblewrap's)
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "process_madvise": (440, 440), "pidfd_open": (434, 434), "pidfd_getfd": (438, 438),
    "pidfd_send_signal": (424, 424),
    # the file system's shape: mounts, namespaces, the root
    "mount": (165, 40), "umount2": (166, 39), "open_tree": (428, 428), "move_mount": (429, 429),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "mount_setattr": (442, 442), "pivot_root": (155, 41), "chroot": (161, 51), "unshare": (272, 97),
    "setns": (308, 268), "open_by_handle_at": (304, 265),
    # the kernel's keyrings, execution domain, programs, profiling, asynchronous rings and fault handling
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218), "personality": (135, 92),
    "bpf": (321, 280), "perf_event_open": (298, 241), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "userfaultfd": (323, 282),
    # memory no limit counts: anonymous files and System V segments hold pages outside the address space
    # (RLIMIT_AS) and outside every sized file system
    "memfd_create": (319, 279), "memfd_secret": (447, 447), "shmget": (29, 194), "msgget": (68, 186),
    # the kernel itself (refused without capabilities anyway)
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106), "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
}


def seccomp_filter() -> bytes | None:
    """A filter that lets threads be made but no process, and refuses every call in ``REFUSED``; None on an
    architecture it does not know."""
    machine = platform.machine()
    if machine not in _AUDIT:
        return None
    column = 0 if machine == "x86_64" else 1
    number = {name: numbers[column] for name, numbers in {**_PROCESSES, **REFUSED}.items()}
    program = [(_LD_ABS, 0, 0, 4), (_JEQ, 1, 0, _AUDIT[machine]), (_RET, 0, 0, _KILL),  # another ABI: refuse all
               (_LD_ABS, 0, 0, 0)]
    if machine == "x86_64":
        program += [(_JGE, 0, 1, 0x40000000), (_RET, 0, 0, _EPERM)]  # the x32 ABI's numbers
    for name in (*REFUSED, "fork", "vfork"):
        if number[name] is not None:
            program += [(_JEQ, 0, 1, number[name]), (_RET, 0, 0, _EPERM)]
    program += [(_JEQ, 0, 1, number["clone3"]), (_RET, 0, 0, _ENOSYS),  # threads fall back to clone, checked below
                (_JEQ, 0, 5, number["clone"]), (_LD_ABS, 0, 0, 16),  # clone's flags
                (_JSET, 1, 0, _CLONE_THREAD), (_RET, 0, 0, _EPERM),  # not a thread: refused
                (_JSET, 0, 1, _CLONE_NAMESPACES), (_RET, 0, 0, _EPERM),  # a thread in new namespaces: refused
                (_RET, 0, 0, _ALLOW)]
    return b"".join(struct.pack("<HBBI", *instruction) for instruction in program)
