"""The node's append-only accounting spool: one JSON line per record, fsynced before the Epilog ends.

Layout: one directory (default :data:`DEFAULT_SPOOL_DIR`, persistent storage: not ``/run``, which is
emptied at boot) holding one file per node and UTC day, ``<node>.<YYYY-MM-DD>.jsonl``. Files are only
ever appended to; ``slurm-gpushare accounting ingest`` reads them where they lie (on the node, or
copied or mounted on the host that keeps the database) and remembers how far it got, so a database
that is down, or a node that is unreachable for a while, delays records but never loses them.

How an append stays whole (:meth:`Spool.append`):

* the file is opened ``O_APPEND``: the kernel moves to the current end and writes in one step, so
  two writers never overwrite each other;
* the writer holds an exclusive ``flock`` on the file for the whole write, and all lines of one
  call (one job's GPUs) go out in one ``write()``; concurrent Epilogs of different jobs therefore
  never interleave, whatever the line length. (POSIX promises atomic writes of at most ``PIPE_BUF``
  = 4096 bytes only for pipes; for a regular file on a local Linux file system a single ``write()``
  is not interleaved either, and a record line is about 600 bytes; over NFS ``O_APPEND`` is not
  atomic between clients, which is why each node writes its own file and the lock is taken anyway);
* ``fsync`` of the file (and of the directory when the file is new) before returning: once the
  Epilog has returned, the record survives a crash or power loss;
* a writer that died mid-write leaves a last line without its newline. The next writer sees that
  (under the lock) and starts with a newline, so the fragment stays one line of its own, which ingest
  skips with a warning naming file and line, and the new record is intact.

Readers take a shared ``flock`` only to learn how much of the file is complete (its size while no
writer holds the lock), then read without it.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from slurm_gpushare.accounting.record import UsageRecord
from slurm_gpushare.errors import GpushareError, InputError

#: Where the Epilog writes, unless the node config says otherwise.
DEFAULT_SPOOL_DIR = "/var/spool/slurm-gpushare/accounting"
#: Spool files end in this.
SUFFIX = ".jsonl"
#: Below the spool directory: one empty file ``<job id>.<restart count>.<node>`` per run and node that holds
#: GPUs there, made by the node's Prolog (root's, like the spool), so that the controller's EpilogSlurmctld
#: (epilog_slurmctld.sh, plain sh) knows without Python which runs will have records, and from which nodes.
RUNS_DIR = "runs"


def run_marks(spool_dir: str | Path, job_id: str, restart: int) -> dict[str, Path]:
    """The nodes that marked run ``restart`` of ``job_id`` in ``spool_dir`` (see :data:`RUNS_DIR`): node name ->
    marker file. Empty when none did (a job that held no GPU) or the directory is unreadable."""
    prefix = f"{job_id}.{restart}."
    try:
        names = os.listdir(Path(spool_dir) / RUNS_DIR)
    except OSError:
        return {}
    return {n[len(prefix):]: Path(spool_dir) / RUNS_DIR / n for n in names
            if n.startswith(prefix) and _NODE.match(n[len(prefix):])}
_NODE = re.compile(r"^[A-Za-z0-9_.+-]+$")


def prune_marks(spool_dir: str | Path, node: str, *, max_age: float = 86400.0, every: float = 3600.0,
                now: float | None = None) -> int:
    """Remove ``node``'s own run marks (:data:`RUNS_DIR`) older than ``max_age`` seconds, at most once per
    ``every`` seconds (a stamp file ``.pruned.<node>`` there: one ``stat`` otherwise). The node's Epilog
    calls it: the marks are root's, and the controller's worker, as SlurmUser, may not remove them; it
    does not need to (a queue entry done is done). Times are epoch seconds (``now``: default the time).
    Returns how many marks went; nothing is raised (an unreadable directory prunes nothing).
    """
    runs = Path(spool_dir) / RUNS_DIR
    stamp = runs / f".pruned.{node}"
    now = time.time() if now is None else now
    try:
        if now - stamp.stat().st_mtime < every:
            return 0
    except OSError:
        pass
    try:
        stamp.touch()
        os.utime(stamp, (now, now))
        names = os.listdir(runs)
    except OSError:
        return 0
    gone = 0
    for name in names:
        if name.startswith(".") or not name.endswith(f".{node}"):
            continue
        try:
            if now - (runs / name).stat().st_mtime > max_age:
                (runs / name).unlink()
                gone += 1
        except OSError:
            continue
    return gone


class SpoolError(GpushareError):
    """The spool could not be written (a full disk, permissions): the Epilog must say so loudly."""


class Spool:
    """The spool directory of one node.

    Args:
        directory: the spool directory (created with its parents on first append).
        node: this node's Slurm name (``SLURMD_NODENAME``); part of each file name.
        clock: returns epoch seconds; picks the day of the file (injectable for tests).
        file_mode: permissions of new files (records name users and accounts: 0600 by default, and
            the directory is created 0700: only its owner, root, reads them).

    Raises:
        InputError: a node name that cannot be part of a file name.
    """

    def __init__(self, directory: str | Path, *, node: str, clock: Callable[[], float] = time.time,
                 file_mode: int = 0o600):
        if not _NODE.match(node or "") or node.startswith("."):
            raise InputError(f"node name {node!r} cannot name a spool file",
                             hint="Slurm node names are letters, digits, '-', '_' and '.'")
        self.directory = Path(directory)
        self.node = node
        self._clock = clock
        self._file_mode = file_mode

    def path_for(self, when: float) -> Path:
        """The file for records written at ``when`` (epoch seconds): ``<node>.<UTC day>.jsonl``."""
        day = time.strftime("%Y-%m-%d", time.gmtime(when))
        return self.directory / f"{self.node}.{day}{SUFFIX}"

    def append(self, records: Sequence[UsageRecord] | Iterable[UsageRecord]) -> Path | None:
        """Append records durably (see module docstring); returns the file, or None when there were none.

        Raises:
            SpoolError: the directory or the file cannot be created or written (``source`` names it).
        """
        lines = "".join(r.to_json() + "\n" for r in records)
        if not lines:
            return None
        path = self.path_for(self._clock())
        try:
            if not self.directory.is_dir():
                self.directory.parent.mkdir(parents=True, exist_ok=True)
                self.directory.mkdir(mode=0o700, exist_ok=True)
            append_lines(path, lines.encode(), mode=self._file_mode)
        except OSError as e:
            raise SpoolError(f"cannot append to the accounting spool: {e.strerror or e}", source=str(path),
                             hint="check free space and permissions of the spool directory") from None
        return path

    def files(self) -> list[Path]:
        """This node's spool files, oldest day first."""
        return [p for p in spool_files(self.directory) if p.name.startswith(f"{self.node}.")]


def append_lines(path: str | Path, data: bytes, *, mode: int = 0o600) -> None:
    """Append ``data`` (whole lines, ending in a newline) to ``path`` under an exclusive ``flock``, in
    one ``write()`` (continued if the kernel writes less), then ``fsync``. Creates the file (and
    fsyncs its directory) when missing. A previous writer's unterminated last line is closed first.

    Raises:
        OSError: as the system call raised it.
    """
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
        if size == 0:
            _fsync_dir(Path(path).parent)
    finally:
        os.close(fd)  # releases the lock


def complete_size(path: str | Path) -> int:
    """The size of ``path`` while no writer holds it (taken under a shared ``flock``): everything
    before it was written by writers that finished. A last line without a newline within it is a
    writer that died, not one still writing.

    Raises:
        OSError: as the system call raised it.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def spool_files(directory: str | Path) -> list[Path]:
    """The ``*.jsonl`` files in a spool directory, sorted by name (node, then day).

    Raises:
        InputError: the directory does not exist or is not a directory.
    """
    d = Path(directory)
    if not d.is_dir():
        raise InputError(f"spool directory {d} does not exist" if not d.exists() else f"{d} is not a directory",
                         hint=f"the Epilog writes to {DEFAULT_SPOOL_DIR} unless configured otherwise")
    return sorted(p for p in d.iterdir() if p.name.endswith(SUFFIX) and p.is_file())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
