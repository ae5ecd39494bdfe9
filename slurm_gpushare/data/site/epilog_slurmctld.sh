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
QUEUE="/var/spool/slurm-gpushare/sacct-queue"
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
# without GPUs has no records to wait for, and costs no Python start here. A marked run is queued as one file
# in QUEUE (SlurmUser's own directory, 0700; temp file then mv) for the one long-lived worker (accounting
# sacct-worker: it holds QUEUE/worker.lock, carries every queued run with its own deadline, exits when idle),
# started here, detached, holding the lock this shell took (flock -n: only when it is free). Where QUEUE
# cannot be written, the run is summarised here, in the foreground.
set -- "$SPOOL/runs/$SLURM_JOB_ID.${SLURM_JOB_RESTART_COUNT:-0}."*
if [ -n "$SLURM_JOB_ID" ] && [ -e "$1" ]; then
  entry="$SLURM_JOB_ID.${SLURM_JOB_RESTART_COUNT:-0}.run"
  if (umask 077 && mkdir -p "$QUEUE" &&
      printf 'SLURM_JOB_ID=%s\nSLURM_JOB_RESTART_COUNT=%s\nSLURM_ARRAY_JOB_ID=%s\nSLURM_ARRAY_TASK_ID=%s\nSLURM_JOB_NODELIST=%s\nSLURM_JOB_USER=%s\nSLURM_JOB_START_TIME=%s\n' \
        "$SLURM_JOB_ID" "${SLURM_JOB_RESTART_COUNT:-0}" "$SLURM_ARRAY_JOB_ID" "$SLURM_ARRAY_TASK_ID" \
        "$SLURM_JOB_NODELIST" "$SLURM_JOB_USER" "$SLURM_JOB_START_TIME" >"$QUEUE/.$entry.$$" && mv -f "$QUEUE/.$entry.$$" "$QUEUE/$entry") 2>/dev/null; then
    # waited for until the worker, already in a session of its own (setsid before Python starts), forks
    # (--detach): slurmctld 24.11+ (slurmscriptd) kills the script's process group once the script exits
    if command -v flock >/dev/null 2>&1; then  # the lock taken here, held by the worker on fd 9
      (flock -n 9 && exec setsid $SLURM_GPUSHARE accounting sacct-worker --queue "$QUEUE" --spool "$SPOOL" \
        --lock-fd 9 --detach) 9>>"$QUEUE/worker.lock" </dev/null >>"$QUEUE/worker.log" 2>&1
    else  # the worker takes the lock itself, or exits
      setsid $SLURM_GPUSHARE accounting sacct-worker --queue "$QUEUE" --spool "$SPOOL" --detach \
        </dev/null >>"$QUEUE/worker.log" 2>&1
    fi
  else
    rm -f "$QUEUE/.$entry.$$"
    $SLURM_GPUSHARE accounting sacct-summary --spool "$SPOOL" || rc=$?
  fi
fi
exit $rc
