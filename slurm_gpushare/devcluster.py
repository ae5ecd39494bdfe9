"""A throwaway Slurm cluster with simulated GPUs on one host: the test fixture and the demo.

``scripts/dev-cluster up|down|status|env`` (or ``python -m slurm_gpushare.devcluster``) runs Debian's
``slurm-wlm`` 22.05 as root without systemd: munged, slurmctld and one ``slurmd -N <node>`` per node,
optionally a private MariaDB + slurmdbd for ``sacct``. Each node's GPUs come from a machine
description (real machines' ``nvidia-smi topo -m`` parsed into JSON, shipped in
``slurm_gpushare/data/machines``): fake ``nvidiaN`` character devices (major 195) and, for MIG
devices, ``nvidia-caps/nvidia-capN`` devices are made with mknod under the cluster's own directory,
and gres.conf / slurm.conf are rendered by :mod:`slurm_gpushare.gresconf`.

Everything lives under one state directory (``--dir``, env ``GPUSHARE_DEV_DIR``, default
``/tmp/slurm-gpushare-dev``); ports come from one base (``--port-base``, env ``GPUSHARE_DEV_PORT``).
``up`` twice is harmless; ``down`` cancels the cluster's jobs first, then stops only the PIDs written
in its own ``run/*.pid`` files. The Slurm 22.05 pitfalls this handles are listed in docs/development.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from slurm_gpushare.errors import ClusterError, GpushareError
from slurm_gpushare.gresconf import GresOptions, node_gres, render_gres_conf, render_slurm_conf
from slurm_gpushare.hardware.machine import Machine

DEFAULT_DIR = "/tmp/slurm-gpushare-dev"
DEFAULT_PORT_BASE = 16817
#: The embedded default cluster: node name -> packaged machine description.
DEFAULT_NODES = {
    "h100-nvs": "dgx-h100-8gpu-nv18.json",
    "a100-nvb": "8x-a100-nv12-bridge.json",
    "rtx4090-pcie": "8x-rtx4090-pcie.json",
    "h100-mig": "4x-h100-mig-mixed.json",
}
NVIDIA_MAJOR = 195
#: nvidia-caps has a dynamic major on real nodes; any free major serves the fake devices.
NVIDIA_CAPS_MAJOR = 239
#: Memory the fake nodes claim (MiB); config_overrides lets slurmd accept more than the host has.
NODE_REAL_MEMORY_MIB = 512000


def packaged_machine(filename: str) -> Machine:
    """Load a machine description shipped in ``slurm_gpushare/data/machines``."""
    ref = resources.files("slurm_gpushare") / "data" / "machines" / filename
    return Machine.from_json(ref.read_text(), source=f"slurm_gpushare/data/machines/{filename}")


@dataclass
class DevCluster:
    """One dev cluster: its directory, ports, nodes and options.

    Attributes:
        root: state directory (created; must be on a filesystem that allows device nodes).
        port_base: slurmctld port; slurmdbd +2, MariaDB +3, slurmd of node i: +10+i.
        nodes: Slurm node name -> machine description.
        cgroup: confine devices with task/cgroup (cgroup v1, ConstrainDevices=yes).
        dbd: run a private MariaDB and slurmdbd so that ``sacct`` works.
        gres_options: per-node gres.conf generation options (the device directory is always the
            node's own fake one).
    """

    root: Path
    port_base: int = DEFAULT_PORT_BASE
    nodes: dict[str, Machine] = field(default_factory=dict)
    cgroup: bool = False
    dbd: bool = False
    gres_options: dict[str, GresOptions] = field(default_factory=dict)

    @classmethod
    def default(cls, root: str | Path | None = None, port_base: int | None = None, *,
                cgroup: bool = False, dbd: bool = False) -> DevCluster:
        """The embedded default cluster (see :data:`DEFAULT_NODES`)."""
        root = Path(root or os.environ.get("GPUSHARE_DEV_DIR") or DEFAULT_DIR)
        port = int(port_base or os.environ.get("GPUSHARE_DEV_PORT") or DEFAULT_PORT_BASE)
        nodes = {name: packaged_machine(f) for name, f in DEFAULT_NODES.items()}
        return cls(root.absolute(), port, nodes, cgroup=cgroup, dbd=dbd)

    # --- paths and environment ----------------------------------------------------------------

    @property
    def slurm_conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm clients and daemons of this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    def pidfile(self, daemon: str) -> Path:
        return self.root / "run" / f"{daemon}.pid"

    def device_dir(self, node: str) -> Path:
        return self.root / "dev" / node

    def daemons(self) -> list[str]:
        """Daemon names in start order (their pid files are ``run/<name>.pid``)."""
        names = ["munged"]
        if self.dbd:
            names += ["mysqld", "slurmdbd"]
        return names + ["slurmctld"] + [f"slurmd-{n}" for n in self.nodes]

    # --- rendering ----------------------------------------------------------------------------

    def render(self) -> dict[str, str]:
        """All config files of the cluster, as ``{relative path: text}`` (pure)."""
        r = self.root
        generated = [node_gres(m, name, replace(self.gres_options.get(name, GresOptions()),
                                                device_dir=str(self.device_dir(name))))
                     for name, m in self.nodes.items()]
        hostname = socket.gethostname().split(".")[0]
        params = {}
        for i, name in enumerate(self.nodes, start=1):
            params[name] = (f"NodeHostname={hostname} NodeAddr=127.0.0.1 Port={self.port_base + 10 + i} "
                            f"RealMemory={NODE_REAL_MEMORY_MIB}")
        gres_text = render_slurm_conf(generated, node_params=params, accounting_tres=self.dbd)
        conf = [
            "# Generated by slurm-gpushare dev-cluster; rewritten by every 'up'.",
            "ClusterName=gpushare-dev",
            "SlurmctldHost=localhost",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={self.port_base}",
            f"SlurmdPort={self.port_base + 1}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={r}/munge/munge.sock",
            f"StateSaveLocation={r}/spool/ctld",
            f"SlurmdSpoolDir={r}/spool/d-%n",
            f"SlurmdPidFile={r}/run/slurmd-%n.pid",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
            f"SlurmctldPidFile={r}/run/slurmctld.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "MailProg=/bin/true",
            "ProctrackType=proctrack/linuxproc",
            f"TaskPlugin={'task/cgroup' if self.cgroup else 'task/none'}",
            f"JobAcctGatherType={'jobacct_gather/linux' if self.dbd else 'jobacct_gather/none'}",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "DefMemPerCPU=100",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=2",
            "MpiDefault=none",
            "ReturnToService=2",
            "MinJobAge=30",
            "SlurmdParameters=config_overrides",
            "PrologFlags=Alloc",
        ]
        if self.dbd:
            conf += [
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=localhost",
                f"AccountingStoragePort={self.port_base + 2}",
                f"AccountingStoragePass={r}/munge/munge.sock",
                "AccountingStoreFlags=job_comment",
            ]
        else:
            conf.append("AccountingStorageType=accounting_storage/none")
        conf.append(gres_text.rstrip("\n"))
        conf.append(f"PartitionName=gpu Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        files = {
            "etc/slurm.conf": "\n".join(conf) + "\n",
            "etc/gres.conf": render_gres_conf(generated, header="Generated by slurm-gpushare dev-cluster."),
        }
        if self.cgroup:
            files["etc/cgroup.conf"] = (
                "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nCgroupAutomount=no\n"
                "ConstrainCores=no\nConstrainRAMSpace=no\nConstrainSwapSpace=no\nConstrainDevices=yes\n")
        if self.dbd:
            files["etc/slurmdbd.conf"] = (
                f"AuthType=auth/munge\nAuthInfo=socket={r}/munge/munge.sock\nDbdHost=localhost\n"
                f"DbdPort={self.port_base + 2}\nSlurmUser=root\nPidFile={r}/run/slurmdbd.pid\n"
                f"LogFile={r}/log/slurmdbd.log\nStorageType=accounting_storage/mysql\n"
                f"StorageHost=127.0.0.1\nStoragePort={self.port_base + 3}\nStorageUser=slurm\n"
                "StoragePass=gpushare-dev\nStorageLoc=slurm_acct_db\n")
        for name, m in self.nodes.items():
            files[f"machines/{name}.json"] = m.to_json()
        files["cluster.json"] = json.dumps({"cgroup": self.cgroup, "dbd": self.dbd, "port_base": self.port_base,
                                            "nodes": list(self.nodes)}, indent=2) + "\n"
        return files

    # --- lifecycle ----------------------------------------------------------------------------

    def up(self, *, timeout: float = 90.0, out=sys.stdout) -> None:
        """Bring the cluster up (idempotent) and wait until every node is IDLE.

        Raises:
            ClusterError: a missing program, a daemon that dies at start (with its log tail), a
                running cluster with another configuration, or nodes not idle within ``timeout``.
        """
        self._check_programs()
        files = self.render()
        running = self.alive("slurmctld")
        if running:
            current = self._read("etc/slurm.conf")
            if current != files["etc/slurm.conf"] or self._read("etc/gres.conf") != files["etc/gres.conf"]:
                raise ClusterError(f"a dev cluster with another configuration is running in {self.root}",
                                   hint="run 'scripts/dev-cluster down' first, or use another --dir/--port-base")
        changed = self._read("etc/slurm.conf") != files["etc/slurm.conf"] or \
            self._read("etc/gres.conf") != files["etc/gres.conf"]
        self._prepare(files)
        self._start_munged()
        if self.dbd:
            self._start_dbd()
        if not running:
            # slurmctld keeps each node's registered GRES in its saved state, and a node whose GRES
            # changed is not re-read from the new gres.conf: start clean (-c) after a config change.
            self._spawn("slurmctld", ["slurmctld", "-c"] if changed else ["slurmctld"])
        self._wait(lambda: self._slurm_ok(["scontrol", "ping"], "UP"), 30, "slurmctld answering ping",
                   log="log/slurmctld.log", daemon="slurmctld")
        for name in self.nodes:
            if not self.alive(f"slurmd-{name}"):
                self._spawn(f"slurmd-{name}", ["slurmd", "-N", name])
        self._wait(self.all_idle, timeout, "all nodes IDLE", log="log/slurmctld.log")
        print(f"dev cluster up in {self.root} ({len(self.nodes)} nodes)", file=out)
        print(self.sinfo(), file=out)
        print(f"export SLURM_CONF={self.slurm_conf}", file=out)

    def down(self, *, out=sys.stdout) -> list[int]:
        """Cancel the cluster's jobs, then stop its daemons by the PIDs in its pid files.

        Returns:
            the PIDs that were stopped.
        """
        if self.alive("slurmctld"):
            ids = self._slurm(["squeue", "-h", "-o", "%i"]).split()
            if ids:
                self._slurm(["scancel", "--full", *ids], check=False)
                self._slurm(["scancel", *ids], check=False)
                try:
                    self._wait(lambda: not self._slurm(["squeue", "-h", "-o", "%i"], check=False).split(),
                               30, "jobs to end")
                except ClusterError as e:
                    print(f"warning: {e}", file=sys.stderr)
        stopped = []
        order = [f"slurmd-{n}" for n in self.nodes] + ["slurmctld", "slurmdbd", "mysqld", "munged"]
        # also stop slurmd pid files of nodes no longer in the configuration
        extra = sorted(p.stem for p in (self.root / "run").glob("slurmd-*.pid") if p.stem not in order)
        for daemon in extra + order:
            pid = self.pid(daemon)
            if pid is not None and _pid_alive(pid):
                _stop_pid(pid)
                stopped.append(pid)
            self.pidfile(daemon).unlink(missing_ok=True)
        self._remove_cgroups()
        print(f"dev cluster in {self.root} is down (stopped {len(stopped)} daemon(s))", file=out)
        return stopped

    def status(self) -> dict:
        """Daemon PIDs and liveness, and the node states when slurmctld answers."""
        daemons = {d: {"pid": self.pid(d), "alive": self.alive(d)} for d in self.daemons()}
        nodes = {}
        if daemons["slurmctld"]["alive"]:
            for line in self._slurm(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).splitlines():
                n, st = line.split()
                nodes[n] = st
        return {"dir": str(self.root), "slurm_conf": str(self.slurm_conf), "daemons": daemons, "nodes": nodes}

    def saved_options(self) -> dict:
        """Options of the last ``up`` in this directory (``cluster.json``), or ``{}``."""
        try:
            return json.loads((self.root / "cluster.json").read_text())
        except (OSError, ValueError):
            return {}

    # --- queries ------------------------------------------------------------------------------

    def pid(self, daemon: str) -> int | None:
        """PID from ``run/<daemon>.pid``, or None."""
        try:
            return int(self.pidfile(daemon).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def alive(self, daemon: str) -> bool:
        pid = self.pid(daemon)
        return pid is not None and _pid_alive(pid)

    def all_idle(self) -> bool:
        out = self._slurm(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return set(states) >= set(self.nodes) and all(states[n] == "idle" for n in self.nodes)

    def sinfo(self) -> str:
        return self._slurm(["sinfo", "-N", "-O", "NodeList:16,StateLong:10,Gres:120"], check=False).rstrip()

    # --- internals ----------------------------------------------------------------------------

    def _read(self, rel: str) -> str | None:
        try:
            return (self.root / rel).read_text()
        except OSError:
            return None

    def _check_programs(self) -> None:
        needed = ["munged", "slurmctld", "slurmd", "sinfo", "scontrol", "squeue", "scancel"]
        if self.dbd:
            needed += ["slurmdbd", "mariadbd", "mariadb-install-db", "mariadb"]
        missing = [p for p in needed if shutil.which(p) is None]
        if missing:
            raise ClusterError(f"missing programs: {', '.join(missing)}",
                               hint="apt-get install slurm-wlm munge"
                               + (" slurmdbd mariadb-server" if self.dbd else ""))
        if os.geteuid() != 0:
            raise ClusterError("the dev cluster runs Slurm daemons as root (SlurmUser=root) and makes device "
                               "nodes with mknod", hint="run it as root, e.g. in a throwaway VM or container")

    def _prepare(self, files: dict[str, str]) -> None:
        r = self.root
        for d in ("etc", "munge", "spool/ctld", "log", "run", "machines", "db", *(f"spool/d-{n}" for n in self.nodes)):
            (r / d).mkdir(parents=True, exist_ok=True)
        # munged refuses a socket directory that is not executable by all ("Socket is inaccessible")
        for p in [r, *r.parents]:
            if p == Path("/"):
                break
            if not p.stat().st_mode & stat.S_IXOTH:
                raise ClusterError(f"{p} is not executable by others; munged refuses its socket below it",
                                   hint="choose --dir under a world-executable path such as /tmp")
        os.chmod(r, 0o755)
        os.chmod(r / "munge", 0o755)
        for rel, text in files.items():
            p = r / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if self._read(rel) != text:
                tmp = p.with_name(p.name + ".tmp")
                tmp.write_text(text)
                os.replace(tmp, p)
        if self.dbd:
            os.chmod(r / "etc/slurmdbd.conf", 0o600)
        key = r / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        for name, m in self.nodes.items():
            d = self.device_dir(name)
            d.mkdir(parents=True, exist_ok=True)
            for g in m.gpus:
                _mknod(d / f"nvidia{g.minor}", NVIDIA_MAJOR, g.minor)
                for inst in g.mig_instances:
                    for cap in inst.caps:
                        (d / "nvidia-caps").mkdir(exist_ok=True)
                        _mknod(d / "nvidia-caps" / f"nvidia-cap{cap}", NVIDIA_CAPS_MAJOR, cap)

    def _start_munged(self) -> None:
        if self.alive("munged"):
            return
        r = self.root
        self._spawn("munged", ["munged", f"--key-file={r}/munge/munge.key", f"--socket={r}/munge/munge.sock",
                               f"--pid-file={self.pidfile('munged')}", f"--log-file={r}/log/munged.log",
                               f"--seed-file={r}/munge/munged.seed"])
        self._wait(lambda: (r / "munge" / "munge.sock").exists(), 10, "munged socket", log="log/munged.log")

    def _start_dbd(self) -> None:
        r = self.root
        sock = r / "db" / "mysqld.sock"
        if not (r / "db" / "data" / "mysql").is_dir():
            _run(["mariadb-install-db", "--user=root", f"--datadir={r}/db/data",
                  "--auth-root-authentication-method=normal", "--skip-test-db"], log=r / "log" / "mariadb-install.log")
        if not self.alive("mysqld"):
            log = open(r / "log" / "mysqld.out", "ab")
            subprocess.Popen(["mariadbd", "--user=root", f"--datadir={r}/db/data", f"--socket={sock}",
                              f"--port={self.port_base + 3}", "--bind-address=127.0.0.1",
                              f"--pid-file={self.pidfile('mysqld')}", f"--log-error={r}/log/mysqld.err",
                              "--innodb-buffer-pool-size=64M"],
                             stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
            log.close()
        sql = ["mariadb", "-S", str(sock), "-uroot"]
        self._wait(lambda: subprocess.run([*sql, "-e", "select 1"], capture_output=True).returncode == 0,
                   30, "MariaDB", log="log/mysqld.err")
        _run([*sql, "-e", "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'gpushare-dev'; "
                          "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"])
        if not self.alive("slurmdbd"):
            self._spawn("slurmdbd", ["slurmdbd"])
        self._wait(lambda: "slurmdbd version" in (self._read("log/slurmdbd.log") or ""), 30, "slurmdbd",
                   log="log/slurmdbd.log")

    def _spawn(self, daemon: str, argv: list[str]) -> None:
        """Start a self-daemonizing program and wait for its pid file to name a live process."""
        log = self.root / "log" / f"{daemon}.start.log"
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        log.write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise ClusterError(f"{argv[0]} exited with {proc.returncode}: {(proc.stdout + proc.stderr).strip()[-500:]}",
                               source=" ".join(argv))
        self._wait(lambda: self.alive(daemon), 15, f"{daemon} pid file", log=f"log/{daemon}.log")

    def _slurm(self, argv: list[str], *, check: bool = True) -> str:
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def _slurm_ok(self, argv: list[str], needle: str) -> bool:
        try:
            return needle in self._slurm(argv, check=False)
        except subprocess.TimeoutExpired:
            return False

    def _wait(self, cond, timeout: float, what: str, *, log: str | None = None, daemon: str | None = None) -> None:
        """Poll ``cond`` with backoff; fail early when ``daemon`` died, with the tail of ``log``."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        problem = f"timed out after {timeout:.0f} s waiting for {what}"
        while time.monotonic() < deadline:
            if cond():
                return
            if daemon is not None and not self.alive(daemon):
                problem = f"{daemon} died while waiting for {what}"
                break
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        tail = ""
        if log:
            lines = (self._read(log) or "").splitlines()
            fatal = [ln for ln in lines if "fatal" in ln or "error" in ln.lower()]
            tail = "\n" + "\n".join((fatal or lines)[-8:])
        raise ClusterError(problem + tail)

    def _remove_cgroups(self) -> None:
        # task/cgroup (cgroup v1) leaves empty slurm_<node> parents behind; remove ours when empty
        base = Path("/sys/fs/cgroup")
        if not base.is_dir():
            return
        for ctl in base.iterdir():
            for name in self.nodes:
                top = ctl / f"slurm_{name}"
                if top.is_dir():
                    for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                        try:
                            d.rmdir()
                        except OSError:
                            pass
                    try:
                        top.rmdir()
                    except OSError:
                        pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours still "exists"; treat it as dead
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _stop_pid(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM, wait up to ``timeout`` s, then SIGKILL (slurmd can ignore SIGTERM while registering)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _pid_alive(pid):
        time.sleep(0.05)


def _mknod(path: Path, major: int, minor: int) -> None:
    dev = os.makedev(major, minor)
    try:
        st = path.lstat()
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == dev:
            return
        path.unlink()
    except FileNotFoundError:
        pass
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, dev)
    except PermissionError:
        raise ClusterError(f"cannot create device node {path}",
                           hint="the dev cluster must run as root on a filesystem that allows device nodes") from None


def _run(argv: list[str], *, log: Path | None = None) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if log is not None:
        log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise ClusterError(f"{argv[0]} failed ({proc.returncode}): {(proc.stdout + proc.stderr).strip()[-500:]}")


def main(argv: list[str] | None = None) -> int:
    """``dev-cluster up|down|status|env`` (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="dev-cluster", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["up", "down", "status", "env"])
    ap.add_argument("--dir", help=f"state directory (env GPUSHARE_DEV_DIR, default {DEFAULT_DIR})")
    ap.add_argument("--port-base", type=int,
                    help=f"slurmctld port (env GPUSHARE_DEV_PORT, default {DEFAULT_PORT_BASE})")
    ap.add_argument("--cgroup", action="store_true", help="confine devices with task/cgroup (cgroup v1)")
    ap.add_argument("--dbd", action="store_true", help="run slurmdbd with a private MariaDB (sacct)")
    ap.add_argument("--json", action="store_true", help="status as JSON")
    args = ap.parse_args(argv)
    cluster = DevCluster.default(args.dir, args.port_base, cgroup=args.cgroup, dbd=args.dbd)
    if args.action != "up":
        # down/status/env act on the cluster as it was brought up
        saved = cluster.saved_options()
        cluster.cgroup = cluster.cgroup or saved.get("cgroup", False)
        cluster.dbd = cluster.dbd or saved.get("dbd", False)
    try:
        if args.action == "up":
            cluster.up()
        elif args.action == "down":
            cluster.down()
        elif args.action == "env":
            print(f"export SLURM_CONF={cluster.slurm_conf}")
        else:
            st = cluster.status()
            if args.json:
                print(json.dumps(st, indent=2))
            else:
                for d, s in st["daemons"].items():
                    print(f"{d:<22} pid {s['pid'] or '-':<8} {'running' if s['alive'] else 'stopped'}")
                for n, s in st["nodes"].items():
                    print(f"node {n:<17} {s}")
                return 0 if st["daemons"]["slurmctld"]["alive"] else 3
    except GpushareError as e:
        print(f"dev-cluster: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
