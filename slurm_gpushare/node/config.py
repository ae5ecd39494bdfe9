"""Node-side settings of the hooks: where state lives, which MPS binary, which machine description.

A TOML file (default ``/etc/slurm/gpushare/node.toml``; the hooks' ``--config``), versioned and
strict like the site policy: unknown keys and wrong types are errors naming the key and the file.
Every key is optional::

    version = 1
    run_dir = "/run/slurm-gpushare"            # per-job state, MPS pipe and log directories
    machine = "/etc/slurm/gpushare/machines/{node}.json"
    mps_control = "/usr/bin/nvidia-cuda-mps-control"
    shard_unit = "1G"                          # with a unit (1G, 512M); must match gres-conf --shard-unit
    mps_start_timeout = 10.0                   # seconds
    mps_quit_timeout = 10.0                    # seconds before SIGTERM/SIGKILL of a daemon that ignores quit
    drain_on_stuck_daemon = true               # an MPS daemon that survives SIGKILL drains the node
    mps_mode = "per-job"                       # or "per-gpu": one daemon per GPU and user, shared by jobs
    low_priority_partitions = ["scavenger"]    # their jobs' MPS clients run below normal priority
    spool_dir = "/var/spool/slurm-gpushare/accounting"   # the Epilog's per-job GPU usage records
    monitor_interval = 10.0                    # seconds between the node monitor's NVML samples
    monitor_jobs_interval = 60.0               # seconds between its squeue calls (slurmctld load)
    monitor_listen = ":9817"                   # its Prometheus endpoint ("" for none)
    monitor_textfile = ""                      # node_exporter textfile to write after each sample ("" none)
    admin_comment_summary = false              # the monitor puts a usage summary in running jobs' AdminComment
    admin_comment_interval = 300.0             # seconds between two such updates of one job

    [mps_env]                                  # extra environment of the MPS control daemon
    LD_LIBRARY_PATH = "/usr/local/cuda/lib64"

``{node}`` in ``run_dir`` and ``machine`` is the Slurm node name (``SLURMD_NODENAME``): several
slurmd on one host (the dev cluster) keep their state apart.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_gpushare.errors import ConfigError, InputError
from slurm_gpushare.memsize import parse_shard_unit

NODE_CONFIG_VERSION = 1
DEFAULT_PATH = "/etc/slurm/gpushare/node.toml"


@dataclass(frozen=True)
class NodeConfig:
    """See the module docstring for each key (seconds, MiB)."""

    run_dir: str = "/run/slurm-gpushare"
    machine: str = "/etc/slurm/gpushare/machines/{node}.json"
    mps_control: str = "/usr/bin/nvidia-cuda-mps-control"
    shard_unit_mib: int = 1024
    mps_start_timeout: float = 10.0
    mps_quit_timeout: float = 10.0
    drain_on_stuck_daemon: bool = True
    mps_env: tuple[tuple[str, str], ...] = ()
    mps_mode: str = "per-job"
    low_priority_partitions: tuple[str, ...] = ()
    spool_dir: str = "/var/spool/slurm-gpushare/accounting"
    monitor_interval: float = 10.0
    monitor_jobs_interval: float = 60.0
    monitor_listen: str = ":9817"
    monitor_textfile: str = ""
    admin_comment_summary: bool = False
    admin_comment_interval: float = 300.0

    def run_dir_for(self, node: str) -> Path:
        return Path(self.run_dir.replace("{node}", node))

    def machine_for(self, node: str) -> Path:
        return Path(self.machine.replace("{node}", node))


_KEYS: dict[str, type | tuple[type, ...]] = {
    "version": int, "run_dir": str, "machine": str, "mps_control": str, "shard_unit": str,
    "mps_start_timeout": (int, float), "mps_quit_timeout": (int, float), "drain_on_stuck_daemon": bool,
    "mps_env": dict, "mps_mode": str, "low_priority_partitions": list, "spool_dir": str,
    "monitor_interval": (int, float), "monitor_jobs_interval": (int, float), "monitor_listen": str,
    "monitor_textfile": str,
    "admin_comment_summary": bool, "admin_comment_interval": (int, float),
}


#: Keys in seconds: (lowest, highest, lowest allowed itself).
_SECONDS: dict[str, tuple[float, float, bool]] = {
    "mps_start_timeout": (0, 600, False), "mps_quit_timeout": (0, 600, False),
    "monitor_interval": (0.1, 3600, True), "monitor_jobs_interval": (0, 3600, True),
    "admin_comment_interval": (1, 86400, True),
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


def parse_node_config(text: str, *, source: str = "<node config>") -> NodeConfig:
    """Parse node.toml text.

    Raises:
        ConfigError: not TOML, wrong version, an unknown key, a value of the wrong type or range.
    """
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML: {e}", source=source) from None
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
    for key, value in data.items():
        want = _KEYS[key]
        if isinstance(value, bool) and want is not bool or not isinstance(value, want):
            raise ConfigError(f"{key} has the wrong type ({type(value).__name__})", source=source)
        if key == "version":
            continue
        if key == "shard_unit":
            try:
                kw["shard_unit_mib"] = parse_shard_unit(value)
            except InputError as e:
                raise ConfigError(e.message, hint=e.hint, source=source) from None
        elif key == "low_priority_partitions":
            if not all(isinstance(v, str) and v for v in value):
                raise ConfigError("low_priority_partitions must be a list of partition names", source=source)
            kw[key] = tuple(value)
        elif key == "mps_mode":
            if value not in ("per-job", "per-gpu"):
                raise ConfigError(f"mps_mode = {value!r} is not a mode", hint="use \"per-job\" or \"per-gpu\"",
                                  source=source)
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
