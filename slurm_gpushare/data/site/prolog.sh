#!/bin/sh
# slurm-gpushare Prolog (slurmd runs it as root when a job starts on the node): Prolog=/etc/slurm/gpushare/prolog.sh
exec /usr/local/bin/slurm-gpushare hook prolog --config /etc/slurm/gpushare/node.toml
