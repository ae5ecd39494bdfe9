#!/bin/sh
# slurm-gpushare Epilog (slurmd runs it as root when a job ends on the node): Epilog=@CONFIG_DIR@/epilog.sh
# 'slurm-gpushare install --role node' writes it from the package's template, naming that installation.
exec @SLURM_GPUSHARE@ hook epilog --config @CONFIG_DIR@/node.toml
