"""slurm_gpushare/topology"""
