"""Which Slurm job a local process belongs to, from data only root writes.

Two sources, both kernel or slurmstepd facts that a job's user cannot write:

* **cgroups** (Slurm's ``task/cgroup`` or ``proctrack/cgroup``): ``/proc/<pid>/cgroup`` names the
  process's cgroup in each hierarchy, and slurmstepd (root) makes the job's directory:

  - cgroup v1: ``<N>:<controllers>:/slurm/uid_<uid>/job_<id>/step_<step>/task_<n>`` (``/slurm_<node>/...``
    where several slurmd share a host; src/plugins/cgroup/v1/cgroup_v1.c);
  - cgroup v2: ``0::/system.slice/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>``
    (``<node>_slurmstepd.scope`` with several slurmd; src/plugins/cgroup/v2/cgroup_v2.c).

  The path alone is not proof: on 22.05 (cgroup v1) a job's step and task directories belong to the job's
  user (docs/compatibility.md), who may create child cgroups there, open them to other users, and move
  their own processes between cgroups they can write; under cgroup v2 a user may name directories of a
  delegated subtree (``user@<uid>.service``) ``job_<id>``. So a job is read from a path only where the
  ``job_<id>`` directory itself is root's (:class:`CgroupFs`), and the caller still checks that the job's
  user is the process's owner (:func:`read_proc`).
* **slurmstepd's pid lists** (``scontrol listpids``, :func:`parse_listpids`): what each step's proctrack
  plugin tracks (``proctrack/linuxproc``: the stepd's descendants).

A process's name, command line and environment (``SLURM_JOB_ID``) are the user's to write and are never read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

#: Slurm's job cgroup in a v1 hierarchy (``/slurm[_<node>]/uid_<uid>/job_<id>``) and in cgroup v2
#: (``[<node>_]slurmstepd.scope/job_<id>``)
_V1_JOB = re.compile(r"/slurm(?:_[^/]+)?/uid_\d+/job_(\d+)(?=/|$)")
_V2_JOB = re.compile(r"/(?:[^/]+_)?slurmstepd\.scope/job_(\d+)(?=/|$)")


@dataclass(frozen=True)
class CgroupJob:
    """One line of ``/proc/<pid>/cgroup`` that names a Slurm job's cgroup.

    Attributes:
        hierarchy: the v1 controllers of the line (``devices``, ``cpu,cpuacct``, ``name=systemd``); ``""``
            for cgroup v2.
        path: the job's directory in that hierarchy, e.g. ``/slurm_node1/uid_1000/job_42``.
        job_id: the job id of the directory name.
    """

    hierarchy: str
    path: str
    job_id: str


def cgroup_jobs(text: str) -> list[CgroupJob]:
    """The Slurm job cgroups a ``/proc/<pid>/cgroup`` text names, one per line that names one (the first
    ``job_<id>`` of Slurm's layout in the line: a user's own child cgroups lie below it)."""
    out: list[CgroupJob] = []
    for line in text.splitlines():
        hierarchy, _, path = line.partition(":")[2].partition(":")
        m = (_V2_JOB if hierarchy == "" else _V1_JOB).search(path)
        if m:
            out.append(CgroupJob(hierarchy, path[:m.end()], m.group(1)))
    return out


def job_of_cgroup(text: str) -> str | None:
    """The Slurm job id of a ``/proc/<pid>/cgroup`` text: the one job its lines name in Slurm's layout
    (see module docstring), or None when none does or lines name different jobs (a process moved in one
    hierarchy: no answer). Says nothing of who made the directories (:class:`CgroupFs` does)."""
    jobs = {c.job_id for c in cgroup_jobs(text)}
    return jobs.pop() if len(jobs) == 1 else None


def read_cgroup(pid: int) -> str:
    """``/proc/<pid>/cgroup`` ("" when the process is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return f.read()
    except OSError:
        return ""


@dataclass(frozen=True)
class ProcFacts:
    """What the kernel says of a process.

    Attributes:
        uid: its real uid (``/proc/<pid>/status``, ``Uid:`` first field).
        start: when it started, clock ticks after boot (``/proc/<pid>/stat`` field 22): with the pid, it
            names one process (a pid the kernel gives to another process later has another start).
    """

    uid: int
    start: int


def read_proc(pid: int) -> ProcFacts | None:
    """:class:`ProcFacts` of ``pid``, or None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
    except OSError:
        return None
    try:
        # the name (field 2) is in parentheses and may hold anything: count fields after the last ")"
        start = int(stat[stat.rindex(b")") + 2:].split()[19])
        at = status.index(b"\nUid:")
        uid = int(status[at + 5:status.index(b"\n", at + 1)].split()[0])
    except (ValueError, IndexError):
        return None
    return ProcFacts(uid, start)


def parse_listpids(text: str) -> dict[int, str]:
    """``scontrol listpids`` output -> ``{pid: job id}``.

    The output is a header ``PID JOBID STEPID LOCALID GLOBALID`` and one row per process
    (``-`` for the step's own slurmstepd). Rows that are not ``<pid> <job id> ...`` are skipped.
    """
    out: dict[int, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            out[int(parts[0])] = parts[1]
    return out


@dataclass(frozen=True)
class _Mount:
    root: str  # the directory of the hierarchy mounted here (field 4 of mountinfo)
    point: str  # where (field 5)
    controllers: frozenset[str]  # v1: the controllers and name=; v2: empty
    v2: bool


_OCTAL = re.compile(r"\\([0-7]{3})")  # mountinfo's escapes of space, tab, newline, backslash


def _unescape(field: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[_Mount]:
    """The cgroup (v1) and cgroup2 mounts of a ``/proc/self/mountinfo`` text (proc(5))."""
    out: list[_Mount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        v2 = tail[0] == "cgroup2"
        opts = frozenset() if v2 else frozenset(tail[2].split(",")) - {"rw", "ro"}
        out.append(_Mount(_unescape(fields[3]), _unescape(fields[4]), opts, v2))
    return out


class CgroupFs:
    """Where the cgroup hierarchies are mounted (``/proc/self/mountinfo``, read once), to look at the
    directory of a job's cgroup.

    Args:
        mountinfo: the mountinfo text (default: read ``/proc/self/mountinfo`` on first use).
    """

    def __init__(self, mountinfo: str | None = None):
        self._text = mountinfo
        self._mounts: list[_Mount] | None = None

    def _all(self) -> list[_Mount]:
        if self._mounts is None:
            text = self._text
            if text is None:
                try:
                    text = Path("/proc/self/mountinfo").read_text()
                except OSError:
                    text = ""
            self._mounts = parse_mountinfo(text)
        return self._mounts

    def directory(self, cg: CgroupJob) -> str | None:
        """The job cgroup's directory on this host, or None when no mount here shows that hierarchy."""
        want = frozenset(cg.hierarchy.split(",")) if cg.hierarchy else frozenset()
        for m in self._all():
            if m.v2 != (cg.hierarchy == "") or not want <= m.controllers:
                continue
            root = m.root.rstrip("/")
            if root and not (cg.path == root or cg.path.startswith(root + "/")):
                continue
            return m.point.rstrip("/") + cg.path[len(root):]
        return None

    def owner(self, cg: CgroupJob) -> int | None:
        """The uid that owns the job cgroup's directory (slurmstepd makes it as root: 0), or None when it
        cannot be found (gone: the job's steps ended; or not mounted here)."""
        where = self.directory(cg)
        if where is None:
            return None
        try:
            return os.stat(where).st_uid
        except OSError:
            return None


class ProcReader:
    """:func:`read_proc` and :func:`read_cgroup` for processes seen again and again (a monitor's samples):
    each process's ``/proc/<pid>`` directory is held open, so that a sample reads only its ``cgroup`` (one
    open) and its owner once. A held directory of a process that has exited answers ESRCH to every open,
    even after the kernel gives the pid to another process: the facts kept are never another process's.
    (Its real uid is kept for its life: an unprivileged process cannot change its real uid.)"""

    def __init__(self) -> None:
        self._held: dict[int, tuple[int, ProcFacts]] = {}  # pid -> (directory fd, facts)

    def facts(self, pid: int) -> ProcFacts | None:
        """:class:`ProcFacts` of ``pid`` (None when gone)."""
        held = self._held.get(pid)
        if held is not None:
            return held[1]
        try:
            fd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return None
        facts = read_proc(pid)
        # the directory opened first: if the pid was reused in between, its stat names the newer process,
        # whose directory this is not; check that the held one still answers
        if facts is None or self._read(fd, "stat") is None:
            os.close(fd)
            return None
        self._held[pid] = (fd, facts)
        return facts

    def cgroup(self, pid: int) -> str:
        """``/proc/<pid>/cgroup`` of the process :meth:`facts` described ("" when it is gone)."""
        held = self._held.get(pid)
        if held is None:
            return read_cgroup(pid) if self.facts(pid) is not None else ""
        text = self._read(held[0], "cgroup")
        if text is None:
            self._drop(pid)
            return ""
        return text

    def keep(self, pids: set[int]) -> None:
        """Close the directories of processes not in ``pids``."""
        for pid in set(self._held) - pids:
            self._drop(pid)

    def _drop(self, pid: int) -> None:
        fd, _ = self._held.pop(pid)
        os.close(fd)

    @staticmethod
    def _read(fd: int, name: str) -> str | None:
        try:
            f = os.open(name, os.O_RDONLY, dir_fd=fd)
        except OSError:
            return None
        try:
            return os.read(f, 65536).decode(errors="replace")
        except OSError:
            return None
        finally:
            os.close(f)
