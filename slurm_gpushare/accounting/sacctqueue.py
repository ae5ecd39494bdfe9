"""The controller's queue of ended GPU runs, and the one worker that writes their usage segments.

EpilogSlurmctld runs once per ended job on slurmctld's host. Its wrapper (``epilog_slurmctld.sh``, plain sh)
starts no Python per job: for a run that some node's Prolog marked as holding GPUs
(:data:`~slurm_gpushare.accounting.spool.RUNS_DIR`) it writes one small entry file into the queue directory
(temp file, then ``mv``: a reader sees a whole entry or none) and starts the worker (``accounting
sacct-worker``, detached with ``setsid``) when the worker's lock is free. The worker:

* holds ``worker.lock`` in the queue (``flock``), so one runs per queue: the wrapper takes the lock with
  ``flock -n`` and hands it to the worker it starts (so of two wrappers ending at once one starts Python);
  a worker started without it takes the lock itself, or exits at once;
* carries every queued run at once, each as a :class:`~slurm_gpushare.accounting.sacct.FinalRun` with its
  own deadline (``wait`` seconds from when the worker first saw it): the marked nodes' records, then
  slurmdbd's end record, then the merge and ``sacctmgr``; one ``sacct`` per round for all runs waiting for
  their end records;
* removes an entry once its run is finished, failed or past its deadline (a line on stderr, the worker's
  log, for each of the last two): an entry done is done, whatever became of the run marks (root's, in the
  nodes' spool, which SlurmUser may not remove; the nodes prune their own, ``prune_marks``);
* exits once the queue has been empty ``idle`` seconds, or when the queue directory is gone. On the way out
  it lets go of the lock and looks again: an entry queued meanwhile (its wrapper saw the lock held and
  started nobody) is taken on again under a retaken lock, or left to the worker that holds it now.

An entry (:func:`entry_text`) is the ``KEY=VALUE`` lines of :data:`ENTRY_KEYS`, the part of EpilogSlurmctld's
environment (slurmctld's own, src/slurmctld/job_mgr.c) that :meth:`FinalJob.from_env` reads. The queue
directory must be writable by SlurmUser only (the wrapper makes it 0700): what it holds decides which jobs'
AdminComment is written.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from slurm_gpushare.accounting.sacct import FinalJob, FinalRun, parse_sacct
from slurm_gpushare.accounting.spool import run_marks
from slurm_gpushare.errors import GpushareError
from slurm_gpushare.slurm.release import Release

#: The wrapper's default queue directory (``QUEUE=`` in epilog_slurmctld.sh).
DEFAULT_QUEUE_DIR = "/var/spool/slurm-gpushare/sacct-queue"
#: EpilogSlurmctld's variables an entry holds, one ``KEY=VALUE`` line each.
ENTRY_KEYS = ("SLURM_JOB_ID", "SLURM_JOB_RESTART_COUNT", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
              "SLURM_JOB_NODELIST", "SLURM_JOB_USER", "SLURM_JOB_START_TIME")
#: Entries end in this (``<job id>.<restart count>.run``); other names (the lock, the log, ``.``-temp files)
#: are not entries.
ENTRY_SUFFIX = ".run"
LOCK_NAME = "worker.lock"


def entry_text(env: dict[str, str]) -> str:
    """The entry of the run EpilogSlurmctld's environment ``env`` names (what the wrapper's ``printf`` writes)."""
    return "".join(f"{k}={env.get(k, '')}\n" for k in ENTRY_KEYS)


def enqueue(queue_dir: str | Path, env: dict[str, str]) -> Path:
    """Queue the run ``env`` names, as the wrapper does (temp file, then rename); returns the entry's path.

    Raises:
        OSError: the queue directory cannot be made or written.
    """
    q = Path(queue_dir)
    q.mkdir(mode=0o700, parents=True, exist_ok=True)
    name = f"{env.get('SLURM_JOB_ID', '')}.{env.get('SLURM_JOB_RESTART_COUNT') or 0}{ENTRY_SUFFIX}"
    tmp = q / f".{name}.{os.getpid()}"
    tmp.write_text(entry_text(env))
    tmp.rename(q / name)
    return q / name


def read_entry(path: str | Path) -> FinalJob:
    """The run an entry names (only the :data:`ENTRY_KEYS` lines are read).

    Raises:
        InputError: no job id in it. OSError: it cannot be read.
    """
    env = {}
    for line in Path(path).read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ENTRY_KEYS:
            env[key] = value.strip()
    return FinalJob.from_env(env)


def entries(queue_dir: str | Path) -> list[Path]:
    """The queue's entries, oldest name first (empty when the directory is gone)."""
    try:
        names = os.listdir(queue_dir)
    except OSError:
        return []
    return [Path(queue_dir) / n for n in sorted(names) if n.endswith(ENTRY_SUFFIX) and not n.startswith(".")]


@dataclass
class _Carried:
    run: FinalRun
    marks: dict[str, Path]


class Worker:
    """The queue worker (see the module docstring). :meth:`tick` is one round; :meth:`run` takes the lock and
    goes round until idle.

    Args:
        queue_dir: the queue directory. spools: where the nodes' spools (and their ``runs/``) are readable.
        wait: seconds each run may take, from when the worker first sees its entry.
        idle: seconds of an empty queue after which :meth:`run` returns.
        poll: seconds between rounds.
        sacct, show_job, sacctmgr, release: as :func:`~slurm_gpushare.accounting.sacct.write_final_summary`
            (the defaults run Slurm's commands).
        clock, sleep: monotonic seconds and the pause (injected by tests).
        log: where a line for each failed or expired run goes (default stderr).
    """

    def __init__(self, queue_dir: str | Path, spools: Sequence[str | Path], *, wait: float = 120.0,
                 idle: float = 60.0, poll: float = 1.0, sacct: Callable[[list[str]], str] | None = None,
                 show_job: Callable[[str], str] | None = None, sacctmgr: Callable[[str, str], str] | None = None,
                 release: Release | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, log: Callable[[str], None] | None = None) -> None:
        from slurm_gpushare.slurm import commands

        self.queue_dir, self.spools = Path(queue_dir), list(spools)
        self.wait, self.idle, self.poll = wait, idle, poll
        self.sacct = sacct or (lambda args: commands.sacct_jobs(args))
        self.show_job, self.sacctmgr, self.release = show_job, sacctmgr, release
        self.clock, self.sleep = clock, sleep
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.carried: dict[Path, _Carried] = {}
        self.written: list[str] = []  # job ids whose segment was written, in order (for tests and the log)

    def _take(self, path: Path) -> None:
        try:
            job = read_entry(path)
        except (OSError, GpushareError) as e:
            self.log(f"slurm-gpushare sacct-worker: queue entry {path.name}: {e}: dropped")
            with contextlib.suppress(OSError):
                path.unlink()
            return
        marks = {n: p for spool in self.spools for n, p in run_marks(spool, job.job_id, job.restart).items()}
        if marks:  # the nodes whose Prologs saw GPUs of this run: their records only are waited for
            job = replace(job, nodes=tuple(n for n in job.nodes if n in marks) or tuple(sorted(marks)))
        run = FinalRun(job, self.spools, wait=self.wait, sacct=self.sacct, show_job=self.show_job,
                       sacctmgr=self.sacctmgr, clock=self.clock, release=self.release)
        self.carried[path] = _Carried(run, marks)

    def _done(self, path: Path, problem: str | None) -> None:
        carried = self.carried.pop(path)
        job = carried.run.job
        if problem is not None:
            self.log(f"slurm-gpushare sacct-worker: job {job.job_id} run {job.restart}: {problem}")
        elif carried.run.result is not None:
            self.written.append(job.job_id)
        for p in [path, *carried.marks.values()]:
            with contextlib.suppress(OSError):  # SlurmUser may not remove root's marks: the nodes prune them
                p.unlink()

    def tick(self) -> int:
        """One round: take on new entries, step every run carried (one ``sacct`` for all those waiting for their
        end records), drop the finished, failed and expired ones. Returns how many runs are still carried."""
        for path in entries(self.queue_dir):
            if path not in self.carried:
                self._take(path)
        waiting = [c.run for c in self.carried.values() if c.run.phase == "dbd"]
        rows = None
        if waiting:
            try:
                rows = parse_sacct(self.sacct(["-j", ",".join(sorted({r.job.job_id for r in waiting}))]))
            except GpushareError as e:
                self.log(f"slurm-gpushare sacct-worker: sacct: {e}")
        for path, carried in list(self.carried.items()):
            run = carried.run
            if run.phase == "dbd" and rows is None and self.clock() < run.deadline:
                continue  # sacct failed this round (slurmdbd down?): try again next round
            try:
                finished = run.step(rows if run.phase == "dbd" else None)
            except GpushareError as e:
                self._done(path, str(e))
                continue
            if finished:
                self._done(path, None)
        return len(self.carried)

    def run(self, lock_fd: int | None = None) -> int:
        """Take the queue's lock and go round until the queue has been empty ``idle`` seconds (or is gone).
        Returns 0, also at once when another worker holds the lock.

        Args:
            lock_fd: an open descriptor of the lock file on which the caller already holds the lock (the
                wrapper's ``flock -n 9``, so that of two wrappers ending at once only one starts Python); it is
                closed on the way out.

        Raises:
            OSError: the lock file cannot be opened.
        """
        lock_path = self.queue_dir / LOCK_NAME
        fd = lock_fd
        while True:
            if fd is None:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    return 0  # another worker carries the queue
            try:
                self._rounds()
            finally:
                os.close(fd)  # lets go of the lock
                fd = None
            # an entry queued after the last round, whose wrapper saw the lock still held, is ours again
            if not self.queue_dir.is_dir() or not entries(self.queue_dir):
                return 0

    def _rounds(self) -> None:
        empty_since = self.clock()
        while self.queue_dir.is_dir():
            if self.tick() or entries(self.queue_dir):
                empty_since = self.clock()
            elif self.clock() - empty_since >= self.idle:
                return
            self.sleep(self.poll)
