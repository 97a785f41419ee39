"""The sandbox itself (``python -m pytest -m classroom``): what a submission's process can do, asked from inside it.

``sandbox_probes.py`` goes into a submission's copy and is called through the bridge, as a submission's code is.
Run as root (CI, Gradescope's runner, many containers) and as any other user:

* every way out is refused: remounting the course's runtime writable (the host's file stays unchanged), ptrace and
  ``process_vm_*`` on the sandbox's pid 1, new namespaces, mounts, keyrings, ``personality``, ``bpf``,
  ``perf_event_open``, ``io_uring``, ``userfaultfd``, pidfds, ``memfd_create``; the process has no capability;
* the limits are the kernel's: ``/tmp`` and the room the copy has to grow are file systems of a fixed size within the
  memory limit, ``/dev`` and the root are read-only, threads stop at ``jail.MAX_THREADS``;
* without the sandbox (``--unsafe-no-sandbox``) the submission's code is what is imported, not the course's stubs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from sampling_course.grading.classroom import jail
from sampling_course.grading.classroom.grade import Connection, grade_submission
from sampling_course.grading.classroom.reports import write_reports
from sampling_course.grading.classroom.settings import GradeSettings, load_settings
from sampling_course.grading.classroom.submission import STUBS

from hostile_corpus import stubbed_sampling

pytestmark = pytest.mark.classroom

PROBES = Path(__file__).with_name("sandbox_probes.py")
RUNTIME_FILE = "toy_models.py"  # a file of the course's runtime, bound read-only at /course/sampling_course/
REFUSED = {"EPERM", "ENOSYS", "EACCES"}  # the seccomp filter's answer, or the kernel's for a process with no rights
READ_ONLY = {"EROFS", "EACCES"}


def _bwrap() -> str:
    bwrap = jail.available()
    if bwrap is None:
        pytest.skip("bubblewrap (bwrap) is not installed or cannot make a sandbox with a user namespace here "
                    "(apt-get install bubblewrap; user namespaces must be allowed)")
    return bwrap


def _probe(tmp_path: Path, memory_mb: int = 512):
    """A running sandbox (its Connection) holding the probes, and the probes' module as the grader sees it."""
    copy = tmp_path / "copy"
    (copy / "exercises").mkdir(parents=True)
    shutil.copyfile(PROBES, copy / "sandbox_probes.py")
    shutil.copyfile(STUBS / "__init__.py", copy / "exercises" / "__init__.py")
    connection = Connection(copy, GradeSettings(memory_mb=memory_mb), bwrap=_bwrap())
    return connection, connection.connect().request("import", None, name="sandbox_probes")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("who", ["as started", "bubblewrap's own user namespace"])
def test_every_way_out_is_refused(tmp_path, monkeypatch, who):
    """Each probe fails with EPERM, ENOSYS or EACCES; the runtime's file cannot be remounted or written, and the host's
    copy of it is unchanged; the process has no capability and, when the grader is root, is not root outside. The
    second case builds the sandbox the way a grader that is not root does (bubblewrap's --unshare-user), whoever
    runs the test."""
    import sampling_course

    if who != "as started":
        monkeypatch.setattr(jail, "identity", lambda: (list(jail.UNPRIVILEGED), [], None))
    host_file = Path(sampling_course.__file__).resolve().parent / RUNTIME_FILE
    before = _digest(host_file)
    connection, probes = _probe(tmp_path)
    try:
        status = probes.status()
        outcomes = probes.run(f"{jail.COURSE}/sampling_course/{RUNTIME_FILE}")
    finally:
        connection.retire()
    assert _digest(host_file) == before, f"the sandbox changed {host_file}"
    assert status["CapEff"] == status["CapPrm"] == "0000000000000000", status
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2", status
    assert status["Uid"].split() == [jail.SANDBOX_ID] * 4, status
    if who == "as started" and os.geteuid() == 0:  # root outside is not root inside: another user outside too
        assert status["uid_map"].split()[-3:] == [jail.SANDBOX_ID, str(jail.HOST_ID), "1"], status
    files = {"append_to_runtime", "write_root"}
    if who == "as started" and os.geteuid() == 0:
        # The submission's user is not bubblewrap's (pid 1's) nor root outside: /proc/1 and /proc/sys are closed
        # to it. (A grader that is not root runs both as itself, inside a namespace: pid 1 then holds nothing of
        # the grader's, and /proc/sys is written by root only.)
        files |= {"write_proc_sys", "read_pid1_memory"}
    else:
        outcomes = {name: outcome for name, outcome in outcomes.items()
                    if name not in ("write_proc_sys", "read_pid1_memory")}
    wrong = {name: outcome for name, outcome in outcomes.items()
             if outcome not in (READ_ONLY if name in files else REFUSED)}
    assert not wrong, f"not refused: {wrong} (all: {outcomes})"
    assert len(outcomes) >= 36, outcomes


def test_limits_the_kernel_enforces(tmp_path):
    """Under a 256 MiB memory limit: /tmp and the copy's room fill up at their size (a share of the memory limit,
    1 MiB files, ENOSPC), /dev and the root take nothing, the copy's host folder is untouched, and threads stop at the
    limit."""
    memory_mb = 256
    connection, probes = _probe(tmp_path, memory_mb)
    host_copy = {p.name for p in (tmp_path / "copy").rglob("*")}
    scratch = jail.scratch_bytes((memory_mb << 20) + (2 << 30)) >> 20  # grade.py adds 2 GiB for Python and torch
    try:
        filled = {where: probes.fill(where, scratch + 64) for where in ("/tmp", "/submission", "/dev", "/dev/shm", "/")}
        threads = probes.threads(jail.MAX_THREADS + 50)
        status = probes.status()
    finally:
        connection.retire()
    for where in ("/tmp", "/submission"):
        assert filled[where]["end"] in ("ENOSPC", "EDQUOT") and filled[where]["mib"] <= scratch + 1, filled
        assert filled[where]["mib"] >= scratch // 2, filled  # the room is there, as sized
    for where in ("/dev", "/dev/shm", "/"):
        assert filled[where] == {"mib": 0, "end": "EROFS"}, filled
    assert {p.name for p in (tmp_path / "copy").rglob("*")} == host_copy
    assert threads.startswith("stopped at ") and int(threads.split()[-1]) < jail.MAX_THREADS, threads
    assert str(jail.MAX_THREADS) in status["nproc"].split(), status


def test_the_seccomp_filter_names_the_kernel_s_numbers():
    """The filter's system call numbers are those of the kernel's headers, where they are installed."""
    headers = {"x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
               "aarch64": Path("/usr/include/asm-generic/unistd.h")}
    import platform

    header = headers.get(platform.machine())
    if header is None or not header.exists():
        pytest.skip("the kernel's headers are not installed (linux-libc-dev)")
    numbers = {}
    for line in header.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "#define" and parts[1].startswith("__NR_") and parts[2].isdigit():
            numbers[parts[1][5:]] = int(parts[2])
    column = 0 if platform.machine() == "x86_64" else 1
    wrong = {name: (pair[column], numbers.get(name)) for name, pair in jail.REFUSED.items()
             if pair[column] != numbers.get(name)}
    assert not wrong, wrong


# An honest greedy_search that also writes a file whose name is not UTF-8 beside itself, in its copy.
GOOD_GREEDY = ("        import os\n"
               "        name = os.path.join(os.fsencode(os.path.dirname(__file__)), b'\\xff\\xfe-not-utf8.txt')\n"
               "        try:\n"
               "            open(name, 'wb').close()\n"
               "        except OSError:\n"
               "            pass\n"
               "        return int(logits.argmax())\n")


def test_unsafe_no_sandbox_grades_the_submission_not_the_stubs(tmp_path):
    """Without the sandbox, the submission's exercises/ comes before the course's folder (which holds the stubs in
    exercises/ too): an honest greedy_search earns its point. Its copy is then the grader's folder, so the file it
    writes there (a name that is not UTF-8) is seen and flagged, and every report shows that name escaped. (In the
    sandbox the copy is a file system of the sandbox's own: nothing written there reaches the grader.)"""
    submission = tmp_path / "alice" / "exercises"
    submission.mkdir(parents=True)
    (submission / "sampling.py").write_text(stubbed_sampling(greedy_search=GOOD_GREEDY))
    settings = load_settings(None, exercises=["greedy_search"], unsafe_no_sandbox=True, diagnose=False)
    result = grade_submission(tmp_path / "alice", settings, student="alice")
    (entry,) = result["exercises"]
    assert entry["status"] == "done" and result["score"] == 1, entry
    assert [f["kind"] for f in result["flags"]] == ["files"], result["flags"]
    write_reports([result], settings, tmp_path / "report")
    feedback = (tmp_path / "report" / "feedback" / "alice.md").read_text(encoding="utf-8")
    assert "\\\\xff\\\\xfe-not-utf8.txt" in feedback, feedback  # Markdown's \\xff reads \xff
    assert os.listdir(submission) == ["sampling.py"]  # it wrote in the grader's copy, never in what was handed in


def test_a_bubblewrap_older_than_0_8_is_refused(tmp_path, monkeypatch):
    """Ubuntu 22.04's bubblewrap (0.6.1) runs ``bwrap ... true`` but refuses the sandbox's options, so every worker
    would fail to start: grading refuses it at once, as when bubblewrap is missing."""
    assert jail.bwrap_version("bubblewrap 0.6.1\n") == (0, 6, 1) < jail.MIN_BWRAP <= jail.bwrap_version("bubblewrap 0.8.0")
    assert jail.bwrap_version("something else") == ()
    for version, found in (("0.6.1", False), ("0.11.0", True)):
        fake = tmp_path / version / "bwrap"
        fake.parent.mkdir()
        fake.write_text(f"#!/bin/sh\necho 'bubblewrap {version}'\n")
        fake.chmod(0o755)
        monkeypatch.setenv("PATH", str(fake.parent))
        assert (jail.available() == str(fake)) is found, version
