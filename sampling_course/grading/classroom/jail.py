"""The sandbox a submission's process runs in: bubblewrap (``bwrap``), the kernel's namespaces and limits.

We use a maintained tool instead of confinement of our own: ``bwrap`` is Flatpak's sandbox,
packaged by Debian as ``bubblewrap``. ``command`` builds its command line so that the
submission's process

* sees a file system made only of Python's installation (read-only), the packages the
  exercises import (an allow-list: torch, einops, jaxtyping, ... and nothing else, so not
  transformers or TransformerLens), the course's runtime under ``/course`` (the top of the
  ``sampling_course`` package and the few modules of the bridge's own side; not the grader,
  not the solutions, not the tests), GPT-2's two tokenizer files under ``/reference/gpt2`` when
  GPT-2 small is cached (read-only; a test's GPT-2 tokenizer is made again there from them), its
  own copy under ``/submission`` (writable), an empty ``/tmp``, and a ``/proc`` of its own process
  namespace;
* has an empty environment, no network (a network namespace with no interface), its own
  process namespace (when its first process ends, every process in it ends), and dies with
  the grader;
* cannot start a process: a seccomp filter refuses fork, vfork, clone3 and every clone that
  does not make a thread;
* is limited in address space, CPU seconds, size of a file and open files (``rlimits``).

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

__all__ = ["ALLOWED_PACKAGES", "GPT2_TOKENIZER", "WORKER_FILES", "available", "command", "gpt2_tokenizer_files",
           "python_paths", "rlimits", "seccomp_filter"]

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


def available() -> str | None:
    """The path of ``bwrap`` when it is installed and can make a sandbox here, else None."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    import subprocess

    probe = subprocess.run([path, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
                           capture_output=True, timeout=30, check=False)
    return path if probe.returncode == 0 else None


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


def command(bwrap: str, copy: Path | None, fd: int, seccomp_fd: int) -> list[str]:
    """The command that starts ``worker.py`` in the sandbox, serving on file descriptor ``fd``; with no
    ``copy`` (the double host), nothing is writable but its ``/tmp``."""
    import sampling_course

    package = Path(sampling_course.__file__).resolve().parent
    prefix, stdlib = python_paths()
    site = _site_packages()
    args = [bwrap, "--unshare-all", "--die-with-parent", "--clearenv",
            "--ro-bind", str(prefix), str(prefix), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
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
    if copy is not None:
        args += ["--bind", str(copy), SUBMISSION]
    args += ["--chdir", home, "--setenv", "HOME", home, "--setenv", "OMP_NUM_THREADS", "1", "--setenv", "LANG", "C.UTF-8",
             "--seccomp", str(seccomp_fd)]
    paths = ":".join([*stdlib, SITE, COURSE, *([SUBMISSION] if copy is not None else [])])
    worker = f"{COURSE}/sampling_course/grading/classroom/worker.py"
    return args + [str(Path(sys.executable).resolve()), "-I", "-S", "-B", worker, str(fd), paths]


def rlimits(memory_bytes: int, cpu_seconds: int, file_bytes: int = 64 << 20, open_files: int = 256) -> None:
    """Set the limits of this process (called in the child, before bwrap starts; they are inherited)."""
    for limit, value in ((resource.RLIMIT_AS, memory_bytes), (resource.RLIMIT_CPU, cpu_seconds),
                         (resource.RLIMIT_FSIZE, file_bytes), (resource.RLIMIT_NOFILE, open_files),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))


# seccomp: a classic BPF program (struct sock_filter: u16 code, u8 jt, u8 jf, u32 k).
_LD_ABS, _JEQ, _JSET, _RET = 0x20, 0x15, 0x45, 0x06
_ALLOW, _KILL, _EPERM = 0x7FFF0000, 0x80000000, 0x00050000 | 1
_ENOSYS = 0x00050000 | 38
_ARCH = {"x86_64": (0xC000003E, 56, 57, 58, 435), "aarch64": (0xC00000B7, 220, None, None, 435)}
_CLONE_THREAD = 0x00010000


def seccomp_filter() -> bytes | None:
    """A filter that lets threads be made but no process; None on an architecture it does not know."""
    arch = _ARCH.get(platform.machine())
    if arch is None:
        return None
    audit, clone, fork, vfork, clone3 = arch
    program = [(_LD_ABS, 0, 0, 4), (_JEQ, 1, 0, audit), (_RET, 0, 0, _KILL),  # another ABI: refuse everything
               (_LD_ABS, 0, 0, 0)]
    if platform.machine() == "x86_64":
        program.append((0x35, 0, 1, 0x40000000))  # JGE: the x32 ABI's numbers
        program.append((_RET, 0, 0, _EPERM))
    for number in (fork, vfork):
        if number is not None:
            program += [(_JEQ, 0, 1, number), (_RET, 0, 0, _EPERM)]
    program += [(_JEQ, 0, 1, clone3), (_RET, 0, 0, _ENOSYS),  # threads fall back to clone, checked below
                (_JEQ, 0, 3, clone), (_LD_ABS, 0, 0, 16), (_JSET, 1, 0, _CLONE_THREAD), (_RET, 0, 0, _EPERM),
                (_RET, 0, 0, _ALLOW)]
    return b"".join(struct.pack("<HBBI", *instruction) for instruction in program)
