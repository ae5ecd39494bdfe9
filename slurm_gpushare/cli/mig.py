"""``mig plan``: choose a MIG geometry (or MIG off) per GPU from the accounting store or a demand file."""

from __future__ import annotations

import json

import click

from slurm_gpushare.cli import main
from slurm_gpushare.errors import InputError


@main.group()
def mig() -> None:
    """MIG layouts that follow demand: plan from accounting (see docs/mig.md).

    'mig plan' proposes a layout and writes what applies it; it changes nothing on any GPU. 'mig apply'
    applies a plan's layout to one node: drain, wait for its GPU jobs, change the GPU instances, rewrite
    gres.conf and slurm.conf, make Slurm take them, resume; crash-safe through a state file.
    """


@mig.command("plan")
@click.argument("machine_files", nargs=-1, type=click.Path())
@click.option("--model", "model_key", metavar="MODEL",
              help="plan for GPUs of a MIG table instead of machine descriptions, e.g. a100-80gb (with --gpus)")
@click.option("--gpus", "gpu_count", type=click.IntRange(1, 64), default=1, show_default=True,
              help="with --model: how many GPUs (one node)")
@click.option("--store", "db_path", metavar="DB", help="the accounting database to take the demand from")
@click.option("--partition", "partitions", multiple=True, metavar="NAME",
              help="with --store: the partition(s) whose requests to serve (repeatable; default all)")
@click.option("--since", help="with --store: start of the period (2026-11-01, @EPOCH, now-30days)")
@click.option("--until", help="with --store: end of the period (same forms; default: the last record's end)")
@click.option("--demand", "demand_file", type=click.Path(), metavar="FILE",
              help="a demand file (CSV mem,count[,sm] or JSON; see docs/mig.md) instead of --store")
@click.option("--fit", type=click.Choice(["nominal", "exact"]), default="nominal", show_default=True,
              help="memory that holds a request: the size in the profile's name, or NVML's exact MiB (as the "
                   "site policy's mig.fit)")
@click.option("--weight-memory", "w_memory", type=float, default=1.0, show_default=True,
              help="weight of stranded memory (per GPU of memory)")
@click.option("--weight-compute", "w_compute", type=float, default=1.0, show_default=True,
              help="weight of stranded compute slices (per GPU of slices)")
@click.option("--weight-unserved", "w_unserved", type=float, default=4.0, show_default=True,
              help="weight of requests no slice holds (per GPU share they ask: memory or compute slices)")
@click.option("--weight-whole", "w_whole", type=float, default=4.0, show_default=True,
              help="weight of a whole-GPU request without a MIG-off GPU")
@click.option("--keep-mig-mode", is_flag=True,
              help="every GPU keeps its MIG mode (what 'mig apply' changes without a GPU reset)")
@click.option("--slurm-version", "slurm_version", metavar="YY.MM",
              help="the Slurm release that reads the gres.conf (default: slurmd -V, else sinfo -V)")
@click.option("--output-dir", type=click.Path(),
              help="write DIR/mig-parted.yaml, DIR/layout.json, DIR/gres.conf, DIR/slurm.conf.gres and "
                   "DIR/NODE.planned.json (DIR is created if its parent exists)")
@click.option("--dry-run", is_flag=True, help="with --output-dir: say what would be written, write nothing")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="the plan as text, or as one JSON object (docs/cli.md); what --output-dir does is then said on "
                   "stderr")
def mig_plan(machine_files, model_key, gpu_count, db_path, partitions, since, until, demand_file, fit, w_memory,
             w_compute, w_unserved, w_whole, keep_mig_mode, slurm_version, output_dir, dry_run, fmt):
    """Propose a MIG geometry (or MIG off) for every GPU that serves the demand with the least stranded
    memory and compute, keeping whole GPUs for whole-GPU requests.

    The GPUs come from MACHINE.json files (one node each), from --model with --gpus, or from NVML on this
    host (no argument). The demand comes from the accounting store (--store DB, --partition, --since,
    --until: each request's size, weighted by its run time in the period) or from --demand FILE.
    Prints the plan next to today's layout with both layouts' stranded memory and compute; with
    --output-dir also writes the mig-parted config, the layout (creation order and placements), the
    planned machine descriptions and their gres.conf and slurm.conf lines. Changes no GPU.
    """
    from slurm_gpushare.mig.output import (
        gres_texts,
        layout_json,
        mig_parted_yaml,
        planned_machine,
        summary,
        summary_document,
    )
    from slurm_gpushare.mig.plan import Weights, plan_layout

    if (db_path is None) == (demand_file is None):
        raise InputError("give the demand either from the store (--store DB) or from a file (--demand FILE)",
                         hint="e.g. --store accounting.db --partition gpu --since now-30days, or --demand demand.csv")
    if demand_file and (partitions or since or until):
        raise InputError("--partition, --since and --until go with --store",
                         hint="a demand file holds its own counts")
    if dry_run and not output_dir:
        raise InputError("--dry-run goes with --output-dir", hint="without --output-dir nothing is written anyway")
    from slurm_gpushare.mig.wait import expected_waits

    machines = _machines(machine_files, model_key, gpu_count)
    demand, trace = _demand(db_path, demand_file, partitions, since, until)
    plan = plan_layout(machines, demand, fit=fit, keep_mig_mode=keep_mig_mode,
                       weights=Weights(memory=w_memory, compute=w_compute, unserved=w_unserved, whole=w_whole))
    waits = expected_waits(plan, trace)
    if fmt == "json":
        click.echo(json.dumps(summary_document(plan, waits), indent=2))
    else:
        click.echo(summary(plan, waits), nl=False)
    if not output_dir:
        return
    from slurm_gpushare.cli.gres import _output_dir, _release
    from slurm_gpushare.cli.hardware import write_files_atomically
    from slurm_gpushare.slurm.nodegres import GresOptions

    planned = [planned_machine(m, plan) for m in machines]
    gres_text, slurm_text = gres_texts(planned, GresOptions(release=_release(slurm_version)))
    header = "MIG layout planned by slurm-gpushare mig plan; apply with: nvidia-mig-parted apply -f FILE -c CONFIG"
    files = {"mig-parted.yaml": mig_parted_yaml(plan, header=header), "layout.json": layout_json(plan),
             "gres.conf": gres_text, "slurm.conf.gres": "# merge into slurm.conf\n" + slurm_text}
    files.update({f"{m.hostname}.planned.json": m.to_json() for m in planned})
    if dry_run:
        click.echo(f"dry run: would write {', '.join(files)} in {output_dir}", err=fmt == "json")
        return
    out, created = _output_dir(output_dir)
    write_files_atomically({out / name: text for name, text in files.items()})
    click.echo(("created " + str(out) + ", " if created else "") + f"wrote {', '.join(files)} in {out}", err=True)


@mig.command("apply")
@click.argument("node")
@click.option("--layout", "layout_file", required=True, type=click.Path(), metavar="FILE",
              help="layout.json or mig-parted.yaml of 'mig plan --output-dir' (the node's entry is applied)")
@click.option("--config", "config_path", help="node config TOML (default /etc/slurm/gpushare/node.toml): "
              "run_dir, machine, shard_unit")
@click.option("--state-dir", type=click.Path(), help="where the state file lives (default: the node's run_dir)")
@click.option("--gres-conf", "gres_conf", type=click.Path(), help="gres.conf to rewrite (default: next to $SLURM_CONF, "
              "else /etc/slurm/gres.conf)")
@click.option("--slurm-conf", "slurm_conf", type=click.Path(), help="slurm.conf whose NodeName=NODE Gres= to rewrite "
              "(default: $SLURM_CONF, else /etc/slurm/slurm.conf)")
@click.option("--device-dir", default="/dev", show_default=True, help="device directory of gres.conf File= values")
@click.option("--slurm-version", "slurm_version", metavar="YY.MM",
              help="the Slurm release that reads the gres.conf (default: slurmd -V, else sinfo -V)")
@click.option("--deadline", "deadline_s", type=click.FloatRange(0), default=3600.0, show_default=True,
              help="seconds to wait for the node's GPU jobs; then the drain is undone and nothing changes")
@click.option("--slurm-timeout", "slurm_timeout_s", type=click.FloatRange(1), default=120.0, show_default=True,
              help="seconds to wait for slurmctld to show the node's new GRES")
@click.option("--stop-slurmd", "stop_command", default="systemctl stop slurmd", show_default=True,
              help="command that stops this node's slurmd ({node}: the node name)")
@click.option("--start-slurmd", "start_command", default="systemctl start slurmd", show_default=True,
              help="command that starts this node's slurmd ({node}: the node name)")
@click.option("--restart-slurmctld", "ctld_command", metavar="CMD",
              help="command that restarts slurmctld (e.g. 'ssh slurmctl systemctl restart slurmctld'); default "
                   "'scontrol reconfigure', which does from Slurm 23.11 on; needed for 22.05")
@click.option("--dry-run", is_flag=True, help="print the steps, change nothing")
def mig_apply(node, layout_file, config_path, state_dir, gres_conf, slurm_conf, device_dir, slurm_version,
              deadline_s, slurm_timeout_s, stop_command, start_command, ctld_command, dry_run):
    """Apply a planned MIG layout to NODE (run as root on NODE), without losing a job.

    Steps: drain NODE with a reason, wait until its GPU jobs end (at most --deadline: then resume,
    nothing changed, exit 5), stop its MPS daemons, destroy and create GPU instances through NVML, write
    the machine description, gres.conf and slurm.conf, stop slurmd, restart slurmctld (--restart-slurmctld,
    or scontrol reconfigure from Slurm 23.11 on), start slurmd, wait for slurmctld to show the new GRES,
    resume (only while the drain reason is still ours). Each step is
    recorded in a state file; run the same command again after an interruption and it continues (see
    docs/mig.md). The MIG mode of a GPU is not changed.
    """
    from pathlib import Path

    from slurm_gpushare.cli.gres import _installed_path, _release, check_device_dir
    from slurm_gpushare.hardware.ports import open_nvml
    from slurm_gpushare.mig.apply import STATE_NAME, Apply
    from slurm_gpushare.mig.layout import read_layout
    from slurm_gpushare.mig.slurmops import CommandSlurm
    from slurm_gpushare.node.config import load_node_config
    from slurm_gpushare.slurm.nodegres import GresOptions
    from slurm_gpushare.slurm.release import RECONFIGURE_RESTARTS

    check_device_dir(device_dir)
    config = load_node_config(config_path)
    run_dir = config.run_dir_for(node)
    state_path = Path(state_dir or run_dir) / STATE_NAME
    targets = read_layout(layout_file, node)
    release = _release(slurm_version)
    if ctld_command is None and release < RECONFIGURE_RESTARTS:
        raise InputError(f"Slurm {release} takes a changed count of MIG devices only when slurmctld restarts "
                         "('scontrol reconfigure' logs \"Attempt to change gres/gpu Count ... invalid with File "
                         "configuration\")", hint="give --restart-slurmctld CMD, e.g. 'ssh slurmctl systemctl "
                         "restart slurmctld'")
    job = Apply(node=node, layout=str(layout_file), targets=targets, machine_path=config.machine_for(node),
                state_path=state_path, gres_conf=_installed_path(gres_conf, "gres.conf"),
                slurm_conf=_installed_path(slurm_conf, "slurm.conf"),
                gres_options=GresOptions(device_dir=device_dir, shard_unit_mib=config.shard_unit_mib,
                                         release=release),
                run_dir=run_dir, slurm=CommandSlurm(stop_command, start_command, ctld_command), open_port=open_nvml,
                mps_control=config.mps_control, deadline_s=deadline_s, slurm_timeout_s=slurm_timeout_s,
                out=lambda line: click.echo(line, err=True))
    import contextlib

    with contextlib.ExitStack() as stack:
        if not dry_run:  # one apply of a node at a time; a dry run changes nothing
            stack.enter_context(job.locked())
        _apply(job, node, layout_file, state_path, dry_run)


def _apply(job, node, layout_file, state_path, dry_run) -> None:
    saved = job.read_state()
    fresh = job.prepare()
    if saved is not None:
        if saved["target"] != fresh["target"] and saved.get("goal") == "target":
            # a rerun resolves the layout again against the layout NVML has now: placements agree
            # when it is the same layout
            from slurm_gpushare.mig.layout import same_profiles

            if not same_profiles(saved["target"], fresh["target"]):
                raise InputError(f"an apply of {node} to {saved['layout']} is in progress ({state_path}, step "
                                 f"{saved['step']}); --layout {layout_file} is another layout",
                                 hint=f"rerun with --layout {saved['layout']} to finish it first")
        click.echo(f"mig apply {node}: continuing the apply recorded in {state_path} (step {saved['step']}, "
                   f"{saved['status']})", err=True)
        state = saved
    else:
        state = fresh
        if _unchanged(fresh) and not dry_run:
            click.echo(f"{node}: already in the layout of {layout_file}; nothing to do")
            return
    if dry_run:
        click.echo("\n".join(job.describe(state)))
        return
    job.run(state)
    click.echo(f"{node}: MIG layout of {layout_file} applied, gres.conf and slurm.conf rewritten, node resumed")


def _unchanged(state: dict) -> bool:
    from slurm_gpushare.mig.layout import same_profiles

    return same_profiles(state["old"], state["target"], placements=True)


def _machines(machine_files, model_key, gpu_count):
    """The machines to plan: files, a table model, or NVML on this host.

    Raises:
        InputError: files and --model together, an unknown model, --gpus without --model.
    """
    from slurm_gpushare.cli.hardware import load_machine
    from slurm_gpushare.hardware.machine import Gpu, Machine

    if model_key is not None:
        from slurm_gpushare.hardware.migtables import mig_table

        if machine_files:
            raise InputError("give machine descriptions or --model, not both")
        table = mig_table(model_key)
        gpus = tuple(Gpu(index=i, minor=i, name=f"NVIDIA {table.key.upper()}", memory_mib=table.memory_gib * 1024,
                         mig_profiles=table.profiles) for i in range(gpu_count))
        return [Machine(hostname=model_key.replace(".", "-"), gpus=gpus, source=f"MIG table {table.key}")]
    if gpu_count != 1:
        raise InputError("--gpus goes with --model", hint="machine descriptions list their own GPUs")
    if not machine_files:
        return [load_machine(None)]
    machines = [load_machine(f) for f in machine_files]
    names = [m.hostname for m in machines]
    if len(set(names)) != len(names):
        raise InputError(f"two machines have the same node name ({', '.join(names)})",
                         hint="give each description its own hostname (inventory --hostname)")
    return machines


def _demand(db_path, demand_file, partitions, since, until):
    """The demand and the trace of its jobs for the queue-wait replay (a demand file: Poisson arrivals)."""
    from slurm_gpushare.mig.demand import demand_from_store, read_demand_file
    from slurm_gpushare.mig.wait import poisson_trace, trace_from_store

    if demand_file:
        demand = read_demand_file(demand_file)
        return demand, poisson_trace(demand)
    from slurm_gpushare.accounting.report import parse_time
    from slurm_gpushare.accounting.store import Store, StoreError

    start = parse_time(since, what="--since") if since else None
    end = parse_time(until, what="--until") if until else None
    try:
        store = Store(db_path, create=False)
    except StoreError as e:
        raise InputError(f"--store {db_path}: {e.message}", hint="give the database 'accounting ingest' writes, "
                         "or --demand FILE") from None
    with store:
        parts = tuple(partitions)
        return (demand_from_store(store, partitions=parts, since=start, until=end),
                trace_from_store(store, partitions=parts, since=start, until=end))
