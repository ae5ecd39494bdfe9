"""Slurm commands the product runs (``sinfo``, ``scontrol``, ``squeue``, ``sacct``, ``sacctmgr``), in one place,
with timeouts.

Every function returns the command's text (or, for a plain list of job ids, the ids; the ``update``
commands return nothing); each docstring names the command and its man page. Parsing is
done by the pure modules (:mod:`slurm_gpushare.submit.inventory`, :mod:`slurm_gpushare.slurm.job`).
pyslurm is not used: it must match the site's Slurm release exactly, and the command-line clients
always do.
"""

from __future__ import annotations

import functools
import os
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path

from slurm_gpushare.atomicfile import read_own_file, write_atomic
from slurm_gpushare.errors import SlurmError
from slurm_gpushare.retry import retry
from slurm_gpushare.slurm.release import SCONTROL_JSON, SUPPORTED, Release

TIMEOUT_S = 30.0
#: Timeout of the node monitor's calls (listpids, AdminComment): it samples every few seconds.
MONITOR_TIMEOUT_S = 10.0


def run(argv: list[str], *, timeout: float = TIMEOUT_S, env: dict[str, str] | None = None) -> str:
    """Run a Slurm client and return its stdout.

    Raises:
        SlurmError: the program is missing, timed out, or exited non-zero (its stderr is quoted, or its stdout when
            stderr is empty; on one line, at most 300 characters).
    """
    try:
        # user-written fields (JobName, Comment, ...) may hold any bytes: decoding never raises
        proc = subprocess.run(argv, capture_output=True, text=True, encoding="utf-8", errors="replace",
                              timeout=timeout, env=env if env is not None else os.environ.copy())
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found", hint="install the Slurm client tools (slurm-client)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv)} did not answer within {timeout:.0f} s",
                         hint="is slurmctld up? (scontrol ping)") from None
    if proc.returncode != 0:
        # scontrol prints some refusals on stdout ("Node x not found", exit 1): quoted when stderr says nothing
        said = " ".join((proc.stderr.strip() or proc.stdout.strip()).split())
        raise SlurmError(f"{' '.join(argv)} exited {proc.returncode}: {said[:300]}")
    return proc.stdout


def sinfo_json(**kw) -> str:
    """``sinfo --json`` (sinfo(1)): every node with its configured ``gres``, partitions and state (Slurm 22.05+)."""
    return run(["sinfo", "--json"], **kw)


def partitions_text(**kw) -> str:
    """``scontrol -o show partition`` (scontrol(1)): one line per partition (``Nodes=``, ``Default=``)."""
    return run(["scontrol", "-o", "show", "partition"], **kw)


def show_job(job_id: str | int, **kw) -> str:
    """``scontrol -d show job ID`` (scontrol(1)): the multi-line record, free-text fields (AdminComment) on lines of
    their own, and the per-node GRES detail (``Nodes=... GRES=shard:10(IDX:0)``)."""
    return run(["scontrol", "-d", "show", "job", str(job_id)], **kw)


def job_record(job_id: str | int, *, release: Release | None = None, **kw) -> str:
    """The job's record as structured text that no user-written field can steer, for
    :func:`slurm_gpushare.slurm.job.parse_job_json` (which reads it in the shape its ``meta`` names).

    * Slurm 23.02 and later: ``scontrol -d show job ID --json`` (scontrol(1); ``--json`` first in
      src/scontrol/scontrol.c at slurm-23-02-0-1): the job alone, or every task for an array's own id (the
      parser picks ``job_id``). An unknown id prints an empty ``jobs`` list and exits 0 (measured on 24.11.5).
      ``-d`` (``SHOW_DETAIL``, src/scontrol/info_job.c) adds ``job_resources``: the cores the job holds.
    * Slurm 22.05: ``squeue --json`` (squeue(1); openapi/v0.0.38): ``scontrol`` has no ``--json`` and
      ``squeue --json`` ignores ``-j`` (measured on 22.05.8), so the whole job table comes back; it loads
      with ``SHOW_DETAIL`` (src/plugins/openapi/v0.0.38/jobs.c), so ``job_resources`` is there.

    Text output cannot serve: ``scontrol -d show job`` embeds JobName, Comment, WorkDir, StdOut verbatim
    (newlines included), and ``squeue -O`` has no AdminComment field on 22.05 (``Invalid job format
    specification: AdminComment``, measured).

    Args:
        release: the Slurm release of the clients (default: :func:`local_release`).

    Raises:
        SlurmError: the command failed, or ``sinfo -V`` did not give the release.
    """
    if (release or local_release()) >= SCONTROL_JSON:
        return run(["scontrol", "-d", "show", "job", str(job_id), "--json"], **kw)
    return run(["squeue", "--json"], **kw)  # 22.05: the table holds every job; the parser picks the job


def cancel_job(job_id: str | int, **kw) -> None:
    """``scancel JOBID`` (scancel(1); root): end one job whose GPU share cannot be prepared, without draining the
    node (a Prolog that exits non-zero drains it: slurm.conf(5) Prolog).

    Raises:
        SlurmError: scancel failed.
    """
    run(["scancel", str(job_id)], **kw)


def requeue_job(job_id: str | int, **kw) -> None:
    """``scontrol requeue JOBID`` (scontrol(1); root): put a job that cannot run here yet back in the queue;
    slurmctld makes it wait before it is eligible again (``Reason=BeginTime``, measured on 22.05.8).

    Raises:
        SlurmError: scontrol failed (e.g. a job submitted with ``--no-requeue``).
    """
    run(["scontrol", "requeue", str(job_id)], **kw)


def running_jobs(node: str, **kw) -> list[str]:
    """Jobs with an allocation on ``node``, sorted, each once:
    ``squeue -h -w NODE -t RUNNING,COMPLETING,CONFIGURING -o %A`` (squeue(1); COMPLETING so that a job stays
    known while its Epilog runs).

    Raises:
        SlurmError: squeue failed.
    """
    out = run(["squeue", "-h", "-w", node, "-t", "RUNNING,COMPLETING,CONFIGURING", "-o", "%A"], **kw)
    return sorted(set(out.split()))


def running_job_owners(node: str, **kw) -> dict[str, int]:
    """The jobs with an allocation on ``node`` and their owners' uids:
    ``squeue -h -w NODE -t RUNNING,COMPLETING,CONFIGURING -o "%A %U"`` (squeue(1): ``%U`` is the job's user
    id, written by slurmctld). Rows that are not two numbers are skipped.

    Raises:
        SlurmError: squeue failed.
    """
    out = run(["squeue", "-h", "-w", node, "-t", "RUNNING,COMPLETING,CONFIGURING", "-o", "%A %U"], **kw)
    owners: dict[str, int] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            owners[parts[0]] = int(parts[1])
    return owners


def show_node(node: str, **kw) -> str:
    """``scontrol -d show node NODE`` (scontrol(1)): its GRES, and which device indices are in use
    (``GresUsed=...(IDX:..)``)."""
    return run(["scontrol", "-d", "show", "node", node], **kw)


def listpids(node: str, *, timeout: float = MONITOR_TIMEOUT_S) -> str:
    """``scontrol listpids '*' NODE`` (scontrol(1) "listpids"): the pids each slurmstepd of this node
    tracks. The node name is needed where several slurmd share a host: without it scontrol takes the
    first node of this host in slurm.conf. A node without job steps is an empty list (scontrol exits 1
    with "No job steps exist on this node."); a step that ends during the call makes scontrol fail
    ("StepId=... does not exist on this node."): it is asked again, up to three times.

    Raises:
        SlurmError: scontrol failed.
    """
    def once() -> str:
        try:
            return run(["scontrol", "listpids", "*", node], timeout=timeout)
        except SlurmError as e:
            if "No job steps exist on this node" in e.message:  # scontrol exits 1 for an empty list
                return ""
            raise

    # a step that ended while scontrol walked the node's steps ("StepId=16.batch does not exist on this
    # node."): ask again at once
    return retry(once, waits=(0, 0),
                 again=lambda e: isinstance(e, SlurmError) and "does not exist on this node" in e.message)


def update_admin_comment(job_id: str, text: str, *, timeout: float = MONITOR_TIMEOUT_S) -> None:
    """``scontrol update jobid=ID AdminComment=TEXT`` (scontrol(1) "update"; root; refused once the
    job has ended).

    Raises:
        SlurmError: scontrol failed (``Job has already finished``, not root, ...).
    """
    run(["scontrol", "update", f"jobid={job_id}", f"AdminComment={text}"], timeout=timeout)


def drain_node(node: str, reason: str, **kw) -> None:
    """``scontrol update nodename=NODE state=drain reason=REASON`` (scontrol(1) "update"; root):
    slurmctld starts no new job on the node and shows ``reason`` (``sinfo -R``).

    Raises:
        SlurmError: scontrol failed.
    """
    run(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"], **kw)


#: The ``sacct`` fields :func:`sacct_jobs` asks for, in this order: AdminComment last, so that a ``|`` in it
#: cannot shift the other columns (sacct -P separates with ``|`` and quotes nothing).
SACCT_FIELDS = ("JobIDRaw", "JobID", "User", "Account", "Partition", "State", "ExitCode", "Start", "End",
                "Elapsed", "AllocTRES", "AdminComment")


def sacct_jobs(args: list[str] | tuple[str, ...] = (), **kw) -> str:
    """``sacct -X -D -n -P -o JobIDRaw,...,AdminComment ARGS`` with ``SLURM_TIME_FORMAT=%s`` (sacct(1)): one
    line per job allocation and run, fields of :data:`SACCT_FIELDS` separated by ``|``, times in epoch
    seconds. ``-X`` keeps to the allocation's own row: a step row has no AdminComment of its own, and
    sacct 22.05 may print the job's user-written Comment in that column of the ``.batch`` row (measured
    on the dev cluster). ``-D`` lists each run of a requeued job. ``args`` are the caller's selection
    (``-S``, ``-E``, ``-u``, ``-A``, ``-j``, ...).

    Raises:
        SlurmError: sacct failed (no slurmdbd: ``AccountingStorageType`` is not ``accounting_storage/slurmdbd``).
    """
    env = {**os.environ, "SLURM_TIME_FORMAT": "%s"}
    return run(["sacct", "-X", "-D", "-n", "-P", "-o", ",".join(SACCT_FIELDS), *args], env=env, **kw)


#: The fields of :func:`sacct_job_header`, in its output's order (sacct(1) "JOB ACCOUNTING FIELDS"): none a user
#: writes, so each run is one line.
SACCT_HEADER_FIELDS = ("JobIDRaw", "Start", "State", "NNodes", "NCPUS", "AllocTRES", "QOS", "Partition", "ElapsedRaw",
                       "TimelimitRaw", "UID")


def _sacct_runs(job_id: str, fields: Sequence[str], **kw) -> str:
    env = {**os.environ, "SLURM_TIME_FORMAT": "%s"}
    return run(["sacct", "-X", "-D", "-n", "-P", "-j", job_id, "-o", ",".join(fields)], env=env, **kw)


def sacct_job_header(job_id: str, **kw) -> str:
    """``sacct -X -D -n -P -j JOB -o JobIDRaw,Start,...`` with ``SLURM_TIME_FORMAT=%s``: what jobstats' header
    shows of each run of the job (:data:`SACCT_HEADER_FIELDS`; ``ElapsedRaw`` in seconds, ``TimelimitRaw`` in
    minutes).

    Raises:
        SlurmError: sacct failed (no slurmdbd).
    """
    return _sacct_runs(job_id, SACCT_HEADER_FIELDS, **kw)


def sacct_job_names(job_id: str, **kw) -> str:
    """``sacct -X -D -n -P -j JOB -o JobIDRaw,Start,JobName`` (``SLURM_TIME_FORMAT=%s``): each run's name, the
    user's own text, which sacct prints as written: a ``|`` or a newline in it stays in it, so a name may span lines
    that look like rows. Apart from :func:`sacct_job_header`, whose rows it cannot then forge.

    Raises:
        SlurmError: sacct failed (no slurmdbd).
    """
    return _sacct_runs(job_id, ("JobIDRaw", "Start", "JobName"), **kw)


def sacctmgr_admin_comment(job: str, text: str, **kw) -> str:
    """``sacctmgr -i modify job where jobid=JOB set AdminComment=TEXT`` (sacctmgr(1) "modify job";
    src/sacctmgr/job_functions.c at slurm-22-05-8-1, 24-11-5-1 and 26-05-3-1 all take AdminComment): sets
    the stored job's AdminComment in slurmdbd, also after the job ended, which ``scontrol update`` refuses
    (src/slurmctld/job_mgr.c: ``IS_JOB_FINISHED`` -> ``ESLURM_JOB_FINISHED`` on all three). slurmdbd allows
    it to an Operator or Administrator only (as_mysql_modify_job: ``ESLURM_ACCESS_DENIED`` otherwise; root
    and SlurmUser always are). ``job`` is a job id, or ``<array id>_<task>`` for an array task whose own id
    is the array's (``jobid=<array id>`` would name every task). Before Slurm 23.02 sacctmgr stores the text
    lowercased (:data:`~slurm_gpushare.slurm.release.SACCTMGR_KEEPS_CASE`). Returns sacctmgr's output.

    Raises:
        SlurmError: sacctmgr failed (not allowed, no slurmdbd).
    """
    return run(["sacctmgr", "-i", "modify", "job", "where", f"jobid={job}", "set", f"AdminComment={text}"], **kw)


def sacct_uids(job_id: str, **kw) -> str:
    """``sacct -X -n -P -o JobIDRaw,UID -j JOBID`` (sacct(1)): the uid slurmdbd recorded for the most recent job
    of that id (``id_user`` of its row: slurmctld's, never the user's to write; without ``-D`` sacct gives
    one row per id, the latest submitted, where an id was used again after slurmctld's state was lost),
    ``ID|UID``; empty when slurmdbd does not know the job.

    Raises:
        SlurmError: sacct failed (no slurmdbd).
    """
    return run(["sacct", "-X", "-n", "-P", "-o", "JobIDRaw,UID", "-j", str(job_id)], **kw)


def show_config(**kw) -> str:
    """``scontrol show config`` (scontrol(1)): ``Key = value`` lines, ``SlurmUserId = slurm(64030)`` among them.

    Raises:
        SlurmError: scontrol failed (slurmctld down).
    """
    return run(["scontrol", "show", "config"], **kw)


def admin_level(user: str, **kw) -> str:
    """``sacctmgr -n -P show user USER format=AdminLevel`` (sacctmgr(1)): ``None``, ``Operator`` or
    ``Administrator`` as slurmdbd holds it (only an Administrator may change it); empty for a user slurmdbd
    does not know.

    Raises:
        SlurmError: sacctmgr failed (no slurmdbd).
    """
    return run(["sacctmgr", "-n", "-P", "show", "user", user, "format=AdminLevel"], **kw)


def resume_node(node: str, **kw) -> None:
    """``scontrol update nodename=NODE state=resume`` (scontrol(1) "update"; root): the drain is lifted.

    Raises:
        SlurmError: scontrol failed.
    """
    run(["scontrol", "update", f"nodename={node}", "state=resume"], **kw)


def reconfigure(**kw) -> None:
    """``scontrol reconfigure`` (scontrol(1); root): slurmctld and the slurmd re-read slurm.conf and gres.conf.

    Raises:
        SlurmError: scontrol failed.
    """
    run(["scontrol", "reconfigure"], **kw)


def site_command(command: str, node: str, option: str, *, timeout: float = 120) -> None:
    """Run a site's command for a Slurm daemon (``mig apply --stop-slurmd 'systemctl stop slurmd'``, run on the
    node; ``{node}`` in it is replaced by ``node``), split as a shell would (``shlex``) but run without one,
    its stdin empty.

    Raises:
        SlurmError: it could not run, took more than ``timeout`` seconds or exited non-zero (the message has
            its output; the hint names ``option``, where the site gives the command).
    """
    argv = [a.replace("{node}", node) for a in shlex.split(command)]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmError(f"{' '.join(argv)} failed: {e}", hint=f"give the site's command with {option}") from None
    if p.returncode != 0:
        said = " ".join((p.stderr.strip() or p.stdout.strip()).split())
        raise SlurmError(f"{' '.join(argv)} exited {p.returncode}: {said[:300]}",
                         hint=f"give the site's command with {option}")


# --- the release of the local Slurm (sinfo -V, slurmd -V) -----------------------------------------------


@functools.lru_cache(maxsize=1)
def local_release() -> Release:
    """The release of the Slurm clients on PATH (``sinfo -V``), once per process.

    Raises:
        SlurmError: sinfo is missing, failed, or printed no version.
    """
    return Release.parse(run(["sinfo", "-V"]))


def cached_local_release(cache: Path) -> Release:
    """:func:`local_release`, remembered in the file ``cache`` (a node hook's run dir: root's) for as long
    as the ``sinfo`` found on PATH is the same file (path, inode, size, mtime): a Prolog that needs the
    release to choose its job-record command then runs no ``sinfo -V``. A Slurm upgrade replaces the
    binary, so the next hook asks again. A cache that cannot be read or written is no error, nor one that is
    not a small regular file (a FIFO or a link there is never opened for reading: it could block the hook).

    Raises:
        SlurmError: as :func:`local_release`, when the cache does not answer.
    """
    import shutil

    found = shutil.which("sinfo")
    try:
        st = os.stat(found) if found else None
    except OSError:
        st = None
    if st is None:
        return local_release()
    key = f"{found} {st.st_ino} {st.st_size} {st.st_mtime_ns}"
    try:
        line = read_own_file(cache, max_bytes=4096).decode("utf-8", errors="replace")  # never a FIFO or link
        k, _, value = line.partition("\n")
        if k == key:
            return Release.parse(value)
    except (OSError, SlurmError):
        pass
    release = local_release()
    try:
        write_atomic(cache, f"{key}\n{release}\n", mode=0o644, fsync=False)
    except OSError:
        pass
    return release


def node_release() -> Release:
    """The release of this node's slurmd (``slurmd -V``), else of the clients (``sinfo -V``): the
    release that will read the gres.conf written or checked here.

    Raises:
        SlurmError: neither slurmd nor sinfo is installed or prints a version (the message says to
            name the release instead).
    """
    errors = []
    for argv in (["slurmd", "-V"], ["sinfo", "-V"]):
        try:
            return Release.parse(run(argv))
        except SlurmError as e:
            errors.append(e.message)
    raise SlurmError(f"cannot tell the Slurm release: {'; '.join(errors)}",
                     hint=f"give --slurm-version, one of {', '.join(map(str, SUPPORTED))}")
