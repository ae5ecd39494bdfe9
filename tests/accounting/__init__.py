"""Tests of slurm_gpushare.accounting and slurm_gpushare.accounting.report."""
