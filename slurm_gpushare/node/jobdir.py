"""One job's directory on a node, ``<run_dir>/jobs/<job id>/``, and the lock that guards it.

* ``state.json``: what the Prolog decided and started (kind, GPUs, limits, phase); root's only (0600):
  the Epilog and ``doctor`` trust it, and it names the job's user;
* ``env``: ``export NAME=value`` lines that the TaskProlog (``taskprolog.sh`` in
  ``slurm_gpushare/data/site/``, a few lines of shell, no Python) prints before every task; it runs as
  the job's user, so these are owned by that user, mode 0600: no other user reads them; for an MPS share
  the client's variables, which the TaskProlog prints only to a task that holds a GPU of the share;
* ``devices``: one line, `` <index>=<UUID>`` per device whose ``CUDA_VISIBLE_DEVICES`` entry the
  TaskProlog translates in each task (MIG devices, an MPS share's GPUs; the index is slurmstepd's
  ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS`` entry), same owner and mode;
* ``ring.<k>``, ``task.<n>.<local id>``, ``note``: a multi-GPU job's NVLink ring order of its ``k`` GPUs
  here, the hints of each local rank when ``n`` tasks of a step run here, and the line that tells the
  job what was changed; the TaskProlog prints them only where they apply (docs/placement.md), same
  owner and mode;
* ``mps/pipe``, ``mps/log``: the job's own MPS control daemon's directories (owned by the job's
  user, mode 0700).

Files are replaced whole (:mod:`slurm_gpushare.atomicfile`): the TaskProlog and a concurrent Epilog
see the old content or the new one.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from slurm_gpushare.atomicfile import write_atomic
from slurm_gpushare.errors import InputError

STATE_VERSION = 1
#: Mode of the files of a job's directory (the env files are then given to the job's user).
FILE_MODE = 0o600
#: Mode of a job's directory: root's; others may only pass through it (to their own env file and MPS
#: pipe directory), not list it.
DIR_MODE = 0o711


def _still_named(fd: int, lock: Path) -> bool:
    """The path ``lock`` still names the file locked through ``fd`` (an Epilog that held the lock before may have
    unlinked it: then the lock protects nothing)."""
    try:
        return os.fstat(fd).st_ino == os.stat(lock).st_ino
    except FileNotFoundError:
        return False


@contextmanager
def job_lock(job_dir: Path, *, remove: bool = False):
    """Exclusive lock for one job's directory (a file next to it, so removing the directory is safe).

    With ``remove``, the lock file is unlinked before the lock is released (the Epilog, once the job
    is gone). A waiter that then gets the lock on the unlinked file notices (the path no longer names
    the file it locked) and locks the new one: the classic lock-file race, closed.
    """
    job_dir.parent.mkdir(parents=True, exist_ok=True)
    lock = job_dir.parent / f".{job_dir.name}.lock"
    while True:
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _still_named(fd, lock):
            break
        os.close(fd)
    try:
        yield
    finally:
        if remove:
            try:
                lock.unlink()
            except FileNotFoundError:
                pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextmanager
def job_lock_nowait(job_dir: Path):
    """The lock of :func:`job_lock` if it is free now: yields True holding it, False (holding nothing) when a
    hook holds it or the job has no lock file (no Prolog made one, or the Epilog removed it). Never creates the
    lock file: a reader that finds the job gone leaves nothing behind (the node monitor's MPS checks)."""
    lock = job_dir.parent / f".{job_dir.name}.lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        try:
            yield _still_named(fd, lock)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def make_job_dir(job_dir: Path) -> None:
    """Create the job's directory (mode :data:`DIR_MODE`: the job's user passes through to its files)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(job_dir, DIR_MODE)


def job_plans(run_dir: Path, *, except_job: str | None = None) -> Iterator[tuple[str, Path, dict]]:
    """``(job id, job directory, plan)`` of each job directory in ``<run_dir>/jobs`` but ``except_job``'s (the plan
    from its state.json, ``{}`` when it has none: a Prolog that died half-way, or a job of one whole GPU)."""
    try:
        entries = sorted(os.scandir(Path(run_dir) / "jobs"), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        if e.name == except_job or e.name.startswith(".") or not e.is_dir():
            continue
        d = Path(e.path)
        yield e.name, d, (read_state(d) or {}).get("plan") or {}


def read_state(job_dir: Path) -> dict | None:
    """The job's state.json, or None when missing or unreadable (a Prolog that died half-way)."""
    try:
        return json.loads((job_dir / "state.json").read_text())
    except (OSError, ValueError):
        return None


#: Whether the job directory's files are fsynced: no. They live in the node's run dir (``/run``, a tmpfs on
#: systemd hosts, cleared at boot with every job it described); the atomic rename is what keeps a reader
#: from seeing half a file, and a node that loses power has no job to resume.
VOLATILE_FSYNC = False


class RunRecord(NamedTuple):
    """What the Prolog recorded of the job's run (:func:`write_run`)."""

    restart: int
    start: int
    #: slurmctld's submit time of the run (epoch s); 0 unknown (a Prolog of an earlier release, or none known)
    submit: int = 0


def write_run(job_dir: Path, *, restart: int, start: int, submit: int = 0) -> None:
    """Record which run of the job this is (``run.json``, root's only): the restart count slurmd gave
    the Prolog (``SLURM_JOB_RESTART_COUNT``), the run's start (epoch seconds, slurmctld's
    ``start_time``) and its submit time (slurmctld's ``submit_time``, 0 unknown). The Epilog of a requeued run
    cannot know them itself: slurmctld has raised the count and reset the start and submit time before that
    Epilog runs (measured on 22.05.8)."""
    make_job_dir(job_dir)
    write_atomic(job_dir / "run.json", json.dumps({"restart": restart, "start": start, "submit": submit}),
                 mode=FILE_MODE, fsync=VOLATILE_FSYNC)


def read_run(job_dir: Path) -> RunRecord | None:
    """The run recorded by the Prolog (:func:`write_run`), or None (``submit`` 0 where a Prolog of an earlier
    release wrote none)."""
    try:
        data = json.loads((job_dir / "run.json").read_text())
        restart, start, submit = data["restart"], data["start"], data.get("submit", 0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (restart, start, submit)):
        return None
    return RunRecord(restart, start, submit)


def write_state(job_dir: Path, state: dict) -> None:
    """Replace the job's state.json."""
    write_atomic(job_dir / "state.json", json.dumps(state), mode=FILE_MODE, fsync=VOLATILE_FSYNC)


def _export_line(name: str, value: str) -> str:
    """``export NAME=value`` for the TaskProlog. slurmd takes the value literally (no shell quoting),
    so a value must be one line."""
    if "\n" in value or "\n" in name:
        raise InputError(f"environment value for {name} spans lines: {value!r}")
    return f"export {name}={value}\n"


def write_env(path: Path, env: Mapping[str, str], *, uid: int | None = None) -> None:
    """Replace an env file of the job (``env``, ``ring.<k>``, ``task.<n>.<local id>``) with ``export``
    lines, in order.

    Args:
        path: the file.
        env: names and values.
        uid: the job's user (``SLURM_JOB_UID``), who reads it in the TaskProlog: the file is given to
            that user, mode 0600. None or negative: it stays root's (then no task sees it).

    Raises:
        InputError: a value spans lines (slurmd would take the rest as another variable).
        OSError: the file could not be written or given to ``uid``.
    """
    write_atomic(path, "".join(_export_line(k, v) for k, v in env.items()), mode=FILE_MODE, fsync=VOLATILE_FSYNC)
    if uid is not None and uid >= 0 and uid != os.geteuid():
        os.chown(path, uid, -1)


def write_devices(path: Path, devices: Iterable[tuple[int, str]], *, uid: int | None = None) -> None:
    """Replace a job's device table (``devices``: index -> UUID; ``files``: index -> device file): one line
    `` <index>=<value>`` per device and a trailing space (the TaskProlog reads it with one ``read`` and finds
    `` <index>=`` with a shell pattern). Owner and mode as :func:`write_env`.

    Raises:
        InputError: a value that is empty or holds a space, ``=`` or a line break.
        OSError: the file could not be written or given to ``uid``.
    """
    line = ""
    for index, value in devices:
        if not value or any(ch in value for ch in " =\n\t"):
            raise InputError(f"device {index}: {value!r} cannot be written to the table {path.name}",
                             hint="device files and UUIDs hold no space, '=' or line break")
        line += f" {int(index)}={value}"
    write_atomic(path, line + " \n", mode=FILE_MODE, fsync=VOLATILE_FSYNC)
    if uid is not None and uid >= 0 and uid != os.geteuid():
        os.chown(path, uid, -1)


def write_note(path: Path, text: str, *, uid: int | None = None) -> None:
    """Replace the job's ``note`` file with one line of ``text``, which the TaskProlog shows the job
    (``print`` in slurm.conf(5) TaskProlog: the task's standard output). Owner and mode as :func:`write_env`.

    Raises:
        InputError: ``text`` spans lines.
        OSError: the file could not be written or given to ``uid``.
    """
    if "\n" in text:
        raise InputError(f"a note spans lines: {text!r}")
    write_atomic(path, text + "\n", mode=FILE_MODE, fsync=VOLATILE_FSYNC)
    if uid is not None and uid >= 0 and uid != os.geteuid():
        os.chown(path, uid, -1)


#: ``CUDA_MPS_PIPE_DIRECTORY`` of a job's own daemon: ``<run_dir>/jobs/<job id>/mps/pipe``.
_JOB_PIPE = re.compile(r"^(?P<run>/.*)/jobs/(?P<job>[0-9][0-9_.a-z]*)/mps/pipe/?$")


@dataclass(frozen=True)
class JobDaemon:
    """An MPS process of a job's own daemon, found by process (not by job directory).

    Attributes:
        job_id: the job its pipe directory names.
        pid: the process.
        uid: its real uid.
        pipe_dir: its ``CUDA_MPS_PIPE_DIRECTORY``.
        binary: the control program on its command line (``nvidia-cuda-mps-control`` or a path to it; a
            server's is the default name). The process's user chose it: shown, never run
            (:func:`~slurm_gpushare.node.daemons.stop_found_daemon` runs the site's binary).
        gid: its real gid (the front end that stops the daemon runs as the process's uid and gid).
    """

    job_id: str
    pid: int
    uid: int
    pipe_dir: Path
    binary: str
    gid: int = -1

    @property
    def run_dir(self) -> Path:
        """The run directory its pipe directory lies in."""
        return self.pipe_dir.parent.parent.parent.parent


def job_daemons(run_dir: Path | None = None) -> list[JobDaemon]:
    """MPS control daemons and servers of per-job daemons, found in ``/proc`` (psutil): a process with an
    MPS program on its command line (``nvidia-cuda-mps-*``) and ``CUDA_MPS_PIPE_DIRECTORY`` of the form
    ``<run_dir>/jobs/<job id>/mps/pipe`` in its environment (``/proc/<pid>/environ``: needs root). Works
    without the node config (``run_dir`` None: any run directory) and without the job's directory.

    A user can start a process that looks like this (the name, the variable and the command line are theirs
    to choose): what stops such a process runs as that user and only ever hurts that user's own process.
    """
    out = []
    import psutil  # only doctor and the broken-config Epilog look for daemons by process

    for proc in psutil.process_iter(["environ", "cmdline", "uids", "gids"]):
        env, argv, uids, gids = proc.info["environ"], proc.info["cmdline"], proc.info["uids"], proc.info["gids"]
        if not env or not argv or uids is None or gids is None or "nvidia-cuda-mps" not in "\0".join(argv):
            continue
        m = _JOB_PIPE.match(env.get("CUDA_MPS_PIPE_DIRECTORY") or "")
        if m is None or (run_dir is not None and Path(m.group("run")) != Path(run_dir)):
            continue
        control = next((a for a in argv if Path(a).name.startswith("nvidia-cuda-mps-control")),
                       "nvidia-cuda-mps-control")
        out.append(JobDaemon(m.group("job"), proc.pid, uids.real, Path(m.group(0).rstrip("/")), control, gids.real))
    return out


def restart_from_env(env: Mapping[str, str]) -> int:
    """The run's restart count from slurmd's Prolog/Epilog environment: ``SLURM_JOB_RESTART_COUNT``
    (set by slurmd from the job's ``restart_cnt`` once the job was requeued; absent for a first run,
    so 0). Not user-controlled: a user's own requeue only increments it."""
    value = env.get("SLURM_JOB_RESTART_COUNT", "")
    return int(value) if value.isascii() and value.isdigit() else 0
