"""Files replaced whole or not at all: write a temporary file next to the target, then rename it.

A reader (the TaskProlog, the Epilog, the monitor, slurmd reading gres.conf) sees the old content or
the new one, never a half-written file: ``rename(2)`` within one directory is atomic on POSIX
filesystems. The temporary name carries the writer's PID, so two processes writing the same file at
once never write into each other's temporary file; the last rename wins. The temporary file is created
anew (``O_CREAT | O_EXCL | O_NOFOLLOW``, open(2)): a link or file someone planted at that predictable
name in a directory they can write is removed, never followed, so a root writer cannot be made to
overwrite or chmod the file it points to.

:func:`locked` holds a lock file (``flock(2)``): the claims of a node, the accounting store's ingest,
``mig apply`` of a node, the fake NVML's limits. The job directories' lock (which must notice its file
removed under it), the spool's data files and the sacct queue's worker lock keep their own.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def _create(tmp: Path, mode: int | None) -> int:
    """A new, empty file at ``tmp`` (whatever was there removed, never followed): its descriptor."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(3):
        try:
            fd = os.open(tmp, flags, 0o666 if mode is None else 0o600)  # None: the umask's, as open() gives
        except FileExistsError:
            os.unlink(tmp)  # a leftover of a killed writer of this PID, or a planted link
            continue
        if mode is not None:
            os.fchmod(fd, mode)
        return fd
    raise FileExistsError(17, "temporary file keeps reappearing", str(tmp))


def read_own_file(path: str | Path, *, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, read only when it is one of its own: never through a symbolic
    link, never a FIFO or device (whose open(2) or read(2) could block or never end), never more than
    ``max_bytes``. For the caches a hook keeps in its run dir (:func:`read_user_file` without an owner).

    Raises:
        OSError: ``path`` is missing, a link, not a regular file or larger than ``max_bytes``.
    """
    return read_user_file(path, max_bytes=max_bytes)


def read_user_file(path: str | Path, *, max_bytes: int, owner: int | None = None, tail: bool = False) -> bytes:
    """The bytes of a file that a user can write (in a directory the user owns: a job's MPS pipe and log
    directories), read the one way root reads such a file: never through a symbolic link (``O_NOFOLLOW``), never
    blocking on open or read (``O_NONBLOCK``: a FIFO opens at once and is then refused), only a regular file
    (``fstat``), only one owned by ``owner`` when given (a hard link to someone else's file is not the user's), and
    at most ``max_bytes``: a larger file is refused, or with ``tail`` its last ``max_bytes`` are read. What is read
    is bytes as the user wrote them: decode with ``errors="replace"`` and keep only printable text before logging it
    (:func:`printable`).

    Raises:
        OSError: ``path`` is missing, a link (ELOOP), not a regular file, of another owner, or (without ``tail``)
            larger than ``max_bytes``.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if owner is not None and st.st_uid != owner:
            raise OSError(errno.EPERM, f"owned by uid {st.st_uid}, not {owner}", str(path))
        if st.st_size > max_bytes:
            if not tail:
                raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes", str(path))
            os.lseek(fd, st.st_size - max_bytes, os.SEEK_SET)
        chunks, left = [], max_bytes
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def printable(text: str, *, limit: int) -> str:
    """``text`` with every character that is not printable (escape sequences, control characters, line breaks)
    shown as ``?``, cut to ``limit`` characters (an ellipsis marks the cut): a user's bytes made fit for a log."""
    shown = "".join(ch if ch.isprintable() else "?" for ch in text[:limit + 1])
    return shown if len(shown) <= limit else shown[:max(limit - 1, 0)] + "…"


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
        with os.fdopen(_create(tmp, mode), "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return target


def write_all_atomic(files: Mapping[str | Path, str], *,
                     mode: int | Mapping[str | Path, int] | None = None) -> None:
    """Write several files so that none changes unless all could be written.

    ``mode``: permission bits for every file, or per file (a mapping from the paths of ``files``; a
    path missing there gets the umask's), or None for the umask's.

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
            this = mode.get(path) if isinstance(mode, Mapping) else mode
            try:
                with os.fdopen(_create(tmp, this), "w", encoding="utf-8") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
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


@contextlib.contextmanager
def locked(path: str | Path, *, shared: bool = False, wait: bool = True, mode: int = 0o600,
           nofollow: bool = False) -> Iterator[int | None]:
    """Hold ``flock(2)`` on the lock file ``path`` (made with ``mode`` when missing) for the block: exclusive,
    or ``shared``. Yields the file's descriptor; with ``wait=False``, None (holding nothing) when another
    process holds the lock now. ``nofollow``: a symbolic link at ``path`` is refused (``O_NOFOLLOW``), for a
    lock file in a directory someone else may write. Closing the descriptor at the end releases the lock.

    Raises:
        OSError: the file cannot be opened or made (``ELOOP`` for a link with ``nofollow``).
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | (getattr(os, "O_NOFOLLOW", 0) if nofollow else 0)
    fd = os.open(path, flags, mode)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            held = False
        else:
            held = True
        yield fd if held else None
    finally:
        os.close(fd)
