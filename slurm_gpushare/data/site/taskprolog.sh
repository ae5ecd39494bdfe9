#!/bin/sh
# slurm-gpushare TaskProlog: runs as the job's user before every task and prints the
# "export NAME=value" lines the Prolog prepared for this job (MPS pipe directory and limits,
# CUDA_VISIBLE_DEVICES for MIG devices, ring order and NIC/core hints for multi-GPU jobs). Plain shell, no Python: a task start must stay cheap.
# RUN_DIR is the node config's run_dir ({node} is replaced by the Slurm node name).
RUN_DIR="/run/slurm-gpushare"
case "$RUN_DIR" in
  *"{node}"*) RUN_DIR="${RUN_DIR%%\{node\}*}${SLURMD_NODENAME}${RUN_DIR#*\{node\}}" ;;
esac
f="$RUN_DIR/jobs/$SLURM_JOB_ID/env"
if [ -r "$f" ]; then cat "$f"; fi
# this task's own part (nearest NIC and cores of its GPU), by local rank
if [ -r "$f.$SLURM_LOCALID" ]; then cat "$f.$SLURM_LOCALID"; fi
exit 0
