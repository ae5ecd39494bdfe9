#!/bin/sh
# slurm-gpushare Prolog (slurmd runs it as root when a job starts on the node): Prolog=@CONFIG_DIR@/prolog.sh
# 'slurm-gpushare install --role node' writes it from the package's template, naming that installation.
# A job that holds no GPU on this node costs nothing, not even a Python start: slurmd sets SLURM_JOB_GPUS
# and CUDA_VISIBLE_DEVICES in the Prolog's environment only for a job with gpu/shard GRES here (the user
# cannot set them: slurmd builds this environment itself).
if [ -n "$SLURM_JOB_ID" ] && [ -z "$SLURM_JOB_GPUS" ] && [ -z "$CUDA_VISIBLE_DEVICES" ]; then exit 0; fi
exec @SLURM_GPUSHARE@ hook prolog --config @CONFIG_DIR@/node.toml
