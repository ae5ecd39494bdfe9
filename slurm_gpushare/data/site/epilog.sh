#!/bin/sh
# slurm-gpushare Epilog (slurmd runs it as root when a job ends on the node): Epilog=/etc/slurm/gpushare/epilog.sh
exec /usr/local/bin/slurm-gpushare hook epilog --config /etc/slurm/gpushare/node.toml
