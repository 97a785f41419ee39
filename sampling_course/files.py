"""The course's own files: shipped assets checked against their manifest, caches that heal.

Two kinds of files hold what the course runs on:

* **Shipped assets** (``sampling_course/assets/``: the story models and the tokenizers).
  ``assets/MANIFEST.json`` lists the size and SHA-256 of each; a file that does not match
  raises ``BrokenCourseFile`` with one line naming it and saying to reinstall. The course
  cannot rebuild these (training takes twenty minutes), so it never tries.
* **Caches** under ``cache_home()`` (the stand-in model, stored reference outputs). Each
  is written to a temporary name, listed in a manifest and only then renamed into place,
  so a reader sees the whole thing or nothing. A cache that fails its manifest (a full
  disk, a killed process, a sync tool) is rebuilt, and one line says so
  (``rebuilt the tiny model cache: model.safetensors was damaged``). Two processes that
  build the same cache at once take turns (a lock file) and both succeed.

Every notice is also kept in ``NOTICES``, so that a check, whose output is captured,
can still show it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ASSETS_DIR: Path = Path(__file__).resolve().parent / "assets"
ASSET_MANIFEST: Path = ASSETS_DIR / "MANIFEST.json"
MANIFEST_NAME = "MANIFEST.json"  # inside every cached folder
REINSTALL = ("reinstall the course: `git checkout -- sampling_course/assets` in a clone (or download it again), "
             "then `pip install -e .`")

# One-line notices of caches rebuilt in this process, oldest first.
NOTICES: list[str] = []


class BrokenCourseFile(RuntimeError):
    """A file the course itself provides is damaged or missing: not the learner's doing."""


def cache_home() -> Path:
    """Where the course keeps what it builds (override with SAMPLING_COURSE_HOME)."""
    env = os.environ.get("SAMPLING_COURSE_HOME")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sampling-course"
    base.mkdir(parents=True, exist_ok=True)
    return base


def notice(message: str) -> None:
    """Say ``message`` on one line (stderr) and keep it in ``NOTICES``."""
    NOTICES.append(message)
    print(f"note: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Hashes and manifests
# ---------------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe(folder: Path, names: list[str] | None = None) -> dict[str, dict]:
    """``{relative path: {"size": bytes, "sha256": hex}}`` for the files under ``folder`` (or ``names``)."""
    if names is None:
        names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                       if p.is_file() and p.name != MANIFEST_NAME)
    return {name: {"size": (folder / name).stat().st_size, "sha256": sha256_of(folder / name)} for name in names}


def problem_with(folder: Path, listed: dict[str, dict]) -> tuple[str, str] | None:
    """The first file of ``folder`` that does not match ``listed`` (a manifest) and what is wrong
    with it, as ``(name, problem)``; None when every file matches.

    The size is compared first, so a truncated file is told apart without reading it.
    """
    for name, expected in listed.items():
        path = folder / name
        if not path.is_file():
            return name, "missing"
        size = path.stat().st_size
        if size != expected["size"]:
            return name, f"{size:,} bytes instead of {expected['size']:,}"
        if sha256_of(path) != expected["sha256"]:
            return name, "its checksum does not match"
    return None


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_manifest(folder: Path) -> dict[str, dict]:
    """List every file of ``folder`` in ``folder/MANIFEST.json``; return the listing."""
    listed = describe(folder)
    write_atomic(folder / MANIFEST_NAME, (json.dumps(listed, indent=1, sort_keys=True) + "\n").encode())
    return listed


def read_manifest(folder: Path) -> dict[str, dict] | None:
    try:
        listed = json.loads((folder / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(listed, dict) and listed and all(
        isinstance(v, dict) and isinstance(v.get("size"), int) and isinstance(v.get("sha256"), str) for v in listed.values())
    return listed if ok else None


# ---------------------------------------------------------------------------------------
# Shipped assets
# ---------------------------------------------------------------------------------------


def asset_listing() -> dict[str, dict]:
    """The shipped manifest: every asset's size and SHA-256, by path under ``assets/``."""
    try:
        return json.loads(ASSET_MANIFEST.read_text())
    except (OSError, ValueError) as exc:
        raise BrokenCourseFile(f"the course's file {ASSET_MANIFEST} cannot be read ({exc}): {REINSTALL}") from None


def check_assets(folder: Path, rebuild: str | None = None) -> dict[str, dict]:
    """Check the shipped files of ``folder`` (``assets/<name>``) against the manifest; return their entries.

    Raises ``BrokenCourseFile`` naming the first damaged or missing file and saying to
    reinstall (or, for an instructor, the ``rebuild`` command).
    """
    prefix = folder.name + "/"
    entries = {name[len(prefix):]: entry for name, entry in asset_listing().items() if name.startswith(prefix)}
    if not entries:
        raise BrokenCourseFile(f"the course's manifest {ASSET_MANIFEST} lists nothing in {folder}: {REINSTALL}")
    found = problem_with(folder, entries)
    if found:
        name, problem = found
        also = f" (or, after changing it on purpose, rebuild it: {rebuild})" if rebuild else ""
        raise BrokenCourseFile(f"the course's file {folder / name} is damaged ({problem}): {REINSTALL}{also}")
    return entries


def write_asset_manifest() -> dict[str, dict]:
    """Rewrite ``assets/MANIFEST.json`` from the files there (after retraining or rebuilding a tokenizer)."""
    listed = describe(ASSETS_DIR)
    listed.pop(ASSET_MANIFEST.name, None)
    write_atomic(ASSET_MANIFEST, (json.dumps(listed, indent=1, sort_keys=True) + "\n").encode())
    return listed


# ---------------------------------------------------------------------------------------
# Caches
# ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (a lock file) across processes, inside the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        try:
            import fcntl
        except ImportError:  # Windows: no lock; the rename below still never shows half a folder
            yield
            return
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def cached_folder(target: Path, build: Callable[[Path], None], what: str) -> tuple[Path, dict[str, dict]]:
    """The cached folder ``target``, checked against its manifest; built first when missing, rebuilt when damaged.

    ``build(folder)`` writes the files into an empty folder. Returns the folder and its
    manifest. ``what`` names the cache in the one-line notice of a rebuild.
    """
    listed = read_manifest(target)
    if listed is not None and problem_with(target, listed) is None:
        return target, listed  # the usual case: no lock needed
    with lock(target.parent / f".{target.name}.lock"):
        # Another process may have built or repaired it while this one waited.
        listed = read_manifest(target)
        problem = None
        if listed is not None:
            found = problem_with(target, listed)
            if found is None:
                return target, listed
            problem = f"{found[0]} was damaged ({found[1]})"
        elif target.exists():
            problem = f"its {MANIFEST_NAME} was missing or unreadable"
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            build(tmp)
            listed = write_manifest(tmp)
            if target.exists():
                aside = target.parent / f".{target.name}.damaged-{os.getpid()}-{time.time_ns()}"
                os.replace(target, aside)
                _remove(aside)
            os.replace(tmp, target)
        finally:
            _remove(tmp)
    if problem is not None:
        notice(f"rebuilt the {what} cache in {target}: {problem}")
    return target, listed


# A cached file starts with one line of JSON, its manifest (the payload's size and SHA-256), then
# the payload: one file written with one rename, so a reader never pairs a payload with another's manifest.
_HEADER = b"sampling-course cache v1 "


def pack(data: bytes) -> bytes:
    """``data`` behind its one-line manifest, as ``cached_file`` stores it."""
    entry = json.dumps({"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}).encode()
    return _HEADER + entry + b"\n" + data


def unpack(blob: bytes) -> tuple[bytes | None, str | None]:
    """``(payload, None)`` when ``blob`` matches its manifest, else ``(None, what is wrong)``."""
    if not blob.startswith(_HEADER) or b"\n" not in blob:
        return None, "its manifest line is missing"
    line, data = blob[len(_HEADER):].split(b"\n", 1)
    try:
        entry = json.loads(line)
        size, digest = entry["size"], entry["sha256"]
    except (ValueError, KeyError, TypeError):
        return None, "its manifest line is unreadable"
    if len(data) != size:
        return None, f"{len(data):,} bytes instead of {size:,}"
    if hashlib.sha256(data).hexdigest() != digest:
        return None, "its checksum does not match"
    return data, None


def read_cached(path: Path) -> tuple[bytes | None, str | None]:
    """The payload of the cached file ``path``: ``(payload, None)``, ``(None, None)`` when there is
    none, or ``(None, what is wrong)`` when it is damaged."""
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"it cannot be read ({exc.strerror})"
    return unpack(blob)


def write_cached(path: Path, data: bytes) -> None:
    """Store ``data`` at ``path`` with its manifest, atomically."""
    write_atomic(path, pack(data))


def cached_file(path: Path, compute: Callable[[], bytes], what: str) -> bytes:
    """The payload of the cached file ``path``; computed when missing, recomputed with a one-line
    notice when damaged."""
    data, problem = read_cached(path)
    if data is not None:
        return data
    data = compute()
    write_cached(path, data)
    if problem is not None:
        notice(f"rebuilt the {what} cache: {path.name} was damaged ({problem})")
    return data
