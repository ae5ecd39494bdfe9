"""MIG layouts that follow demand: every geometry a GPU can hold (:mod:`~slurm_gpushare.mig.geometry`), the
demand from accounting or a file (:mod:`~slurm_gpushare.mig.demand`), the plan (:mod:`~slurm_gpushare.mig.plan`)
what it writes (:mod:`~slurm_gpushare.mig.output`) and applying it to a node (:mod:`~slurm_gpushare.mig.apply`,
the state machine; the layout it reads, :mod:`~slurm_gpushare.mig.layout`; its Slurm calls,
:mod:`~slurm_gpushare.mig.slurmops`; the files it rewrites, :mod:`~slurm_gpushare.mig.files`).
See docs/mig.md.
"""
