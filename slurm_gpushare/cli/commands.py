"""Registers every command module with the ``slurm-gpushare`` group (one import per family)."""

from slurm_gpushare.cli import gres, hardware, node, service  # noqa: F401
