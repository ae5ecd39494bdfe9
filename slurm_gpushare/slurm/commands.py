"""Slurm commands the product runs (``sinfo``, ``scontrol``, ``squeue``), in one place, with timeouts.

Every function returns the command's text (or, for a plain list of job ids, the ids); parsing is
done by the pure modules (:mod:`slurm_gpushare.submit.inventory`, :mod:`slurm_gpushare.slurm.job`).
pyslurm is not used: it must match the site's Slurm release exactly, and the command-line clients
always do.
"""

from __future__ import annotations

import os
import subprocess

from slurm_gpushare.errors import SlurmError

TIMEOUT_S = 30.0


def run(argv: list[str], *, timeout: float = TIMEOUT_S, env: dict[str, str] | None = None) -> str:
    """Run a Slurm client and return its stdout.

    Raises:
        SlurmError: the program is missing, timed out, or exited non-zero (its stderr is quoted).
    """
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=env if env is not None else os.environ.copy())
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found", hint="install the Slurm client tools (slurm-client)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv)} did not answer within {timeout:.0f} s",
                         hint="is slurmctld up? (scontrol ping)") from None
    if proc.returncode != 0:
        raise SlurmError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[:300]}")
    return proc.stdout


def sinfo_json(**kw) -> str:
    """``sinfo --json``: every node with its configured ``gres``, partitions and state (Slurm 22.05+)."""
    return run(["sinfo", "--json"], **kw)


def partitions_text(**kw) -> str:
    """``scontrol -o show partition``: one line per partition (``Nodes=``, ``Default=``)."""
    return run(["scontrol", "-o", "show", "partition"], **kw)


def show_job(job_id: str | int, **kw) -> str:
    """``scontrol -d show job ID``: the multi-line record, free-text fields (AdminComment) on lines of
    their own, and the per-node GRES detail (``Nodes=... GRES=shard:10(IDX:0)``)."""
    return run(["scontrol", "-d", "show", "job", str(job_id)], **kw)


def running_jobs(node: str, **kw) -> list[str]:
    """Jobs with an allocation on ``node``, sorted, each once:
    ``squeue -h -w NODE -t RUNNING,COMPLETING,CONFIGURING -o %A`` (COMPLETING so that a job stays
    known while its Epilog runs).

    Raises:
        SlurmError: squeue failed.
    """
    out = run(["squeue", "-h", "-w", node, "-t", "RUNNING,COMPLETING,CONFIGURING", "-o", "%A"], **kw)
    return sorted(set(out.split()))


def show_node(node: str, **kw) -> str:
    """``scontrol -d show node NODE``: its GRES, and which device indices are in use (``GresUsed=...(IDX:..)``)."""
    return run(["scontrol", "-d", "show", "node", node], **kw)
