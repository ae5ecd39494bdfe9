"""Registers every command module with the ``slurm-gpushare`` group (one import per family)."""

from slurm_gpushare.cli import gres, hardware, service  # noqa: F401
