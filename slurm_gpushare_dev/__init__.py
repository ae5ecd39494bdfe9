"""slurm_gpushare_dev"""
