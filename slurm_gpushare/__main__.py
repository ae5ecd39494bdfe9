"""``python -m slurm_gpushare ...`` is the ``slurm-gpushare`` command."""

from slurm_gpushare.cli import main

main(prog_name="slurm-gpushare")
