"""Registers every command module with the ``slurm-gpushare`` group (one import per family)."""

from slurm_gpushare.cli import accounting, gres, hardware, install, mig, node, placement, policy, service  # noqa: F401
