"""``gres-conf``: generate gres.conf and the matching slurm.conf lines, or check installed ones."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from slurm_gpushare.cli import main
from slurm_gpushare.cli.hardware import check_node_name, load_machine, machine_options, write_files_atomically
from slurm_gpushare.errors import ConfigError, InputError
from slurm_gpushare.slurm.release import OLDEST, SUPPORTED, Release


def _installed_path(given: str | None, name: str) -> Path:
    """An installed config file: as given, else ``$SLURM_CONF`` itself for slurm.conf and the file next to it for
    the others, else ``/etc/slurm/<name>``."""
    if given:
        return Path(given)
    conf = os.environ.get("SLURM_CONF")
    if conf and name == "slurm.conf":
        return Path(conf)
    return (Path(conf).parent if conf else Path("/etc/slurm")) / name


def check_device_dir(path: str) -> None:
    """``--device-dir`` goes into gres.conf ``File=`` values: an absolute path, no white space, no hostlist.

    Raises:
        InputError: a relative path, white space, or ``[``, ``]``, ``,`` (``File=`` is a hostlist).
    """
    if any(ch.isspace() for ch in path):
        raise InputError(f"--device-dir {path!r} contains white space",
                         hint="gres.conf File= values end at white space; give a directory such as /dev")
    if not path.startswith("/"):
        raise InputError(f"--device-dir {path!r} is not an absolute path",
                         hint="slurmd opens the File= paths as written; give a directory such as /dev")
    bad = sorted({ch for ch in path if ch in "[],"})
    if bad:
        raise InputError(f"--device-dir {path!r} contains {', '.join(repr(ch) for ch in bad)}",
                         hint="gres.conf File= is a hostlist expression, where these characters make ranges "
                              "and lists; give a directory such as /dev")


def _output_dir(path: str) -> tuple[Path, bool]:
    """The ``--output-dir``: an existing directory, or one made here when only its last part is missing.

    Returns:
        The directory and whether it was created.

    Raises:
        InputError: the path is a file, its parent does not exist or is not a directory, or mkdir fails.
    """
    out = Path(path)
    if out.is_dir():
        return out, False
    if out.exists():
        raise InputError(f"--output-dir {out} is not a directory",
                         hint="give a directory; its last part is created when missing")
    parent = out.parent
    if not parent.is_dir():
        state = "is not a directory" if parent.exists() else "does not exist"
        raise InputError(f"cannot create {out}: its parent {parent} {state}",
                         hint="--output-dir creates only the last directory; create the parent first")
    try:
        out.mkdir()
    except OSError as e:
        raise InputError(f"cannot create {out}: {e.strerror or e}") from None
    return out, True


@main.command("gres-conf")
@click.argument("machine_files", nargs=-1, type=click.Path())
@machine_options
@click.option("--node-name", help="Slurm NodeName (one machine only; default: the description's hostname)")
@click.option("--device-dir", default="/dev", show_default=True,
              help="directory of the nvidiaN device files (absolute, no white space)")
@click.option("--shard-unit", default="1G", show_default=True,
              help="GPU memory per shard, with its unit: 1G, 512M (Name=shard Count= is each GPU's memory "
                   "in this unit)")
@click.option("--no-links", is_flag=True, help="do not write Links=")
@click.option("--no-shards", is_flag=True, help="do not write Name=shard lines")
@click.option("--slurm-version", "slurm_version", metavar="YY.MM",
              help="the Slurm release that reads the files (default: slurmd -V, else sinfo -V): it decides "
                   "the MIG form, whether Cores= must be whole sockets, and what --check accepts")
@click.option("--mig-multiple-files/--mig-file", "mig_multiple_files", default=None,
              help="MIG devices as MultipleFiles=parent,caps (default from 23.11) or File=cap (default "
                   "before: 22.05 splits MultipleFiles next to shards, see docs)")
@click.option("--output-dir", type=click.Path(),
              help="write DIR/gres.conf and DIR/slurm.conf.gres instead of printing both (DIR is created "
                   "if its parent exists)")
@click.option("--partition", "partitions", multiple=True, metavar="NAME=NODES",
              help="write TRESBillingWeights for partition NAME of NODES (a hostlist of the given machines' "
                   "node names); repeat for several (default: one partition 'gpu' of every given node)")
@click.option("--billing-gpu-weight", "gpu_weight", type=float, default=1.0, show_default=True,
              help="TRESBillingWeights weight of one whole GPU: a shard bills this / the GPU's shard count, a "
                   "MIG device its fraction of it (the billing TRES is an integer: weigh a GPU by its shard "
                   "count, e.g. 80, for QOS billing= limits)")
@click.option("--billing-mig-by", "mig_by", type=click.Choice(["memory", "slices"]), default="memory",
              show_default=True,
              help="weigh a MIG device by its share of the GPU's memory slices (1g.10gb: 1/8) or compute "
                   "slices (1/7)")
@click.option("--slurmdbd", "with_dbd", is_flag=True,
              help="the cluster runs slurmdbd: print AccountingStorageTRES and TRESBillingWeights (default: as "
                   "AccountingStorageType of the installed slurm.conf says, see --slurm-conf; when it cannot be "
                   "read, as with slurmdbd)")
@click.option("--no-slurmdbd", "without_dbd", is_flag=True,
              help="the cluster runs no slurmdbd: print no AccountingStorageTRES and no TRESBillingWeights (Slurm "
                   "tracks GRES only with slurmdbd; slurmctld stops on either without it)")
@click.option("--check", is_flag=True, help="compare with the installed gres.conf/slurm.conf and lint them")
@click.option("--gres-conf", "gres_conf", type=click.Path(),
              help="installed gres.conf for --check (default: next to $SLURM_CONF, else /etc/slurm)")
@click.option("--slurm-conf", "slurm_conf", type=click.Path(),
              help="installed slurm.conf for --check (default: $SLURM_CONF, else /etc/slurm/slurm.conf)")
@click.option("--slurmd-g", "slurmd_g", type=click.Path(allow_dash=True),
              help="'sudo slurmd -G' output of the node: compare what slurmd detected with the generated "
                   "gres.conf, device by device (one machine only; with or without --check)")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="how --check and --slurmd-g report: text lines, or one JSON object (docs/cli.md)")
def gres_conf(machine_files, from_topo, gpu_name, memory, mig_table, cpus, topo_host, hostname, node_name, device_dir,
              shard_unit, no_links, no_shards, slurm_version, mig_multiple_files, output_dir, partitions,
              gpu_weight, mig_by, with_dbd, without_dbd, check, gres_conf, slurm_conf, slurmd_g, fmt):
    """Generate gres.conf and the matching slurm.conf lines from machine descriptions.

    Give one or more MACHINE.json files (one node each), or --from-topo FILE, or nothing to probe
    NVML on this host. gres.conf gets one line per GPU (File=, Type=, Cores= as core ids, Links=
    from the hop matrix), one per MIG device, and Name=shard Count=<memory in --shard-unit> per
    whole GPU; the slurm.conf text has GresTypes=, AccountingStorageTRES= (gres/gpu, gres/shard and
    every typed gres/gpu:<type>, MIG types included), NodeName=... Gres= and one
    PartitionName=... TRESBillingWeights= line per --partition: a whole GPU bills
    --billing-gpu-weight, a shard:N job N/Count of it (Count: its GPU's shards), a MIG device its
    share of the GPU (--billing-mig-by). See docs/accounting.md, "Billing and QOS limits".

    With --slurmd-g FILE (what 'sudo slurmd -G' printed on the node) nothing is written either: each
    GPU and MIG device slurmd detected is matched with the generated gres.conf by its device files
    (/dev/nvidiaN, the GPU instance's /dev/nvidia-caps/nvidia-capM) and its type (Slurm's
    nvidia_h100_80gb_hbm3_1g.10gb and the product's h100_1g.10gb agree); exit status 1 when any
    device or count differs.

    With --check nothing is written: the installed files are compared with what would be generated
    and linted; the exit status is 1 when they differ or have errors. Only the installed lines that
    apply to the checked nodes are looked at, so one node can be checked against the cluster-wide
    files. AccountingStorageTRES is expected only when the installed slurm.conf uses slurmdbd.
    """
    from slurm_gpushare.gresconf.render import (
        check_shard_unit,
        generate_node_gres,
        render_gres_conf,
        render_slurm_conf,
    )
    from slurm_gpushare.memsize import format_mib, parse_shard_unit
    from slurm_gpushare.slurm.nodegres import GresOptions

    if with_dbd and without_dbd:
        raise click.UsageError("--slurmdbd and --no-slurmdbd contradict each other: give one")
    if machine_files and (from_topo or len(machine_files) > 1 and node_name):
        raise InputError("--node-name and --from-topo take one machine; several MACHINE.json files use "
                         "their own hostnames")
    check_node_name(node_name, "--node-name")
    check_device_dir(device_dir)
    shard_unit_mib = parse_shard_unit(shard_unit, what="--shard-unit")
    release = _release(slurm_version)
    source = dict(from_topo=from_topo, gpu_name=gpu_name, memory=memory, mig_table=mig_table, cpus=cpus,
                  hostname=hostname, topo_host=topo_host)
    machines = [load_machine(f, **source) for f in machine_files] if machine_files else [
        load_machine(None, **source)]
    opts = GresOptions(device_dir=device_dir, shard_unit_mib=shard_unit_mib,
                       links=not no_links, shards=not no_shards, mig_multiple_files=mig_multiple_files,
                       release=release)
    names = [node_name or m.hostname for m in machines]
    if len(set(names)) != len(names):
        raise InputError(f"two machines have the same node name ({', '.join(names)})",
                         hint="give each description its own hostname (inventory --hostname)")
    if opts.shards:
        for m, n in zip(machines, names, strict=True):
            check_shard_unit(m, opts.shard_unit_mib, n)
    nodes = [generate_node_gres(m, n, opts) for m, n in zip(machines, names, strict=True)]
    header = (f"gres.conf for Slurm {release} generated by slurm-gpushare gres-conf (shard unit "
              f"{format_mib(opts.shard_unit_mib)}).\n"
              "Check it against the hardware with: slurm-gpushare gres-conf --check")
    gres_text = render_gres_conf(nodes, header=header)

    if fmt == "json" and not (check or slurmd_g):
        raise InputError("--format json reports --check and --slurmd-g; generating prints the files",
                         hint="add --check (or --slurmd-g FILE), or leave --format out")
    if slurmd_g or check:
        if slurmd_g and len(nodes) != 1:
            raise InputError("--slurmd-g compares one node's 'slurmd -G' print: give one machine",
                             hint="run it once per node, with that node's MACHINE.json")
        report: dict = {"nodes": [n.node_name for n in nodes], "release": str(release)}
        status = 0
        if slurmd_g:
            report["detected"] = _check_detected(slurmd_g, nodes[0])
            status = report["detected"]["exit_status"]
        if check:
            report["check"] = _check(gres_text, nodes, _installed_path(gres_conf, "gres.conf"),
                                     Path(slurm_conf) if slurm_conf else _installed_path(None, "slurm.conf"),
                                     release, mig_by)
            status = max(status, report["check"]["exit_status"])
        if fmt == "json":
            click.echo(json.dumps({**report, "exit_status": status}, indent=2))
        else:
            if slurmd_g:
                _print_detected(report["detected"])
            if check:
                _print_check(report["check"], report)
        sys.exit(status)
    slurmdbd = True if with_dbd else False if without_dbd else None
    if slurmdbd is None:
        slurmdbd = _site_has_slurmdbd(Path(slurm_conf) if slurm_conf else _installed_path(None, "slurm.conf"))
    slurm_text = render_slurm_conf(nodes, accounting_tres=slurmdbd is not False,
                                   partitions=_partitions(partitions, nodes, gpu_weight, mig_by))
    if slurmdbd is None:  # the site's slurm.conf not read: the lines for slurmdbd, and how to get the others
        slurm_text += ("# AccountingStorageTRES and TRESBillingWeights need slurmdbd (AccountingStorageType="
                       "accounting_storage/slurmdbd): slurmctld stops on them without it; then generate with "
                       "--no-slurmdbd\n")
    if slurmdbd is False:
        slurm_text = ("# no slurmdbd: no AccountingStorageTRES and no TRESBillingWeights, which stop slurmctld "
                      "without it (Slurm tracks GRES only with slurmdbd)\n" + slurm_text)
    if output_dir:
        out, created = _output_dir(output_dir)
        write_files_atomically({out / "gres.conf": gres_text,
                                out / "slurm.conf.gres": "# merge into slurm.conf\n" + slurm_text})
        click.echo(("created " + str(out) + ", " if created else "")
                   + f"wrote {out / 'gres.conf'} and {out / 'slurm.conf.gres'} ({len(nodes)} node(s))", err=True)
        return
    click.echo("# ===== gres.conf =====")
    click.echo(gres_text, nl=False)
    click.echo("# ===== slurm.conf (merge these lines) =====")
    click.echo(slurm_text, nl=False)


def _site_has_slurmdbd(path: Path) -> bool | None:
    """Whether the site's slurm.conf at ``path`` runs slurmdbd (``AccountingStorageType``, its includes
    followed); None when it cannot be read or is not a whole slurm.conf (no ``SlurmctldHost``)."""
    from slurm_gpushare.errors import GpushareError
    from slurm_gpushare.slurm.conf import parse_slurm_conf_gres

    try:
        conf = parse_slurm_conf_gres(path.read_text(), source=str(path), include=include_loader(path.parent))
    except (OSError, UnicodeDecodeError, GpushareError):
        return None
    if conf.slurmdbd:
        return True
    return False if conf.no_slurmdbd else None


def _partitions(given: tuple[str, ...], nodes, gpu_weight: float, mig_by: str):
    """The ``--partition NAME=NODES`` options as billing weights (default: ``gpu`` of every node).

    Raises:
        InputError: a value without ``=``, a bad name or hostlist, a node that is not among the given
            machines, or a bad weight (:class:`~slurm_gpushare.gresconf.billing.BillingOptions`).
    """
    import re

    from slurm_gpushare.errors import ParseError
    from slurm_gpushare.gresconf.billing import BillingOptions, partition_billing
    from slurm_gpushare.slurm.hostlist import expand_hostlist

    opts = BillingOptions(gpu_weight=gpu_weight, mig_by=mig_by)
    by_name = {n.node_name: n for n in nodes}
    if not given:
        return [partition_billing("gpu", nodes, opts)]
    out = []
    for item in given:
        name, eq, hosts = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not hosts:
            raise InputError(f"--partition {item!r} is not NAME=NODES",
                             hint="e.g. --partition a100=gpu-a[01-04] (a partition name, '=', a hostlist)")
        try:
            names = expand_hostlist(hosts)
        except ParseError as e:
            raise InputError(f"--partition {item!r}: {e}", hint="NODES is a Slurm hostlist, e.g. gpu[01-04]") from None
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise InputError(f"--partition {item!r}: {', '.join(unknown)} is not among the given machines "
                             f"({', '.join(by_name)})", hint="give each node's MACHINE.json too")
        out.append(partition_billing(name, [by_name[n] for n in names], opts))
    return out


def _release(given: str | None) -> Release:
    """``--slurm-version``, else the release of this node's slurmd (or clients).

    Raises:
        InputError: a version that is not ``YY.MM`` or older than the oldest supported release.
        SlurmError: no version given and none installed.
    """
    from slurm_gpushare.errors import SlurmError
    from slurm_gpushare.slurm.commands import node_release

    if not given:
        return node_release()
    try:
        release = Release.parse(given)
    except SlurmError:
        raise InputError(f"--slurm-version {given!r} is not a Slurm release",
                         hint=f"write YY.MM, e.g. {', '.join(map(str, SUPPORTED))}") from None
    if release < OLDEST:
        raise InputError(f"Slurm {release} is older than {OLDEST}, the oldest release this version supports",
                         hint=f"supported: {', '.join(map(str, SUPPORTED))}")
    return release


def include_loader(conf_dir: Path):
    """The :data:`~slurm_gpushare.slurm.conf.IncludeLoader` of installed files: absolute names as
    written, relative ones in ``conf_dir``, the directory of slurm.conf (where slurmd looks for them,
    whichever file holds the ``Include`` line).

    The loader raises ConfigError, naming the ``Include`` line, for a file it cannot read.
    """
    def load(name: str, where: str) -> tuple[str, str]:
        path = Path(name) if name.startswith("/") else conf_dir / name
        try:
            return str(path), path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"Include {name}: cannot read {path}: {e.strerror or e}: slurmd fails this "
                              "include too", source=where,
                              hint=f"relative Include names are looked up in the directory of slurm.conf "
                                   f"({conf_dir}), not of the including file") from None
        except UnicodeDecodeError:
            raise ConfigError(f"Include {name}: {path} is not text (UTF-8)", source=where) from None
    return load


def _read_installed(path: Path, what: str, option: str) -> str:
    """An installed configuration file, or one clear line saying why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read installed {what} {path}: {e.strerror or e}",
                          hint=f"point {option} at it, or generate one without --check") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not text (UTF-8)", hint=f"point {option} at the installed {what}") from None


def _check(gres_text: str, nodes, gres_path: Path, slurm_path: Path, release: Release,
           mig_by: str = "memory") -> dict:
    """Compare and lint the installed files with what would be generated for ``nodes``.

    Only the installed lines that apply to the checked nodes count (see ``compare(nodes=...)``), and
    ``AccountingStorageTRES`` is expected only with slurmdbd: slurmctld 22.05 refuses GRES TRES without
    it, so a slurm.conf without ``AccountingStorageType=accounting_storage/slurmdbd`` must not have it.
    The partitions holding the nodes are checked for their ``TRESBillingWeights`` (``lint_billing``, MIG
    shares by ``mig_by``).

    Returns:
        ``gres_conf`` and ``slurm_conf`` (the paths read), ``problems`` (each ``file``: ``gres.conf``,
        ``slurm.conf`` or ``lint``, ``message``, and for lint findings ``where`` and ``hint``), ``warnings``
        (lint findings that are not errors, the same keys), ``exit_status`` (0 clean, 1 problems).

    Raises:
        InputError: an installed file that cannot be read or parsed.
    """
    from slurm_gpushare.gresconf.check import lint_billing, lint_device_constraint, lint_gres_conf, sharing_nodes
    from slurm_gpushare.gresconf.diff import compare
    from slurm_gpushare.gresconf.render import render_slurm_conf
    from slurm_gpushare.slurm.conf import parse_gres_conf, parse_slurm_conf_gres, slurm_conf_settings

    names = [n.node_name for n in nodes]
    include = include_loader(slurm_path.parent)
    installed_gres = _read_installed(gres_path, "gres.conf", "--gres-conf")
    gres = parse_gres_conf(installed_gres, source=str(gres_path), include=include)
    slurm = None
    if slurm_path.exists():
        installed_slurm = _read_installed(slurm_path, "slurm.conf", "--slurm-conf")
        slurm = parse_slurm_conf_gres(installed_slurm, source=str(slurm_path), include=include)
    problems: list[dict] = [{"file": "gres.conf", "message": d}
                            for d in compare(gres_text, installed_gres, what="gres.conf", nodes=names,
                                             installed_source=str(gres_path), include=include, release=release)]
    if slurm is not None:
        slurm_text = render_slurm_conf(nodes, accounting_tres=slurm.slurmdbd)
        problems += [{"file": "slurm.conf", "message": d}
                     for d in compare(slurm_text, installed_slurm, what="slurm.conf",
                                      installed_source=str(slurm_path), include=include)]
    else:
        problems.append({"file": "slurm.conf", "message": f"{slurm_path} not found (Gres= counts not checked)"})
    findings = lint_gres_conf(gres, slurm, {n.node_name: n.machine for n in nodes}, nodes=names, release=release)
    if slurm is not None:
        findings += lint_billing(slurm, nodes, mig_by=mig_by)
    cgroup_path = slurm_path.parent / "cgroup.conf"
    cgroup = (slurm_conf_settings(_read_installed(cgroup_path, "cgroup.conf", "--slurm-conf"),
                                  source=str(cgroup_path), include=include) if cgroup_path.exists() else None)
    findings += lint_device_constraint(
        cgroup, str(cgroup_path),
        slurm_conf_settings(installed_slurm, source=str(slurm_path), include=include) if slurm is not None else None,
        str(slurm_path), whole=slurm is not None and slurm.whole, sharing=sharing_nodes(gres, names))
    warnings: list[dict] = []
    for f in findings:
        item = {"file": "lint", "severity": f.severity, "where": f.where, "message": f.message, "hint": f.hint or ""}
        (problems if f.severity == "error" else warnings).append(item)
    return {"gres_conf": str(gres_path), "slurm_conf": str(slurm_path), "problems": problems, "warnings": warnings,
            "exit_status": 1 if problems else 0}


def _finding_line(item: dict) -> str:
    """One problem or warning of :func:`_check` as the text report prints it."""
    if item["file"] != "lint":
        return f"{item['file']}: {item['message']}"
    return f"{item['severity']}: {item['where']}: {item['message']}" + (f" ({item['hint']})" if item["hint"] else "")


def _print_check(report: dict, about: dict) -> None:
    for item in report["warnings"] + report["problems"]:
        click.echo(_finding_line(item))
    if report["problems"]:
        click.echo(f"{len(report['problems'])} problem(s): regenerate with 'slurm-gpushare gres-conf --output-dir DIR' "
                   "and install the files, then 'scontrol reconfigure' (drain nodes whose GPU count changes)")
    else:
        click.echo(f"{report['gres_conf']} and {report['slurm_conf']} match the hardware ({len(about['nodes'])} "
                   f"node(s), Slurm {about['release']})")


def _check_detected(path: str, node) -> dict:
    """Compare a ``slurmd -G`` print with the node's generated records, device by device.

    Returns:
        ``source`` (the print's name), ``node``, ``devices`` (each ``device``, ``ok``, ``detail``), ``problems``
        (strings: those of no listed device too) and ``exit_status`` (0 every device and count agrees, 1 not).

    Raises:
        InputError: the print cannot be read or parsed.
    """
    from slurm_gpushare.cli.hardware import _read, _read_stdin
    from slurm_gpushare.gresconf.detected import compare_detected
    from slurm_gpushare.slurm.slurmd import parse_slurmd_g

    what = "'slurmd -G' output"
    name = "<stdin>" if path == "-" else Path(path).name
    text = _read_stdin(what) if path == "-" else _read(path, what)
    devices, problems = compare_detected(parse_slurmd_g(text, source=name), node, detected_source=name)
    return {"source": name, "node": node.node_name,
            "devices": [{"device": d.device, "ok": d.ok, "detail": d.detail} for d in devices],
            "problems": list(problems), "exit_status": 1 if problems else 0}


def _print_detected(report: dict) -> None:
    devices = report["devices"]
    for d in devices:
        click.echo(f"{'ok' if d['ok'] else 'DIFFERS'}: {d['device']}: {d['detail']}")
    for p in report["problems"]:
        if not any(p.startswith(d["device"] + ":") for d in devices):
            click.echo(f"DIFFERS: {p}")
    if report["problems"]:
        click.echo(f"{len(report['problems'])} problem(s) between {report['source']} and the gres.conf generated for "
                   f"{report['node']}: if the MIG layout changed, re-run 'slurm-gpushare inventory' on the node, "
                   "regenerate gres.conf and 'scontrol reconfigure'; then 'scontrol update nodename=... state=resume'")
    else:
        click.echo(f"{report['source']}: all {len(devices)} GPU device(s) slurmd detected on {report['node']} match "
                   "the generated gres.conf")
