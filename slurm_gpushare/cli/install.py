"""``install``: write a host role's site files with this installation's paths (slurm_gpushare.siteinstall)."""

from __future__ import annotations

import difflib
import json
import sys

import click

from slurm_gpushare.cli import main
from slurm_gpushare.siteinstall import DEFAULT_RUN_DIR, ROLES

#: state -> (what was done, what would be done)
_SAID = {"new": ("written", "would write"), "unchanged": ("unchanged", "unchanged"),
         "mode": ("mode set (its content was unchanged)", "would set the mode (its content is unchanged)"),
         "upgrade": ("replaced (unchanged since the last install)", "would replace (unchanged since the last install)"),
         "replace": ("replaced (--force)", "would replace (--force)"),
         "refused": ("refused", "REFUSED (changed since the last install wrote it, or not written by it)")}


def _diff(outcome) -> str:
    """How ``outcome``'s file changes: a unified diff of what is there against what this install writes."""
    f = outcome.file
    old = f.path.read_text(errors="replace").splitlines(keepends=True)
    return "".join(difflib.unified_diff(old, f.text.splitlines(keepends=True), str(f.path), f"{f.path} (this install)"))


@main.command("install")
@click.option("--role", "roles", multiple=True, required=True, type=click.Choice(ROLES),
              help="what this host is: controller (slurmctld + filter service), node (slurmd with GPUs), "
                   "login (where users run sbatch/srun); repeat for a host with several")
@click.option("--prefix", required=True, type=click.Path(file_okay=False),
              help="root of the layout: PREFIX/etc/slurm (slurm.conf's directory), PREFIX/etc/slurm/gpushare, "
                   "PREFIX/etc/systemd/system; / on a real host")
@click.option("--slurm-conf-dir", type=click.Path(file_okay=False),
              help="slurm.conf's directory, where the Lua files must be (default PREFIX/etc/slurm)")
@click.option("--config-dir", type=click.Path(file_okay=False),
              help="slurm-gpushare's configuration directory (default PREFIX/etc/slurm/gpushare)")
@click.option("--run-dir", default=DEFAULT_RUN_DIR, show_default=True,
              help="the filter service's socket directory (controller, login) and the hooks' run_dir (node; "
                   "may hold {node})")
@click.option("--dry-run", is_flag=True, help="write nothing; list what would be written (and stop where the "
                                              "install would)")
@click.option("--diff", "show_diff", is_flag=True,
              help="show how each file that is replaced changes (a unified diff), and where the install refuses, "
                   "how the refused files would; it writes unless --dry-run is given too")
@click.option("--force", is_flag=True, help="replace files that were changed since the last install (their "
                                            "content is lost)")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="what was (or would be) done as text lines, or as one JSON object (docs/cli.md)")
def install_cmd(roles, prefix, slurm_conf_dir, config_dir, run_dir, dry_run, show_diff, force, fmt):
    """Install the site files of this host's role(s), and print the slurm.conf lines they need.

    The files (Lua shims, hook wrappers, systemd units, example configs, and for every role the man pages in
    PREFIX/usr/local/share/man/man1) come from this package and name this installation's slurm-gpushare
    command. A file that already holds what would be written is left
    alone; one written by the last install and unchanged since is replaced (an upgrade); one changed since
    (or not written by this command) is refused, and then nothing is written, unless --force. Each file
    is replaced atomically. --dry-run writes nothing; --diff shows the changes (like ansible's --diff, and
    with --dry-run like --check --diff). See docs/install.md.

    Exit status: 0 written (or, with --dry-run, the real install would write); 1 with --dry-run when the
    real install would refuse a changed file (run it with --force, or merge first); 2 an error or a refusal.
    --format json prints one object: each file's path, state (new, unchanged, mode, upgrade, replace,
    refused), roles, source and, with --diff, its diff; the slurm.conf lines; the exit status.
    """
    from slurm_gpushare import siteinstall
    from slurm_gpushare.errors import ConfigError

    layout = siteinstall.Layout.under(prefix, slurm_conf_dir=slurm_conf_dir, config_dir=config_dir, run_dir=run_dir)
    files = siteinstall.plan(roles, layout)
    # the diffs are read before the install replaces the files
    diffs = {o.file.path: _diff(o) for o in siteinstall.assess(files, layout, force=force)
             if show_diff and o.state in ("upgrade", "replace", "refused")}
    try:
        outcomes = siteinstall.install(files, layout, force=force, dry_run=dry_run)
    except ConfigError:
        for text in diffs.values():
            click.echo(text, nl=False, err=fmt == "json")
        raise
    refused = dry_run and any(o.state == "refused" for o in outcomes)
    if fmt == "json":
        states = [{"path": str(o.file.path), "state": o.state, "roles": list(o.file.roles), "source": o.file.source,
                   **({"diff": diffs[o.file.path]} if o.file.path in diffs else {})} for o in outcomes]
        click.echo(json.dumps({"roles": list(dict.fromkeys(roles)), "dry_run": dry_run, "files": states,
                               "slurm_conf_lines": siteinstall.slurm_conf_lines(roles, layout),
                               "exit_status": 1 if refused else 0}, indent=2))
        sys.exit(1 if refused else 0)
    for o in outcomes:
        click.echo(f"{_SAID[o.state][dry_run]}: {o.file.path}")
        click.echo(diffs.get(o.file.path, ""), nl=False)
    if dry_run and any(o.state == "refused" for o in outcomes):
        click.echo("(without --force the install would write nothing: see --diff, merge, or pass --force)")
    click.echo(f"\nslurm.conf lines these files need{'' if not dry_run else ' (once written)'}:")
    for line in siteinstall.slurm_conf_lines(roles, layout):
        click.echo(f"  {line}")
    if dry_run and any(o.state == "refused" for o in outcomes):
        sys.exit(1)  # a check that would fail says so in its status, as ansible's --check does


#: removal state -> (what was done, what would be done)
_REMOVED = {"remove": ("removed", "would remove"), "gone": ("not there", "not there"),
            "changed": ("left (changed since the last install wrote it, or not written by it)",
                        "would leave (changed since the last install wrote it, or not written by it)"),
            "shared": ("left (a file of a role this host keeps)", "would leave (a file of a role this host keeps)")}


@main.command("uninstall")
@click.option("--role", "roles", multiple=True, required=True, type=click.Choice(ROLES),
              help="the role(s) to remove from this host, as given to install")
@click.option("--prefix", required=True, type=click.Path(file_okay=False), help="as given to install")
@click.option("--slurm-conf-dir", type=click.Path(file_okay=False), help="as given to install")
@click.option("--config-dir", type=click.Path(file_okay=False), help="as given to install")
@click.option("--run-dir", default=DEFAULT_RUN_DIR, show_default=True, help="as given to install")
@click.option("--dry-run", is_flag=True, help="remove nothing; list what would be removed and what is in the way")
def uninstall_cmd(roles, prefix, slurm_conf_dir, config_dir, run_dir, dry_run):
    """Remove the site files that install wrote for this host's role(s).

    First, and refused until then: slurm.conf (next to the Lua files, its Include files followed) must no
    longer name what would be removed (JobSubmitPlugins=lua, CliFilterPlugins=cli_filter/lua, Prolog=,
    Epilog=, TaskProlog=, EpilogSlurmctld=), and for the node role no job may still have its directory in the
    run dir (its Epilog has not run). A file is removed only as the last install wrote it (the manifest);
    one changed since is left and named; a file another role of this host still uses stays. Directories,
    node.toml, machine descriptions and policies stay. No service is stopped: disable the units first. See
    docs/install.md.

    Exit status: 0 removed (or, with --dry-run, would remove); 1 with --dry-run when the uninstall would be
    refused; 2 an error or a refusal.
    """
    from slurm_gpushare import siteinstall
    from slurm_gpushare.cli.gres import include_loader
    from slurm_gpushare.errors import ConfigError, GpushareError
    from slurm_gpushare.slurm.conf import slurm_conf_settings

    layout = siteinstall.Layout.under(prefix, slurm_conf_dir=slurm_conf_dir, config_dir=config_dir, run_dir=run_dir)
    removals = siteinstall.uninstall_plan(roles, layout)
    conf = layout.slurm_conf_dir / "slurm.conf"
    problems = []
    try:
        text = conf.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {conf} to see whether it still names these files: {e}",
                          hint="fix its permissions, or run as root") from None
    try:
        settings = slurm_conf_settings(text, source=str(conf), include=include_loader(conf.parent))
    except GpushareError as e:
        raise ConfigError(f"cannot read {conf} whole to see whether it still names these files: {e}",
                          hint="fix the Include line first") from None
    named = siteinstall.lines_in_force(removals, settings)
    if named:
        problems.append("slurm.conf still names files this would remove; remove these lines first, then "
                        "'scontrol reconfigure' (on 22.05 restart slurmctld for EpilogSlurmctld):\n"
                        + "\n".join(f"  {line}" for line in named))
    jobs = siteinstall.job_dirs(layout) if "node" in roles else []
    if jobs:
        problems.append(f"{len(jobs)} job(s) still have their directory in the run dir ({jobs[0].parent}: "
                        f"{', '.join(p.name for p in jobs[:10])}{' ...' if len(jobs) > 10 else ''}): drain the node "
                        "and wait until they end (or 'slurm-gpushare doctor --repair' for jobs that are gone)")
    for r in removals:
        click.echo(f"{_REMOVED[r.state][dry_run]}: {r.path}")
    if problems:
        for p in problems:
            click.echo(("" if dry_run else "REFUSED: ") + p, err=not dry_run)
        if dry_run:
            click.echo("(the uninstall would remove nothing until then)")
            sys.exit(1)
        raise ConfigError("nothing was removed: " + "; ".join(p.split(":", 1)[0] for p in problems),
                          hint="see above")
    siteinstall.uninstall(roles, removals, layout, dry_run=dry_run)
    units = [r.path.name for r in removals if r.state == "remove" and r.path.suffix == ".service"]
    if units:
        click.echo(f"\n{'then ' if dry_run else ''}systemctl daemon-reload (units removed: {', '.join(units)}; "
                   "they were not stopped here)")
