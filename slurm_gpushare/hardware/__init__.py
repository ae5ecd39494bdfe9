"""The hardware port: machine descriptions and the NVML interface (real and fake).

Only :mod:`slurm_gpushare.hardware.nvml` imports ``pynvml``, and only when a real port is opened.
"""
