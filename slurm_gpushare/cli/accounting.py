"""``accounting ingest`` (node spools -> the SQLite store), ``accounting sacct-summary`` (the job's usage segment
into slurmdbd's AdminComment, from EpilogSlurmctld) and ``report`` (reserved vs used, waste; from the store or,
``--from-sacct``, from sacct alone)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import click

from slurm_gpushare.cli import main
from slurm_gpushare.cli.service import DEFAULT_MACHINES, DEFAULT_POLICY
from slurm_gpushare.errors import InputError

_GROUP_CHOICES = ["user", "account", "partition", "model", "mode", "node", "day", "month", "job"]
_DB_HELP = ("the accounting database: an SQLite file or a postgresql:// URL (default: $GPUSHARE_ACCOUNTING_DB, "
            "else /var/lib/slurm-gpushare/accounting.db)")


@main.group()
def accounting() -> None:
    """Per-job GPU usage records: load the nodes' spools into the accounting database.

    The Epilog appends one record per job and GPU to the node's spool
    (/var/spool/slurm-gpushare/accounting); 'accounting ingest' loads spools into an SQLite file
    or a PostgreSQL database (--db postgresql://...) that 'slurm-gpushare report' reads. See docs/accounting.md.
    """


@accounting.command()
@click.option("--spool", "spools", multiple=True, metavar="DIR|FILE",
              help="spool directory or file to load; repeatable (default /var/spool/slurm-gpushare/accounting)")
@click.option("--db", "db_path", help=_DB_HELP)
def ingest(spools, db_path):
    """Load spool files into the accounting database; safe to repeat and to interrupt.

    Records already stored are not added again; a killed run loses and doubles nothing when run again.
    Lines that are not valid records (corrupt, a fragment left by a crash, a newer format) are skipped
    with a warning naming file and line, and counted. A last line without its newline yet (a spool
    being copied) is left for the next run. Exit status 0 also when lines were skipped.
    """
    from slurm_gpushare.accounting.spool import DEFAULT_SPOOL_DIR
    from slurm_gpushare.accounting.store import Store, default_db

    def warn(skipped) -> None:
        click.echo(f"slurm-gpushare: warning: {skipped}", err=True)

    sources = list(spools) or [DEFAULT_SPOOL_DIR]
    for src in sources:  # before the database is created: a typo must not leave an empty database behind
        if not Path(src).exists():
            raise InputError(f"spool directory or file {src} does not exist",
                             hint=f"the Epilog writes to {DEFAULT_SPOOL_DIR} unless spool_dir in node.toml says "
                                  "otherwise")
    with Store(db_path or default_db(), create=True) as store:
        result = store.ingest(sources, on_skip=warn)
        total = store.count()
    for line in result.incomplete:
        click.echo(f"slurm-gpushare: note: {line}", err=True)
    click.echo(f"ingested {result.ingested} record(s) from {result.files} file(s); "
               f"{result.duplicates} already stored; {len(result.skipped)} line(s) skipped; "
               f"{total} record(s) in {store.where}")


@accounting.command("sacct-summary")
@click.argument("job_id", required=False)
@click.option("--spool", "spools", multiple=True, metavar="DIR|FILE",
              help="where the nodes' spools are readable here; repeatable "
                   "(default /var/spool/slurm-gpushare/accounting)")
@click.option("--wait", "wait", type=click.FloatRange(min=0), default=120.0, show_default=True,
              help="seconds to wait for the nodes' records and for slurmdbd's end record of the job")
def sacct_summary(job_id, spools, wait):
    """Write the job's usage segment ([gpushare:u1 ...]) into its AdminComment in slurmdbd.

    Run by EpilogSlurmctld (as SlurmUser; the job from SLURM_JOB_ID, SLURM_JOB_RESTART_COUNT and
    SLURM_JOB_NODELIST), after any tool that replaces the whole field (jobstats): see the wrapper
    epilog_slurmctld.sh. The segment comes from the job's accounting records in the spools; other
    tools' text in AdminComment (jobstats' JS1:) is kept. Prints what was written.
    """
    import contextlib
    import os
    from dataclasses import replace

    from slurm_gpushare.accounting.sacct import FinalJob, write_final_summary
    from slurm_gpushare.accounting.spool import DEFAULT_SPOOL_DIR, run_marks

    spools = list(spools) or [DEFAULT_SPOOL_DIR]
    job = FinalJob.from_env(dict(os.environ), job_id)
    marks = {n: p for spool in spools for n, p in run_marks(spool, job.job_id, job.restart).items()}
    if marks:  # the nodes whose Prologs saw GPUs of this run: their records only are waited for
        job = replace(job, nodes=tuple(n for n in job.nodes if n in marks) or tuple(sorted(marks)))
    text = write_final_summary(job, spools, wait=wait)
    for mark in marks.values():
        with contextlib.suppress(OSError):  # SlurmUser may not remove root's marks: left behind
            mark.unlink()
    if text is None:
        click.echo(f"job {job.job_id}: no accounting records of run {job.restart} in the spools: nothing written")
    else:
        click.echo(f"job {job.job_id}: AdminComment={text}")


@accounting.command("sacct-worker")
@click.option("--queue", "queue_dir", metavar="DIR", default=None,
              help="the queue epilog_slurmctld.sh writes (default /var/spool/slurm-gpushare/sacct-queue)")
@click.option("--spool", "spools", multiple=True, metavar="DIR|FILE",
              help="where the nodes' spools are readable here; repeatable "
                   "(default /var/spool/slurm-gpushare/accounting)")
@click.option("--wait", "wait", type=click.FloatRange(min=0), default=120.0, show_default=True,
              help="seconds each queued run may take: the nodes' records, then slurmdbd's end record")
@click.option("--idle", "idle", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="exit after the queue has been empty this many seconds")
@click.option("--lock-fd", "lock_fd", type=click.IntRange(min=3), default=None,
              help="an open descriptor on which the caller holds QUEUE/worker.lock (epilog_slurmctld.sh's flock -n)")
@click.option("--detach", is_flag=True,
              help="fork once started and let the caller go on (epilog_slurmctld.sh, after setsid)")
def sacct_worker(queue_dir, spools, wait, idle, lock_fd, detach):
    """Write the usage segments of every run queued by epilog_slurmctld.sh, then exit when idle.

    One worker per queue (it holds QUEUE/worker.lock; a second one exits at once). The wrapper takes
    the lock (flock -n) and starts it, detached, holding it (--lock-fd). Failed and expired runs are
    logged on stderr (the wrapper sends it to QUEUE/worker.log). See docs/accounting.md.
    """
    from slurm_gpushare.accounting.sacctqueue import DEFAULT_QUEUE_DIR, Worker
    from slurm_gpushare.accounting.spool import DEFAULT_SPOOL_DIR

    queue = Path(queue_dir or DEFAULT_QUEUE_DIR)
    if not queue.is_dir():
        raise InputError(f"queue directory {queue} does not exist", hint="epilog_slurmctld.sh makes it (QUEUE=)")
    if detach and os.fork():
        os._exit(0)  # the caller waited only for the start: the worker is already in its own session
    Worker(queue, list(spools) or [DEFAULT_SPOOL_DIR], wait=wait, idle=idle).run(lock_fd)


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--db", "db_path", help=_DB_HELP)
@click.option("--by", "by", type=click.Choice(_GROUP_CHOICES), default=None,
              help="group rows by this (default user; job: one row per job, asked vs peak memory)")
@click.option("--since", help="start of the period: 2026-11-01, 2026-11-01T08:00, @EPOCH, now-30days")
@click.option("--until", help="end of the period (same forms; default: no end)")
@click.option("--user", "users", multiple=True, metavar="USER", help="only this user's jobs; repeatable")
@click.option("--account", "accounts", multiple=True, metavar="ACCOUNT", help="only this account's jobs; repeatable")
@click.option("--job", "jobs", multiple=True, metavar="JOBID",
              help="only this job (an array's id: all its tasks); repeatable")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
              show_default=True, help="output format")
@click.option("--waste", is_flag=True,
              help="list the jobs that used at most half the memory they asked for, with the request that fits: "
                   "jobstats' suggestion (the peak plus the site policy's headroom, rounded to what the GPUs and "
                   "MIG profiles offer)")
@click.option("--limit", type=click.IntRange(min=0), default=None, metavar="N",
              help="--waste: list the N jobs that wasted most (default 100; 0: all of them)")
@click.option("--policy", "policy_path", type=click.Path(dir_okay=False),
              help="site policy TOML for --waste's headroom and rounding (default: "
                   f"{DEFAULT_POLICY} where readable, else built-in defaults)")
@click.option("--machines", "machines_dir", default=DEFAULT_MACHINES, show_default=True,
              help="machine descriptions for --waste: the GPU models' memory and MIG profiles it rounds to")
@click.option("--plot", "plot_path", metavar="FILE.png|FILE.html",
              help="draw GPU-hours reserved vs used per user (--by account: per account), the jobs' memory "
                   "efficiency and reserved and used memory over time into FILE instead of printing a table")
@click.option("--from-sacct", "from_sacct", is_flag=True,
              help="read the jobs from sacct (their AdminComment usage segments) instead of the database; "
                   "the remaining arguments go to sacct (-S, -E, -u, -A, -r, -j ...)")
@click.argument("sacct_args", nargs=-1, type=click.UNPROCESSED)
def report(db_path, by, since, until, users, accounts, jobs, fmt, waste, limit, policy_path, machines_dir, plot_path,
           from_sacct, sacct_args):
    """Reserved vs used GPU-hours and GPU memory, per user, account, partition, model, mode or job.

    Utilization of a job on several GPUs is their average, never a sum; MIG devices and GPUs
    without utilization data count as "no data", never 0%. Durations are clipped to the period.
    See docs/accounting.md for every column.

    --user, --account and --job keep to those jobs (each repeatable; several values of one are any
    of them, different options all of them).

    --plot FILE.png or FILE.html draws the same records as pictures (matplotlib, the package's plot
    extra; the HTML page embeds the PNG): GPU-hours reserved vs used per user or account, a histogram of the jobs'
    peak memory over what they asked for, and reserved and used GPU memory over time per GPU model
    and mode.

    --from-sacct builds the same report from 'sacct' alone: each job's [gpushare:u1 ...] AdminComment
    segment (written after the job by 'accounting sacct-summary') with sacct's user, account and
    partition. Arguments after the options select jobs as sacct does (default: --since as -S, --until
    as -E; sacct's own default is since midnight; --user, --account and --job as -u, -A and -j).
    """
    from slurm_gpushare.accounting.report import (
        WASTE_LIMIT,
        Filters,
        job_report,
        parse_time,
        render,
        usage_report,
        waste_report,
    )
    from slurm_gpushare.accounting.store import Store, default_db

    if waste and by not in (None, "job"):
        raise click.UsageError(f"--waste lists jobs; --by {by} does not apply to it (use 'report --by {by}' "
                               "for the usage per group)")
    if limit is not None and not waste:
        raise click.UsageError("--limit applies to --waste's list of jobs: add --waste, or drop --limit")
    if plot_path and (waste or by not in (None, "user", "account")):
        raise click.UsageError("--plot draws per user or per account: give --by user or --by account, without "
                               "--waste")
    if plot_path and fmt != "table":
        raise click.UsageError("--plot writes a picture: drop --format")
    if plot_path == "":
        raise click.UsageError("--plot '' names no file: give FILE.png or FILE.html")
    for option, values in (("--user", users), ("--account", accounts)):
        if any(not v.strip() for v in values):
            raise click.UsageError(f"{option} '' names no one: give a name (repeat {option} for several)")
    if plot_path:
        _plot_module().check_suffix(plot_path)  # before sacct is read or the figure drawn
    for job in jobs:
        if _job_id(job) is None:
            raise click.UsageError(f"--job {job!r} is not a job id (digits: the job's own id, or an array's)")
    jobs = tuple(_job_id(job) for job in jobs)
    by = by or "user"
    start = parse_time(since, what="--since") if since else None
    end = parse_time(until, what="--until") if until else None
    if sacct_args and not from_sacct:
        raise click.UsageError(f"unexpected argument {sacct_args[0]!r} (sacct options need --from-sacct)")
    if from_sacct and db_path:
        raise click.UsageError("--from-sacct reads sacct, not a database: drop --db")
    filters = Filters(tuple(users), tuple(accounts), tuple(jobs))
    if from_sacct:
        store = _store_from_sacct(list(sacct_args), since, until, filters)
    else:
        store = Store(db_path or default_db(), create=False)
    with store:
        if plot_path:
            plot = _plot_module()
            written = plot.write(plot.figure(store, by=by, since=start, until=end, filters=filters), plot_path)
            click.echo(f"wrote {written}")
            return
        if waste:
            rep = waste_report(store, since=start, until=end, filters=filters,
                               rule=_rule(_policy(policy_path), machines_dir),
                               limit=WASTE_LIMIT if limit is None else limit)
        elif by == "job":
            rep = job_report(store, since=start, until=end, filters=filters)
        else:
            rep = usage_report(store, by=by, since=start, until=end, filters=filters)
    click.echo(render(rep, fmt), nl=False)


#: sacct options that change the shape of its output (sacct(1)): --from-sacct sets the fields and the format.
_SACCT_SHAPING = frozenset({"-o", "--format", "-p", "--parsable", "-P", "--parsable2", "--json", "--yaml", "-l",
                            "--long", "-b", "--brief", "-X", "--allocations", "-D", "--duplicates", "-n",
                            "--noheader", "-e", "--helpformat", "--delimiter", "--usage"})


def _store_from_sacct(args: list[str], since: str | None, until: str | None, filters=None):
    """An in-memory store of the records that sacct's rows describe (``report --from-sacct``)."""
    from slurm_gpushare.accounting.sacct import latest_jobs, parse_sacct, records_from_sacct
    from slurm_gpushare.accounting.store import Store
    from slurm_gpushare.slurm import commands

    flags = {a.split("=", 1)[0] for a in args}
    by_job = bool(flags & {"-j", "--jobs"} or (filters is not None and filters.jobs))
    shaping = sorted(flags & _SACCT_SHAPING)
    if shaping:
        raise click.UsageError(f"sacct option {shaping[0]} changes sacct's output, which --from-sacct reads itself: "
                               "give only options that select jobs (-S, -E, -u, -A, -r, -j, -s ...)")
    if since and not flags & {"-S", "--starttime"}:
        args += ["-S", _sacct_time(since, "--since")]
    if until and not flags & {"-E", "--endtime"}:
        args += ["-E", _sacct_time(until, "--until")]
    # the filters select in sacct too (fewer rows to read); the report applies them again either way
    if filters is not None:
        if filters.users and not flags & {"-u", "--uid", "--user"}:
            args += ["-u", ",".join(filters.users)]
        if filters.accounts and not flags & {"-A", "--accounts"}:
            args += ["-A", ",".join(filters.accounts)]
        if filters.jobs and not flags & {"-j", "--jobs"}:
            args += ["-j", ",".join(filters.jobs)]
    rows = parse_sacct(commands.sacct_jobs(args))
    # jobs named by id: the most recent job of each id, as sacct -j shows without -D (with its requeued runs)
    store = Store(":memory:")
    store.add(records_from_sacct(latest_jobs(rows) if by_job else rows))
    return store


def _sacct_time(text: str, what: str) -> str:
    """A report time as sacct -S/-E takes it (local ``YYYY-MM-DDTHH:MM:SS``)."""
    import time

    from slurm_gpushare.accounting.report import parse_time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(parse_time(text, what=what)))


@main.command()
@click.argument("job_id")
@click.option("--db", "db_path", help=_DB_HELP + "; read where this user may read it, else sacct")
@click.option("--from-sacct", "from_sacct", is_flag=True,
              help="read the job's AdminComment usage segment in sacct even where the database is readable")
@click.option("--policy", "policy_path", type=click.Path(dir_okay=False),
              help="site policy TOML for the suggestion's headroom and rounding (default: "
                   f"{DEFAULT_POLICY} where readable, else built-in defaults)")
@click.option("--machines", "machines_dir", default=DEFAULT_MACHINES, show_default=True,
              help="machine descriptions: the GPU models' memory and MIG profiles the suggestion rounds to "
                   "(where not readable: what the job's own records say)")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="output format")
def jobstats(job_id, db_path, from_sacct, policy_path, machines_dir, fmt):
    """One job's GPU usage: per GPU what it asked for, was granted, peaked at and used, and the request to
    make next time (peak plus the site's headroom, rounded to what its GPUs and MIG profiles offer).

    For the job's user and Slurm administrators (root, SlurmUser, AdminLevel Operator or Administrator);
    whose job it is comes from Slurm's records (slurmctld's, else sacct's UID), never from a field the user
    writes. The records come from the accounting database where it is readable, else from the job's
    [gpushare:u1 ...] AdminComment segment in sacct (written when the job ends). See docs/accounting.md.
    """
    from slurm_gpushare.accounting import jobstats as js
    from slurm_gpushare.accounting.backend import is_url
    from slurm_gpushare.accounting.sacct import latest_jobs, parse_sacct, records_from_sacct
    from slurm_gpushare.accounting.store import Store, default_db
    from slurm_gpushare.slurm import commands

    array, sep, task = job_id.partition("_")
    array_id = _job_id(array)
    if _job_id(job_id) is None and not (sep and array_id and _job_id(task)):
        raise click.UsageError(f"{job_id!r} is not a job id: give the job's id (digits), or an array task as "
                               "squeue names it (10_2)")
    if sep and array_id:
        given = job_id
        job_id = _array_task_job_id(array_id, int(task))
        if job_id is None:
            raise click.UsageError(f"array task {given} is not known to slurmctld or to sacct")
    else:
        job_id = _job_id(job_id)
    ctld = _ctld_job(job_id)  # slurmctld's record, read once (on 22.05 squeue --json is the whole job table)
    owner_uid = _job_uid(job_id, ctld)
    js.may_see(job_id, owner_uid, os.getuid(), slurm_user_uid=_slurm_user_uid,
               admin_level=lambda: _admin_level(os.getuid()))
    owner = _user_name(owner_uid)

    def owners(user: str) -> bool:
        # a reused job id (slurmctld's state lost, slurmdbd's kept) also names other users' old jobs
        return owner is None or user in ("", owner)

    records, source, rows = [], "sacct", []
    db = db_path or default_db()
    if not from_sacct and (is_url(db) or _readable(db)):
        with Store(db, create=False) as store:
            # the allocation's records (step ""), as the AdminComment segment holds them, of the current job of
            # the id (a job id Slurm gave again is another job; slurmctld's submit time tells which while it knows it)
            records = js.current_job([r for r in store.records(job_id=job_id) if r.step == "" and owners(r.user)],
                                     submit=ctld.submit_time if ctld is not None else None,
                                     restarts=ctld.restarts if ctld is not None else None)
            source = "store"
    if not records:
        # a row that started when slurmctld's job of the id started is that job, whoever slurmdbd names (22.05 was
        # seen recording uid 0 for a user's job); other rows only where they name the owner
        started = ctld.start_time if ctld is not None else None
        rows = [r for r in latest_jobs(parse_sacct(commands.sacct_jobs(["-j", job_id])))
                if r.job_id == job_id and (owners(r.user) or (started is not None and r.start == started))]
        records, source = records_from_sacct(rows), "sacct"
    if not records:
        _why_no_records(job_id, ctld, rows)
    policy = _policy(policy_path)
    notes = js.NotesRule(policy.notes_low_sm, policy.notes_low_memory, policy.notes_footer) if policy.notes else None
    stats = js.job_stats(job_id, records, source=source, rule=_rule(policy, machines_dir), notes=notes,
                         header=_header(job_id, ctld), user=owner)
    if ctld is not None:  # where slurmdbd's row lost them (the uid-0 rows above have no account or partition)
        stats = dataclasses.replace(stats, account=stats.account or ctld.account,
                                    partition=stats.partition or ctld.partition)
    click.echo(js.to_json(stats) if fmt == "json" else js.to_text(stats), nl=False)


def _header(job_id: str, ctld):
    """What sacct says of the job's run that started when slurmctld's job (``ctld``, :func:`_ctld_job`) did
    (else its most recent run), for jobstats' header, marked incomplete where its uid is not slurmctld's owner's;
    None where sacct cannot tell (no slurmdbd)."""
    from slurm_gpushare.accounting.jobstats import parse_job_header
    from slurm_gpushare.errors import GpushareError
    from slurm_gpushare.slurm import commands

    try:
        text = commands.sacct_job_header(job_id)
    except GpushareError:
        return None
    try:
        names = commands.sacct_job_names(job_id)
    except GpushareError:
        names = ""
    known = ctld is not None and ctld.uid >= 0
    return parse_job_header(text, job_id, ctld.start_time if ctld is not None else None, names=names,
                            owner_uid=ctld.uid if known else None)


def _array_task_job_id(array_id: str, task: int) -> str | None:
    """The job id of array task ``ARRAY_TASK`` as slurmctld holds it, else as slurmdbd recorded it for the
    most recent job of that name (sacct without -D); None when neither knows it."""
    from slurm_gpushare.errors import GpushareError
    from slurm_gpushare.slurm import commands
    from slurm_gpushare.slurm.job import array_task_job_id

    try:
        found = array_task_job_id(commands.job_record(f"{array_id}_{task}"), array_id, task)
        if found:
            return found
    except GpushareError:
        pass
    try:
        rows = [line.split("|") for line in commands.sacct_uids(f"{array_id}_{task}").splitlines()
                if line.count("|") == 1]
        ids = {jid for jid, _uid in rows if jid.isascii() and jid.isdigit()}
        if len(ids) == 1:
            return ids.pop()
    except GpushareError:
        pass
    return None


#: slurmctld's states of a job that has not ended (squeue(1) JOB STATE CODES).
_NOT_ENDED = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
                        "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "REQUEUE_HOLD", "REQUEUE_FED"})
#: AllocTRES items of a job that held GPUs (sacct(1); ``gres/gpu`` from 23.11, ``gres:gpu`` before).
_GPU_TRES = ("gres/gpu", "gres:gpu", "gres/shard", "gres:shard", "gres/mps", "gres:mps")


def _why_no_records(job_id: str, info, rows) -> None:
    """Raise the reason a job has no GPU usage records, where Slurm's records say it: still running (records
    are written when it ends), or it held no GPU (slurmctld's GRES of the job, else its sacct AllocTRES).
    Returns (for :func:`~slurm_gpushare.accounting.jobstats.job_stats` to say the general reason) otherwise.

    Raises:
        InputError: the job is running, or held no GPU.
    """
    from slurm_gpushare.errors import InputError

    if info is not None and info.state in _NOT_ENDED:
        raise InputError(f"job {job_id} is {info.state}: its GPU usage records are written when it ends",
                         hint="while it runs, the node monitor's metrics show its GPU use (docs/accounting.md, "
                              "'The node monitor'); run jobstats again once it has ended")
    held = None
    if info is not None:
        held = bool(info.gres) or any(x in info.tres_per_node for x in ("gpu", "shard", "mps"))
    elif rows:
        held = any(t in (rows[-1].alloc_tres or "") for t in _GPU_TRES)
    if held is False:
        raise InputError(f"job {job_id} held no GPU: jobstats shows GPU usage",
                         hint=f"sacct -j {job_id} -o JobID,Elapsed,TotalCPU,MaxRSS shows its CPU and memory use")


def _job_id(text: str) -> str | None:
    """A job id as Slurm reads it (ASCII digits, leading zeros dropped: ``007`` is job 7), None when ``text`` is
    not one (``str.isdigit`` also holds for ``²`` and other scripts' digits, which Slurm does not read)."""
    if not (text.isascii() and text.isdigit()):
        return None
    return text.lstrip("0") or "0"


def _ctld_job(job_id: str):
    """slurmctld's record of the job of that id (:class:`~slurm_gpushare.slurm.job.JobInfo`), None when slurmctld
    does not hold it or cannot be asked."""
    from slurm_gpushare.errors import GpushareError
    from slurm_gpushare.slurm import commands
    from slurm_gpushare.slurm.job import parse_job_json

    try:
        return parse_job_json(commands.job_record(job_id), job_id)
    except GpushareError:
        return None


def _job_uid(job_id: str, ctld=None) -> int | None:
    """The job's uid as slurmctld holds it (``ctld``, :func:`_ctld_job`: the job of that id now, since a job id can
    be used again once slurmctld's state is lost while slurmdbd keeps the old job's row), else as slurmdbd
    recorded it for the most recent job of that id (sacct without -D: a job slurmctld has forgotten); None when
    neither knows the job."""
    from slurm_gpushare.errors import GpushareError
    from slurm_gpushare.slurm import commands

    if ctld is not None and ctld.uid >= 0:
        return ctld.uid
    try:
        rows = [line.split("|") for line in commands.sacct_uids(job_id).splitlines() if line.count("|") == 1]
        uids = {uid for jid, uid in rows if jid == job_id and uid.isdigit()}
        if len(uids) == 1:
            return int(uids.pop())
    except GpushareError:
        pass
    return None


def _user_name(uid: int | None) -> str | None:
    """The name of the user ``uid`` (None: no uid, or no such user here)."""
    import pwd

    try:
        return None if uid is None else pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _slurm_user_uid() -> int | None:
    """SlurmUser's uid (``scontrol show config``: ``SlurmUserId = slurm(64030)``), None when not known."""
    import re

    from slurm_gpushare.errors import GpushareError
    from slurm_gpushare.slurm import commands

    try:
        m = re.search(r"^SlurmUserId\s*=\s*\S*?\((\d+)\)", commands.show_config(), re.MULTILINE)
    except GpushareError:
        return None
    return int(m.group(1)) if m else None


def _admin_level(uid: int) -> str:
    """The Slurm AdminLevel of the user with ``uid`` (``sacctmgr show user``), ``""`` when not known."""
    import pwd

    from slurm_gpushare.errors import GpushareError
    from slurm_gpushare.slurm import commands

    try:
        name = pwd.getpwuid(uid).pw_name
        return commands.admin_level(name).strip().splitlines()[0] if name else ""
    except (KeyError, IndexError, GpushareError):
        return ""


def _policy(path: str | None):
    """The policy given, else the site's where readable, else the built-in defaults."""
    from slurm_gpushare.submit.policyfile import SitePolicy, load_policy

    if path:
        return load_policy(path)
    return load_policy(DEFAULT_POLICY) if _readable(DEFAULT_POLICY) else SitePolicy()


def _rule(policy, machines_dir: str):
    """The site's rule for a suggested request (jobstats, ``report --waste``): the policy's headroom, shard unit
    and whole-GPU threshold, the offers of the machine descriptions."""
    from slurm_gpushare.accounting.jobstats import SuggestRule

    return SuggestRule(headroom=policy.headroom, unit_mib=policy.shard_unit_mib,
                       whole_threshold=policy.whole_gpu_threshold,
                       offers=_offers(machines_dir, policy.mig_enabled))


def _offers(machines_dir: str, mig_enabled: bool) -> dict:
    """The GPU models' offers from the readable machine descriptions (one that does not load is left out)."""
    from slurm_gpushare.accounting.jobstats import offers_from_machines
    from slurm_gpushare.errors import GpushareError
    from slurm_gpushare.hardware.machine import Machine

    machines = []
    d = Path(machines_dir)
    if _readable(d, directory=True):
        for p in sorted(d.glob("*.json")):
            try:
                machines.append(Machine.load(p))
            except (GpushareError, OSError):
                continue
    return offers_from_machines(machines, mig_enabled=mig_enabled)


def _readable(path: str | Path, *, directory: bool = False) -> bool:
    """Whether this user may read the file (or list the directory): False also where a directory above it may
    not be entered (``Path.is_file`` raises then)."""
    p = Path(path)
    try:
        kind = p.is_dir() if directory else p.is_file()
    except OSError:
        return False
    return kind and os.access(p, os.R_OK | (os.X_OK if directory else 0))


def _plot_module():
    """:mod:`slurm_gpushare.accounting.plot`, which needs matplotlib: the ``plot`` extra of the package.

    Raises:
        InputError: matplotlib is not installed.
    """
    try:
        from slurm_gpushare.accounting import plot
    except ModuleNotFoundError as e:
        if not (e.name or "").split(".")[0] == "matplotlib":
            raise
        raise InputError("report --plot draws with matplotlib, which this installation lacks",
                         hint="install the plot extra (pip install 'slurm-gpushare[plot]', or Debian's "
                              "python3-matplotlib beside a system install), or drop --plot for the table") from None
    return plot
