#!/bin/sh
# slurm-gpushare EpilogSlurmctld (slurmctld runs it as SlurmUser when a job's allocation ends, while the
# nodes run their Epilogs): EpilogSlurmctld=@CONFIG_DIR@/epilog_slurmctld.sh (slurm-gpushare install
# --role controller writes it with this installation's paths)
# 1. every executable file in BEFORE_DIR, in name order, one after the other: put there (or link there)
#    the site's other slurmctld epilogs, above all those that replace the whole AdminComment with
#    sacctmgr, such as Princeton jobstats' slurmctldepilog.sh (run after ours, it would erase our segment);
# 2. the job's usage segment [gpushare:u1 ...] into its AdminComment in slurmdbd (sacctmgr), read from the
#    nodes' accounting records in SPOOL (where the nodes' spools are readable on this host: a shared
#    mount), keeping what the tools of step 1 wrote (docs/accounting.md).
# The exit status is the last failure's (slurmctld logs it; the job is not affected).
BEFORE_DIR="@CONFIG_DIR@/epilog_slurmctld.d"
SPOOL="/var/spool/slurm-gpushare/accounting"
SLURM_GPUSHARE="@SLURM_GPUSHARE@"
# slurmctld gives the script no PATH (src/slurmctld/job_mgr.c builds its environment); sacct, sacctmgr and
# scontrol are looked up there
PATH="${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}"
export PATH
rc=0
if [ -d "$BEFORE_DIR" ]; then
  for f in "$BEFORE_DIR"/*; do
    if [ -f "$f" ] && [ -x "$f" ]; then
      "$f" || rc=$?
    fi
  done
fi
# 2 only for a run that some node's Prolog marked as holding GPUs (SPOOL/runs/<job>.<restart>.<node>): a job
# without GPUs has no records to wait for, and costs no Python start here
set -- "$SPOOL/runs/$SLURM_JOB_ID.${SLURM_JOB_RESTART_COUNT:-0}."*
if [ -n "$SLURM_JOB_ID" ] && [ -e "$1" ]; then
  $SLURM_GPUSHARE accounting sacct-summary --spool "$SPOOL" || rc=$?
fi
exit $rc
