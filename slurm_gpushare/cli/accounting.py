"""``accounting ingest`` (node spools -> the SQLite store), ``accounting sacct-summary`` (the job's usage segment
into slurmdbd's AdminComment, from EpilogSlurmctld) and ``report`` (reserved vs used, waste; from the store or,
``--from-sacct``, from sacct alone)."""

from __future__ import annotations

from pathlib import Path

import click

from slurm_gpushare.cli import main
from slurm_gpushare.errors import InputError

_GROUP_CHOICES = ["user", "account", "partition", "model", "mode", "node", "day", "month", "job"]
_DB_HELP = ("the accounting database (default: $GPUSHARE_ACCOUNTING_DB, else "
            "/var/lib/slurm-gpushare/accounting.db)")


@main.group()
def accounting() -> None:
    """Per-job GPU usage records: load the nodes' spools into the accounting database.

    The Epilog appends one record per job and GPU to the node's spool
    (/var/spool/slurm-gpushare/accounting); 'accounting ingest' loads spools into an SQLite file
    that 'slurm-gpushare report' reads. See docs/accounting.md.
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
               f"{total} record(s) in {store.path}")


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
    import os

    from slurm_gpushare.accounting.sacct import FinalJob, write_final_summary
    from slurm_gpushare.accounting.spool import DEFAULT_SPOOL_DIR

    job = FinalJob.from_env(dict(os.environ), job_id)
    text = write_final_summary(job, list(spools) or [DEFAULT_SPOOL_DIR], wait=wait)
    if text is None:
        click.echo(f"job {job.job_id}: no accounting records of run {job.restart} in the spools: nothing written")
    else:
        click.echo(f"job {job.job_id}: AdminComment={text}")


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--db", "db_path", help=_DB_HELP)
@click.option("--by", "by", type=click.Choice(_GROUP_CHOICES), default=None,
              help="group rows by this (default user; job: one row per job, asked vs peak memory)")
@click.option("--since", help="start of the period: 2026-11-01, 2026-11-01T08:00, @EPOCH, now-30days")
@click.option("--until", help="end of the period (same forms; default: no end)")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
              show_default=True, help="output format")
@click.option("--waste", is_flag=True,
              help="list the jobs that used at most half the memory they asked for, with the request that fits")
@click.option("--from-sacct", "from_sacct", is_flag=True,
              help="read the jobs from sacct (their AdminComment usage segments) instead of the database; "
                   "the remaining arguments go to sacct (-S, -E, -u, -A, -r, -j ...)")
@click.argument("sacct_args", nargs=-1, type=click.UNPROCESSED)
def report(db_path, by, since, until, fmt, waste, from_sacct, sacct_args):
    """Reserved vs used GPU-hours and GPU memory, per user, account, partition, model, mode or job.

    Utilization of a job on several GPUs is their average, never a sum; MIG devices and GPUs
    without utilization data count as "no data", never 0%. Durations are clipped to the period.
    See docs/accounting.md for every column.

    --from-sacct builds the same report from 'sacct' alone: each job's [gpushare:u1 ...] AdminComment
    segment (written after the job by 'accounting sacct-summary') with sacct's user, account and
    partition. Arguments after the options select jobs as sacct does (default: --since as -S, --until
    as -E; sacct's own default is since midnight).
    """
    from slurm_gpushare.accounting.report import job_report, parse_time, render, usage_report, waste_report
    from slurm_gpushare.accounting.store import Store, default_db

    if waste and by not in (None, "job"):
        raise click.UsageError(f"--waste lists jobs; --by {by} does not apply to it (use 'report --by {by}' "
                               "for the usage per group)")
    by = by or "user"
    start = parse_time(since, what="--since") if since else None
    end = parse_time(until, what="--until") if until else None
    if sacct_args and not from_sacct:
        raise click.UsageError(f"unexpected argument {sacct_args[0]!r} (sacct options need --from-sacct)")
    if from_sacct and db_path:
        raise click.UsageError("--from-sacct reads sacct, not a database: drop --db")
    if from_sacct:
        store = _store_from_sacct(list(sacct_args), since, until)
    else:
        store = Store(db_path or default_db(), create=False)
    with store:
        if waste:
            rep = waste_report(store, since=start, until=end)
        elif by == "job":
            rep = job_report(store, since=start, until=end)
        else:
            rep = usage_report(store, by=by, since=start, until=end)
    click.echo(render(rep, fmt), nl=False)


#: sacct options that change the shape of its output (sacct(1)): --from-sacct sets the fields and the format.
_SACCT_SHAPING = frozenset({"-o", "--format", "-p", "--parsable", "-P", "--parsable2", "--json", "--yaml", "-l",
                            "--long", "-b", "--brief", "-X", "--allocations", "-D", "--duplicates", "-n",
                            "--noheader", "-e", "--helpformat", "--delimiter", "--usage"})


def _store_from_sacct(args: list[str], since: str | None, until: str | None):
    """An in-memory store of the records that sacct's rows describe (``report --from-sacct``)."""
    from slurm_gpushare.accounting.sacct import parse_sacct, records_from_sacct
    from slurm_gpushare.accounting.store import Store
    from slurm_gpushare.slurm import commands

    flags = {a.split("=", 1)[0] for a in args}
    shaping = sorted(flags & _SACCT_SHAPING)
    if shaping:
        raise click.UsageError(f"sacct option {shaping[0]} changes sacct's output, which --from-sacct reads itself: "
                               "give only options that select jobs (-S, -E, -u, -A, -r, -j, -s ...)")
    if since and not flags & {"-S", "--starttime"}:
        args += ["-S", _sacct_time(since, "--since")]
    if until and not flags & {"-E", "--endtime"}:
        args += ["-E", _sacct_time(until, "--until")]
    store = Store(":memory:")
    store.add(records_from_sacct(parse_sacct(commands.sacct_jobs(args))))
    return store


def _sacct_time(text: str, what: str) -> str:
    """A report time as sacct -S/-E takes it (local ``YYYY-MM-DDTHH:MM:SS``)."""
    import time

    from slurm_gpushare.accounting.report import parse_time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(parse_time(text, what=what)))
