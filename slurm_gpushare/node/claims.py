"""Which job holds which GPU of this node, whole or as an MPS share, as the node's Prologs claimed them.

Slurm 22.05.8 gives a GPU whole to a ``gpu`` job while another job's MPS share (a ``shard`` job) still runs
on it, and a share to a GPU that a job holds whole (its shard bookkeeping of a GPU is reset when one of the
GPU's shard jobs ends; measured on the dev cluster, tests/test_shard_sharing_slurm.py; 24.11 and 26.05 keep
them apart). The Prolog of the later job finds the earlier one's claim here and yields
(:func:`slurm_gpushare.node.prolog.wait_for_gpus`): it is requeued, and slurmctld starts it again after its
requeue delay (``BeginTime``: now + the credential lifetime, cred_expire, 120 s by default; job_mgr.c), when
slurmd has forgotten the job's credential and runs the Prolog again.

Files, all root's, in the node's run dir:

* ``claims/<job id>``: ``{"kind": "gpu" | "mps", "gpus": [NVML index, ...]}``, written by the job's Prolog,
  removed by its Epilog (mode 0600 in a 0700 directory);
* ``claims.lock``: the lock every read-modify-write of them takes (:func:`claims_lock`), so that two Prologs
  that start at once on one GPU see each other;
* ``refused/<job id>.<restart>``: a run of the job that did not get its GPUs here (mode 0644 in a 0755
  directory: the job's TaskProlog, as the job's user, looks for them), from the Prolog that requeued it, or
  from the Epilog of a run that started without a Prolog after one was requeued. They stay until a Prolog
  lets a later run of the job start (:func:`forget_refused`). While one is there, every task of the job on
  this node fails in its TaskProlog, so slurmstepd never starts it (TaskProlog failed: ``exec_task`` in
  src/slurmd/slurmstepd/task.c): on 22.05 slurmd launches the batch script of the run the Prolog requeued
  before the requeue lands, and it runs a rerun without the Prolog when the job id is still in its
  credential cache (``slurm_cred_jobid_cached()`` in src/slurmd/slurmd/req.c, every supported release), e.g.
  one whose start its user brought forward. The Epilog of a requeued run of a job the product prepared (an MPS
  share, MIG devices) marks it too: a rerun without the Prolog would have no daemon and no limit;
* ``claims/<job id>.refused``: the run the Prolog refused has not had its Epilog yet (root's, 0600): that
  Epilog removes it, and an Epilog that finds refused marks but none of these ends a run that started without
  its Prolog.

No user writes any of these: the decision reads only what root's Prologs wrote and slurmctld's own job list.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from slurm_gpushare.atomicfile import locked, read_own_file, write_atomic

#: ``<run_dir>/claims/<job id>``
CLAIMS_DIR = "claims"
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
    with locked(Path(run_dir) / LOCK_FILE):
        yield


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


def refuse_run(run_dir: Path, job: str, restart: int, why: str, *, by_prolog: bool = False) -> Path:
    """Mark run ``restart`` of ``job`` as refused here (``refused/<job>.<restart>``, 0644, holding ``why``): the
    job's tasks on this node fail in their TaskProlog until a Prolog lets a later run start. ``by_prolog``: the
    run's Prolog refused it, and its Epilog is still to come (``claims/<job>.refused``, :func:`epilog_of_refused`).

    Raises:
        OSError: the run dir cannot be written.
    """
    if by_prolog:
        d = run_dir / CLAIMS_DIR
        d.mkdir(mode=0o700, exist_ok=True)
        write_atomic(d / f"{job}.refused", f"{restart}\n", mode=0o600, fsync=False)
    d = run_dir / REFUSED_DIR
    d.mkdir(mode=0o755, exist_ok=True)
    os.chmod(d, 0o755)
    return write_atomic(d / f"{job}.{restart}", why[:500] + "\n", mode=0o644, fsync=False)


def epilog_of_refused(run_dir: Path, job: str) -> int | None:
    """The restart count of the run whose Prolog refused it (:func:`refuse_run` ``by_prolog``) when this Epilog of
    ``job`` ends that run, else None; it is then forgotten."""
    path = run_dir / CLAIMS_DIR / f"{job}.refused"
    try:
        text = read_own_file(path, max_bytes=64)
    except OSError:
        return None
    path.unlink(missing_ok=True)
    text = text.strip()
    return int(text) if text.isdigit() else 0


#: A refused mark older than this (seconds) is removed by any Epilog: a mark matters only until the job's next
#: run starts on the node, which is within slurmctld's requeue delay (the credential lifetime, 120 s by default)
#: unless the job is held; a later run of a held job has its Prolog (the credential is long forgotten).
REFUSED_KEEP_S = 86400


def refused_runs(run_dir: Path, job: str, *, prune_before: float | None = None) -> list[int]:
    """The runs of ``job`` marked refused here, in order. With ``prune_before`` (a time, seconds since the
    epoch), marks of any job older than that are removed first."""
    d = run_dir / REFUSED_DIR
    try:
        entries = list(os.scandir(d))
    except OSError:
        return []
    runs = []
    for e in entries:
        j, _, n = e.name.partition(".")
        if prune_before is not None:
            try:
                if e.stat(follow_symlinks=False).st_mtime < prune_before:
                    Path(e.path).unlink(missing_ok=True)
                    continue
            except OSError:
                continue
        if j == job and n.isdigit():
            runs.append(int(n))
    return sorted(runs)


def forget_refused(run_dir: Path, job: str, up_to: int) -> None:
    """Remove the refused marks of ``job`` up to run ``up_to`` (a Prolog let that run start).

    Raises:
        OSError: a mark cannot be removed.
    """
    (run_dir / CLAIMS_DIR / f"{job}.refused").unlink(missing_ok=True)
    for n in refused_runs(run_dir, job):
        if n <= up_to:
            (run_dir / REFUSED_DIR / f"{job}.{n}").unlink(missing_ok=True)
