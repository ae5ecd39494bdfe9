"""Registers every command module with the ``slurm-gpushare`` group (one import per family)."""
