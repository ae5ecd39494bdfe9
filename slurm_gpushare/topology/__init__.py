"""GPU topology: the hop matrix and Slurm ``Links=`` (:mod:`~slurm_gpushare.topology.hops`), the placement
engine (:mod:`~slurm_gpushare.topology.placement`) and task binding along NVLink
(:mod:`~slurm_gpushare.topology.binding`).
"""
