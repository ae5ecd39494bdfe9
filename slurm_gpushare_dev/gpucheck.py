"""``scripts/gpu-check``: one prepared check, on a machine with a real NVIDIA driver, of what the fake NVML and
the stand-in MPS control executable stand in for everywhere else.

Made for a machine lent for minutes, with Python 3, an NVIDIA driver and no network: it runs from a copy of
this repository (the product's source is put on ``sys.path``), with the few pure-Python or abi3 packages it
needs carried in a folder that ``--prepare DIR`` fills here (``pip download``; CUDA is reached through
``ctypes`` on ``libcuda.so.1``: no toolkit, no compiler). Each step is independent, has its own time limit
and ends ``pass``, ``fail``, ``skip`` (with the reason) or ``error``; one table is printed and a JSON result
written. Without a driver every step skips with one line saying why, and the run exits 0.

Steps:

- ``nvml``: the node through the product's NVML port (:func:`~slurm_gpushare.hardware.probe.probe_machine`):
  GPUs, memory, UUIDs, CPU affinity, NUMA node, GPU-pair links (NVLink count, PCIe level: the hop matrix's
  input), MIG mode and profiles; compared with ``nvidia-smi topo -m`` and ``nvidia-smi mig -lgip`` parsed by
  the product's own parsers. Any disagreement fails the step, each one named.
- ``mps``: the Prolog's MPS path for real (:class:`~slurm_gpushare.node.mps.MpsDaemon`, as the Prolog builds
  it): a control daemon for an unprivileged user, a pinned-memory limit and an active-thread percentage set
  and read back, then CUDA clients of that user (``cuInit``, ``cuCtxCreate``, ``cuMemAlloc``): one below the
  limit (must succeed), one above it (must fail out of memory), two at once each below it (whether the limit
  holds per client or for both together, measured and stated), and one that leaves MPS (no
  ``CUDA_MPS_PIPE_DIRECTORY``) asking above the limit (way (a) of docs/mps.md: measured, not judged), and one
  asking above it after the user raised the running server's limit through the daemon (way (c), measured); the
  daemon stopped as the Epilog stops it, nothing left (no process of it, NVML lists no process on the GPU).
- ``processes``: what the node monitor attributes usage by: while a client of an MPS daemon holds memory,
  which pids NVML lists on the GPU (the client's, the MPS server's) and with how much memory, through the
  product's port (``nvmlDeviceGetComputeRunningProcesses``) and beside it through
  ``nvmlDeviceGetMPSComputeRunningProcesses``, and the utilization NVML reports.
- ``memlimit``: the driver's per-cgroup memory limit (``nvmlDeviceSetMemoryLimits_v1``, R615+, cgroup v2), as
  the product sets it on a share job's cgroup: a scratch cgroup limited to the check's limit on GPU 0 through the
  port, then CUDA clients inside it, outside MPS: one below (must succeed), one above (must fail out of memory),
  two at once of three quarters each (the limit holds for the cgroup's processes together: the second must
  fail), a client in a child cgroup above the limit (whether the limit holds below the cgroup, measured), and
  two clients of an MPS daemon started outside the cgroup (whose cgroup an MPS client's memory is charged to,
  measured and stated). Skipped with the reason on an older driver, without cgroup v2, or not as root.
- ``mig``: where a GPU has MIG enabled, a GPU instance of its smallest profile created and destroyed through
  the port; skipped with the reason where MIG is off (enabling it needs a GPU reset, which this check never
  does).
"""

from __future__ import annotations

import contextlib
import ctypes.util
import json
import os
import platform
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: What the steps import beyond the standard library and the product's source (``--prepare`` fetches these
#: as wheels for the device's Python: pure Python, or abi3).
PACKAGES = ("nvidia-ml-py", "psutil")
#: The Python of the GPU machines this check is prepared for (3.12 in their image).
DEVICE_PYTHON = "3.12"
CARRY_LIMIT_MIB = 64

#: A CUDA client, run as the MPS daemon's user: allocates ``MIB`` MiB on device 0 and prints one JSON line
#: (the CUresult of each call: 0 success, 2 CUDA_ERROR_OUT_OF_MEMORY), then holds the memory ``HOLD`` seconds.
CLIENT = r"""
import ctypes, json, sys, time
mib, hold = int(sys.argv[1]), float(sys.argv[2])
out = {"pid": __import__("os").getpid()}
try:
    cu = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    print(json.dumps({**out, "error": str(e)})); sys.exit(3)
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
out["init"] = cu.cuInit(0)
out["device"] = cu.cuDeviceGet(ctypes.byref(dev), 0) if out["init"] == 0 else None
out["context"] = cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) if out["device"] == 0 else None
out["alloc"] = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib << 20)) if out["context"] == 0 else None
print(json.dumps(out), flush=True)
if out["alloc"] == 0:
    time.sleep(hold)
"""
CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY = 0, 2


@dataclass
class Result:
    """One step's outcome: ``status`` pass | fail | skip | error, one line of ``detail``, its ``data``."""

    step: str
    status: str
    detail: str
    seconds: float = 0.0
    data: dict = field(default_factory=dict)


class Skip(Exception):
    """The step cannot run here (the message says why)."""


class Failed(Exception):
    """The step ran and found what it checks wrong (the message says what)."""


@dataclass
class Options:
    """What the steps run with: the NVML port spec (``nvml``, or ``fake:PATH`` for tests), the ``nvidia-smi``
    and ``nvidia-cuda-mps-control`` programs, the MPS limit checked (MiB), the user clients run as (None: a
    throwaway user ``gpscheck`` when root, else the caller) and the scratch directory."""

    nvml: str = "nvml"
    nvidia_smi: str = "nvidia-smi"
    mps_control: str = "nvidia-cuda-mps-control"
    limit_mib: int = 2048
    user: str | None = None
    scratch: Path = Path("/tmp")
    data: dict = field(default_factory=dict)


def _port(opts: Options):
    """The product's NVML port, opened (Skip when there is no driver)."""
    from slurm_gpushare.errors import GpushareError
    from slurm_gpushare.hardware.ports import open_nvml

    if opts.nvml == "nvml" and not _loads("libnvidia-ml.so.1"):
        raise Skip("no NVIDIA driver here (libnvidia-ml.so.1 not found)")
    port = open_nvml(opts.nvml)  # a driver without the binding: an error (carry --prepare's wheels)
    try:
        port.init()
    except GpushareError as e:
        raise Skip(f"no usable NVML: {e}") from None
    return port


def _smi(opts: Options, *args: str) -> str | None:
    """``nvidia-smi ARGS`` output, None when the program is missing."""
    exe = shutil.which(opts.nvidia_smi)
    if exe is None:
        return None
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise Failed(f"nvidia-smi {' '.join(args)} exited {p.returncode}: {(p.stderr or p.stdout).strip()[:200]}")
    return p.stdout


def compare_machines(nvml, topo) -> list[str]:
    """What ``topo`` (parsed from ``nvidia-smi topo -m``) says differently from ``nvml`` (probed through the
    port): GPU count; per GPU the CPU affinity and NUMA node where the matrix gives them; per GPU pair the
    NVLink count, and the PCIe level where the matrix shows one (it prints only ``NV#`` for NVLinked pairs).
    Empty when they agree."""
    out = []
    if len(nvml.gpus) != len(topo.gpus):
        return [f"NVML has {len(nvml.gpus)} GPUs, nvidia-smi topo -m {len(topo.gpus)}"]
    for a, b in zip(nvml.gpus, topo.gpus, strict=True):
        if b.cpu_affinity and tuple(a.cpu_affinity) != tuple(b.cpu_affinity):
            out.append(f"GPU {a.index}: CPU affinity {list(a.cpu_affinity)} by NVML, {list(b.cpu_affinity)} by topo -m")
        if b.numa_node is not None and a.numa_node != b.numa_node:
            out.append(f"GPU {a.index}: NUMA node {a.numa_node} by NVML, {b.numa_node} by topo -m")
    for x in topo.links:
        y = nvml.link(x.a, x.b)
        if y is None:
            out.append(f"GPUs {x.a},{x.b}: no link by NVML, {x.nvlinks} NVLinks / {x.pcie} by topo -m")
            continue
        if x.nvlinks != y.nvlinks:
            out.append(f"GPUs {x.a},{x.b}: {y.nvlinks} NVLinks by NVML, {x.nvlinks} by topo -m")
        if x.pcie is not None and x.pcie != y.pcie:
            out.append(f"GPUs {x.a},{x.b}: PCIe {y.pcie} by NVML, {x.pcie} by topo -m")
    return out


def step_nvml(opts: Options) -> str:
    """The ``nvml`` step (module docstring); returns its one-line detail. Raises Skip or Failed."""
    from slurm_gpushare.hardware.nvidia_smi import parse_mig_profiles, parse_topo_matrix
    from slurm_gpushare.hardware.probe import probe_machine

    port = _port(opts)
    try:
        m = probe_machine(port, hostname=platform.node().split(".")[0] or "node")
    finally:
        port.shutdown()
    opts.data["machine"] = m
    opts.data["nvml"] = {"driver": m.driver_version, "gpus": [
        {"index": g.index, "name": g.name, "uuid": g.uuid, "memory_mib": g.memory_mib, "numa_node": g.numa_node,
         "cpus": len(g.cpu_affinity), "mig_enabled": g.mig_enabled, "mig_profiles": [p.name for p in g.mig_profiles]}
        for g in m.gpus], "links": [asdict(x) for x in m.links]}
    problems = []
    text = _smi(opts, "topo", "-m")
    if text is None:
        compared = "nvidia-smi not found: not compared with topo -m"
    else:
        # topo -m shows neither the model nor the memory: the parser is given NVML's (not compared)
        problems += compare_machines(m, parse_topo_matrix(text, source="nvidia-smi topo -m", gpu_name=m.gpus[0].name,
                                                          memory_mib=m.gpus[0].memory_mib))
        compared = "topo -m agrees" if not problems else ""
    if any(g.mig_profiles for g in m.gpus):
        lgip = _smi(opts, "mig", "-lgip")
        if lgip is not None:
            listed = parse_mig_profiles(lgip, source="nvidia-smi mig -lgip")
            for g in m.gpus:
                names = sorted(p.name for p in g.mig_profiles)
                smi = sorted(p.name for p in listed.get(g.index, ()))
                if g.mig_enabled and names != smi:
                    problems.append(f"GPU {g.index}: MIG profiles {names} by NVML, {smi} by mig -lgip")
    if problems:
        raise Failed("; ".join(problems))
    kinds: dict[str, int] = {}
    for g in m.gpus:
        kind = f"{g.name} ({g.memory_mib} MiB{', MIG on' if g.mig_enabled else ''})"
        kinds[kind] = kinds.get(kind, 0) + 1
    gpus = ", ".join(f"{n}x {k}" for k, n in kinds.items())
    return f"driver {m.driver_version or '?'}; {gpus}; {len(m.links)} GPU pairs; {compared}"


def _needs_cuda(opts: Options) -> tuple[str, str]:
    """The MPS control program and the first GPU (Skip where either, or libcuda, is missing)."""
    if ctypes.util.find_library("cuda") is None and not _loads("libcuda.so.1"):
        raise Skip("no libcuda.so.1 (no NVIDIA driver's CUDA library): no CUDA client can run")
    exe = shutil.which(opts.mps_control)
    if exe is None:
        raise Skip(f"{opts.mps_control} not found (the driver's MPS control program)")
    port = _port(opts)
    try:
        if port.device_count() == 0:
            raise Skip("NVML lists no GPU")
        uuid = port.uuid(0)
    finally:
        port.shutdown()
    return exe, uuid


def _loads(name: str) -> bool:
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


def _user(opts: Options) -> pwd.struct_passwd:
    """The user the daemon and its clients run as: ``opts.user``, else a throwaway ``gpscheck`` (root), else the
    caller."""
    if opts.user:
        return pwd.getpwnam(opts.user)
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    with contextlib.suppress(KeyError):
        return pwd.getpwnam("gpscheck")
    subprocess.run(["useradd", "--system", "--no-create-home", "gpscheck"], capture_output=True, timeout=30)
    try:
        return pwd.getpwnam("gpscheck")
    except KeyError:
        raise Skip("no unprivileged user to run the MPS daemon as (useradd gpscheck failed): give --user") from None


def _daemon(opts: Options, exe: str, uuid: str, user: pwd.struct_passwd):
    from slurm_gpushare.node.mps import MpsDaemon, MpsSettings

    base = Path(tempfile.mkdtemp(prefix="gpscheck-", dir=opts.scratch))
    os.chmod(base, 0o755)
    return MpsDaemon(base / "pipe", base / "log", settings=MpsSettings(control_binary=exe), visible_devices=uuid,
                     uid=user.pw_uid, gid=user.pw_gid), base


def _clients(daemon, user: pwd.struct_passwd, sizes: list[int], hold: float = 0.0,
             during: Callable[[list[dict]], None] | None = None, *, mps: bool = True,
             cgroup: Path | None = None) -> list[dict]:
    """Run one CUDA client per size at once, as ``user``, through the daemon's pipe (``mps``; else as a CUDA
    program of its own), each moved into ``cgroup`` first when given (root writes its pid into the cgroup's
    ``cgroup.procs``, then ``runuser`` drops to ``user``); their JSON lines."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(daemon.client_env() if mps else {})}
    if "LD_LIBRARY_PATH" in os.environ:
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    root = os.geteuid() == 0
    if cgroup is not None:
        procs = [subprocess.Popen(["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec runuser -u "$1" -- "$@"',
                                   str(cgroup), user.pw_name, sys.executable, "-c", CLIENT, str(mib), str(hold)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
                 for mib in sizes]
    else:
        procs = [subprocess.Popen([sys.executable, "-c", CLIENT, str(mib), str(hold)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
                                  user=user.pw_uid if root else None, group=user.pw_gid if root else None,
                                  extra_groups=[] if root else None)
                 for mib in sizes]
    lines = [json.loads((p.stdout.readline() if p.stdout else "") or "{}") for p in procs]
    if during is not None:
        during(lines)
    for p, line in zip(procs, lines, strict=True):
        _, err = p.communicate(timeout=60 + hold)
        line["exit"] = p.returncode
        if err.strip():
            line["stderr"] = err.strip()[-300:]
    return lines


def step_mps(opts: Options) -> str:
    """The ``mps`` step (module docstring); returns its one-line detail. Raises Skip or Failed."""
    exe, uuid = _needs_cuda(opts)
    user = _user(opts)
    daemon, base = _daemon(opts, exe, uuid, user)
    limit = opts.limit_mib
    found: dict = {"limit_mib": limit, "user": user.pw_name}
    opts.data["mps"] = found
    try:
        daemon.start([daemon.pinned_mem_limit(0, limit), daemon.active_thread_percentage(50)])
        below = _clients(daemon, user, [limit // 2])[0]
        above = _clients(daemon, user, [limit + limit // 2])[0]
        both = _clients(daemon, user, [limit * 3 // 4, limit * 3 // 4], hold=2.0)
        outside = _clients(daemon, user, [limit + limit // 2], mps=False)[0]

        def raise_and_ask(_holding: list[dict]) -> None:  # way (c): the job's user raises its running server's limit
            for server in daemon.server_pids():
                daemon.command(f"set_device_pinned_mem_limit {server} 0 {limit * 2}M")
            found["raised_by_its_user"] = _clients(daemon, user, [limit + limit // 2])[0]

        _clients(daemon, user, [limit // 4], hold=3.0, during=raise_and_ask)
        found.update(below=below, above=above, two_at_once=both, outside_mps=outside)
    finally:
        stopped = daemon.stop()
        shutil.rmtree(base, ignore_errors=True)
    found["stop_clean"] = stopped.clean
    problems = []
    if below.get("alloc") != CUDA_SUCCESS:
        problems.append(f"{limit // 2} MiB below the {limit} MiB limit: CUresult {below}")
    if above.get("alloc") != CUDA_ERROR_OUT_OF_MEMORY:
        problems.append(f"{limit + limit // 2} MiB above the {limit} MiB limit was not refused out of memory: "
                        f"CUresult {above}")
    if not stopped.clean:
        problems.append(f"the Epilog's stop left something: {stopped}")
    left = _gpu_processes(opts)
    found["processes_after_stop"] = left
    if left:
        problems.append(f"NVML lists processes on GPU 0 after the stop: {left}")
    if problems:
        raise Failed("; ".join(problems))
    per_client = all(c.get("alloc") == CUDA_SUCCESS for c in both)
    found["limit_per_client"] = per_client
    return (f"limit {limit} MiB: {limit // 2} MiB allocated, {limit + limit // 2} MiB refused out of memory; two "
            f"clients of {limit * 3 // 4} MiB at once: "
            + ("both allocated (the limit holds per client)" if per_client else
               f"CUresults {[c.get('alloc') for c in both]} (the limit held for both together)")
            + f"; outside MPS {limit + limit // 2} MiB: CUresult {outside.get('alloc')}"
            + f"; after its user raised the server's limit, {limit + limit // 2} MiB: CUresult "
            + f"{found.get('raised_by_its_user', {}).get('alloc')}"
            + "; stopped clean")


def _scratch_cgroup() -> Path:
    """A new cgroup v2 directory for the check (Skip without a writable cgroup v2 hierarchy)."""
    if os.geteuid() != 0:
        raise Skip("not root: the driver's cgroup limit needs root, and so does making a cgroup")
    from slurm_gpushare.node.membership import parse_mountinfo

    mounts = [m for m in parse_mountinfo(Path("/proc/self/mountinfo").read_text()) if m.v2]
    if not mounts:
        raise Skip("no cgroup v2 hierarchy is mounted here (the product passes a v1 directory; untested)")
    where = Path(mounts[0].point) / f"gpscheck-{os.getpid()}"
    try:
        where.mkdir()
    except OSError as e:
        raise Skip(f"cannot make a cgroup under {mounts[0].point}: {e.strerror}") from None
    return where


def step_memlimit(opts: Options) -> str:
    """The ``memlimit`` step (module docstring); returns its one-line detail. Raises Skip or Failed."""
    from slurm_gpushare.errors import NvmlError
    from slurm_gpushare.hardware.port import NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED

    exe, uuid = _needs_cuda(opts)
    user = _user(opts)
    limit = opts.limit_mib
    cgroup = _scratch_cgroup()
    child = cgroup / "step_0"
    found: dict = {"limit_mib": limit, "cgroup": str(cgroup)}
    opts.data["memlimit"] = found
    port = _port(opts)
    daemon, base = _daemon(opts, exe, uuid, user)
    try:
        try:
            port.set_memory_limits(0, str(cgroup), limit, limit)
        except NvmlError as e:
            if e.code in (NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED):
                raise Skip(f"driver {port.driver_version()}: {e}") from None
            raise Failed(f"nvmlDeviceSetMemoryLimits_v1 on {cgroup}: {e}") from None
        got = port.memory_limits(0, str(cgroup))
        found["read_back"] = [got.soft_mib, got.hard_mib]
        below = _clients(daemon, user, [limit // 2], mps=False, cgroup=cgroup)[0]
        above = _clients(daemon, user, [limit + limit // 2], mps=False, cgroup=cgroup)[0]
        both = _clients(daemon, user, [limit * 3 // 4, limit * 3 // 4], hold=2.0, mps=False, cgroup=cgroup)
        child.mkdir()
        nested = _clients(daemon, user, [limit + limit // 2], mps=False, cgroup=child)[0]
        daemon.start([daemon.pinned_mem_limit(0, limit * 2)])  # outside the cgroup, as the Prolog starts it
        mps_both = _clients(daemon, user, [limit * 3 // 4, limit * 3 // 4], hold=2.0, cgroup=cgroup)
        found.update(below=below, above=above, two_at_once=both, in_child_cgroup=nested, mps_two_at_once=mps_both)
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)
        port.shutdown()
        for d in (child, cgroup):  # NVIDIA: removing the cgroup clears its limits
            with contextlib.suppress(OSError):
                d.rmdir()
    problems = []
    if found["read_back"] != [limit, limit]:
        problems.append(f"read back {found['read_back']}, set [{limit}, {limit}] MiB")
    if below.get("alloc") != CUDA_SUCCESS:
        problems.append(f"{limit // 2} MiB below the cgroup's {limit} MiB: CUresult {below}")
    if above.get("alloc") != CUDA_ERROR_OUT_OF_MEMORY:
        problems.append(f"{limit + limit // 2} MiB above the cgroup's {limit} MiB was not refused: CUresult {above}")
    codes: list[int] = sorted(a if isinstance(a := c.get("alloc"), int) else -1 for c in both)
    if codes != [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]:
        problems.append(f"two processes of {limit * 3 // 4} MiB in one cgroup of {limit} MiB: CUresults "
                        f"{[c.get('alloc') for c in both]} (one should fail: the limit is the cgroup's)")
    if problems:
        raise Failed("; ".join(problems))
    mps_charged = any(c.get("alloc") == CUDA_ERROR_OUT_OF_MEMORY for c in mps_both)
    found["mps_clients_charged_to_their_cgroup"] = mps_charged
    found["holds_in_child_cgroup"] = nested.get("alloc") == CUDA_ERROR_OUT_OF_MEMORY
    return (f"cgroup limit {limit} MiB on GPU 0: {limit // 2} allocated, {limit + limit // 2} refused, two of "
            f"{limit * 3 // 4} at once: one refused; in a child cgroup {limit + limit // 2}: CUresult "
            f"{nested.get('alloc')}; two MPS clients in the cgroup: CUresults {[c.get('alloc') for c in mps_both]} ("
            + ("their memory is charged to the client's cgroup" if mps_charged else
               "not charged to the client's cgroup") + ")")


def _gpu_processes(opts: Options) -> list[dict]:
    port = _port(opts)
    try:
        return [{"pid": p.pid, "used_mib": p.used_memory_mib} for p in port.processes(0)]
    finally:
        port.shutdown()


def step_processes(opts: Options) -> str:
    """The ``processes`` step (module docstring); returns its one-line detail. Raises Skip or Failed."""
    from slurm_gpushare.errors import NvmlError

    exe, uuid = _needs_cuda(opts)
    user = _user(opts)
    daemon, base = _daemon(opts, exe, uuid, user)
    seen: dict = {}
    opts.data["processes"] = seen

    def look(lines: list[dict]) -> None:
        time.sleep(1.0)
        port = _port(opts)
        try:
            seen["nvml"] = [{"pid": p.pid, "used_mib": p.used_memory_mib} for p in port.processes(0)]
            try:  # what the monitor reads to find a share's process outside MPS (docs/mps.md, way (a))
                seen["mps_clients"] = sorted(port.mps_client_pids(0))
            except NvmlError as e:
                seen["mps_clients"] = f"{e}"
            u = port.utilization(0)
            seen["utilization"] = {"gpu_percent": u.gpu_percent, "memory_percent": u.memory_percent}
        finally:
            port.shutdown()
        seen["client_pids"] = [c.get("pid") for c in lines]
        seen["server_pids"] = list(daemon.server_pids())
        seen["nvml_lists"] = _both_lists()

    try:
        daemon.start([daemon.pinned_mem_limit(0, opts.limit_mib)])
        lines = _clients(daemon, user, [opts.limit_mib // 4], hold=3.0, during=look)
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)
    if lines[0].get("alloc") != CUDA_SUCCESS:
        raise Failed(f"the client could not allocate {opts.limit_mib // 4} MiB: {lines[0]}")
    listed = {p["pid"]: p["used_mib"] for p in seen.get("nvml", [])}
    client = [p for p in seen["client_pids"] if p in listed]
    server = [p for p in seen["server_pids"] if p in listed]
    if not client and not server:
        raise Failed(f"NVML lists neither the client {seen['client_pids']} nor the MPS server "
                     f"{seen['server_pids']} on GPU 0: {seen.get('nvml')}")
    clients = seen.get("mps_clients")
    if isinstance(clients, list) and [p for p in client if p not in clients]:
        raise Failed(f"NVML lists the MPS client(s) {client} as compute processes but not as MPS clients "
                     f"({clients}): the monitor would take them for processes outside MPS (docs/mps.md, way (a))")
    return (f"NVML lists {'the client' if client else 'only the MPS server'} "
            f"({', '.join(f'pid {p}: {listed[p]} MiB' for p in client or server)}) while it holds "
            f"{opts.limit_mib // 4} MiB; MPS clients (the port) {clients}; utilization {seen.get('utilization')}; "
            "NVML's two lists: "
            f"{seen.get('nvml_lists')}")


def _both_lists() -> dict:
    """NVML's two process lists of GPU 0, read with pynvml directly: ``nvmlDeviceGetComputeRunningProcesses``
    (what the product's port reads) and ``nvmlDeviceGetMPSComputeRunningProcesses`` (processes with an MPS
    compute context). Which pids each holds under MPS decides how the monitor can tell a share's clients
    from a process of the job outside MPS (issue: enforcement of way (a))."""
    import pynvml  # noqa: TID251 - measures NVML beside the port: what the port does not read yet

    out: dict = {}
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for key, call in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                          ("mps_compute", "nvmlDeviceGetMPSComputeRunningProcesses")):
            try:
                out[key] = [{"pid": p.pid, "used_mib": (p.usedGpuMemory or 0) >> 20}
                            for p in getattr(pynvml, call)(handle)]
            except (pynvml.NVMLError, AttributeError) as e:
                out[key] = f"{call}: {e}"
    finally:
        pynvml.nvmlShutdown()
    return out


def step_mig(opts: Options) -> str:
    """The ``mig`` step (module docstring); returns its one-line detail. Raises Skip or Failed."""
    from slurm_gpushare.errors import MigPlacementError, NvmlError
    from slurm_gpushare.hardware.port import NVML_ERROR_NOT_SUPPORTED

    port = _port(opts)
    full = []
    try:
        for i in range(port.device_count()):
            try:
                mode = port.mig_mode(i)
            except NvmlError as e:  # a GPU without MIG answers NOT_SUPPORTED (as probe_machine reads it)
                if e.code != NVML_ERROR_NOT_SUPPORTED:
                    raise
                continue
            if not mode.current:
                continue
            profiles = sorted(port.gpu_instance_profiles(i), key=lambda p: (p.memory_mib, p.profile_id))
            if not profiles:
                raise Failed(f"GPU {i} has MIG enabled and NVML lists no GPU instance profile")
            before = {g.gi_id for g in port.gpu_instances(i)}
            try:
                gi = port.create_gpu_instance(i, profiles[0].profile_id)
            except MigPlacementError as e:  # no room: another's instances are never destroyed here
                full.append(str(e))
                continue
            try:
                listed = {g.gi_id for g in port.gpu_instances(i)}
                if gi.gi_id not in listed - before:
                    raise Failed(f"GPU {i}: created GPU instance {gi.gi_id} is not listed: {sorted(listed)}")
                ran = _mig_client(gi.uuid) if _loads("libcuda.so.1") else None
                opts.data["mig"] = {"gpu": i, "profile": profiles[0].name, "uuid": gi.uuid, "client": ran}
                if ran is not None and ran.get("alloc") != CUDA_SUCCESS:
                    raise Failed(f"GPU {i}: a CUDA client on {gi.uuid} could not allocate 256 MiB: {ran}")
            finally:
                port.destroy_gpu_instance(i, gi.gi_id)
            after = {g.gi_id for g in port.gpu_instances(i)}
            if after != before:
                raise Failed(f"GPU {i}: GPU instances {sorted(before)} before, {sorted(after)} after")
            client = "no libcuda: no client run" if ran is None else "a CUDA client allocated 256 MiB on it"
            return f"GPU {i}: a {profiles[0].name} GPU instance created and destroyed through the port; {client}"
    finally:
        port.shutdown()
    if full:
        raise Skip("no room for a GPU instance on any MIG GPU (" + "; ".join(full) + ")")
    raise Skip("no GPU has MIG enabled (enabling it needs a GPU reset, which this check does not do)")


def _mig_client(uuid: str) -> dict:
    """A CUDA client on one MIG device (``CUDA_VISIBLE_DEVICES`` its UUID), 256 MiB: its JSON line."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CUDA_VISIBLE_DEVICES": uuid}
    p = subprocess.run([sys.executable, "-c", CLIENT, "256", "0"], env=env, capture_output=True, text=True,
                       timeout=60)
    return {**json.loads(p.stdout.splitlines()[0] if p.stdout.strip() else "{}"), "exit": p.returncode}


STEPS: dict[str, Callable[[Options], str]] = {"nvml": step_nvml, "mps": step_mps, "processes": step_processes,
                                              "memlimit": step_memlimit, "mig": step_mig}


def run_steps(opts: Options, names: list[str], limit_s: float) -> list[Result]:
    """Each named step under its own time limit (``limit_s``), whatever the others did."""
    from slurm_gpushare.node.hook import HookTimeout, time_limit

    results = []
    for name in names:
        t0 = time.monotonic()
        try:
            with time_limit(limit_s):
                r = Result(name, "pass", STEPS[name](opts))
        except HookTimeout:
            r = Result(name, "error", f"did not end within {limit_s:g} s")
        except Skip as e:
            r = Result(name, "skip", str(e))
        except Failed as e:
            r = Result(name, "fail", str(e))
        except Exception as e:  # noqa: BLE001 - every step reports, whatever broke
            r = Result(name, "error", f"{type(e).__name__}: {e}")
        r.seconds = round(time.monotonic() - t0, 2)
        r.data = {k: v for k, v in opts.data.items() if k == name or (name == "nvml" and k == "nvml")}
        results.append(r)
    return results


def table(results: list[Result]) -> str:
    """The printed table: one row per step."""
    rows = [f"{'step':<10} {'status':<6} {'seconds':>7}  detail"]
    rows += [f"{r.step:<10} {r.status:<6} {r.seconds:7.2f}  {r.detail}" for r in results]
    return "\n".join(rows) + "\n"


def prepare(folder: Path, python: str = DEVICE_PYTHON) -> int:
    """Fill ``folder`` with wheels of :data:`PACKAGES` for the device's Python (manylinux x86-64, pure or abi3);
    returns its size in bytes. Raises RuntimeError when pip fails."""
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--python-version", python, "--implementation", "cp", "-d", str(folder)]
    for n in (17, 27, 28):
        argv += ["--platform", f"manylinux_2_{n}_x86_64"]
    argv += ["--platform", "manylinux2014_x86_64", "--platform", "any", *PACKAGES]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"pip download failed: {(p.stderr or p.stdout).strip()[-500:]}")
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def install_carried(folder: Path, target: Path) -> None:
    """On the device: the carried wheels unpacked into ``target`` (put on ``sys.path``); nothing fetched."""
    import zipfile

    target.mkdir(parents=True, exist_ok=True)
    for wheel in sorted(folder.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(target)
    sys.path.insert(0, str(target))
