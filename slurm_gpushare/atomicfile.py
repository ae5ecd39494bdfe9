"""Files replaced whole or not at all: write a temporary file next to the target, then rename it.

A reader (the TaskProlog, the Epilog, the monitor, slurmd reading gres.conf) sees the old content or
the new one, never a half-written file: ``rename(2)`` within one directory is atomic on POSIX
filesystems. The temporary name carries the writer's PID, so two processes writing the same file at
once never write into each other's temporary file; the last rename wins.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def write_atomic(path: str | Path, data: str | bytes, *, mode: int | None = None, fsync: bool = True) -> Path:
    """Replace ``path`` with ``data`` atomically.

    Args:
        path: the file to write; its directory must exist.
        data: text (written as UTF-8) or bytes.
        mode: permission bits for the file (``0o600``); None leaves the umask's.
        fsync: flush the data to disk before the rename (what a crash must not lose: job state,
            accounting, configs); False for files that are rewritten often and cheap to lose.

    Returns:
        The path written.

    Raises:
        OSError: the file could not be written (no temporary file is left behind).
    """
    target = Path(path)
    tmp = _tmp_name(target)
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return target


def write_all_atomic(files: Mapping[str | Path, str], *, mode: int | None = None) -> None:
    """Write several files so that none changes unless all could be written.

    Every temporary file is written and flushed first; only then are they renamed, one after the
    other. A failure while writing leaves every target as it was and no temporary file behind.

    Raises:
        OSError: a file could not be written; ``filename`` names it.
    """
    written: list[tuple[Path, Path]] = []
    try:
        for path, text in files.items():
            target = Path(path)
            tmp = _tmp_name(target)
            written.append((tmp, target))
            try:
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
                if mode is not None:
                    os.chmod(tmp, mode)
            except OSError as e:
                e.filename = str(target)
                raise
        for tmp, target in written:
            try:
                os.replace(tmp, target)
            except OSError as e:
                e.filename = str(target)
                raise
    except BaseException:
        for tmp, _ in written:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise
