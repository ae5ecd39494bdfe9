"""A stand-in GPU application for simulated nodes: it "uses" fake GPUs as a CUDA program would.

``python -m slurm_gpushare_dev.fakeapp --mem 6G --sm 40 --seconds 10`` run inside a job on the dev
cluster registers itself in the fake NVML's process table
(:class:`~slurm_gpushare.hardware.fake.ProcessTable`, ``GPUSHARE_FAKE_GPU_PROCESSES``), so that every
:class:`~slurm_gpushare.hardware.fake.FakeNvml` of that node (the node monitor's, the Epilog's)
reports it in ``nvmlDeviceGetComputeRunningProcesses`` with that memory and SM utilization while it
runs, and forgets it when it exits. ``--schedule 0:2G:20,3:8G:90`` makes the use change over time.

The GPUs are the ones a CUDA program would see: ``CUDA_VISIBLE_DEVICES`` (NVML indices, ``GPU-``
UUIDs or ``MIG-`` UUIDs, resolved through the node's fake NVML), or ``--devices``. Like the CUDA driver, it
is an MPS client when ``CUDA_MPS_PIPE_DIRECTORY`` names a directory with a control daemon's socket
(``control``) in it, else it runs a context of its own, outside MPS; the process table says which
(``nvmlDeviceGetMPSComputeRunningProcesses`` lists only clients). As under MPS, a client's memory step above its
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for a device fails: the app prints an out-of-memory error at that moment
and exits 2 (cudaMalloc would fail there); so does a step above what the device holds (the GPU's memory, or the
MIG slice's). A process outside MPS has no MPS limit. Where the node's driver keeps a memory limit on the
process's job cgroup (``nvmlDeviceSetMemoryLimits_v1``, as the fake NVML keeps it), a step that would take the
cgroup's processes on a GPU past it fails the same way, inside MPS or outside.

Exit status: 0 done; 2 out of memory (the device, the MPS limit or the cgroup's limit); 64 bad usage or input.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from dataclasses import dataclass

import click

from slurm_gpushare.errors import GpushareError, InputError
from slurm_gpushare.hardware.fake import PROCESS_TABLE_ENV, FakeNvml, ProcessTable, ScheduledProcess
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.hardware.ports import ENV as NVML_ENV
from slurm_gpushare.memsize import format_mib, parse_mib
from slurm_gpushare.node.gpulimit import job_cgroup_dir
from slurm_gpushare.node.membership import CgroupFs, cgroup_jobs, read_cgroup

EXIT_OOM = 2
EXIT_USAGE = 64


def parse_schedule(text: str) -> tuple[tuple[float, int, float | None], ...]:
    """``0:2G:20,3:8G:90`` -> ``((0.0, 2048, 20.0), (3.0, 8192, 90.0))``: seconds after start, memory
    (``M`` by default, ``G``/``T`` suffixes), SM percent (``-`` for none).

    Raises:
        InputError: a step that is not ``SECONDS:SIZE:SM``, times not ascending, SM outside 0-100.
    """
    steps: list[tuple[float, int, float | None]] = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3:
            raise InputError(f"schedule step {item!r} is not SECONDS:SIZE:SM", hint="e.g. 0:2G:20,3:8G:90")
        try:
            t = float(parts[0])
        except ValueError:
            t = math.nan
        if not (math.isfinite(t) and t >= 0):
            raise InputError(f"schedule step {item!r}: {parts[0]!r} is not a number of seconds >= 0")
        mib = parse_mib(parts[1], what="memory")
        sm = None
        if parts[2] != "-":
            try:
                sm = float(parts[2])
            except ValueError:
                raise InputError(f"schedule step {item!r}: SM {parts[2]!r} is not a percentage") from None
            if not 0 <= sm <= 100:  # also refuses nan
                raise InputError(f"schedule step {item!r}: SM {sm:g} is not a percentage (0-100)")
        if steps and t < steps[-1][0]:
            raise InputError(f"schedule times must ascend: {t:g} after {steps[-1][0]:g}")
        steps.append((t, mib, sm))
    return tuple(steps)


def device_memory_mib(port: FakeNvml, device: tuple[int, int | None]) -> int:
    """What a device holds, MiB: the GPU's memory, or the MIG GPU instance profile's."""
    index, gi_id = device
    if gi_id is None:
        return port.memory_total_mib(index)
    inst = next(i for i in port.gpu_instances(index) if i.gi_id == gi_id)
    return next(p.memory_mib for p in port.gpu_instance_profiles(index) if p.name == inst.profile)


def resolve_devices(port: FakeNvml, visible: str) -> list[tuple[int, int | None]]:
    """``CUDA_VISIBLE_DEVICES`` -> ``[(NVML index, MIG GPU instance id or None), ...]``.

    Raises:
        InputError: empty, or an entry no GPU or MIG device of the node has.
    """
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not entries:
        raise InputError("no GPU is visible (CUDA_VISIBLE_DEVICES is empty)",
                         hint="run it in a job that has GPUs, or pass --devices 0")
    by_uuid: dict[str, tuple[int, int | None]] = {}
    for i in range(port.device_count()):
        by_uuid[port.uuid(i)] = (i, None)
        for inst in _instances(port, i):
            by_uuid[inst.uuid] = (i, inst.gi_id)
    out: list[tuple[int, int | None]] = []
    for e in entries:
        if e.isdigit() and int(e) < port.device_count():
            out.append((int(e), None))
        elif e in by_uuid:
            out.append(by_uuid[e])
        else:
            raise InputError(f"CUDA_VISIBLE_DEVICES entry {e!r} is no GPU or MIG device of this node",
                             hint="NVML indices, GPU-... or MIG-... UUIDs")
    return out


def _instances(port: FakeNvml, index: int) -> tuple:
    try:
        return port.gpu_instances(index)
    except GpushareError:  # no MIG on this GPU
        return ()


def own_job_cgroup() -> str | None:
    """This process's job cgroup directory (root's, in Slurm's layout), None outside a job cgroup."""
    text = read_cgroup(os.getpid())
    jobs = {c.job_id for c in cgroup_jobs(text)}
    return job_cgroup_dir(text, jobs.pop(), CgroupFs()) if len(jobs) == 1 else None


def cgroup_limit(port: FakeNvml, device: tuple[int, int | None], cgroup: str | None) -> tuple[int, int] | None:
    """The driver's hard memory limit on the job cgroup ``cgroup`` (:func:`own_job_cgroup`) for a GPU, and what
    the cgroup's other processes hold there now (MiB), as the fake NVML keeps them
    (``nvmlDeviceGetMemoryLimits_v1``); None outside a job cgroup, on a MIG device, or where no limit is set.
    Allocations later made by the other processes are not counted (a real driver counts every allocation as it
    happens)."""
    index, gi_id = device
    if gi_id is not None or cgroup is None:
        return None
    try:
        hard = port.memory_limits(index, cgroup).hard_mib
    except GpushareError:
        return None
    return None if hard is None else (hard, port.cgroup_used_mib(index, cgroup, exclude=os.getpid()))


def mps_limits(text: str) -> dict[int, int]:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``0=10G,1=512M``) -> ``{device ordinal: MiB}``.

    Raises:
        InputError: an entry that is not ``ORDINAL=SIZE``.
    """
    out = {}
    for item in text.split(","):
        if not item.strip():
            continue
        ordinal, _, size = item.partition("=")
        if not ordinal.strip().isdigit() or not size:
            raise InputError(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT entry {item!r} is not ORDINAL=SIZE")
        out[int(ordinal)] = parse_mib(size.strip(), what="MPS memory limit")
    return out


@dataclass(frozen=True)
class Options:
    """The command line's values (``--help`` says what each is)."""

    mem: str = "1G"
    sm: str = "50"
    schedule: str | None = None
    seconds: float = 5.0
    devices: str | None = None
    machine: str | None = None
    table: str | None = None


@click.command(name="fake-gpu-app", help=__doc__.split("\n\n")[0],
               context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--mem", default="1G", help="GPU memory per device (default 1G); ignored with --schedule")
@click.option("--sm", default="50", help="SM utilization percent, '-' for none (default 50)")
@click.option("--schedule", help="SECONDS:SIZE:SM,... memory and SM over time")
@click.option("--seconds", type=float, default=5.0, help="how long to run (default 5)")
@click.option("--devices", help="devices to use (default: CUDA_VISIBLE_DEVICES)")
@click.option("--machine", help="the node's machine description (default: from GPUSHARE_NVML=fake:PATH)")
@click.option("--table", help=f"process table directory (default: {PROCESS_TABLE_ENV})")
def cli(**options) -> int:
    """The command line; returns the exit status (see the module docstring)."""
    return run(Options(**options))


def main(argv: list[str] | None = None) -> int:
    """Run the app with ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

    A usage error (unknown option, a value that is not a number) is one ``fake-gpu-app: error:`` line
    and :data:`EXIT_USAGE`, like bad input, never 2 (:data:`EXIT_OOM`).
    """
    try:
        return cli.main(args=argv, prog_name="python -m slurm_gpushare_dev.fakeapp", standalone_mode=False)
    except click.ClickException as e:
        print(f"fake-gpu-app: error: {' '.join(e.format_message().split())}", file=sys.stderr)
        return EXIT_USAGE


def run(args: Options) -> int:
    """Register, run the schedule for ``args.seconds`` and unregister; returns the exit status."""
    try:
        if not (math.isfinite(args.seconds) and args.seconds >= 0):
            raise InputError(f"--seconds {args.seconds} is not a number of seconds >= 0")
        schedule = parse_schedule(args.schedule or f"0:{args.mem}:{args.sm}")
        spec = os.environ.get(NVML_ENV, "")
        machine_path = args.machine or (spec[5:] if spec.startswith("fake:") else "")
        table_dir = args.table or os.environ.get(PROCESS_TABLE_ENV, "")
        if not machine_path or not table_dir:
            raise InputError("no fake NVML to register with",
                             hint=f"set {NVML_ENV}=fake:PATH and {PROCESS_TABLE_ENV}=DIR (the dev cluster's "
                                  "bin/fake-gpu-app does), or pass --machine and --table")
        if not os.path.isdir(table_dir):
            raise InputError(f"the process table {table_dir} does not exist",
                             hint="the dev cluster creates one per node under <dir>/fake-gpu-procs")
        port = FakeNvml(Machine.load(machine_path), path=machine_path, process_table=table_dir)
        with port:
            devices = resolve_devices(port, args.devices or os.environ.get("CUDA_VISIBLE_DEVICES", ""))
            sizes = [device_memory_mib(port, d) for d in devices]
            cgroup = own_job_cgroup()
            cgroup_limits = [cgroup_limit(port, d, cgroup) for d in devices]
        pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")
        client = bool(pipe) and os.path.exists(os.path.join(pipe, "control"))
        limits = mps_limits(os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")) if client else {}
    except GpushareError as e:
        print(f"fake-gpu-app: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    # the moment a step exceeds what a device holds or its MPS limit, cudaMalloc fails there
    oom_at, oom_msg = None, ""
    for ordinal, size in enumerate(sizes):
        limit = limits.get(ordinal)
        held = cgroup_limits[ordinal]
        for t, mib, _sm in schedule:
            if oom_at is not None and t >= oom_at:
                break
            if mib > size:
                oom_at, why = t, f"the device memory is {format_mib(size)}"
            elif limit is not None and mib > limit:
                oom_at, why = t, f"MPS pinned device memory limit {format_mib(limit)}"
            elif held is not None and held[1] + mib > held[0]:
                oom_at, why = t, (f"its cgroup's device memory limit {format_mib(held[0])}, of which its other "
                                  f"processes hold {format_mib(held[1])}")
            else:
                continue
            oom_msg = f"fake-gpu-app: cudaMalloc of {format_mib(mib)} on device {ordinal} failed: out of memory ({why})"
    if oom_at is not None:
        schedule = tuple(s for s in schedule if s[0] < oom_at) or ((0.0, 0, None),)
    pid = os.getpid()
    table = ProcessTable(table_dir)
    start = time.time()
    table.register([ScheduledProcess(pid, gpu, start, schedule, gi, mps=client) for gpu, gi in devices])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        end = start + (min(args.seconds, oom_at) if oom_at is not None else args.seconds)
        while (left := end - time.time()) > 0:
            time.sleep(min(left, 0.5))
    finally:
        table.unregister(pid)
    if oom_at is not None:
        print(oom_msg, file=sys.stderr)
        return EXIT_OOM
    return 0


if __name__ == "__main__":
    sys.exit(main())
