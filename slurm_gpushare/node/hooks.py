"""Prolog and Epilog: set up and tear down each job's GPU share on the node; ``doctor`` repairs leftovers.

Run by slurmd as root (``Prolog=``/``Epilog=`` wrappers in ``etc/`` call ``slurm-gpushare hook
prolog|epilog``). Per job and node, everything lives in one directory,
``<run_dir>/jobs/<job id>/``:

* ``state.json``: what the Prolog decided and started (kind, GPUs, limits, phase);
* ``env``: ``export NAME=value`` lines that the TaskProlog (``etc/taskprolog.sh``, a few lines of
  shell, no Python) prints before every task;
* ``mps/pipe``, ``mps/log``: the job's own MPS control daemon's directories (owned by the job's
  user, mode 0700).

Decisions come from trusted inputs only (:mod:`slurm_gpushare.node.plan`). Every step is idempotent
and guarded by a per-job lock (``fcntl.flock``), so concurrent Prologs and Epilogs of different jobs
never block each other and a retried or half-finished one is repaired by the next. The exit status is
non-zero (which drains the node) only for node faults, after setting a drain reason that says what
to fix; a user's bad request was refused at submit time and never gets here.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from slurm_gpushare.errors import GpushareError, InputError
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.hardware.port import read_uuids
from slurm_gpushare.hardware.ports import open_nvml
from slurm_gpushare.node.config import NodeConfig
from slurm_gpushare.node.mps import MpsDaemon, MpsError, MpsSettings
from slurm_gpushare.node.plan import JobPlan, plan_job
from slurm_gpushare.slurm import commands as slurm
from slurm_gpushare.slurm.job import JobInfo, parse_show_job
from slurm_gpushare.slurm.nodegres import GresOptions, node_gres

STATE_VERSION = 1


class NodeFault(GpushareError):
    """A problem of the node (not of the job): the hook exits non-zero and the node is drained."""


@dataclass(frozen=True)
class HookContext:
    """What a hook runs with: the node's settings and name, and how to reach Slurm (injectable)."""

    config: NodeConfig
    node: str
    show_job: object = slurm.show_job  # callable(job_id) -> text of `scontrol -d show job`
    show_node: object = slurm.show_node  # callable(node) -> text of `scontrol -d show node`
    drain: object = None  # callable(node, reason); default: scontrol update

    @property
    def run_dir(self) -> Path:
        return self.config.run_dir_for(self.node)

    def job_dir(self, job_id: str) -> Path:
        return self.run_dir / "jobs" / job_id

    def mps(self, job_id: str, plan: JobPlan | None = None, *, base: Path | None = None) -> MpsDaemon:
        """The MPS daemon of a job (``<job dir>/mps``), or the shared one under ``base``."""
        d = base if base is not None else self.job_dir(job_id) / "mps"
        settings = MpsSettings(control_binary=self.config.mps_control,
                               start_timeout_s=self.config.mps_start_timeout,
                               quit_timeout_s=self.config.mps_quit_timeout)
        return MpsDaemon(d / "pipe", d / "log", settings=settings,
                         visible_devices=plan.visible_devices if plan else "",
                         uid=plan.uid if plan and plan.uid >= 0 else None,
                         gid=plan.gid if plan and plan.gid >= 0 else None,
                         extra_env=dict(self.config.mps_env))

    def do_drain(self, reason: str) -> None:
        if self.drain is not None:
            self.drain(self.node, reason)
            return
        try:
            slurm.run(["scontrol", "update", f"nodename={self.node}", "state=drain", f"reason={reason[:250]}"])
        except GpushareError:
            pass  # slurmd drains the node anyway when the hook fails; the reason is then Slurm's


@contextmanager
def job_lock(job_dir: Path, *, remove: bool = False):
    """Exclusive lock for one job's directory (a file next to it, so removing the directory is safe).

    With ``remove``, the lock file is unlinked before the lock is released (the Epilog, once the job
    is gone). A waiter that then gets the lock on the unlinked file notices (the path no longer names
    the file it locked) and locks the new one: the classic lock-file race, closed.
    """
    job_dir.parent.mkdir(parents=True, exist_ok=True)
    lock = job_dir.parent / f".{job_dir.name}.lock"
    while True:
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        if remove:
            try:
                lock.unlink()
            except FileNotFoundError:
                pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _export_line(name: str, value: str) -> str:
    """``export NAME=value`` for the TaskProlog. slurmd takes the value literally (no shell quoting),
    so a value must be one line."""
    if "\n" in value or "\n" in name:
        raise InputError(f"environment value for {name} spans lines: {value!r}")
    return f"export {name}={value}\n"


def read_state(job_dir: Path) -> dict | None:
    """The job's state.json, or None when missing or unreadable (a Prolog that died half-way)."""
    try:
        return json.loads((job_dir / "state.json").read_text())
    except (OSError, ValueError):
        return None


def _job_info(ctx: HookContext, job_id: str) -> JobInfo:
    last: Exception | None = None
    for delay in (0, 0.5, 1.0):
        time.sleep(delay)
        try:
            return parse_show_job(ctx.show_job(job_id), job_id)
        except GpushareError as e:
            last = e
    raise NodeFault(f"cannot read job {job_id} from slurmctld: {last}",
                    hint="check that this node reaches slurmctld (scontrol ping)")


def _plan(ctx: HookContext, info: JobInfo) -> JobPlan:
    return _plan_with_machine(ctx, info)[0]


def _plan_with_machine(ctx: HookContext, info: JobInfo):
    try:
        machine = Machine.load(ctx.config.machine_for(ctx.node))
    except GpushareError as e:
        raise NodeFault(f"no usable machine description for {ctx.node}: {e}",
                        hint="write it with 'slurm-gpushare inventory -o' on the node") from None
    gres = node_gres(machine, ctx.node, GresOptions(shard_unit_mib=ctx.config.shard_unit_mib))
    try:
        with open_nvml() as port:
            gpu_uuids, mig_uuids = read_uuids(port, machine.gpus)
    except GpushareError as e:
        raise NodeFault(f"NVML failed on {ctx.node}: {e}", hint="check the driver (nvidia-smi)") from None
    try:
        plan = plan_job(info, ctx.node, gres, gpu_uuids=gpu_uuids, mig_uuids=mig_uuids,
                        shard_unit_mib=ctx.config.shard_unit_mib,
                        low_priority_partitions=ctx.config.low_priority_partitions)
    except InputError as e:
        raise NodeFault(e.message, hint=e.hint) from None
    return plan, machine.with_gpu_uuids(gpu_uuids), gres


def prolog(ctx: HookContext, env: dict[str, str]) -> int:
    """Prepare the job's share on this node. Returns the exit status (non-zero drains the node).

    Jobs without GPU GRES on this node (Slurm sets no ``SLURM_JOB_GPUS``/``CUDA_VISIBLE_DEVICES``
    in the Prolog's environment for them) cost nothing: no Slurm call, no file.
    """
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        raise InputError("SLURM_JOB_ID is not set: run this as slurmd's Prolog")
    if not (env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES")):
        return 0
    try:
        info = _job_info(ctx, job_id)
        plan, machine, gres = _plan_with_machine(ctx, info)
        if plan.kind == "none" or (plan.kind == "gpu" and len(plan.gpu_indices) < 2):
            return 0
        job_dir = ctx.job_dir(job_id)
        with job_lock(job_dir):
            if plan.kind == "gpu":
                _prepare_topology(ctx, info, plan, machine, gres, job_dir)
            else:
                _prepare(ctx, plan, job_dir)
    except NodeFault as e:
        ctx.do_drain(f"gpushare prolog job {job_id}: {e}")
        raise
    return 0


def _prepare(ctx: HookContext, plan: JobPlan, job_dir: Path) -> None:
    job_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(job_dir, 0o755)
    state = {"version": STATE_VERSION, "phase": "starting", "plan": asdict(plan)}
    prev = read_state(job_dir)
    if prev and prev.get("phase") == "ready" and (job_dir / "env").exists():
        return  # a retried Prolog: everything is in place
    _write(job_dir / "state.json", json.dumps(state))
    env: dict[str, str] = plan.env()
    if plan.kind == "mps" and ctx.config.mps_mode == "per-gpu" and len(plan.gpu_indices) == 1 and plan.uid >= 0:
        shared = shared_dir(ctx, plan.gpu_indices[0], plan.uid)
        state["shared"] = str(shared)
        _write(job_dir / "state.json", json.dumps(state))
        daemon = _join_shared(ctx, plan, shared)
        env = plan.env(pipe_dir=str(daemon.pipe_dir), log_dir=str(daemon.log_dir))
    elif plan.kind == "mps":
        daemon = ctx.mps(plan.job_id, plan)
        daemon.stop()  # leftovers of a Prolog that died half-way
        try:
            daemon.start()
            if plan.mem_limit_mib is not None:
                for i in range(len(plan.gpu_indices)):
                    daemon.set_pinned_mem_limit(i, plan.mem_limit_mib)
            if plan.sm_percent is not None:
                daemon.set_active_thread_percentage(plan.sm_percent)
            _client_priority(daemon, plan)
        except MpsError as e:
            daemon.stop()
            raise NodeFault(f"MPS control daemon for job {plan.job_id} failed: {e}",
                            hint=f"check {ctx.config.mps_control} and the driver") from None
        env = plan.env(pipe_dir=str(daemon.pipe_dir), log_dir=str(daemon.log_dir))
    _write(job_dir / "env", "".join(_export_line(k, v) for k, v in env.items()))
    state["phase"] = "ready"
    _write(job_dir / "state.json", json.dumps(state))


def _free_before(ctx: HookContext, gres, plan: JobPlan) -> tuple[int, ...]:
    """NVML indices of the node's whole GPUs that were free when Slurm chose this job's: not in use
    by another job's GPUs or shards (``scontrol -d show node``: ``GresUsed=...(IDX:..)``)."""
    from slurm_gpushare.slurm.job import parse_gres_detail

    devices = [r for r in gres.records if r.name == "gpu"]
    text = ctx.show_node(ctx.node)
    used_text = next((kv.split("=", 1)[1] for line in text.splitlines() for kv in line.split()
                      if kv.startswith("GresUsed=")), "")
    used = {i for a in parse_gres_detail(used_text) if a.name in ("gpu", "shard") for i in a.indices}
    busy = {devices[i].gpu_index for i in used if i < len(devices)} - set(plan.gpu_indices)
    return tuple(r.gpu_index for r in devices if r.mig_gi is None and r.gpu_index not in busy)


def _prepare_topology(ctx: HookContext, info: JobInfo, plan: JobPlan, machine: Machine, gres,
                      job_dir: Path) -> None:
    """A multi-GPU whole-GPU job: audit Slurm's choice against the best free set, and bind tasks.

    The audit (:func:`slurm_gpushare.topology.placement.audit`) goes to state.json (accounting reads it) and,
    when the job got a worse set than was free, to slurmd's log. The tasks get the GPUs in ring order
    along NVLink and, per local rank, the nearest NIC and cores (:mod:`slurm_gpushare.topology.binding`):
    ``env`` for all tasks, ``env.<local id>`` for one (the TaskProlog prints both).
    """
    from slurm_gpushare.topology.binding import bind
    from slurm_gpushare.topology.hops import hop_matrix
    from slurm_gpushare.topology.placement import audit

    job_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(job_dir, 0o755)
    order = sorted(g.index for g in machine.gpus)
    pos = {g: i for i, g in enumerate(order)}
    numa = [machine.gpu(g).numa_node for g in order]
    hop = hop_matrix(machine)
    try:
        free = _free_before(ctx, gres, plan)
        result = audit(hop, [pos[g] for g in plan.gpu_indices], [pos[g] for g in free], numa)
        placement = {"given": [order[i] for i in result.allocated], "best": [order[i] for i in result.best.gpus],
                     "cost_given": round(result.cost_given, 4), "cost_best": round(result.cost_best, 4),
                     "excess": round(result.excess, 4), "free_before": list(free)}
    except GpushareError as e:
        placement = {"error": str(e)}
    if placement.get("excess", 0) > 1e-9:
        print(f"slurm-gpushare prolog: job {plan.job_id} got GPUs {placement['given']} (cost "
              f"{placement['cost_given']}) while {placement['best']} (cost {placement['cost_best']}) were free",
              file=sys.stderr)
    binding = bind(machine, plan.gpu_indices, ntasks=len(plan.gpu_indices))
    _write(job_dir / "env", "".join(_export_line(k, v) for k, v in binding.job_environment().items()))
    for local in range(len(binding.tasks)):
        task_env = binding.task_environment(local)
        extra = {k: v for k, v in task_env.items() if k not in binding.job_environment()}
        _write(job_dir / f"env.{local}", "".join(_export_line(k, v) for k, v in extra.items()))
    state = {"version": STATE_VERSION, "phase": "ready", "plan": asdict(plan), "placement": placement,
             "binding": binding.to_dict()}
    _write(job_dir / "state.json", json.dumps(state))


def epilog(ctx: HookContext, env: dict[str, str]) -> int:
    """Tear down what the Prolog prepared (or half-prepared). Returns the exit status."""
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        raise InputError("SLURM_JOB_ID is not set: run this as slurmd's Epilog")
    job_dir = ctx.job_dir(job_id)
    if env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or job_dir.exists():
        record_usage(ctx, env, read_state(job_dir) or {})
    if not job_dir.exists():
        return 0
    problem = None
    with job_lock(job_dir, remove=True):
        problem = cleanup_job(ctx, job_id)
    if problem:
        ctx.do_drain(problem)
        return 1
    return 0


def _client_priority(daemon: MpsDaemon, plan: JobPlan) -> None:
    """Set the daemon's default client priority where the driver has the command (CUDA 11.8+ MPS);
    an older driver that refuses it is not a node fault: the job's environment still asks for it."""
    if plan.client_priority is None:
        return
    try:
        daemon.set_client_priority(plan.client_priority)
    except MpsError:
        pass


def shared_dir(ctx: HookContext, gpu: int, uid: int) -> Path:
    """The shared daemon of one GPU and one user (``mps_mode = "per-gpu"``)."""
    return ctx.run_dir / "shared" / f"gpu{gpu}-uid{uid}"


def _members(d: Path) -> dict[str, dict]:
    try:
        return json.loads((d / "jobs.json").read_text())
    except (OSError, ValueError):
        return {}


def _join_shared(ctx: HookContext, plan: JobPlan, d: Path) -> MpsDaemon:
    """Add the job to the GPU's shared daemon of its user, starting the daemon for the first job.

    An MPS control daemon runs one server per user at a time (NVIDIA: a server of another user must
    wait until the first user's clients are done), so a daemon is shared only by one user's jobs on
    one GPU; other users' jobs get their own. The server-side default pinned-memory limit is the
    largest share among the jobs (a running server is raised to it with
    ``set_device_pinned_mem_limit``); each job's own share is in its client environment. docs/mps.md
    explains what that does and does not enforce.
    """
    with job_lock(d):
        d.mkdir(parents=True, exist_ok=True)
        daemon = ctx.mps(plan.job_id, plan, base=d)
        members = _members(d)
        try:
            if not daemon.alive():
                daemon.stop()
                members = {}
                daemon.start()
            members[plan.job_id] = {"mem_limit_mib": plan.mem_limit_mib, "sm_percent": plan.sm_percent}
            limits = [m["mem_limit_mib"] for m in members.values() if m.get("mem_limit_mib")]
            if limits:
                daemon.set_pinned_mem_limit(0, max(limits))
                for pid in daemon.command("get_server_list").split():
                    if pid.isdigit():
                        daemon.command(f"set_device_pinned_mem_limit {pid} 0 {max(limits)}M")
            shares = [m.get("sm_percent") or 100 for m in members.values()]
            if max(shares) < 100:
                daemon.set_active_thread_percentage(max(shares))
        except MpsError as e:
            if not members or list(members) == [plan.job_id]:
                daemon.stop()
            raise NodeFault(f"shared MPS control daemon {d} for job {plan.job_id} failed: {e}",
                            hint=f"check {ctx.config.mps_control} and the driver") from None
        _write(d / "jobs.json", json.dumps(members))
        return daemon


def _leave_shared(ctx: HookContext, job_id: str, d: Path) -> str | None:
    """Remove the job from a shared daemon; the last job stops it. Returns a drain reason if stuck."""
    with job_lock(d, remove=False):
        members = _members(d)
        members.pop(job_id, None)
        if members:
            _write(d / "jobs.json", json.dumps(members))
            return None
        result = ctx.mps(job_id, base=d).stop()
        stuck = list(getattr(result, "survivors", ()) or ())
        if stuck and ctx.config.drain_on_stuck_daemon:
            return (f"gpushare: shared MPS daemon {d} (pid {', '.join(map(str, stuck))}) survives SIGKILL: "
                    "check the GPU and the driver, then run 'slurm-gpushare doctor --repair'")
        shutil.rmtree(d, ignore_errors=True)
        return None


def record_usage(ctx: HookContext, env: dict[str, str], state: dict) -> int:
    """Append the finished job's per-GPU records to the node's accounting spool (docs/accounting.md).

    Never fails the Epilog: a record that cannot be built or written is reported on stderr (slurmd's
    log) with the job id, and the node stays up. Peak memory and SM utilization come from the node
    monitor's usage file (``<run_dir>/usage/<job>.json``, :mod:`slurm_gpushare.accounting.live`),
    removed once the records are spooled; without one (no monitor ran) they are "no data".

    Returns:
        the number of records written.
    """
    from slurm_gpushare.accounting import Spool, exit_from_env
    from slurm_gpushare.accounting.live import load_usage, remove_usage
    from slurm_gpushare.accounting.record import exit_from_code
    from slurm_gpushare.node.records import records_for_job

    job_id = env.get("SLURM_JOB_ID", "")
    try:
        usage = load_usage(ctx.run_dir, job_id)
    except GpushareError as e:
        print(f"slurm-gpushare epilog: job {job_id}: monitor usage not used: {e}", file=sys.stderr)
        usage = None
    try:
        info = parse_show_job(ctx.show_job(job_id), job_id)
        if not info.gres_on(ctx.node):
            # slurmctld drops the per-node GRES detail once the job completes (``GRES=`` is empty in
            # the Epilog): take the devices from slurmd's own environment, SLURM_JOB_GPUS
            info = replace(info, gres={**info.gres, ctx.node: _gres_from_env(info, env)})
        if (state.get("plan") or {}).get("kind") in ("mps", "mig", "gpu"):
            p = state["plan"]
            plan = JobPlan(**{**p, "gpu_indices": tuple(p.get("gpu_indices", ()))})
            machine = _machine_with_uuids(ctx)
        else:
            plan, machine, _gres = _plan_with_machine(ctx, info)
        placement = state.get("placement") or {}
        exit_state, exit_code = exit_from_env(env)
        if info.exit_code and info.exit_code != "0:0":
            # scancel and time limits reach the Epilog as 0:0; slurmctld already holds the signal (0:15)
            exit_state, exit_code = exit_from_code(info.exit_code)
        end = int(time.time())
        records = records_for_job(
            info, plan, machine, node=ctx.node, start=info.start_time or end, end=end,
            exit_state=exit_state, exit_code=exit_code, gpu_uuids={g.index: g.uuid for g in machine.gpus},
            account=info.account, array_job_id=info.array_job_id, array_task_id=info.array_task_id,
            placement_cost=placement.get("cost_given"), usage=usage)
        if records:
            Spool(ctx.config.spool_dir, node=ctx.node).append(records)
        if usage is not None:
            remove_usage(ctx.run_dir, job_id)
        return len(records)
    except GpushareError as e:
        print(f"slurm-gpushare epilog: job {job_id}: accounting record not written: {e}", file=sys.stderr)
        return 0


def _gres_from_env(info: JobInfo, env: dict[str, str]):
    """The job's GPU devices on this node from slurmd's Epilog environment (``SLURM_JOB_GPUS=0,2``),
    typed as the job's TresPerNode says (``gres:gpu:a100:2`` -> ``gpu:a100``)."""
    from slurm_gpushare.slurm.gres import GresItem, parse
    from slurm_gpushare.slurm.hostlist import format_ranges, parse_id_list

    job_gpus = env.get("SLURM_JOB_GPUS", "")
    if not job_gpus:
        return ()
    indices = parse_id_list(job_gpus)
    tres = info.tres_per_node if info.tres_per_node != "(null)" else ""
    held = [it for it in parse(tres) if it.name in ("gpu", "shard")]
    name, gtype = (held[-1].name, held[-1].type) if held else ("gpu", "")
    count = len(indices) if name == "gpu" else held[-1].amount
    return (GresItem(name, gtype, count, f"IDX:{format_ranges(indices)}"),)


def _machine_with_uuids(ctx: HookContext) -> Machine:
    """The node's machine description with NVML's GPU UUIDs (``nvmlDeviceGetUUID``; descriptions made
    from ``nvidia-smi topo -m`` text have none). When NVML fails the description's stand."""
    try:
        machine = Machine.load(ctx.config.machine_for(ctx.node))
    except GpushareError as e:
        raise NodeFault(f"no usable machine description for {ctx.node}: {e}") from None
    try:
        with open_nvml() as port:
            uuids, _mig = read_uuids(port, machine.gpus)
    except GpushareError as e:
        print(f"slurm-gpushare epilog: GPU UUIDs from the machine description: NVML failed ({e})", file=sys.stderr)
        return machine
    return machine.with_gpu_uuids(uuids)


def cleanup_job(ctx: HookContext, job_id: str) -> str | None:
    """Stop the job's MPS daemon and remove its directory. Returns a drain reason when a process is stuck."""
    job_dir = ctx.job_dir(job_id)
    shared = (read_state(job_dir) or {}).get("shared")
    if shared:
        problem = _leave_shared(ctx, job_id, Path(shared))
        if problem:
            return problem
    result = ctx.mps(job_id).stop()
    stuck = list(getattr(result, "survivors", ()) or ())
    if stuck and ctx.config.drain_on_stuck_daemon:
        return (f"gpushare: MPS daemon of job {job_id} (pid {', '.join(map(str, stuck))}) survives SIGKILL: "
                f"check the GPU and the driver, then run 'slurm-gpushare doctor --repair'")
    shutil.rmtree(job_dir, ignore_errors=True)
    return None


@dataclass(frozen=True)
class Finding:
    """One thing ``doctor`` found: what, and what it did or would do."""

    job_id: str
    problem: str
    action: str


def _compute_modes(ctx: HookContext, repair: bool, port=None) -> list[Finding]:
    """GPUs left in a compute mode other than DEFAULT (nothing of ours sets one: several jobs' MPS
    servers share a GPU, which EXCLUSIVE_PROCESS would forbid). ``nvmlDeviceGetComputeMode``."""
    try:
        machine = Machine.load(ctx.config.machine_for(ctx.node))
    except GpushareError:
        return []
    out = []
    try:
        with (port or open_nvml()) as p:
            for g in machine.gpus:
                mode = p.compute_mode(g.index)
                if mode != "DEFAULT":
                    action = "would set it to DEFAULT"
                    if repair:
                        p.set_compute_mode(g.index, "DEFAULT")
                        action = "set it to DEFAULT"
                    out.append(Finding("-", f"GPU {g.index} is in compute mode {mode}", action))
    except GpushareError as e:
        out.append(Finding("-", f"compute modes not checked: NVML failed ({e})", "nothing done"))
    return out


def doctor(ctx: HookContext, *, repair: bool, running_jobs: set[str] | None = None, port=None) -> list[Finding]:
    """Find leftovers on this node: job directories and MPS daemons of jobs no longer running here,
    shared daemons listing such jobs, dead daemons of running jobs, GPUs left in a non-DEFAULT
    compute mode. With ``repair``, clean up and restart what can be.

    Args:
        running_jobs: ids of jobs running on this node (default: asks slurmctld with ``squeue``).
        port: the NVML port for the compute modes (default: :func:`open_nvml`).
    """
    jobs_dir = ctx.run_dir / "jobs"
    shared_root = ctx.run_dir / "shared"
    findings: list[Finding] = _compute_modes(ctx, repair, port)
    if not jobs_dir.is_dir() and not shared_root.is_dir():
        return findings
    if running_jobs is None:
        out = slurm.run(["squeue", "-h", "-w", ctx.node, "-t", "RUNNING,COMPLETING,CONFIGURING", "-o", "%A"])
        running_jobs = set(out.split())
    for d in sorted(p for p in shared_root.glob("*") if p.is_dir()):
        gone = sorted(set(_members(d)) - running_jobs)
        if gone or not _members(d):
            action = "would remove them (and stop the daemon when none is left)"
            if repair:
                problem = None
                for job_id in gone or ["-"]:
                    problem = _leave_shared(ctx, job_id, d) or problem
                action = problem or "removed them; the daemon stops with its last job"
            findings.append(Finding(",".join(gone) or "-",
                                    f"shared MPS daemon {d.name} lists jobs not running here", action))
    for d in sorted(p for p in jobs_dir.glob("*") if p.is_dir()):
        job_id = d.name
        state = read_state(d)
        if job_id not in running_jobs:
            action = "stopped its MPS daemon and removed its directory" if repair else "would clean up"
            problem = None
            if repair:
                with job_lock(d, remove=True):
                    problem = cleanup_job(ctx, job_id)
            findings.append(Finding(job_id, f"job {job_id} is not running here but left {d}",
                                    problem or action))
            continue
        plan = (state or {}).get("plan") or {}
        if plan.get("kind") == "mps" and not ctx.mps(job_id).alive():
            action = "would restart it"
            if repair:
                with job_lock(d):
                    _restart(ctx, job_id, plan, d)
                action = "restarted it with the job's limits"
            findings.append(Finding(job_id, f"MPS daemon of running job {job_id} is not running", action))
    return findings


def _restart(ctx: HookContext, job_id: str, plan_fields: dict, job_dir: Path) -> None:
    plan = JobPlan(**{**plan_fields, "gpu_indices": tuple(plan_fields.get("gpu_indices", ()))})
    (job_dir / "state.json").unlink(missing_ok=True)
    _prepare(ctx, plan, job_dir)
