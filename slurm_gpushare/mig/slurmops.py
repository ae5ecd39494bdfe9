"""The Slurm calls ``mig apply`` makes (:class:`SlurmOps`; the real ones :class:`CommandSlurm`, through
:mod:`slurm_gpushare.slurm`): drain, the node's GPU jobs, reconfigure, the node's GRES as slurmctld holds them,
resume."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from slurm_gpushare.errors import GpushareError, InputError, SlurmError
from slurm_gpushare.slurm import commands
from slurm_gpushare.slurm.node import NodeState, parse_node

#: GRES names that make a job a GPU job for ``wait-jobs``.
_GPU_GRES = ("gpu", "shard")


class SlurmOps(Protocol):
    """The Slurm calls apply makes (the real ones: :class:`CommandSlurm`; tests record them)."""

    def node(self, node: str) -> NodeState:
        """``scontrol show node NODE``; InputError for an unknown node."""

    def drain(self, node: str, reason: str) -> None:
        """Drain with ``reason``."""

    def resume(self, node: str) -> None:
        """Resume."""

    def gpu_jobs(self, node: str) -> list[str]:
        """Job ids with GPU GRES running on the node."""

    def stop_slurmd(self, node: str) -> None:
        """Stop the node's slurmd (nothing when it is stopped)."""

    def start_slurmd(self, node: str) -> None:
        """Start the node's slurmd."""

    def restart_slurmctld(self) -> None:
        """Make slurmctld read slurm.conf and gres.conf anew (a restart, or ``scontrol reconfigure``)."""


@dataclass
class CommandSlurm:
    """:class:`SlurmOps` through the Slurm clients (:mod:`slurm_gpushare.slurm.commands`) and the site's
    commands that stop and start the node's slurmd and restart slurmctld (``{node}`` is replaced by the
    node name). ``restart_slurmctld`` None: ``scontrol reconfigure``, which restarts slurmctld from 23.11 on."""

    stop_command: str = "systemctl stop slurmd"
    start_command: str = "systemctl start slurmd"
    restart_slurmctld_command: str | None = None

    def node(self, node: str) -> NodeState:
        """``scontrol show node NODE`` (commands.show_node).

        Raises:
            InputError: Slurm knows no such node.
            SlurmError: scontrol failed otherwise.
        """
        try:
            return parse_node(commands.show_node(node))
        except SlurmError as e:
            if "not found" in e.message.lower() or "invalid node name" in e.message.lower():
                said = e.message.split(": ", 1)[-1]
                raise InputError(f"node {node} is not in Slurm (scontrol show node: {said}): give a node name "
                                 "from sinfo") from None
            raise

    def drain(self, node: str, reason: str) -> None:
        """commands.drain_node."""
        commands.drain_node(node, reason)

    def resume(self, node: str) -> None:
        """commands.resume_node."""
        commands.resume_node(node)

    def gpu_jobs(self, node: str) -> list[str]:
        """The jobs that hold GPU GRES (``gpu``, ``shard``) on the node as slurmctld allocated them, whatever
        form they asked them in (``--gres``, ``--gpus``, ``--gpus-per-node``, ``--gpus-per-task``, a
        gpushare request): each job with an allocation there (commands.running_jobs, COMPLETING included)
        whose allocated GRES on the node (``gres_detail`` of commands.job_record) has one; a job whose record
        cannot be read counts. When no job does but the node's ``GresUsed=`` (commands.show_node) still
        shows GPU GRES in use, that (``GresUsed=...``) is returned instead: the node is not idle yet.

        Raises:
            SlurmError: squeue or scontrol failed.
        """
        from slurm_gpushare.slurm.job import parse_gres_detail, parse_job_json
        from slurm_gpushare.slurm.release import SCONTROL_JSON

        jobs = commands.running_jobs(node)
        release = commands.local_release()
        # before 23.02 the record is the whole job table (squeue --json): read it once
        table = commands.job_record(jobs[0], release=release) if jobs and release < SCONTROL_JSON else None
        found = []
        for job in jobs:
            try:
                info = parse_job_json(table if table is not None else commands.job_record(job, release=release), job)
            except GpushareError:
                found.append(job)  # ended meanwhile, or unreadable: not known to be idle
                continue
            if any(it.name in _GPU_GRES and (it.count or 0) > 0 for it in info.gres_on(node)):
                found.append(job)
        if found:
            return sorted(found, key=lambda j: (len(j), j))
        gres_used = parse_node(commands.show_node(node)).gres_used
        try:
            used = [it for it in parse_gres_detail(gres_used) if it.name in _GPU_GRES and (it.count or 0) > 0] \
                if gres_used else []
        except InputError:
            used = []
        return [f"(GresUsed={gres_used})"] if used else []

    def stop_slurmd(self, node: str) -> None:
        """Run the stop command (``--stop-slurmd``).

        Raises:
            SlurmError: it failed or took more than 120 s.
        """
        commands.site_command(self.stop_command, node, "--stop-slurmd")

    def start_slurmd(self, node: str) -> None:
        """Run the start command (``--start-slurmd``).

        Raises:
            SlurmError: it failed or took more than 120 s.
        """
        commands.site_command(self.start_command, node, "--start-slurmd")

    def restart_slurmctld(self) -> None:
        """Run ``--restart-slurmctld``, or ``scontrol reconfigure`` without one.

        Raises:
            SlurmError: it failed.
        """
        if self.restart_slurmctld_command is None:
            commands.reconfigure()
        else:
            commands.site_command(self.restart_slurmctld_command, "", "--restart-slurmctld")


#: How many polls in a row (``poll_s`` apart) slurmctld must show the node responding before apply goes on.
STEADY_POLLS = 3
