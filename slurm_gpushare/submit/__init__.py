"""slurm_gpushare/submit"""
