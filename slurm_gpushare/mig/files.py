"""The files ``mig apply`` rewrites: the node's machine description with the instances NVML reports, and
the checks that gres.conf and slurm.conf are files this host may rewrite (not a configless copy)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from slurm_gpushare.atomicfile import write_atomic
from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.hardware.port import NvmlPort


def with_instances(machine: Machine, port: NvmlPort) -> Machine:
    """``machine`` with each MIG GPU's instances as NVML reports them now (``NvmlPort.gpu_instances``)."""
    gpus = []
    for g in machine.gpus:
        if g.mig_enabled:
            g = replace(g, mig_instances=tuple(port.gpu_instances(g.index)))
        gpus.append(g)
    return replace(machine, gpus=tuple(gpus))


def write_keeping_mode(path: Path, text: str) -> bool:
    """Replace ``path`` whole with ``text`` (not when it holds it already), keeping its mode; a symbolic link
    stays one: the file it points to is replaced, atomically, in that file's directory."""
    target = Path(os.path.realpath(path))
    try:
        if target.read_text() == text:
            return False
        mode: int | None = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = None
    write_atomic(target, text, mode=mode)
    return True


#: Where slurmd keeps the files it fetched from slurmctld on a configless node (slurm.conf(5)
#: ``SlurmctldParameters=enable_configless``; slurmd writes them under ``<SlurmdSpoolDir>/conf-cache``, and links
#: ``/run/slurm/conf`` to it): rewriting them changes nothing slurmctld reads, and slurmd replaces them.
CONFIGLESS_DIRS = ("conf-cache", "/run/slurm/conf")


def check_config_file(path: Path, what: str, option: str) -> str:
    """The text of a file apply rewrites, checked before anything changes.

    Raises:
        InputError: missing (a configless node has none of its own), a copy slurmd fetched on a configless
            node, not a regular file, or its directory not writable.
    """
    real = os.path.realpath(path)
    if "conf-cache" in Path(real).parts or real.startswith(CONFIGLESS_DIRS[1] + "/") or \
            str(path).startswith(CONFIGLESS_DIRS[1] + "/"):
        raise InputError(f"{what} {path} is slurmd's copy from slurmctld (configless): rewriting it changes "
                         "nothing slurmctld reads", hint=f"give the file slurmctld reads with {option} (run mig "
                         "apply where it can write it, e.g. a shared /etc/slurm)")
    try:
        text = Path(real).read_text()
    except FileNotFoundError:
        raise InputError(f"{what} {path} does not exist (a configless node has none: slurmd fetches it from "
                         "slurmctld)", hint=f"give the {what} slurmctld reads with {option}, or write one "
                         "first (slurm-gpushare gres-conf)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{what} {path} cannot be read: {e}", hint=f"give a readable {what} with {option}") from None
    if not os.access(os.path.dirname(real), os.W_OK):
        raise InputError(f"{what} {path}: its directory {os.path.dirname(real)} is not writable here",
                         hint="run mig apply as root, on a host that can write it")
    return text
