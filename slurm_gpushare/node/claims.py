"""Which job holds which GPU of this node, whole or as an MPS share, as the node's Prologs claimed them.

Slurm 22.05.8 gives a GPU whole to a ``gpu`` job while another job's MPS share (a ``shard`` job) still runs
on it, and a share to a GPU that a job holds whole (its shard bookkeeping of a GPU is reset when one of the
GPU's shard jobs ends; measured on the dev cluster, tests/test_shard_sharing_slurm.py; 24.11 and 26.05 keep
them apart). The Prolog of the later job finds the earlier one's claim here and yields
(:func:`slurm_gpushare.node.prolog.wait_for_gpus`): it is requeued, remembered as waiting, and made eligible
by the Epilog of the last job it waited for (:func:`slurm_gpushare.node.epilog.wake_waiting`).

Files, all root's (mode 0600, directories 0700), in the node's run dir:

* ``claims/<job id>``: ``{"kind": "gpu" | "mps", "gpus": [NVML index, ...]}``, written by the job's Prolog,
  removed by its Epilog;
* ``waiting/<job id>``: ``{"waits_for": [job id, ...]}``, a requeued job and the jobs whose GPUs it waits for;
* ``claims.lock``: the lock every read-modify-write of both takes (:func:`claims_lock`), so that two Prologs
  that start at once on one GPU see each other, and a Prolog's requeue and the Epilog's wake-up cannot cross.

No user writes any of these: the decision reads only what root's Prologs wrote and slurmctld's own job list.

* ``refused/<job id>.<restart>``: a run the Prolog requeued (mode 0644 in a 0755 directory: the job's
  TaskProlog, as the job's user, reads that it is there). On 22.05 slurmd launches that run's batch script
  before the requeue lands; its TaskProlog fails, so slurmstepd never starts the script (TaskProlog failed:
  ``exec_task`` in src/slurmd/slurmstepd/task.c). The run's Epilog removes it.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from slurm_gpushare.atomicfile import read_own_file, write_atomic

#: ``<run_dir>/claims/<job id>``
CLAIMS_DIR = "claims"
#: ``<run_dir>/waiting/<job id>``
WAITING_DIR = "waiting"
#: ``<run_dir>/claims.lock``
LOCK_FILE = "claims.lock"
#: ``<run_dir>/refused/<job id>.<restart>``
REFUSED_DIR = "refused"
#: Kinds of claim: a GPU held whole, or an MPS share of it (:attr:`slurm_gpushare.node.plan.JobPlan.kind`).
KINDS = ("gpu", "mps")
_MAX_BYTES = 65536


@dataclass(frozen=True)
class Claim:
    """One job's claim on GPUs of this node.

    Attributes:
        job: the job id (digits).
        kind: ``gpu`` (whole GPUs) or ``mps`` (a share of each).
        gpus: NVML indices of the GPUs.
    """

    job: str
    kind: str
    gpus: tuple[int, ...]

    def conflicts_with(self, kind: str, gpus: Iterable[int]) -> tuple[int, ...]:
        """The GPUs of ``gpus`` that this claim and a ``kind`` claim on ``gpus`` cannot both hold: every shared
        GPU when either is whole, none between two MPS shares."""
        if self.kind == "mps" and kind == "mps":
            return ()
        return tuple(g for g in gpus if g in self.gpus)


@contextmanager
def claims_lock(run_dir: Path) -> Iterator[None]:
    """Hold the node's claims lock (``<run_dir>/claims.lock``, flock(2) exclusive) for the block.

    Raises:
        OSError: the run dir cannot be created or the lock file opened.
    """
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(run_dir) / LOCK_FILE, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def claims(run_dir: Path, *, except_job: str | None = None) -> list[Claim]:
    """Every job's claim on this node but ``except_job``'s, by job id; an unreadable or malformed file is
    skipped (it claims nothing)."""
    try:
        entries = sorted(os.scandir(Path(run_dir) / CLAIMS_DIR), key=lambda e: e.name)
    except OSError:
        return []
    found = []
    for e in entries:
        if not e.name.isdigit() or e.name == except_job:
            continue
        try:
            data = json.loads(read_own_file(Path(e.path), max_bytes=_MAX_BYTES))
            kind, gpus = data["kind"], tuple(int(g) for g in data["gpus"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if kind in KINDS:
            found.append(Claim(e.name, kind, gpus))
    return found


def conflicting(run_dir: Path, job: str, kind: str, gpus: Iterable[int]) -> dict[str, tuple[int, ...]]:
    """Other jobs' claims that a ``kind`` claim of ``job`` on ``gpus`` cannot share GPUs with: job id -> the GPUs
    both would hold."""
    gpus = tuple(gpus)
    out = {}
    for c in claims(run_dir, except_job=job):
        held = c.conflicts_with(kind, gpus)
        if held:
            out[c.job] = held
    return out


def write_claim(run_dir: Path, claim: Claim) -> None:
    """Record ``claim`` (replacing the job's earlier one, e.g. of a requeued run).

    Raises:
        OSError: it cannot be written.
    """
    d = Path(run_dir) / CLAIMS_DIR
    d.mkdir(mode=0o700, exist_ok=True)
    write_atomic(d / claim.job, json.dumps({"kind": claim.kind, "gpus": list(claim.gpus)}), mode=0o600,
                 fsync=False)


def drop_claim(run_dir: Path, job: str) -> None:
    """Forget ``job``'s claim (none is fine)."""
    (Path(run_dir) / CLAIMS_DIR / job).unlink(missing_ok=True)


def waiting_path(run_dir: Path, job: str) -> Path:
    """Where a requeued job is remembered (root's, mode 0600)."""
    return Path(run_dir) / WAITING_DIR / job


def write_waiting(run_dir: Path, job: str, waits_for: Iterable[str]) -> None:
    """Remember ``job`` as waiting for the jobs ``waits_for``.

    Raises:
        OSError: it cannot be written.
    """
    path = waiting_path(run_dir, job)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    write_atomic(path, json.dumps({"waits_for": sorted(set(waits_for))}), mode=0o600, fsync=False)


def waiting(run_dir: Path) -> dict[str, list[str]]:
    """Every waiting job and the jobs it waits for. A file that cannot be read as such is removed (it would
    wake nobody), and so is one that waits for nothing."""
    try:
        entries = sorted(os.scandir(Path(run_dir) / WAITING_DIR), key=lambda e: e.name)
    except OSError:
        return {}
    out = {}
    for e in entries:
        if not e.name.isdigit():
            continue
        try:
            data = json.loads(read_own_file(Path(e.path), max_bytes=_MAX_BYTES))
            # "shares": the name of the list before a share could wait for a whole GPU too
            jobs = [str(j) for j in data.get("waits_for", data.get("shares"))]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            jobs = []
        if jobs:
            out[e.name] = jobs
        else:
            Path(e.path).unlink(missing_ok=True)
    return out


def refuse_run(run_dir: Path, job: str, restart: int, why: str) -> Path:
    """Mark run ``restart`` of ``job`` as requeued by the Prolog (``refused/<job>.<restart>``, 0644, holding
    ``why``): its TaskProlog fails, so its batch script never starts here.

    Raises:
        OSError: the run dir cannot be written.
    """
    d = run_dir / REFUSED_DIR
    d.mkdir(mode=0o755, exist_ok=True)
    os.chmod(d, 0o755)
    return write_atomic(d / f"{job}.{restart}", why[:500] + "\n", mode=0o644, fsync=False)


def forget_refused(run_dir: Path, job: str, up_to: int) -> None:
    """Remove the refused-run marks of ``job`` up to run ``up_to`` (its Epilog: that run has ended)."""
    d = run_dir / REFUSED_DIR
    try:
        names = [p.name for p in d.iterdir()]
    except OSError:
        return
    for name in names:
        j, _, n = name.partition(".")
        if j == job and n.isdigit() and int(n) <= up_to:
            (d / name).unlink(missing_ok=True)
