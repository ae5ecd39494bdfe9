"""The controller side: what runs behind ``job_submit.lua`` as SlurmUser.

The gpushare request grammar (:mod:`~slurm_gpushare.submit.request`), the site policy file
(:mod:`~slurm_gpushare.submit.policyfile`), the pure rewrite policy (:mod:`~slurm_gpushare.submit.policy`),
the cluster inventory (:mod:`~slurm_gpushare.submit.inventory`) and the filter service on its unix socket
(:mod:`~slurm_gpushare.submit.service`). Nothing here imports NVML, numpy, scipy or networkx (an
import-linter contract): the service must start and answer fast.
"""
