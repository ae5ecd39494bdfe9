#!/bin/sh
# slurm-gpushare Prolog (slurmd runs it as root when a job starts on the node): Prolog=@CONFIG_DIR@/prolog.sh
# 'slurm-gpushare install --role node' writes it from the package's template, naming that installation.
exec @SLURM_GPUSHARE@ hook prolog --config @CONFIG_DIR@/node.toml
