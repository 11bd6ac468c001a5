"""One home for writing files: atomic (temp file in the same folder, fsync, rename), sha256, JSONL.

A crash, a full disk or Ctrl-C at any moment leaves either the old file or the new one, never half
of one: every artifact of a run (checkpoints, spec.json, exports, caches) is written through here.

Files get the mode a plain `open(path, "w")` would give them: 0666 less the user's umask (0644 under
the usual 0022), or the mode of the file they replace. A temporary file is created 0600, and renamed
as it was, exports were unreadable to a Triton or KServe process running as another user, and a
decoded-image cache beside a shared dataset to every other user of it.

A write that runs out of space is the user's to fix: `NoSpace`, "no space left on <folder>: N MB
needed, M free", a one-line error (torch.save reported it as `RuntimeError: [enforce fail at
inline_container.cc:672] . unexpected pos ...`, an internal failure with a traceback).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, Iterable

from inceptionlab.errors import UserError


def current_umask() -> int:
    """The process's umask, read without changing it where /proc says it (os.umask can only be read by
    setting it, which races with threads creating files meanwhile)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def plain_mode(directory: bool = False) -> int:
    """What open() or mkdir() would give a new file (0666) or folder (0777): less the umask. For what
    tempfile makes (0600 files, 0700 folders) before it is renamed into place."""
    return (0o777 if directory else 0o666) & ~current_umask()


def default_mode(path: Path) -> int:
    """The mode of the file `path` replaces, else a new file's (`plain_mode`)."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return plain_mode()


MB = 1e6
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # the disk is full; the user's disk quota is used up


class NoSpace(UserError):
    """A file did not fit where it was written: the fix is free space, not a bug report."""

    def __init__(self, folder: Path, needed: int):
        free = shutil.disk_usage(folder).free if folder.exists() else 0
        super().__init__(f"no space left on {folder}: {needed / MB:.1f} MB needed, {free / MB:.1f} MB free "
                         "(free some space there, or write elsewhere: `train --out DIR`)")


def ran_out_of_space(exc: BaseException) -> bool:
    """True when `exc` or an exception it was raised from or during is a full disk (ENOSPC, EDQUOT):
    torch.save wraps the OSError in a RuntimeError whose context it is."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any], size_hint: int = 0) -> None:
    """Call `write(handle)` on a temp file beside `path`, then rename it over `path`.

    Out of space: the temp file is removed, `path` keeps its old content, and `NoSpace` names the folder,
    the bytes needed (`size_hint`, or what had been written when it failed) and the bytes free."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fchmod(handle.fileno(), default_mode(path))
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        written = _size(tmp)
        Path(tmp).unlink(missing_ok=True)
        if ran_out_of_space(exc):
            raise NoSpace(path.parent, max(size_hint, written)) from exc
        raise


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda handle: handle.write(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def atomic_torch_save(obj: Any, path: Path) -> None:
    import torch  # here, not at the top: `inceptionlab data ...` writes files without paying torch's ~1 s import

    atomic_write(path, lambda handle: torch.save(obj, handle), size_hint=tensor_bytes(obj))


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in `obj` (nested dicts, lists, tuples): about what torch.save writes."""
    if hasattr(obj, "untyped_storage"):
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(tensor_bytes(value) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(value) for value in obj)
    return 0


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):  # 1 MiB reads: flat memory for GB files
            digest.update(block)
    return digest.hexdigest()


def append_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Append rows, flushed and fsynced: a crash loses at most the line being written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(row, default=str) + "\n" for row in rows)
    try:
        with open(path, "a") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        if exc.errno in NO_SPACE_ERRNOS:
            raise NoSpace(path.parent, len(text.encode())) from exc
        raise


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete row; a last line cut by a crash is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(row, default=str) + "\n" for row in rows))
