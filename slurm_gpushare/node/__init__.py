"""slurm_gpushare/node"""
