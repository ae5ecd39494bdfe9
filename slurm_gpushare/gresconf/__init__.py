"""gres.conf and the matching slurm.conf lines for administrators: render from machine descriptions
(:mod:`~slurm_gpushare.gresconf.render`) and judge installed files (:mod:`~slurm_gpushare.gresconf.check`).
"""
