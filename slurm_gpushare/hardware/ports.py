"""Choosing the NVML port: the real one, or the fake built from a machine description.

Entry points call :func:`open_nvml`; nothing else decides. ``GPUSHARE_NVML=fake:/path/machine.json``
(or ``spec=``) serves the same production code path from a description, which is how the dev
cluster's simulated nodes, the demo and the tests run without GPUs.
"""

from __future__ import annotations

import os

from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.hardware.port import NvmlPort

ENV = "GPUSHARE_NVML"


def open_nvml(spec: str | None = None) -> NvmlPort:
    """Return an (uninitialised) NVML port.

    Args:
        spec: ``nvml`` (default: the real library through pynvml) or ``fake:PATH`` (a
            :class:`~slurm_gpushare.hardware.fake.FakeNvml` serving the machine description at
            PATH, which its MIG changes are written back to; with
            ``GPUSHARE_FAKE_GPU_PROCESSES=DIR`` its processes include the live entries of
            that :class:`~slurm_gpushare.hardware.fake.ProcessTable`).
            Default: the ``GPUSHARE_NVML`` environment variable, else ``nvml``.

    Raises:
        InputError: an unknown spec.
        MachineDescriptionError: the fake's description cannot be read.
    """
    spec = spec or os.environ.get(ENV) or "nvml"
    if spec == "nvml":
        from slurm_gpushare.hardware.nvml import RealNvml

        return RealNvml()
    if spec.startswith("fake:") and len(spec) > 5:
        from slurm_gpushare.hardware.fake import PROCESS_TABLE_ENV, FakeNvml

        return FakeNvml(Machine.load(spec[5:]), process_table=os.environ.get(PROCESS_TABLE_ENV) or None,
                        path=spec[5:])
    raise InputError(f"{ENV}={spec!r} is not an NVML port", hint="use 'nvml' or 'fake:/path/machine.json'")
