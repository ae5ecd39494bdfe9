"""slurm_gpushare/gresconf"""
