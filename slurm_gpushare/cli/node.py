"""``hook prolog|epilog`` (slurmd runs them as root) and ``doctor`` (repairs leftovers on a node)."""

from __future__ import annotations

import os
import socket
import sys

import click

from slurm_gpushare.cli import main


def _context(config_path: str | None, node: str | None):
    """The hook context of ``doctor`` and ``monitor`` (``hook`` builds its own: :mod:`slurm_gpushare.node.hook`)."""
    from slurm_gpushare.node.config import load_node_config
    from slurm_gpushare.node.context import HookContext

    name = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    return HookContext(load_node_config(config_path), name)


@main.command()
@click.argument("which", type=click.Choice(["prolog", "epilog"]))
@click.option("--config", "config_path", help="node config TOML (default /etc/slurm/gpushare/node.toml)")
def hook(which, config_path):
    """Run as slurmd's Prolog or Epilog (root): start/stop the job's MPS daemon, write its environment.

    Reads SLURM_JOB_ID and SLURMD_NODENAME from slurmd's environment and the job's record from
    slurmctld. Exit status 1 (which drains the node) only for node faults; the drain reason says what
    to fix. Errors go to stderr, which slurmd logs.
    """
    from slurm_gpushare.node.hook import run

    sys.exit(run(which, config_path, os.environ))


@main.command()
@click.option("--config", "config_path", help="node config TOML (default /etc/slurm/gpushare/node.toml)")
@click.option("--node", help="Slurm node name (default: SLURMD_NODENAME, else this host's short name)")
@click.option("--repair", is_flag=True, help="clean up and restart what can be, instead of only reporting")
@click.option("--timeout", type=click.FloatRange(0.1, 86400), default=None,
              help="seconds doctor may take (default: hook_timeout of node.toml, 120)")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one object (node, run_dir, repair, finished, exit_status, findings[] of job_id, problem, "
                   "action) for monitoring scripts; the exit status is the same")
def doctor(config_path, node, repair, timeout, fmt):
    """Find leftovers of the gpushare hooks on a node, and with --repair fix them.

    Job directories and MPS daemons of jobs that no longer run here are stopped and removed; a running
    job whose MPS daemon died gets a new one with its limits; a GPU process whose cgroup names a job that
    no longer runs here is killed, any other GPU process of no running job is reported and left alone.
    Exit status 1 when something was found and not repaired, 2 when doctor did not finish within --timeout
    (what it found before is printed).
    """
    from slurm_gpushare.node.doctor import LEFT_ALONE, doctor_within

    ctx = _context(config_path, node)
    limit = timeout if timeout is not None else ctx.config.hook_timeout
    findings, finished = doctor_within(ctx, repair=repair, limit=limit)
    unchecked = any(f.action == "nothing done" or f.action.startswith(LEFT_ALONE) for f in findings)
    status = 2 if not finished else 1 if (findings and not repair) or unchecked else 0
    if fmt == "json":
        import json

        click.echo(json.dumps({"node": ctx.node, "run_dir": str(ctx.run_dir), "repair": repair, "finished": finished,
                               "exit_status": status,
                               "findings": [{"job_id": f.job_id, "problem": f.problem, "action": f.action}
                                            for f in findings]}, indent=1))
        sys.exit(status)
    for f in findings:
        click.echo(f"{'job ' + f.job_id + ': ' if f.job_id != '-' else ''}{f.problem}: {f.action}")
    if not finished:
        click.echo(f"{ctx.node}: doctor did not finish within {limit:g} s (--timeout; default node.toml hook_timeout): "
                   "something it waits on does not answer (slurmctld, NVML, an MPS daemon); what is listed above "
                   "was found before", err=True)
        sys.exit(2)
    if not findings:
        click.echo(f"{ctx.node}: nothing left over in {ctx.run_dir}")
    sys.exit(status)


@main.command()
@click.option("--config", "config_path", help="node config TOML (default /etc/slurm/gpushare/node.toml)")
@click.option("--node", help="Slurm node name (default: SLURMD_NODENAME, else this host's short name)")
@click.option("--interval", type=click.FloatRange(0.01, 3600), callback=lambda ctx, p, v: _finite(v, "--interval"),
              help="seconds between samples (default: monitor_interval of node.toml, 10)")
@click.option("--listen", callback=lambda ctx, p, v: _listen(v),
              help="Prometheus endpoint, HOST:PORT or :PORT (every address); '' for none (default: monitor_listen, "
                   "127.0.0.1:9817)")
@click.option("--textfile", help="write the metrics to this node_exporter textfile after each sample "
              "(default: monitor_textfile)")
@click.option("--once", is_flag=True, help="take one sample, print the metrics (Prometheus text format) and exit; "
              "with admin_comment_summary, also update the running jobs' AdminComment")
def monitor(config_path, node, interval, listen, textfile, once):
    """Watch this node's GPUs: per-job memory and SM use, Prometheus metrics, usage for the Epilog.

    Samples NVML every --interval seconds, attributes each GPU process to its Slurm job (cgroup, else
    'scontrol listpids'), keeps each job's peak memory and SM utilization per GPU in
    <run_dir>/usage/ (the Epilog's accounting records read them), flags jobs whose processes together
    hold more than their share, and serves the metrics at http://HOST:PORT/metrics. Runs as root
    until SIGTERM or SIGINT. With --once, exit status 1 when anything failed in the sample (an NVML
    call, a Slurm command, a file). See docs/accounting.md.
    """
    import signal

    from slurm_gpushare.errors import MachineDescriptionError, NvmlError
    from slurm_gpushare.hardware.machine import Machine
    from slurm_gpushare.hardware.ports import open_nvml
    from slurm_gpushare.node.metrics import metrics_text, serve
    from slurm_gpushare.node.monitor import Monitor

    ctx = _context(config_path, node)
    cfg = ctx.config
    try:
        machine = Machine.load(cfg.machine_for(ctx.node))
    except MachineDescriptionError as e:
        raise MachineDescriptionError(e.message, source=e.source,
                                      hint=e.hint or f"write it on this node with 'slurm-gpushare inventory -o "
                                      f"{cfg.machine_for(ctx.node)}', or set machine= in node.toml") from None
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    mon = Monitor(cfg, ctx.node, machine, open_nvml())
    try:
        mon.open()
    except NvmlError as e:
        raise NvmlError(e.message, source=e.source, code=e.code,
                        hint="the monitor reads the GPUs through the NVIDIA driver (check nvidia-smi); a simulated "
                             "node sets GPUSHARE_NVML=fake:MACHINE.json") from None
    textfile = textfile if textfile is not None else cfg.monitor_textfile
    to_stdout = once and textfile in ("", "-")
    with mon:
        serve(mon, interval_s=interval or cfg.monitor_interval,
              listen=None if once else (cfg.monitor_listen if listen is None else listen),
              textfile=None if to_stdout else textfile or None, once=once, stop=lambda: bool(stopping))
        if to_stdout:
            click.echo(metrics_text(mon), nl=False)
        problems = sum(mon.errors_total.values())
    if once and problems:
        click.echo(f"slurm-gpushare monitor: {problems} problem(s) in this sample (see above); the numbers may be "
                   "incomplete", err=True)
        sys.exit(1)


def _listen(value):
    """Check --listen before anything starts ('' means no endpoint)."""
    if value:
        from slurm_gpushare.errors import InputError
        from slurm_gpushare.node.config import parse_listen

        try:
            parse_listen(value)
        except InputError as e:
            raise click.BadParameter(f"{e.message} ({e.hint})", param_hint="--listen") from None
    return value


def _finite(value, name: str):
    import math

    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number of seconds", param_hint=name)
    return value
