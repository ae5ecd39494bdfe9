"""``filterd``: run the decision service for job_submit.lua / cli_filter.lua (see slurm_gpushare.submit.service)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from slurm_gpushare.cli import main
from slurm_gpushare.errors import InputError

DEFAULT_SOCKET = "/run/slurm-gpushare/filterd/filterd.sock"
DEFAULT_CONTROLLER_SOCKET = "/run/slurm-gpushare/filterd/controller.sock"
DEFAULT_MACHINES = "/etc/slurm/gpushare/machines"
DEFAULT_POLICY = "/etc/slurm/gpushare/gpushare.toml"


@main.command()
@click.option("--socket", "socket_path", default=DEFAULT_SOCKET, show_default=True,
              help="public unix socket, for cli_filter.lua as the user (gpushare_client.lua's settings.socket)")
@click.option("--controller-socket", "controller_socket", default=DEFAULT_CONTROLLER_SOCKET, show_default=True,
              help="private unix socket (mode 0600, only this service's user and root are served) for "
                   "slurmctld's job_submit.lua (gpushare_client.lua's settings.controller_socket); '' for none")
@click.option("--machines", "machines_dir", default=DEFAULT_MACHINES, show_default=True,
              type=click.Path(file_okay=False), help="directory of <node>.json machine descriptions")
@click.option("--policy", "policy_path", type=click.Path(dir_okay=False),
              help=f"site policy TOML (default: {DEFAULT_POLICY} when it exists, else built-in defaults; "
                   "read again on SIGHUP)")
@click.option("--default-policy", "default_policy", default=DEFAULT_POLICY, show_default=True,
              type=click.Path(dir_okay=False),
              help="without --policy: the policy file used when it exists (else built-in defaults), looked up "
                   "again on SIGHUP; 'slurm-gpushare install' names its --config-dir's gpushare.toml")
@click.option("--refresh", default=30.0, show_default=True, type=click.FloatRange(min=1.0),
              help="seconds between refreshes of Slurm's view (sinfo --json)")
@click.option("--socket-mode", default="0666", show_default=True,
              help="permissions of the socket (cli_filter.lua runs as the submitting user)")
@click.option("--log", "log_path", type=click.Path(dir_okay=False),
              help="append the structured (JSON lines) log to FILE instead of stderr")
@click.option("--pid-file", type=click.Path(dir_okay=False), help="write the service's PID to FILE")
def filterd(socket_path, controller_socket, machines_dir, policy_path, default_policy, refresh, socket_mode, log_path,
            pid_file):
    """Run the gpushare decision service on its unix sockets (foreground; runs as SlurmUser).

    job_submit.lua (on the private --controller-socket, which users can neither connect to nor fill)
    and cli_filter.lua (on the public --socket) send each GPU-share request and get the
    rewritten TRES, the AdminComment audit, or a refusal. The cluster inventory (machine
    descriptions joined with sinfo --json) is reloaded when the directory changes and every
    --refresh seconds. SIGHUP (systemctl reload) reloads the site policy and the inventory together:
    a policy file that is not valid, or that is gone, keeps the policy in force and logs why
    (policy_rejected); check a file first with 'slurm-gpushare policy check FILE'.
    """
    from slurm_gpushare.submit.daemon import serve

    if not Path(machines_dir).is_dir():
        raise InputError(f"--machines {machines_dir} is not a directory",
                         hint="collect the nodes' 'slurm-gpushare inventory' files there")
    try:
        mode = int(socket_mode, 8)
    except ValueError:
        raise InputError(f"--socket-mode {socket_mode!r} is not an octal mode", hint="e.g. 0660") from None
    Path(socket_path).parent.mkdir(parents=True, exist_ok=True)
    if controller_socket:
        if Path(controller_socket) == Path(socket_path):
            raise InputError(f"--controller-socket {controller_socket} is the same path as --socket",
                             hint="give slurmctld a socket of its own, e.g. " + DEFAULT_CONTROLLER_SOCKET)
        Path(controller_socket).parent.mkdir(parents=True, exist_ok=True)
    if pid_file:
        Path(pid_file).write_text(f"{os.getpid()}\n")
    stream = open(log_path, "a", buffering=1) if log_path else sys.stderr
    try:
        sys.exit(serve(Path(socket_path), Path(machines_dir), policy_path=Path(policy_path) if policy_path else None,
                       default_policy_path=Path(default_policy),
                       refresh_s=refresh, socket_mode=mode, log_stream=stream,
                       controller_socket_path=Path(controller_socket) if controller_socket else None))
    finally:
        if pid_file:
            Path(pid_file).unlink(missing_ok=True)
