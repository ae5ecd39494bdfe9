"""slurm_gpushare/slurm"""
