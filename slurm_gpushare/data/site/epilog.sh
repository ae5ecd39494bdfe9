#!/bin/sh
# slurm-gpushare Epilog (slurmd runs it as root when a job ends on the node): Epilog=@CONFIG_DIR@/epilog.sh
# 'slurm-gpushare install --role node' writes it from the package's template, naming that installation.
# A job that held no GPU on this node (no SLURM_JOB_GPUS/CUDA_VISIBLE_DEVICES in slurmd's environment) and
# for which nothing was prepared here (no job directory in the run dir, RUN_DIR: node.toml's run_dir as
# installed) ends without a Python start.
RUN_DIR="@RUN_DIR@"
case "$RUN_DIR" in
  *"{node}"*) RUN_DIR="${RUN_DIR%%\{node\}*}${SLURMD_NODENAME}${RUN_DIR#*\{node\}}" ;;
esac
if [ -n "$SLURM_JOB_ID" ] && [ -z "$SLURM_JOB_GPUS" ] && [ -z "$CUDA_VISIBLE_DEVICES" ] &&
   [ ! -e "$RUN_DIR/jobs/$SLURM_JOB_ID" ]; then exit 0; fi
exec @SLURM_GPUSHARE@ hook epilog --config @CONFIG_DIR@/node.toml
