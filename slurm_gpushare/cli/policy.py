"""``policy check``: validate a site policy file and show what it changes before the filter service reloads it."""

from __future__ import annotations

from pathlib import Path

import click

from slurm_gpushare.cli import main
from slurm_gpushare.cli.service import DEFAULT_MACHINES, DEFAULT_POLICY


@main.group()
def policy() -> None:
    """The site policy of the filter service (gpushare.toml): check a file before a reload.

    filterd reads the policy again on SIGHUP (systemctl reload slurm-gpushare-filterd); a file that is
    not valid is not loaded (the running policy stays, and the log says why). See docs/admin-guide.md.
    """


@policy.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--against", "against", type=click.Path(dir_okay=False),
              help=f"the running policy file (default: the one filterd finds without --policy: {DEFAULT_POLICY} "
                   "when it exists, else the built-in defaults)")
@click.option("--requests", "requests_file", type=click.Path(dir_okay=False),
              help="requests to decide, one per line (--gres=gpushare:mem=10G -p gpu -N 2); default: a built-in "
                   "set for every partition")
@click.option("--machines", "machines_dir", default=DEFAULT_MACHINES, show_default=True,
              type=click.Path(file_okay=False), help="machine descriptions, as filterd's --machines")
def check(file, against, requests_file, machines_dir):
    """Validate FILE and show what sample requests would get under it and under the running policy.

    Exit status 0 when FILE is a valid policy (whatever changes), 2 when it is not (the message says
    what was wrong and what would work), 4 when Slurm cannot be asked for the inventory. The
    inventory is filterd's: --machines joined with sinfo --json and scontrol show partition.
    """
    from slurm_gpushare.errors import InputError
    from slurm_gpushare.slurm import commands
    from slurm_gpushare.submit.cache import PolicySource
    from slurm_gpushare.submit.policycheck import compare, parse_requests
    from slurm_gpushare.submit.policyfile import load_policy

    new = load_policy(file)
    running = PolicySource(Path(against) if against else None, Path(DEFAULT_POLICY))
    try:
        old = running.load()
    except InputError as e:
        raise InputError(f"the running policy cannot be read to compare with: {e}",
                         hint="give --against the file filterd last loaded (its log's 'policy' or 'listening' "
                              "line names it)") from None
    requests = None
    if requests_file:
        try:
            text = Path(requests_file).read_text()
        except OSError as e:
            raise InputError(f"cannot read the requests file {requests_file}: {e.strerror}",
                             hint="one request per line, e.g. --gres=gpushare:mem=10G -p gpu") from None
        requests = parse_requests(text, source=requests_file)
    if not Path(machines_dir).is_dir():
        raise InputError(f"--machines {machines_dir} is not a directory",
                         hint="give the directory filterd reads (its --machines)")
    report = compare(new, old, Path(machines_dir), commands.sinfo_json(), commands.partitions_text(), requests)
    click.echo(report.render(), nl=False)
