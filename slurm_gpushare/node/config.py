"""Node-side settings of the hooks: where state lives, which MPS binary, which machine description.

A TOML file (default ``/etc/slurm/gpushare/node.toml``; the hooks' ``--config``), versioned and
strict like the site policy: unknown keys and wrong types are errors naming the key and the file.
Every key is optional::

    version = 1
    run_dir = "/run/slurm-gpushare"            # per-job state, MPS pipe and log directories
    machine = "/etc/slurm/gpushare/machines/{node}.json"
    device_dir = "/dev"                        # the nvidiaN files gres.conf names (nvidia-caps/ beneath it)
    mps_control = "/usr/bin/nvidia-cuda-mps-control"
    shard_unit = "1G"                          # with a unit (1G, 512M); must match gres-conf --shard-unit
    mps_start_timeout = 10.0                   # seconds
    mps_quit_timeout = 10.0                    # seconds before SIGTERM/SIGKILL of a daemon that ignores quit
    mps_dir_size = "64M"                       # tmpfs on each MPS pipe and log directory (the job user's,
                                               # in the run dir, usually RAM); "0": none (unbounded)
    drain_on_stuck_daemon = true               # an MPS daemon that survives SIGKILL drains the node
    hook_timeout = 120.0                       # seconds a Prolog/Epilog may run (keep it below slurm.conf's
                                               # PrologEpilogTimeout): then the job fails / the node drains
    mps_mode = "per-job"                       # or "per-gpu": one daemon per GPU and user, shared by jobs
    low_priority_partitions = ["scavenger"]    # their jobs' MPS clients run below normal priority
    low_priority_qos = ["preemptible"]         # so do the jobs of these QOS (sacctmgr; needs slurmdbd)
    gpu_order = "gpushare"                     # whose multi-GPU tasks get NVLink ring order: "gpushare"
                                               # (jobs that asked for a share), "all" jobs, or "none"
    task_notes = false                         # the TaskProlog tells a job's output when it reordered its GPUs
    spool_dir = "/var/spool/slurm-gpushare/accounting"   # the Epilog's per-job GPU usage records
    monitor_interval = 10.0                    # seconds between the node monitor's NVML samples (>= 0.01)
    monitor_jobs_interval = 60.0               # seconds between its squeue calls (slurmctld load)
    monitor_steps_interval = 10.0              # seconds between its scontrol listpids calls (local stepds)
    monitor_save_interval = 1.0                # seconds between two writes of a job's usage file
    monitor_listen = "127.0.0.1:9817"          # its Prometheus endpoint (":9817": every address; "" none)
    monitor_textfile = ""                      # node_exporter textfile to write after each sample ("" none)
    admin_comment_summary = false              # the monitor puts a usage summary in running jobs' AdminComment
    admin_comment_interval = 300.0             # seconds between two such updates of one job
    enforce = "kill"                           # what the monitor does to an MPS share job whose processes on a
                                               # GPU together hold more than its share: "kill" them, "requeue"
                                               # the job, or "warn" (log, metric, AdminComment note)
    enforce_grace = 3                          # consecutive samples over the share before it acts (1-100)
    mps_check_interval = 10.0                  # seconds between two read-backs of each share job's MPS daemon
                                               # limits (a job that changed them, or quit its daemon, gets
                                               # the enforce action); 0: never
    gpu_memory_limit = "auto"                  # the driver's own limit on each share job's cgroup, where NVML
                                               # has it (nvmlDeviceSetMemoryLimits_v1, R615+); "off": never

    [enforce_partitions]                       # another action for the jobs of a partition
    debug = "warn"

    [mps_env]                                  # extra environment of the MPS control daemon
    LD_LIBRARY_PATH = "/usr/local/cuda/lib64"

``{node}`` in ``run_dir``, ``machine`` and ``device_dir`` is the Slurm node name (``SLURMD_NODENAME``): several
slurmd on one host (the dev cluster) keep their state apart.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_gpushare.errors import ConfigError, InputError
from slurm_gpushare.memsize import format_mib, parse_mib, parse_shard_unit_value

if TYPE_CHECKING:  # annotations only: the hooks read node.toml before they know whether they need more
    from slurm_gpushare.hardware.machine import Machine
    from slurm_gpushare.slurm.conf import GresConf

NODE_CONFIG_VERSION = 1
#: ``enforce``: what the node monitor does to an MPS share job whose processes together hold more than its share.
ENFORCE_ACTIONS = ("kill", "requeue", "warn")
#: ``gpu_order``: whose multi-GPU tasks the TaskProlog may give the GPUs in NVLink ring order (and task
#: hints): only jobs that asked for a GPU share (their AdminComment has a gpushare segment), every job, none.
GPU_ORDERS = ("gpushare", "all", "none")
DEFAULT_PATH = "/etc/slurm/gpushare/node.toml"


@dataclass(frozen=True)
class NodeConfig:
    """See the module docstring for each key (seconds, MiB)."""

    run_dir: str = "/run/slurm-gpushare"
    machine: str = "/etc/slurm/gpushare/machines/{node}.json"
    device_dir: str = "/dev"
    mps_control: str = "/usr/bin/nvidia-cuda-mps-control"
    shard_unit_mib: int = 1024
    mps_start_timeout: float = 10.0
    mps_quit_timeout: float = 10.0
    mps_dir_size_mib: int = 64
    hook_timeout: float = 120.0
    drain_on_stuck_daemon: bool = True
    mps_env: tuple[tuple[str, str], ...] = ()
    mps_mode: str = "per-job"
    low_priority_partitions: tuple[str, ...] = ()
    low_priority_qos: tuple[str, ...] = ()
    gpu_order: str = "gpushare"
    task_notes: bool = False
    spool_dir: str = "/var/spool/slurm-gpushare/accounting"
    monitor_interval: float = 10.0
    monitor_jobs_interval: float = 60.0
    monitor_steps_interval: float = 10.0
    monitor_save_interval: float = 1.0
    monitor_listen: str = "127.0.0.1:9817"
    monitor_textfile: str = ""
    admin_comment_summary: bool = False
    admin_comment_interval: float = 300.0
    enforce: str = "kill"
    enforce_grace: int = 3
    enforce_partitions: tuple[tuple[str, str], ...] = ()
    mps_check_interval: float = 10.0
    gpu_memory_limit: str = "auto"

    def enforce_for(self, partition: str) -> str:
        """The enforcement action (:data:`ENFORCE_ACTIONS`) for a job of ``partition``."""
        return dict(self.enforce_partitions).get(partition, self.enforce)

    def run_dir_for(self, node: str) -> Path:
        """The run dir of Slurm node ``node`` (``{node}`` in ``run_dir`` replaced by its name)."""
        return Path(self.run_dir.replace("{node}", node))

    def device_dir_for(self, node: str) -> str:
        """The directory of Slurm node ``node``'s ``nvidiaN`` device files, ``nvidia-caps/`` beneath it, as
        its gres.conf names them (``{node}`` replaced by its name)."""
        return self.device_dir.replace("{node}", node)

    def machine_for(self, node: str) -> Path:
        """The machine description file of Slurm node ``node`` (``{node}`` replaced by its name)."""
        return Path(self.machine.replace("{node}", node))


_KEYS: dict[str, type | tuple[type, ...]] = {
    "version": int, "run_dir": str, "machine": str, "device_dir": str, "mps_control": str, "shard_unit": str,
    "mps_start_timeout": (int, float), "mps_quit_timeout": (int, float), "mps_dir_size": str,
    "drain_on_stuck_daemon": bool, "hook_timeout": (int, float),
    "mps_env": dict, "mps_mode": str, "low_priority_partitions": list, "low_priority_qos": list, "gpu_order": str,
    "task_notes": bool,
    "spool_dir": str,
    "monitor_interval": (int, float), "monitor_jobs_interval": (int, float),
    "monitor_steps_interval": (int, float), "monitor_save_interval": (int, float), "monitor_listen": str,
    "monitor_textfile": str,
    "admin_comment_summary": bool, "admin_comment_interval": (int, float),
    "enforce": str, "enforce_grace": int, "enforce_partitions": dict, "mps_check_interval": (int, float),
    "gpu_memory_limit": str,
}


#: Keys in seconds: (lowest, highest, lowest allowed itself).
_SECONDS: dict[str, tuple[float, float, bool]] = {
    "mps_start_timeout": (0, 600, False), "mps_quit_timeout": (0, 600, False), "hook_timeout": (0, 3600, False),
    "monitor_interval": (0.01, 3600, True), "monitor_jobs_interval": (0, 3600, True),
    "monitor_steps_interval": (0, 3600, True), "monitor_save_interval": (0, 3600, True),
    "admin_comment_interval": (1, 86400, True), "mps_check_interval": (0, 3600, True),
}


def parse_listen(text: str) -> tuple[str, int]:
    """An endpoint address (``monitor_listen``, ``monitor --listen``): ``host:port``, ``:port`` or
    ``[v6]:port`` -> ``(host, port)``; an empty host means every address (``0.0.0.0``).

    Raises:
        InputError: no valid port (1-65535).
    """
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"listen address {text!r} has no valid port", hint="e.g. :9817 or 127.0.0.1:9817")
    return host.strip("[]") or "0.0.0.0", int(port)


def _has_type(value: Any, want: type | tuple[type, ...]) -> bool:
    """TOML type check that does not take ``true`` for an integer (``bool`` is a subclass of ``int``)."""
    return isinstance(value, want) and not (isinstance(value, bool) and want is not bool)


def parse_node_config(text: str, *, source: str = "<node config>") -> NodeConfig:
    """Parse node.toml text.

    Raises:
        ConfigError: not TOML, wrong version, an unknown key, a value of the wrong type or range.
    """
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML: {e}", source=source) from None
    return _node_config_from_data(data, source)


def lenient_node_config(text: str) -> NodeConfig:
    """What can still be read of a node.toml that :func:`parse_node_config` refuses: every key whose
    value is valid on its own, the defaults for the rest (a typo in one key keeps ``run_dir`` and
    ``spool_dir``). Only for cleaning up after a job (the Epilog), never for deciding a new one.
    Text that is not TOML gives the defaults.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return NodeConfig()
    base = NodeConfig()
    kept: dict[str, Any] = {}
    for key, value in data.items():
        if key == "version":
            continue
        try:
            alone = _node_config_from_data({"version": NODE_CONFIG_VERSION, key: value}, "<node config>")
        except ConfigError:
            continue
        kept.update({f.name: getattr(alone, f.name) for f in fields(NodeConfig)
                     if getattr(alone, f.name) != getattr(base, f.name)})
    return replace(base, **kept)


def _node_config_from_data(data: dict[str, Any], source: str) -> NodeConfig:
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(unknown)}", hint=f"known keys: {', '.join(_KEYS)}",
                          source=source)
    if "version" not in data:
        raise ConfigError("no version key", hint=f"start the file with version = {NODE_CONFIG_VERSION}", source=source)
    if data.get("version") != NODE_CONFIG_VERSION:
        raise ConfigError(f"version = {data.get('version')!r} is not supported",
                          hint=f"write version = {NODE_CONFIG_VERSION}", source=source)
    kw: dict[str, Any] = {}
    value: Any
    for key, value in data.items():
        want = _KEYS[key]
        if key == "shard_unit":
            try:
                kw["shard_unit_mib"] = parse_shard_unit_value(value)
            except InputError as e:
                raise ConfigError(e.message, hint=e.hint, source=source) from None
            continue
        if not _has_type(value, want):
            raise ConfigError(f"{key} has the wrong type ({type(value).__name__})", source=source)
        if key == "mps_dir_size":
            try:
                kw["mps_dir_size_mib"] = 0 if value.strip() == "0" else parse_mib(value, what=key, maximum=1 << 20)
            except InputError as e:
                raise ConfigError(e.message, hint=e.hint or 'e.g. mps_dir_size = "64M", or "0" for none',
                                  source=source) from None
            continue
        if key == "version":
            continue
        if key in ("low_priority_partitions", "low_priority_qos"):
            bad = [v for v in value if not (isinstance(v, str) and v)]
            if bad:
                what = "partition" if key == "low_priority_partitions" else "QOS"
                raise ConfigError(f"{key} must be a list of {what} names: {bad[0]!r} is not one",
                                  hint=f'e.g. {key} = ["scavenger"]', source=source)
            kw[key] = tuple(value)
        elif key == "mps_mode":
            if value not in ("per-job", "per-gpu"):
                raise ConfigError(f"mps_mode = {value!r} is not a mode", hint="use \"per-job\" or \"per-gpu\"",
                                  source=source)
            kw[key] = value
        elif key == "gpu_order":
            if value not in GPU_ORDERS:
                raise ConfigError(f"gpu_order = {value!r} is not a choice",
                                  hint='use "gpushare" (jobs that asked for a GPU share), "all" or "none"',
                                  source=source)
            kw[key] = value
        elif key == "enforce":
            if value not in ENFORCE_ACTIONS:
                raise ConfigError(f"enforce = {value!r} is not an action", hint='use "kill", "requeue" or "warn"',
                                  source=source)
            kw[key] = value
        elif key == "gpu_memory_limit":
            if value not in ("auto", "off"):
                raise ConfigError(f"gpu_memory_limit = {value!r} is not a choice",
                                  hint='use "auto" (set the driver\'s per-job limit where NVML has it) or "off"',
                                  source=source)
            kw[key] = value
        elif key == "enforce_partitions":
            bad = sorted(k for k, v in value.items() if v not in ENFORCE_ACTIONS)
            if bad:
                raise ConfigError(f"enforce_partitions: {', '.join(bad)} must be \"kill\", \"requeue\" or \"warn\"",
                                  source=source)
            kw[key] = tuple(sorted(value.items()))
        elif key == "enforce_grace":
            if not 1 <= value <= 100:
                raise ConfigError(f"enforce_grace = {value} is out of range (1-100 samples)", source=source)
            kw[key] = value
        elif key == "mps_env":
            bad = [k for k, v in value.items() if not isinstance(v, str) or k.startswith("CUDA_MPS_")]
            if bad:
                raise ConfigError(f"mps_env: {', '.join(bad)} must be strings and not CUDA_MPS_* (the hooks set "
                                  "those per job)", source=source)
            kw["mps_env"] = tuple(sorted(value.items()))
        elif key in _SECONDS:
            low, high, low_included = _SECONDS[key]
            if not ((low <= value) if low_included else (low < value)) or not value <= high:
                raise ConfigError(f"{key} = {value} is out of range ({low:g}-{high:g} seconds)", source=source)
            kw[key] = float(value)
        elif key == "device_dir":
            if not value.startswith("/") or any(ch in value for ch in " =\t\n"):
                raise ConfigError(f"device_dir = {value!r} is not an absolute path without blanks or '='",
                                  hint='the directory gres.conf File= names, e.g. device_dir = "/dev"',
                                  source=source)
            kw[key] = value
        elif key == "monitor_listen":
            if value:
                try:
                    parse_listen(value)
                except InputError as e:
                    raise ConfigError(f"monitor_listen = {value!r} has no valid port",
                                      hint='write ":9817", "127.0.0.1:9817", or "" for no endpoint',
                                      source=source) from e
            kw[key] = value
        else:
            kw[key] = value
    return NodeConfig(**kw)


def load_node_config(path: str | Path | None) -> NodeConfig:
    """Read the node config; a missing default file means the defaults, a missing given file is an error.

    Raises:
        ConfigError: unreadable or invalid file.
    """
    p = Path(path or DEFAULT_PATH)
    try:
        text = p.read_text()
    except FileNotFoundError:
        if path is None:
            return NodeConfig()
        raise ConfigError(f"node config {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read node config {p}: {e}") from None
    return parse_node_config(text, source=str(p))


# --- the shard unit against the installed gres.conf ---------------------------------------------

_DEVICE_MINOR = re.compile(r"/nvidia(\d+)$")


def installed_shard_counts(gres_conf: GresConf, node: str) -> dict[int, int]:
    """The ``Name=shard`` ``Count=`` of each GPU in an installed gres.conf, keyed by device minor.

    Args:
        gres_conf: the parsed gres.conf (:func:`slurm_gpushare.slurm.conf.parse_gres_conf`).
        node: the Slurm node name; lines for other nodes are skipped.

    Returns:
        ``{minor: count}`` for each ``File=<dir>/nvidia<minor>`` of the node's shard lines. A line
        naming several files splits its ``Count=`` evenly over them (gres.conf(5) "Count"); a shard
        line without ``File=`` is not attributable to a GPU and is left out.
    """
    counts: dict[int, int] = {}
    for entry in gres_conf.records_for(node):
        if entry.name != "shard" or not entry.files:
            continue
        each = entry.effective_count // len(entry.files)
        for path in entry.files:
            m = _DEVICE_MINOR.search(path)
            if m:
                counts[int(m.group(1))] = counts.get(int(m.group(1)), 0) + each
    return counts


def shard_unit_mismatch(machine: Machine, shard_unit_mib: int, installed: Mapping[int, int]) -> str | None:
    """Whether a shard unit reproduces the shard counts of an installed gres.conf (pure).

    The gres.conf generator gives each whole GPU ``Count=<memory_mib // unit>`` shards (no line when
    that is 0; MIG GPUs get none). The Prolog turns N shards into N x ``shard_unit`` MiB of MPS
    memory limit, so a node.toml unit other than the one gres.conf was written with gives every job
    a wrong limit.

    Args:
        machine: the node's description (memory per GPU from NVML, in MiB).
        shard_unit_mib: node.toml ``shard_unit``, MiB.
        installed: the installed shard ``Count=`` per device minor (:func:`installed_shard_counts`).

    Returns:
        None when the unit gives every whole GPU its installed count, or when gres.conf has no shard
        lines at all (shards not configured); else the reason, naming the first GPU that differs
        and the unit gres.conf implies (when one unit reproduces every count).
    """
    if not installed:
        return None
    whole = [g for g in sorted(machine.gpus, key=lambda g: g.index) if not g.mig_enabled]
    for g in whole:
        want, have = g.memory_mib // shard_unit_mib, installed.get(g.minor, 0)
        if want != have:
            break
    else:
        return None
    problem = (f"node.toml shard_unit {format_mib(shard_unit_mib)} does not reproduce the installed gres.conf: "
               f"GPU {g.index} ({format_mib(g.memory_mib)}) would have Count={want}, gres.conf has "
               + (f"Count={have}" if have else "none"))
    implied = _implied_unit(whole, installed)
    return problem + (f'; gres.conf implies shard_unit = "{format_mib(implied)}"' if implied else
                      "; no shard unit gives these counts: regenerate gres.conf")


def _implied_unit(gpus, installed: Mapping[int, int]) -> int | None:
    """The roundest unit u (most factors of 2) with ``memory // u == count`` on every GPU, or None.

    ``memory // u == c`` holds for u in ``(memory / (c + 1), memory / c]`` (c > 0), and for
    ``u > memory`` when c is 0.
    """
    lo, hi = 1, 1 << 44
    for g in gpus:
        c = installed.get(g.minor, 0)
        lo = max(lo, g.memory_mib // (c + 1) + 1)
        if c:
            hi = min(hi, g.memory_mib // c)
    if lo > hi:
        return None
    step = 1 << 44
    while step > 1 and -(-lo // step) * step > hi:
        step //= 2
    return -(-lo // step) * step


def check_shard_unit(machine: Machine, node: str, shard_unit_mib: int, gres_conf: GresConf) -> None:
    """Refuse a node.toml shard unit that does not reproduce the node's installed gres.conf.

    Args:
        machine: the node's description.
        node: the Slurm node name (``SLURMD_NODENAME``).
        shard_unit_mib: node.toml ``shard_unit``, MiB.
        gres_conf: the gres.conf slurmd reads, parsed.

    Raises:
        ConfigError: the reason from :func:`shard_unit_mismatch`, ``source`` the gres.conf.
    """
    problem = shard_unit_mismatch(machine, shard_unit_mib, installed_shard_counts(gres_conf, node))
    if problem:
        raise ConfigError(problem, source=gres_conf.source,
                          hint=f"node.toml shard_unit and 'gres-conf --shard-unit' must be the same: set shard_unit "
                               f"in node.toml to the unit gres.conf was written with, or regenerate gres.conf with "
                               f"--shard-unit {format_mib(shard_unit_mib)} and restart slurmd")
