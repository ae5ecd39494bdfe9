"""slurm-gpushare: safe, topology-aware GPU sharing for Slurm.

Importing this package does nothing: no NVML initialisation, no Slurm call, no file opened.
"""

__version__ = "0.1.0"
