"""The development kit: a throwaway Slurm cluster with simulated GPUs (:mod:`~slurm_gpushare_dev.cluster`)
and a stand-in GPU program for its jobs (:mod:`~slurm_gpushare_dev.fakeapp`).

A user of the product, never imported by it (an import-linter contract).
"""
