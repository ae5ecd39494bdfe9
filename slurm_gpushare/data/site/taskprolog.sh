#!/bin/sh
# slurm-gpushare TaskProlog: runs as the job's user before every task and prints the
# "export NAME=value" lines the Prolog prepared for this job: this task's MIG devices and MPS share GPUs
# as UUIDs in the CUDA_VISIBLE_DEVICES Slurm gave it, the MPS pipe directory and limits to a task that holds
# a GPU of the share; for multi-GPU jobs, where they apply, the NVLink ring order and this task's NIC/core
# hints. Plain shell, no Python: a task start must stay cheap.
# RUN_DIR is the node config's run_dir ({node} is replaced by the Slurm node name).
RUN_DIR="/run/slurm-gpushare"
case "$RUN_DIR" in
  *"{node}"*) RUN_DIR="${RUN_DIR%%\{node\}*}${SLURMD_NODENAME}${RUN_DIR#*\{node\}}" ;;
esac
d="$RUN_DIR/jobs/$SLURM_JOB_ID"
# A run refused here (root's marks, claims.refuse_run): the Prolog requeued it (another job still held its GPUs:
# Slurm 22.05), and slurmd may launch its script before the requeue lands; or it started without its Prolog after
# an earlier run was requeued (slurmd skips the Prolog of a job id still in its credential cache). A mark stays
# until a Prolog lets a later run start. A task of such a run that holds GPUs fails here, so it never starts.
if [ -n "$SLURM_JOB_ID" ] && [ -n "$SLURM_JOB_GPUS$CUDA_VISIBLE_DEVICES" ]; then
  for f in "$RUN_DIR/refused/$SLURM_JOB_ID".*; do
    [ -e "$f" ] || continue
    if [ "${f##*.}" = "${SLURM_RESTART_COUNT:-0}" ]; then
      echo "print gpushare: this run of job $SLURM_JOB_ID was requeued by the Prolog on $SLURMD_NODENAME (its GPUs were still in use by another job); it does not start here and runs again later"
    else
      echo "print gpushare: run ${SLURM_RESTART_COUNT:-0} of job $SLURM_JOB_ID started without its Prolog on $SLURMD_NODENAME after run ${f##*.} was requeued there (its GPUs were in use by another job); it does not start here and runs again later"
    fi
    exit 1
  done
fi
# Slurm's binding is the input: slurmstepd set this task's CUDA_VISIBLE_DEVICES and named the same devices,
# in the same order, by their gres.conf index in SLURM_STEP_GPUS (the batch step: SLURM_JOB_GPUS); a task
# without GPU has neither. devices (" <index>=<UUID> ...") lists the job's devices that must be named by UUID
# (MIG devices; an MPS share's GPUs, which its clients name relative to the job's daemon): each such entry is
# replaced, the others keep Slurm's form (so does an entry Slurm already names by UUID: with AutoDetect=nvml a
# MIG device has a UniqueId, which Slurm prints instead of the index); lists of different lengths leave
# Slurm's value. The MPS variables
# (env) go only to a task that holds a GPU of the share; a step's task without one unsets those inherited
# from the batch step's TaskProlog (forget, below). A job prepared without devices (an older Prolog) gets env.
forget() {
  while IFS= read -r line; do
    line=${line#export }; name=${line%%=*}
    case "$name" in ""|[0-9]*|*[!A-Za-z0-9_]*) continue ;; esac
    eval "cur=\${$name-}"
    if [ "$cur" = "${line#*=}" ]; then echo "unset $name"; fi
  done < "$1"
}
# Under task/cgroup with ConstrainDevices=yes, slurmstepd confines each task of a --gpus-per-task step to its
# own devices but names the step's first device in every task's SLURM_STEP_GPUS (22.05 to 26.05, measured).
# files (" <index>=<device file> ...": a MIG job's devices here) tells them apart: where Slurm names a device
# this task may not open (test -r: the device cgroup's verdict) and the job's devices it may open are as
# many as Slurm named, those, in index order, are this task's own. Otherwise Slurm's names stand.
own() {
  files=$1 denied="" mine="" n=0 m=0
  set -f; IFS=,
  for id in $ids; do
    n=$((n + 1))
    case "$files" in *" $id="*)
      f=${files#* $id=}; f=${f%% *}
      [ ! -e "$f" ] || [ -r "$f" ] || denied=1 ;;
    esac
  done
  unset IFS
  if [ -n "$denied" ]; then
    for e in $files; do
      if [ -r "${e#*=}" ]; then mine="$mine,${e%%=*}"; m=$((m + 1)); fi
    done
    if [ "$m" -eq "$n" ]; then ids=${mine#,}; fi
  fi
  set +f
}
translate() {
  table=$1 out="" hit=""
  set -f; IFS=,
  set -- $CUDA_VISIBLE_DEVICES
  for id in $ids; do
    [ $# -gt 0 ] || { hit=""; break; }
    e=$1; shift
    case "$table" in *" $id="*)
      case "$e" in
        MIG-*|GPU-*) ;;  # Slurm named it by UUID itself (AutoDetect=nvml: UniqueId): keep Slurm's
        *) e=${table#* $id=}; e=${e%% *} ;;
      esac
      hit=1 ;;
    esac
    out="$out,$e"
  done
  [ $# -eq 0 ] || hit=""
  unset IFS; set +f
  [ -n "$hit" ] && echo "export CUDA_VISIBLE_DEVICES=${out#,}"
}
if [ -r "$d/devices" ]; then
  table=""
  read -r table < "$d/devices"
  ids=${SLURM_STEP_GPUS:-$SLURM_JOB_GPUS}
  if [ -n "$CUDA_VISIBLE_DEVICES" ] && [ -r "$d/files" ]; then
    files=""
    read -r files < "$d/files"
    own " $files "
  fi
  if [ -n "$CUDA_VISIBLE_DEVICES" ] && translate " $table "; then
    if [ -r "$d/env" ]; then cat "$d/env"; fi
  elif [ -n "$SLURM_STEP_ID" ] && [ -r "$d/env" ]; then
    forget "$d/env"
  fi
elif [ -r "$d/env" ]; then
  cat "$d/env"
fi
# ring.<k>: the job's k GPUs here in NVLink ring order (written only where node.toml gpu_order lets the
# product order this job). It applies to a task only when nothing asked for a GPU binding (--gpu-bind,
# --gpus-per-task, --tres-bind, --ntasks-per-gpu: Slurm exports them to the job's tasks) and Slurm gave
# this task every one of the k GPUs (its CUDA_VISIBLE_DEVICES, set by slurmstepd before the TaskProlog,
# has k entries): then every named GPU is one the task can open. Otherwise Slurm's value stands.
# A step's tasks inherit what the batch step's TaskProlog exported (srun passes the environment on):
# first unset those of our variables that still hold the batch step's values; what applies to this
# task is exported again below.
# The job directory is not listable by the job's user (mode 0711): every file is opened by its name.
count() { c=0; IFS=,; for x in $1; do c=$((c + 1)); done; unset IFS; }
if [ -n "$SLURM_STEP_ID" ] && [ -n "$GPUSHARE_GPU_RING" ]; then
  count "$GPUSHARE_GPU_RING"  # the batch step's ring names the job's GPUs here: ring.<that many>
  if [ -r "$d/ring.$c" ]; then forget "$d/ring.$c"; fi
  if [ -r "$d/task.1.0" ]; then forget "$d/task.1.0"; fi
fi
ring() {
  [ -z "$GPUSHARE_KEEP_GPU_ORDER$SLURM_GPU_BIND$SLURM_TRES_BIND$SLURM_GPUS_PER_TASK$SLURM_NTASKS_PER_GPU$SLURM_NTASKS_PER_TRES" ] || return 0
  case "$SLURM_TRES_PER_TASK" in *gpu*) return 0 ;; esac
  count "$CUDA_VISIBLE_DEVICES"; k=$c
  count "$SLURM_GTIDS"; n=$c  # this step's tasks on this node (slurmstepd sets it)
  [ -r "$d/ring.$k" ] || return 0
  cat "$d/ring.$k"
  if [ -r "$d/task.$n.$SLURM_LOCALID" ]; then cat "$d/task.$n.$SLURM_LOCALID"; fi
  if [ "$SLURM_LOCALID" = 0 ] && [ -r "$d/note" ]; then
    read -r note < "$d/note"
    echo "print $note Slurm set CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
  fi
}
ring
exit 0
