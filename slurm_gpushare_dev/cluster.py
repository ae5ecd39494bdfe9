"""A throwaway Slurm cluster with simulated GPUs on one host: the test fixture and the demo.

``scripts/dev-cluster up|down|status|env`` (or ``python -m slurm_gpushare_dev.cluster``) runs Debian's
``slurm-wlm`` 22.05 as root without systemd: munged, slurmctld, the filter service, one
``slurmd -N <node>`` and one node monitor (``slurm-gpushare monitor``) per node, optionally a private
MariaDB + slurmdbd for ``sacct``. Each node's GPUs come from a machine
description (real machines' ``nvidia-smi topo -m`` parsed into JSON, shipped in
``slurm_gpushare/data/machines``): fake ``nvidiaN`` character devices (major 195) and, for MIG
devices, ``nvidia-caps/nvidia-capN`` devices are made with mknod under the cluster's own directory,
and gres.conf / slurm.conf are rendered by :mod:`slurm_gpushare.gresconf.render`. Jobs "use" the fake GPUs
with ``<dir>/bin/fake-gpu-app`` (:mod:`slurm_gpushare_dev.fakeapp`, run from a world-readable copy of the
package), which registers in a process table that every fake NVML of the cluster reads.

Everything lives under one state directory (``--dir``, env ``GPUSHARE_DEV_DIR``, default
``/tmp/slurm-gpushare-dev``); ports come from one base (``--port-base``, env ``GPUSHARE_DEV_PORT``).
``up`` checks its settings before starting anything, is harmless twice, and stops what it started when
it fails. A PID (from a ``run/*.pid`` file) is only reported as running or signalled once ``/proc``
shows it is this cluster's daemon (:meth:`DevCluster.is_ours`); ``down`` cancels the cluster's jobs
first, then stops the cluster's daemons. The Slurm 22.05 pitfalls this handles are listed in
docs/development.md.
"""

from __future__ import annotations

import difflib
import errno
import filecmp
import functools
import importlib.util
import itertools
import json
import os
import py_compile
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

import click
import ClusterShell
import psutil

import slurm_gpushare
from slurm_gpushare.atomicfile import write_atomic
from slurm_gpushare.errors import ClusterError, GpushareError
from slurm_gpushare.gresconf.render import generate_node_gres, render_gres_conf, render_slurm_conf
from slurm_gpushare.hardware.fake import PROCESS_TABLE_ENV, ProcessTable, derived_gpus
from slurm_gpushare.hardware.machine import Machine, mig_cap_minors
from slurm_gpushare.hardware.ports import ENV as NVML_ENV
from slurm_gpushare.memsize import format_mib
from slurm_gpushare.procinfo import pid_alive
from slurm_gpushare.siteinstall import SOCKET_SUBDIR, set_lua_setting
from slurm_gpushare.slurm.nodegres import MIB_PER_GIB, GresOptions
from slurm_gpushare.slurm.release import RECONFIGURE_RESTARTS, Release
from slurm_gpushare_dev.release import IN_ROOT_ENV, PROJECT, SUITES, host_release, needs_root, run_in_release

DEFAULT_DIR = "/tmp/slurm-gpushare-dev"
DEFAULT_PORT_BASE = 16817
#: The dev clusters' credential lifetime (AuthInfo cred_expire, seconds): also slurmctld's requeue delay.
CRED_EXPIRE_S = 30

#: The embedded default cluster: node name -> packaged machine description.
DEFAULT_NODES = {
    "h100-nvs": "dgx-h100-8gpu-nv18.json",
    "a100-nvb": "8x-a100-nv12-bridge.json",
    "rtx4090-pcie": "8x-rtx4090-pcie.json",
    "h100-mig": "4x-h100-mig-mixed.json",
}
#: The site files the product ships (Lua shims, hook wrappers, units, examples: package data). The dev cluster
#: never copies them from here: the product's ``install`` command writes them (:meth:`DevCluster.install_site`).
SITE = resources.files("slurm_gpushare") / "data" / "site"
#: An installed ``slurm-gpushare`` (a console script, e.g. of a wheel installed into a clean venv) whose
#: ``install`` command writes the clusters' site files, and whose hooks the nodes run; unset: this
#: interpreter's product (``python -m slurm_gpushare``). .ci/run sets it (docs/development.md).
INSTALLED_ENV = "GPUSHARE_DEV_INSTALLED"
#: Partitions besides ``gpu`` (all nodes, the default): one without MIG, one PCIe-only.
DEFAULT_PARTITIONS = {"nomig": ("h100-nvs", "a100-nvb", "rtx4090-pcie"), "pcie": ("rtx4090-pcie",)}
#: The stand-in for nvidia-cuda-mps-control (package data of this package, see fake_mps/README.md); the
#: simulated nodes run a copy of it, ``<dir>/bin/nvidia-cuda-mps-control``.
_STANDIN = resources.files("slurm_gpushare_dev") / "fake_mps" / "nvidia-cuda-mps-control"
#: The stand-in's module name in a cluster's ``bin`` (beside its launcher ``nvidia-cuda-mps-control``).
_STANDIN_MODULE = "fake_mps_control"
MPS_STANDIN = Path(str(_STANDIN))
#: Seconds the cluster's gpushare_client.lua waits for filterd's answer, when set (else the shipped 20 ms,
#: slurmctld's bound on a real controller): the test session sets it (tests/conftest.py), whose tests wait for
#: the service's answer on a machine that other work may keep too busy to answer within 20 ms.
FILTER_TIMEOUT_ENV = "GPUSHARE_DEV_FILTER_TIMEOUT"
NVIDIA_MAJOR = 195
#: nvidia-caps has a dynamic major on real nodes; any free major serves the fake devices.
NVIDIA_CAPS_MAJOR = 239
#: GPU instance ids per GPU in the driver's nvidia-caps table (``/proc/driver/nvidia-caps/mig-minors``:
#: ``gpu<G>/gi<I>`` for I up to 14).
MIG_GI_IDS = 14
#: Memory the fake nodes claim (MiB); config_overrides lets slurmd accept more than the host has.
NODE_REAL_MEMORY_MIB = 512000
#: Longest path a unix socket can bind (sun_path is 108 bytes with its terminating NUL).
UNIX_SOCKET_PATH_MAX = 107
#: Characters a state directory may contain: Slurm config values split on whitespace, ``#`` starts a
#: comment, ``%`` is expanded in the slurmd paths, ``,`` and ``=`` separate AuthInfo options, and the
#: directory is also written into a Lua string.
_DIR_CHARS = re.compile(r"[A-Za-z0-9._+@/-]")
#: Log lines every start writes on Debian's build (no PMIx library), never the cause of a failure.
_HARMLESS_LOG = ("mpi/pmix", "pmi/pmix", "Couldn't load specified plugin name for mpi/pmix",
                 "Cannot create context for mpi/pmix")
#: Stop order of ``down`` (after the monitor and then the slurmd of every node).
_STOP_ORDER = ("filterd", "slurmctld", "slurmdbd", "mysqld", "munged")
#: Node *i*'s slurmd listens on port base + 10 + *i*, its monitor on port base + 40 + *i*.
SLURMD_PORT_OFFSET = 10
MONITOR_PORT_OFFSET = 40
#: Most nodes a cluster can have before node slurmd ports would run into the monitors' ports.
MAX_NODES = MONITOR_PORT_OFFSET - SLURMD_PORT_OFFSET - 1
#: The source trees of the product, of this package, of click (the fake app's command line; pure Python)
#: of psutil (which the product's ``procinfo`` imports) and of ClusterShell (its hostlists and ``IDX:`` lists: a
#: user's ``jobstats`` of a running job reads them), copied to ``<dir>/lib`` for the jobs' users
#: (see :meth:`DevCluster.install_lib`).
PACKAGE_DIRS = (Path(slurm_gpushare.__file__).resolve().parent, Path(__file__).resolve().parent,
                Path(click.__file__).resolve().parent, Path(psutil.__file__).resolve().parent,
                Path(ClusterShell.__file__).resolve().parent)


@dataclass
class _Start:
    """What one ``up`` found running, where each log ended when it began, and what it started."""

    before: set[int]
    marks: dict[str, int]
    started: list[tuple[str, int]] = field(default_factory=list)
    children: list[subprocess.Popen] = field(default_factory=list)


def packaged_machine(filename: str) -> Machine:
    """Load a machine description shipped in ``slurm_gpushare/data/machines``."""
    ref = resources.files("slurm_gpushare") / "data" / "machines" / filename
    return Machine.from_json(ref.read_text(), source=f"slurm_gpushare/data/machines/{filename}")


#: ``sinfo %T`` states of a node in service (not down, drained, or not responding: those carry a suffix)
IN_SERVICE = frozenset({"idle", "mixed", "allocated", "completing"})


@dataclass
class DevCluster:
    """One dev cluster: its directory, ports, nodes and options.

    Attributes:
        root: state directory (created; must be on a filesystem that allows device nodes).
        port_base: slurmctld port; slurmdbd +2, MariaDB +3, slurmd of node i: +10+i, its monitor +40+i.
        nodes: Slurm node name -> machine description.
        cgroup: confine devices with task/cgroup (cgroup v1, ConstrainDevices=yes).
        dbd: run a private MariaDB and slurmdbd so that ``sacct`` works.
        gres_options: per-node gres.conf generation options (the device directory is always the
            node's own fake one; the release is the cluster's, :attr:`slurm_release`, unless the
            options name one).
        extra_partitions: partitions besides ``gpu`` (every node, the default), name -> node names.
        unwaited: nodes ``up`` neither waits for nor resumes: a test's node that the release may
            refuse (set INVAL), to see whether it does.
        gpu_order: the nodes' node.toml ``gpu_order`` (whose multi-GPU tasks get the NVLink ring).
        extra_conf: lines appended to slurm.conf (a test's own partitions, ``AccountingStorageEnforce``).
        node_conf: lines added to the nodes' node.toml before its ``[mps_env]`` table (top-level keys first, then
            tables such as ``[enforce_partitions]``).
        scheduler_parameters: slurm.conf ``SchedulerParameters`` (benchmarks/packing runs backfill
            every second: its jobs last seconds, not hours).
        product: slurm.conf names the product's hooks and plugins (:meth:`product_lines`); ``False``: the
            same cluster (gres.conf, nodes, daemons, filterd and monitors) as plain Slurm, to compare the
            two (:meth:`set_product` switches a running cluster).
    """

    root: Path
    port_base: int = DEFAULT_PORT_BASE
    nodes: dict[str, Machine] = field(default_factory=dict)
    cgroup: bool = False
    dbd: bool = False
    gres_options: dict[str, GresOptions] = field(default_factory=dict)
    extra_partitions: dict[str, tuple[str, ...]] = field(default_factory=dict)
    unwaited: tuple[str, ...] = ()
    gpu_order: str = "gpushare"
    extra_conf: tuple[str, ...] = ()
    node_conf: tuple[str, ...] = ()
    scheduler_parameters: str = "sched_interval=2"
    product: bool = True
    _start: _Start | None = field(default=None, init=False, repr=False, compare=False)

    @functools.cached_property
    def slurm_release(self) -> str | None:
        """The release of the Slurm this cluster runs (``slurmctld -V`` of this process's Slurm)."""
        return host_release()

    @classmethod
    def default(cls, root: str | Path | None = None, port_base: int | None = None, *,
                cgroup: bool = False, dbd: bool = False) -> DevCluster:
        """The embedded default cluster (see :data:`DEFAULT_NODES`)."""
        root = Path(root or os.environ.get("GPUSHARE_DEV_DIR") or DEFAULT_DIR)
        port = int(port_base or os.environ.get("GPUSHARE_DEV_PORT") or DEFAULT_PORT_BASE)
        nodes = {name: packaged_machine(f) for name, f in DEFAULT_NODES.items()}
        return cls(root.absolute(), port, nodes, cgroup=cgroup, dbd=dbd, extra_partitions=DEFAULT_PARTITIONS)

    # --- paths and environment ----------------------------------------------------------------

    @property
    def slurm_conf(self) -> Path:
        """The cluster's slurm.conf (clients need it as ``SLURM_CONF``)."""
        return self.root / "etc" / "slurm.conf"

    @property
    def node_config(self) -> Path:
        """The simulated nodes' node config (``slurm-gpushare hook``/``monitor`` ``--config``): ``node.toml`` in
        :attr:`site_config_dir`, where the installed wrappers look for it."""
        return self.site_config_dir / "node.toml"

    @property
    def site_config_dir(self) -> Path:
        """The product's config directory of this cluster (``install --config-dir``): the installed hook
        wrappers and example configs."""
        return self.root / "etc" / "gpushare"

    @property
    def site_prefix(self) -> Path:
        """The cluster's ``install --prefix`` (only the systemd units land below it; nothing runs them)."""
        return self.root / "site"

    @property
    def shard_unit_mib(self) -> int:
        """GPU memory per shard of the nodes' gres.conf (:attr:`gres_options`; one unit for all nodes:
        node.toml and the site policy, which must agree with it, are one file each)."""
        units = {self.gres_options.get(n, GresOptions()).shard_unit_mib for n in self.nodes}
        return units.pop() if len(units) == 1 else MIB_PER_GIB

    def initial_policy_text(self) -> str:
        """The site policy filterd starts with when the cluster has none yet: the shipped example,
        with :attr:`shard_unit_mib` where the nodes' shards are not 1 GiB."""
        text = (SITE / "gpushare.toml.example").read_text()
        if self.shard_unit_mib != MIB_PER_GIB:
            text = re.sub(r'^shard_unit = .*$', f'shard_unit = "{format_mib(self.shard_unit_mib)}"', text,
                          count=1, flags=re.M)
        return text

    @property
    def policy_file(self) -> Path:
        """The site policy filterd reads (``etc/gpushare.toml``; the shipped example when first started)."""
        return self.root / "etc" / "gpushare.toml"

    @property
    def filterd_socket(self) -> Path:
        """The filter service's public unix socket (cli_filter.lua's), in ``run/filterd`` as a site's install puts it
        in ``<run dir>/filterd``."""
        return self.root / "run" / SOCKET_SUBDIR / "filterd.sock"

    @property
    def controller_socket(self) -> Path:
        """The filter service's private unix socket (job_submit.lua's in slurmctld)."""
        return self.root / "run" / SOCKET_SUBDIR / "controller.sock"

    @property
    def fake_gpu_procs(self) -> Path:
        """The directory of the nodes' fake GPU process tables (mode 1777, see :meth:`fake_gpu_table`)."""
        return self.root / "fake-gpu-procs"

    def fake_gpu_table(self, node: str) -> Path:
        """``node``'s fake GPU process table (:class:`~slurm_gpushare.hardware.fake.ProcessTable`,
        ``GPUSHARE_FAKE_GPU_PROCESSES``), mode 1777 like ``/tmp``: the fake GPU processes of jobs on
        that node register here, and every fake NVML of that node (its monitor, its Prolog/Epilog)
        reads it. One table per node: an entry names a GPU index only, so a shared table would put a
        job's process on the same-numbered GPU of every node."""
        return self.fake_gpu_procs / node

    @property
    def fake_gpu_app(self) -> Path:
        """The stand-in CUDA program for jobs: ``fake-gpu-app --mem 6G --sm 40 --seconds 10``
        (:mod:`slurm_gpushare_dev.fakeapp`) "uses" the job's fake GPUs; any user can run it in a job."""
        return self.root / "bin" / "fake-gpu-app"

    @property
    def lib_dir(self) -> Path:
        """The world-readable copy of the package that :attr:`fake_gpu_app` imports."""
        return self.root / "lib"

    @property
    def down_command(self) -> str:
        """The command that stops this cluster (``--dir`` named unless it is the default directory)."""
        default = Path(os.environ.get("GPUSHARE_DEV_DIR") or DEFAULT_DIR).absolute()
        return "scripts/dev-cluster down" + ("" if self.root == default else f" --dir {self.root}")

    def monitor_port(self, node: str) -> int:
        """The port of ``node``'s monitor (port base + 40 + the node's 1-based position).

        Raises:
            KeyError: no such node.
        """
        names = list(self.nodes)
        if node not in names:
            raise KeyError(f"no node {node!r} in the dev cluster in {self.root}")
        return self.port_base + MONITOR_PORT_OFFSET + names.index(node) + 1

    def monitor_url(self, node: str) -> str:
        """``http://127.0.0.1:PORT/metrics`` of ``node``'s monitor (Prometheus text format)."""
        return f"http://127.0.0.1:{self.monitor_port(node)}/metrics"

    def monitor_textfile(self, node: str) -> Path:
        """The node_exporter textfile ``node``'s monitor rewrites after each sample."""
        return self.root / "metrics" / f"{node}.prom"

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm clients and daemons of this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    def env_exports(self) -> str:
        """What ``dev-cluster env`` prints, for ``eval``: ``SLURM_CONF`` (Slurm's clients need it) and
        ``GPUSHARE_FAKE_GPU_APP`` (:attr:`fake_gpu_app`, for job scripts), one ``export`` line each."""
        return f"export SLURM_CONF={self.slurm_conf}\nexport GPUSHARE_FAKE_GPU_APP={self.fake_gpu_app}"

    def pidfile(self, daemon: str) -> Path:
        """The pid file of ``daemon`` (``slurmctld``, ``slurmd-<node>``, ``monitor-<node>``, ...)."""
        return self.root / "run" / f"{daemon}.pid"

    def device_dir(self, node: str) -> Path:
        """Where ``node``'s fake ``nvidiaN`` devices are made (never ``/dev``)."""
        return self.root / "dev" / node

    def daemons(self) -> list[str]:
        """Daemon names in start order (their pid files are ``run/<name>.pid``)."""
        names = ["munged"]
        if self.dbd:
            names += ["mysqld", "slurmdbd"]
        return names + ["slurmctld", "filterd"] + [f"slurmd-{n}" for n in self.nodes] + \
            [f"monitor-{n}" for n in self.nodes]

    # --- rendering ----------------------------------------------------------------------------

    def render(self) -> dict[str, str]:
        """All config files of the cluster, as ``{relative path: text}`` (pure)."""
        r = self.root
        release = Release.parse(self.slurm_release) if self.slurm_release else None
        generated = []
        for name, m in self.nodes.items():
            opts = self.gres_options.get(name, GresOptions())
            # for the cluster's own release unless the node's options name one
            generated.append(generate_node_gres(m, name, replace(opts, device_dir=str(self.device_dir(name)),
                                                                 release=opts.release or release)))
        hostname = socket.gethostname().split(".")[0]
        params = {}
        for i, name in enumerate(self.nodes, start=1):
            port = self.port_base + SLURMD_PORT_OFFSET + i
            params[name] = f"NodeHostname={hostname} NodeAddr=127.0.0.1 Port={port} RealMemory={NODE_REAL_MEMORY_MIB}"
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
            # cred_expire (slurm.conf(5) AuthInfo; 120 s by default): a requeued job waits this long (+1 s) before
            # it is eligible again, and slurmd runs no Prolog for a job id it ran within it; shorter here, so
            # that the tests of requeued jobs do not wait 2 minutes
            f"AuthInfo=socket={r}/munge/munge.sock,cred_expire={CRED_EXPIRE_S}",
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
            f"SchedulerParameters={self.scheduler_parameters}",
            "MpiDefault=none",
            "ReturnToService=2",
            "MinJobAge=30",
            "SlurmdParameters=config_overrides",
            *(self.product_lines() if self.product else ["# the product's lines are off (dev-cluster product on)"]),
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
        for part, names in self.extra_partitions.items():
            conf.append(f"PartitionName={part} Nodes={','.join(names)} MaxTime=INFINITE State=UP")
        conf += self.extra_conf
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
                f"StoragePass={self._db_secret('slurm')}\nStorageLoc=slurm_acct_db\n")
        files.update(self._node_side_files())
        if self.dbd:
            files["scripts/epilog_slurmctld.sh"] = self._epilog_slurmctld_text()
        for name, m in self.nodes.items():
            # as a node's inventory records it: with the UUIDs and bus ids NVML reports (the fake's, derived
            # once here rather than by every hook that opens the fake)
            files[f"machines/{name}.json"] = replace(m, gpus=tuple(derived_gpus(m))).to_json()
        files["cluster.json"] = json.dumps({"cgroup": self.cgroup, "dbd": self.dbd, "port_base": self.port_base,
                                            "nodes": list(self.nodes), "slurm": self.slurm_release,
                                            "product": self.product}, indent=2) + "\n"
        return files

    def product_lines(self) -> list[str]:
        """The slurm.conf lines that name the product (what ``slurm-gpushare install`` asks a site to add,
        siteinstall.slurm_conf_lines, with this cluster's Prolog/Epilog shims): without them the cluster is
        plain Slurm with the same nodes, GRES and daemons."""
        r = self.root
        lines = [
            "PrologFlags=Alloc",
            f"Prolog={r}/scripts/prolog.sh",
            f"Epilog={r}/scripts/epilog.sh",
            f"TaskProlog={self.site_config_dir}/taskprolog.sh",
            "JobSubmitPlugins=lua",
            # every release needs it: 22.05 for srun --gres=gpushare without an allocation, 23.11+ because
            # the clients refuse "=" in a GRES type (cli_filter.lua writes it %3D; docs/admin-guide.md)
            "CliFilterPlugins=cli_filter/lua",
        ]
        if self.dbd:
            # the job's usage segment into slurmdbd's AdminComment once it ends (docs/accounting.md)
            lines.append(f"EpilogSlurmctld={r}/scripts/epilog_slurmctld.sh")
        return lines

    def set_product(self, enabled: bool, *, timeout: float = 120.0) -> None:
        """Switch the running cluster's product lines (:meth:`product_lines`) on or off: slurm.conf (and
        cluster.json) rewritten, then ``scontrol reconfigure``, which applies every one of them on each
        supported release (22.05: slurmctld re-reads slurm.conf and re-inits job_submit plugins whose list
        changed, src/slurmctld/job_submit.c, and each slurmd re-reads its Prolog/Epilog/TaskProlog;
        24.11+: slurmctld and slurmd restart in place; CliFilterPlugins is read by each client at start),
        except an added or removed ``EpilogSlurmctld`` on 22.05, which prep/script takes only at its init
        (``have_epilog_slurmctld`` in src/plugins/prep/script/prep_script.c at slurm-22-05-8-1): there, with
        slurmdbd, slurmctld is restarted after the reconfigure (its state kept: running jobs go on).
        Returns once slurmctld's ``scontrol show config`` shows the new lines and every node is in service.
        Jobs keep running; a job's own Prolog/Epilog is the one in force when it ran.

        Raises:
            ClusterError: the cluster is not running, or slurmctld does not show the change within ``timeout``.
        """
        if not self.alive("slurmctld"):
            raise ClusterError(f"no dev cluster runs in {self.root}", hint=f"bring it up: scripts/dev-cluster up "
                                                                       f"--dir {self.root}")
        self.product = enabled
        files = self.render()
        for rel in ("etc/slurm.conf", "cluster.json"):
            write_atomic(self.root / rel, files[rel], mode=0o644)
        self._slurm(["scontrol", "reconfigure"])
        if self.dbd and self.slurm_release and Release.parse(self.slurm_release) < RECONFIGURE_RESTARTS:
            # 22.05's reconfigure keeps whether an EpilogSlurmctld runs (prep/script's have_epilog_slurmctld,
            # set at its init): removed, slurmctld still runs one (exit 127); added, none. Restart slurmctld.
            pid = self.pid("slurmctld")
            if pid is not None and self.is_ours("slurmctld", pid):
                _stop_pid(pid, what="slurmctld")
                self.pidfile("slurmctld").unlink(missing_ok=True)
            self.up(timeout=timeout, out=open(os.devnull, "w"))
        want = f"{self.site_config_dir}/taskprolog.sh" if enabled else "(null)"

        def applied() -> bool:
            config = dict(re.findall(r"^(\w+)\s*=\s*(.*?)\s*$", self._slurm(["scontrol", "show", "config"],
                                                                           check=False), flags=re.M))
            return config.get("TaskProlog", "(null)") == want and \
                ("lua" in config.get("JobSubmitPlugins", "")) == enabled
        self._wait(applied, timeout, f"slurmctld showing the product's lines {'on' if enabled else 'off'}",
                   log="log/slurmctld.log")
        self._wait(self._up_resuming_drained, timeout, "all nodes in service (idle, or running jobs)",
                   log="log/slurmctld.log")

    # --- lifecycle ----------------------------------------------------------------------------

    def up(self, *, timeout: float = 120.0, out=sys.stdout) -> None:
        """Bring the cluster up (idempotent) and wait until every node is in service (idle, or running
        jobs when only some daemons were missing).

        Settings are checked before anything starts (:meth:`check_settings`). When a later step
        fails, the daemons this call started are stopped again before the error is raised; daemons
        that were already running are left alone.

        Raises:
            ClusterError: bad settings (one line each), a missing program, a daemon that dies at start
                (with the relevant lines its log got during this start), a running cluster with another
                configuration (naming what differs), or nodes not idle within ``timeout``.
        """
        self.check_settings()
        self._check_programs()
        files = self.render()
        running = self.alive("slurmctld")
        if running:
            diffs = self._config_differences(files)
            if diffs:
                shown = "; ".join(diffs[:3]) + (f" (and {len(diffs) - 3} more differing lines)" if len(diffs) > 3
                                                else "")
                raise ClusterError(f"a dev cluster with another configuration is running in {self.root}: {shown}",
                                   hint=f"run '{self.down_command}' first, or use another --dir/--port-base")
        if not running:
            self._forget_state_of_another_release(out)
        changed = self._read("etc/slurm.conf") != files["etc/slurm.conf"] or \
            self._read("etc/gres.conf") != files["etc/gres.conf"]
        self._begin_start()
        try:
            self._prepare(files)
            self._start_munged()
            if self.dbd:
                self._start_dbd()
            if not running:
                # slurmctld keeps each node's registered GRES in its saved state, and a node whose GRES
                # changed is not re-read from the new gres.conf: start clean (-c) after a config change.
                self._spawn("slurmctld", ["slurmctld", "-c"] if changed else ["slurmctld"])
            self._wait(lambda: self._slurm_ok(["scontrol", "ping"], "UP"), 60, "slurmctld answering ping",
                       log="log/slurmctld.log", daemon="slurmctld")
            self.start_filterd()
            for name in self.nodes:
                if not self.alive(f"slurmd-{name}"):
                    self._spawn(f"slurmd-{name}", ["slurmd", "-N", name])
            self.start_monitors()
            self._wait(self._up_resuming_drained, timeout, "all nodes in service (idle, or running jobs)",
                       log="log/slurmctld.log")
        except BaseException as e:
            note = self._undo_start()
            if isinstance(e, ClusterError):
                raise ClusterError(e.message + (f"\n{note}" if note else ""), hint=e.hint, source=e.source) from e
            if isinstance(e, (OSError, subprocess.SubprocessError)):
                raise ClusterError(f"{e}" + (f"\n{note}" if note else "")) from e
            raise
        finally:
            self._start = None
        print(f"dev cluster up in {self.root} ({len(self.nodes)} nodes)", file=out)
        print(self.sinfo(), file=out)
        print(self.env_exports(), file=out)
        if os.environ.get(IN_ROOT_ENV):
            print(f"# Slurm {self.slurm_release} runs in its own root filesystem: run its clients there with "
                  "scripts/dev-cluster exec -- COMMAND (e.g. exec -- sbatch --wrap hostname)", file=out)

    def _forget_state_of_another_release(self, out) -> None:
        """Start Slurm's state afresh in a directory last brought up with another release: slurmctld cannot
        read what another release saved ("Can not recover assoc_usage state, incompatible version", fatal:
        measured with 26.05 over 22.05's state), nor can MariaDB or slurmdbd be trusted with the other's
        database. StateSaveLocation, the slurmd spools and the database go, and with them the product's
        accounting spool, job directories and the demo's outputs (the new state numbers jobs from 1 again,
        and the accounting store keys records by job id). The release that
        wrote the state is ``spool/slurm-release``, written before any daemon starts (cluster.json is
        rewritten by every ``up``, even one that then fails)."""
        marker = self.root / "spool" / "slurm-release"
        try:
            ran: str | None = marker.read_text().strip()
        except OSError:  # no marker: no state yet, or a dev cluster older than the marker (release unknown)
            ran = "unknown" if (self.root / "spool" / "ctld").is_dir() else None
        if ran != self.slurm_release and ran:
            self._forget_slurm_state(ran, out)
        if self.slurm_release:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(self.slurm_release + "\n")

    def _forget_slurm_state(self, ran: str, out) -> None:
        # the new state numbers jobs from 1 again: what names the old jobs by id goes too (usage records,
        # job directories, scripts/demo's outputs and accounting database, whose keys hold the job id)
        for sub in (self.root / "spool" / "ctld", *(self.root / "spool").glob("d-*"), self.root / "db" / "data",
                    self.accounting_spool, self.root / "run" / "gpushare", self.root / "demo"):
            if sub.is_dir() and not sub.is_symlink():
                shutil.rmtree(sub)
        what = f"Slurm {ran}" if ran[:1].isdigit() else "a Slurm release it did not record"
        print(f"dev-cluster: {self.root} was last up with {what}: its Slurm state (jobs, nodes, accounting "
              f"database, usage records) starts afresh for Slurm {self.slurm_release}", file=out)

    def down(self, *, out=sys.stdout) -> list[int]:
        """Cancel the cluster's jobs, then stop its daemons.

        A daemon's PID comes from its pid file when that names this cluster's daemon (see
        :meth:`is_ours`); a daemon whose pid file is missing or stale is found in ``/proc`` by the same
        check. A pid file naming any other process is reported as stale and removed; that process is
        never signalled.

        Returns:
            the PIDs that were stopped.

        Raises:
            ClusterError: daemons of the cluster run but this user may not stop them (not root).
        """
        if not self.root.is_dir():
            print(f"no dev cluster in {self.root}: nothing to stop", file=out)
            return []
        found = self._scan()
        nodes = [f"{kind}-{n}" for kind in ("monitor", "slurmd") for n in self.nodes]
        # also stop the monitor and slurmd of nodes no longer in the configuration (pid files, or found running)
        extra = sorted(({p.stem for kind in ("monitor", "slurmd") for p in (self.root / "run").glob(f"{kind}-*.pid")} |
                        {d for d in found if d.startswith(("monitor-", "slurmd-"))}) - set(nodes))
        names = extra + nodes + list(_STOP_ORDER)
        targets: dict[str, list[int]] = {}
        stale: dict[str, int] = {}
        for daemon in names:
            pids = list(found.get(daemon, []))
            pid = self.pid(daemon)
            if pid is not None and pid_alive(pid):
                if self.is_ours(daemon, pid):
                    pids = [pid] + [p for p in pids if p != pid]
                else:
                    stale[daemon] = pid
            if pids:
                targets[daemon] = pids
        if targets and os.geteuid() != 0:
            running = ", ".join(f"{d} (pid {ps[0]})" for d, ps in targets.items())
            raise ClusterError(f"cannot stop the dev cluster in {self.root} as this user: its daemons run as root "
                               f"({running})", hint="run as root")
        if "slurmctld" in targets:
            self._cancel_jobs()
        # a monitor ends after its current sample (up to a few tenths of a second): signal them all first
        for pid in (pid for daemon, pids in targets.items() if daemon.startswith("monitor-") for pid in pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        stopped = []
        for daemon in names:
            if daemon in stale:
                print(f"{daemon}: stale pid file (pid {stale[daemon]} is not this cluster's {daemon}); "
                      "left that process alone", file=out)
            for pid in targets.get(daemon, []):
                _stop_pid(pid, what=daemon)
                stopped.append(pid)
            try:
                self.pidfile(daemon).unlink(missing_ok=True)
            except PermissionError:
                raise ClusterError(f"cannot remove {self.pidfile(daemon)}", hint="run as root") from None
        self._remove_cgroups()
        if os.geteuid() == 0:  # MPS directories of jobs whose Epilog never ran (tmpfs mounts under the run dir)
            from slurm_gpushare.node.mps import unmount_below

            try:
                left = unmount_below(self.root)
            except OSError as e:
                print(f"left mounted: {e.filename} ({e.strerror})", file=out)
            else:
                if left:
                    print(f"unmounted {len(left)} MPS director{'y' if len(left) == 1 else 'ies'} left under "
                          f"{self.root}", file=out)
        print(f"dev cluster in {self.root} is down (stopped {len(stopped)} daemon(s))", file=out)
        return stopped

    def status(self) -> dict:
        """Daemon PIDs and liveness, and the node states when slurmctld answers.

        Returns:
            ``dir``, ``slurm_conf``; ``exists`` (the directory holds a dev cluster); ``ok`` (every
            daemon runs); ``daemons``: name -> ``pid`` (from its pid file), ``alive`` (that PID is this
            cluster's daemon), a monitor's ``url`` (its metrics endpoint) and, for a pid file naming
            another process, ``problem``; ``nodes``:
            name -> Slurm state.
        """
        daemons: dict[str, dict] = {}
        for d in self.daemons():
            problem = self.pid_problem(d)
            daemons[d] = {"pid": self.pid(d), "alive": self.alive(d)}
            if d.startswith("monitor-") and d[len("monitor-"):] in self.nodes:
                daemons[d]["url"] = self.monitor_url(d[len("monitor-"):])
            if problem:
                daemons[d]["problem"] = problem
        if any("problem" in s for s in daemons.values()):
            found = self._scan()
            for d, s in daemons.items():
                if "problem" in s and found.get(d):
                    s["problem"] += f"; this cluster's {d} runs as pid {found[d][0]}"
        nodes = {}
        if daemons["slurmctld"]["alive"]:
            for line in self._slurm(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).splitlines():
                n, st = line.split()
                nodes[n] = st
        exists = any(_is_file(self.root / rel) for rel in ("cluster.json", "etc/slurm.conf")) or \
            any(s["pid"] is not None for s in daemons.values())
        return {"dir": str(self.root), "slurm_conf": str(self.slurm_conf), "exists": exists,
                "ok": all(s["alive"] for s in daemons.values()), "daemons": daemons, "nodes": nodes}

    def saved_options(self) -> dict:
        """Options of the last ``up`` in this directory (``cluster.json``), or ``{}``."""
        try:
            return json.loads((self.root / "cluster.json").read_text())
        except (OSError, ValueError):
            return {}

    def check_settings(self) -> None:
        """Check what ``up`` needs before it starts anything; one line per problem.

        Ports: every port the cluster derives from ``port_base`` (slurmctld = base, slurmd default
        +1, slurmdbd +2, MariaDB +3, node *i*'s slurmd +10+*i* and monitor +40+*i*) lies within
        1024..65535, and the ones a daemon of this cluster that is not running yet would listen on are
        free on 127.0.0.1 and 0.0.0.0. Nodes: at most :data:`MAX_NODES` (more would put a slurmd on
        a monitor's port).
        Directory: only characters Slurm config files take, not a file nor below one, not under
        /proc or /sys, and short enough for its unix socket paths.

        Raises:
            ClusterError: naming each problem.
        """
        problems = self._dir_problems()
        b, n = self.port_base, len(self.nodes)
        units = {name: self.gres_options.get(name, GresOptions()).shard_unit_mib for name in self.nodes}
        if len(set(units.values())) > 1:
            problems.append("the nodes' gres options must give one shard unit for all nodes (node.toml and the "
                            "site policy are one file each), not "
                            + ", ".join(f"{k}: {format_mib(v)}" for k, v in units.items()))
        if n > MAX_NODES:
            problems.append(f"{n} nodes are too many: a dev cluster has at most {MAX_NODES} (node i's slurmd "
                            f"listens on port base +{SLURMD_PORT_OFFSET}+i, its monitor on +{MONITOR_PORT_OFFSET}+i)")
        last = b + MONITOR_PORT_OFFSET + n
        if b < 1024 or last > 65535:
            problems.append(f"--port-base {b} is out of range: the cluster uses ports {b}..{last} (slurmctld {b}, "
                            f"slurmd default {b + 1}, slurmdbd {b + 2}, MariaDB {b + 3}, the nodes' slurmd "
                            f"{b + SLURMD_PORT_OFFSET + 1}..{b + SLURMD_PORT_OFFSET + n}, their monitors "
                            f"{b + MONITOR_PORT_OFFSET + 1}..{last}), which must lie within 1024..65535 "
                            f"(use a --port-base from 1024 to {65535 - MONITOR_PORT_OFFSET - n})")
        elif not problems:
            problems += self._port_problems()
        if len(problems) == 1:
            raise ClusterError(problems[0])
        if problems:
            raise ClusterError(f"{len(problems)} problems with the settings:\n" + "\n".join(problems))

    # --- queries ------------------------------------------------------------------------------

    def pid(self, daemon: str) -> int | None:
        """PID from ``run/<daemon>.pid``, or None."""
        try:
            return int(self.pidfile(daemon).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def alive(self, daemon: str) -> bool:
        """Whether ``run/<daemon>.pid`` names a live process that is this cluster's ``daemon``."""
        pid = self.pid(daemon)
        return pid is not None and pid_alive(pid) and self.is_ours(daemon, pid)

    def pid_problem(self, daemon: str) -> str | None:
        """Why ``run/<daemon>.pid`` cannot be trusted (it names a live process that is not this
        cluster's ``daemon``), or None."""
        pid = self.pid(daemon)
        if pid is not None and pid_alive(pid) and not self.is_ours(daemon, pid):
            return f"stale pid file (pid {pid} is not this cluster's {daemon})"
        return None

    def is_ours(self, daemon: str, pid: int, *, strict: bool = False) -> bool:
        """Whether process ``pid`` is this cluster's ``daemon`` (a pid-file name: ``munged``,
        ``slurmctld``, ``slurmd-<node>``, ``filterd``, ...), judged from ``/proc/<pid>``.

        The program (``/proc/<pid>/cmdline``) must match: ``munged``; ``slurmctld``; ``slurmdbd``;
        ``slurmd -N <node>``; ``mariadbd`` (or ``mysqld``) for ``mysqld``; a Python running
        ``slurm_gpushare filterd``, or ``slurm_gpushare monitor --node <node>`` for ``monitor-<node>``.
        And it must belong to this cluster: munged's ``--socket``, MariaDB's ``--datadir``/``--socket``,
        filterd's ``--socket`` and a monitor's ``--config`` are this cluster's; a Slurm daemon's
        ``SLURM_CONF`` (``/proc/<pid>/environ``) is this cluster's slurm.conf. Another user's
        environment cannot be read: then the program match decides, unless ``strict``.
        """
        argv = _proc_argv(pid)
        if not argv or _daemon_of(argv) != daemon:
            return False
        r = self.root
        if daemon == "munged":
            return _same_path(_option(argv[1:], "--socket", "-S"), r / "munge" / "munge.sock")
        if daemon == "mysqld":
            return _same_path(_option(argv[1:], "--datadir"), r / "db" / "data") or \
                _same_path(_option(argv[1:], "--socket"), r / "db" / "mysqld.sock")
        if daemon == "filterd":
            return _same_path(_option(argv[1:], "--socket"), self.filterd_socket)
        if daemon.startswith("monitor-"):
            return _same_path(_option(argv[1:], "--config"), self.node_config)
        try:
            conf = psutil.Process(pid).environ().get("SLURM_CONF")
        except psutil.AccessDenied:
            return not strict
        except psutil.Error:
            return False
        return conf is not None and _same_path(conf, self.slurm_conf)

    def all_idle(self) -> bool:
        """Every node of the cluster is idle (no job holds anything)."""
        out = self._slurm(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return set(states) >= set(self.nodes) and all(states[n] == "idle" for n in self.nodes)

    def _up_resuming_drained(self) -> bool:
        """Every node in service: idle, or running jobs (an ``up`` that restarts a stopped daemon while
        jobs run must not wait for them), after putting back nodes a previous run left drained (slurmctld
        keeps node states across restarts; a throwaway cluster starts with every node in service)."""
        out = self._slurm(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
        states = dict(line.split() for line in out.splitlines() if line.strip())
        waited = [n for n in self.nodes if n not in self.unwaited]
        drained = sorted(n for n in waited if states.get(n, "").startswith("drain"))
        if drained:
            self._slurm(["scontrol", "update", f"nodename={','.join(drained)}", "state=resume"], check=False)
            return False
        return set(states) >= set(waited) and all(states[n] in IN_SERVICE for n in waited)

    def sinfo(self) -> str:
        """Node, state and the full GRES of every node (one row per node), aligned."""
        out = self._slurm(["sinfo", "-h", "-N", "-o", "%N|%T|%G"], check=False)
        rows = [("NODELIST", "STATE", "GRES")]
        for line in out.splitlines():
            row = tuple(line.split("|", 2))
            if len(row) == 3 and row not in rows:  # sinfo -N repeats a node once per partition
                rows.append(row)
        w0, w1 = (max(len(r[i]) for r in rows) for i in (0, 1))
        return "\n".join(f"{n:<{w0}}  {s:<{w1}}  {g}".rstrip() for n, s, g in rows)

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

    def _node_side_files(self) -> dict[str, str]:
        """The node side: node config, Prolog/Epilog wrappers (fake NVML per node, reading the fake GPU
        process table), TaskProlog, the jobs' stand-in GPU program ``bin/fake-gpu-app`` and the stand-in MPS
        control program ``bin/nvidia-cuda-mps-control``."""
        r = self.root
        # the simulated node's GPUs for the installed wrapper (slurmd gives a Prolog a fresh environment)
        hook = (f'#!/bin/sh\n# Generated by slurm-gpushare dev-cluster: the fake GPUs of the simulated node, then the\n'
                f'# {{which}} wrapper that slurm-gpushare install wrote\n'
                f'{NVML_ENV}="fake:{r}/machines/$SLURMD_NODENAME.json" '
                f'{PROCESS_TABLE_ENV}="{self.fake_gpu_procs}/$SLURMD_NODENAME" '
                f'exec {self.site_config_dir}/{{which}}.sh\n')
        return {
            "etc/gpushare/node.toml": (
                "# Generated by slurm-gpushare dev-cluster (see slurm_gpushare/data/site/node.toml.example)\n"
                "version = 1\n"
                f'run_dir = "{self.node_run_dir}"\nmachine = "{r}/machines/{{node}}.json"\n'
                f'device_dir = "{r}/dev/{{node}}"\n'
                f'mps_control = "{self.mps_control}"\nmps_start_timeout = 10.0\nmps_quit_timeout = 3.0\n'
                f'spool_dir = "{self.accounting_spool}"\ngpu_order = "{self.gpu_order}"\n'
                # short jobs (seconds) must get samples; the listen port and textfile differ per node,
                # so each monitor gets them on its command line
                'monitor_interval = 0.5\nmps_check_interval = 2.0\n'
                + (f'shard_unit = "{format_mib(self.shard_unit_mib)}"\n' if self.shard_unit_mib != MIB_PER_GIB else "")
                + "".join(f"{line}\n" for line in self.node_conf)
                + f'\n[mps_env]\nGPUSHARE_FAKE_MPS_MODE_FILE = "{self.fake_mps_mode_file}"\n'),
            "scripts/prolog.sh": hook.replace("{which}", "prolog"),
            "scripts/epilog.sh": hook.replace("{which}", "epilog"),
            "bin/fake-gpu-app": self._fake_gpu_app_text(),
            # the stand-in as a module with a launcher: a module's byte code is compiled once (_prepare),
            # a script's on every run (4 ms, twice per MPS job Prolog); -I -S: no site-packages to search,
            # as the real program is a small C binary, not an interpreter
            "bin/" + _STANDIN_MODULE + ".py": _STANDIN.read_text(),
            "bin/nvidia-cuda-mps-control": (
                "#!/usr/bin/env -S python3 -I -S\n"
                f"# Generated by slurm-gpushare dev-cluster: runs the stand-in {_STANDIN_MODULE}.py beside it\n"
                "import os\nimport sys\n\n"
                "sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))\n"
                f"from {_STANDIN_MODULE} import main  # noqa: E402\n\n"
                "sys.exit(main(sys.argv[1:]))\n"),
        }

    @property
    def epilog_slurmctld_dir(self) -> Path:
        """The ``--dbd`` cluster's EpilogSlurmctld runs every executable here first (the shipped wrapper's
        ``BEFORE_DIR``): where a test puts a jobstats-like step."""
        return self.root / "scripts" / "epilog_slurmctld.d"

    @property
    def sacct_queue(self) -> Path:
        """The ``--dbd`` cluster's queue of ended GPU runs for the summary worker (the wrapper's ``QUEUE``;
        :mod:`slurm_gpushare.accounting.sacctqueue`), with the worker's ``worker.log``."""
        return self.root / "spool" / "gpushare-sacct-queue"

    def _epilog_slurmctld_text(self) -> str:
        """The shipped ``epilog_slurmctld.sh`` with this cluster's paths: its directory of earlier steps, the
        nodes' spool, the product (:attr:`installed_command`), and ``SLURM_CONF`` (slurmctld passes no
        environment of its own to the script)."""
        text = (SITE / "epilog_slurmctld.sh").read_text()
        for old, new in (("@CONFIG_DIR@/epilog_slurmctld.d", str(self.epilog_slurmctld_dir)),
                         ('SPOOL="/var/spool/slurm-gpushare/accounting"', f'SPOOL="{self.accounting_spool}"'),
                         ('QUEUE="/var/spool/slurm-gpushare/sacct-queue"', f'QUEUE="{self.sacct_queue}"'),
                         ('SLURM_GPUSHARE="@SLURM_GPUSHARE@"',
                          f'SLURM_GPUSHARE="{" ".join(self.installed_command)}"\n'
                          f'SLURM_CONF="{self.slurm_conf}"\nexport SLURM_CONF')):
            if old not in text:
                raise ClusterError(f"epilog_slurmctld.sh has no {old!r} to render")
            text = text.replace(old, new)
        return text.replace("#!/bin/sh\n", "#!/bin/sh\n# Generated by slurm-gpushare dev-cluster from "
                            "slurm_gpushare/data/site/epilog_slurmctld.sh\n", 1)

    def _fake_gpu_app_text(self) -> str:
        """``bin/fake-gpu-app``: runs :mod:`slurm_gpushare_dev.fakeapp` from ``lib/`` with an interpreter
        every user can run (a job's user cannot use a venv or interpreter under root's home)."""
        r = self.root
        return (
            "#!/bin/sh\n"
            "# Generated by slurm-gpushare dev-cluster: a stand-in CUDA program for jobs on the simulated nodes.\n"
            "# 'fake-gpu-app --mem 6G --sm 40 --seconds 10' holds 6 GiB at 40 % SM on each GPU of\n"
            "# CUDA_VISIBLE_DEVICES (fake NVML processes, seen by the node monitor); --help for the rest.\n"
            'if [ -n "${SLURMD_NODENAME:-}" ]; then\n'
            f'  {NVML_ENV}="fake:{r}/machines/$SLURMD_NODENAME.json"\n'
            f'  {PROCESS_TABLE_ENV}="{self.fake_gpu_procs}/$SLURMD_NODENAME"\n'
            f"  export {NVML_ENV} {PROCESS_TABLE_ENV}\n"
            f'elif [ -z "${{{NVML_ENV}:-}}" ]; then\n'
            '  case " $* " in\n'
            '    *" -h "*|*" --help "*|*" --machine"*) ;;\n'
            '    *) echo "fake-gpu-app: error: not in a job on a simulated node (no SLURMD_NODENAME): run it in a '
            f'job, or pass --machine {r}/machines/NODE.json --table {self.fake_gpu_procs}/NODE --devices 0" >&2\n'
            "       exit 64 ;;\n"
            "  esac\n"
            "fi\n"
            f"PYTHONPATH={self.lib_dir}\n"
            "export PYTHONPATH\n"
            f'exec {job_python()} -s -m slurm_gpushare_dev.fakeapp "$@"\n')

    @property
    def accounting_spool(self) -> Path:
        """The simulated nodes' accounting spool (one directory for all: file names carry the node)."""
        return self.root / "spool" / "gpushare-accounting"

    @property
    def fake_mps_mode_file(self) -> Path:
        """Write a misbehaviour (``ignore-quit``, ``crash-on-start``...) here to make the MPS stand-ins
        started from then on misbehave (slurm_gpushare_dev/fake_mps/README.md)."""
        return self.root / "run" / "fake-mps-mode"

    @property
    def mps_control(self) -> Path:
        """The simulated nodes' MPS control program: a launcher of ``fake_mps_control.py`` beside it, a copy
        of :data:`MPS_STANDIN` (byte-compiled when the cluster is prepared)."""
        return self.root / "bin" / "nvidia-cuda-mps-control"

    @property
    def node_run_dir(self) -> str:
        """The hooks' run_dir template: one directory per simulated node."""
        return f"{self.root}/run/gpushare/{{node}}"

    def _prepare(self, files: dict[str, str]) -> None:
        r = self.root
        for sub in ("etc", "munge", "spool/ctld", "log", "run", "machines", "db", "bin", "metrics",
                    *(f"spool/d-{n}" for n in self.nodes)):
            (r / sub).mkdir(parents=True, exist_ok=True)
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
        for script in ("prolog.sh", "epilog.sh", *(["epilog_slurmctld.sh"] if self.dbd else [])):
            os.chmod(r / "scripts" / script, 0o755)
        if self.dbd:
            self.epilog_slurmctld_dir.mkdir(mode=0o755, exist_ok=True)
        self.install_site()
        # what a job's user runs and reads: the fake app, the package copy, the machine descriptions,
        # and the process table every user registers in (sticky like /tmp: no one removes another's entry)
        for sub in ("bin", "machines"):
            os.chmod(r / sub, 0o755)
        os.chmod(self.fake_gpu_app, 0o755)
        os.chmod(self.mps_control, 0o755)
        # byte code every user can read (the stand-in runs as the job's user, who cannot write bin/__pycache__)
        module = r / "bin" / f"{_STANDIN_MODULE}.py"
        py_compile.compile(str(module), cfile=importlib.util.cache_from_source(str(module)), doraise=True)
        for pyc in (r / "bin" / "__pycache__").iterdir():
            os.chmod(pyc, 0o644)
        os.chmod(r / "bin" / "__pycache__", 0o755)
        for name in self.nodes:
            os.chmod(r / "machines" / f"{name}.json", 0o644)
        for table in (self.fake_gpu_procs, *(self.fake_gpu_table(n) for n in self.nodes)):
            table.mkdir(exist_ok=True)
            os.chmod(table, 0o1777)
            ProcessTable(table).prune()  # entries of apps killed with SIGKILL: their pids may be reused
        self.install_lib()
        key = r / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        for name, m in self.nodes.items():
            d = self.device_dir(name)
            d.mkdir(parents=True, exist_ok=True)
            for g in m.gpus:
                _mknod(d / f"nvidia{g.minor}", NVIDIA_MAJOR, g.minor)
                caps = {cap for inst in g.mig_instances for cap in inst.caps}
                if g.mig_enabled:
                    # every GPU instance id the driver can give (and its first compute instance): the devices
                    # a MIG layout made later (mig apply, through the fake NVML) names, as the driver's
                    # nvidia-caps devices exist on a real node
                    caps |= {cap for gi in range(1, MIG_GI_IDS + 1) for cap in mig_cap_minors(g.minor, gi, 0)}
                for cap in sorted(caps):
                    (d / "nvidia-caps").mkdir(exist_ok=True)
                    _mknod(d / "nvidia-caps" / f"nvidia-cap{cap}", NVIDIA_CAPS_MAJOR, cap)

    @property
    def installed_command(self) -> list[str]:
        """The ``slurm-gpushare`` whose ``install`` writes the site files and which runs the cluster's filterd,
        monitors and EpilogSlurmctld (:data:`INSTALLED_ENV`, else this interpreter's product).

        Raises:
            ClusterError: :data:`INSTALLED_ENV` names no executable file here (a path of the host seen
                inside a release root, say).
        """
        exe = os.environ.get(INSTALLED_ENV)
        if exe and not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            raise ClusterError(f"{INSTALLED_ENV}={exe} is not an executable file here",
                               hint="name an installed slurm-gpushare console script, or unset it to use this "
                                    "interpreter's product (a release root has its own venv)")
        return [exe] if exe else [sys.executable, "-m", "slurm_gpushare"]

    def install_commands(self) -> list[list[str]]:
        """The ``slurm-gpushare install`` runs that write this cluster's site files: the controller and login
        roles with the run directory ``run/`` (the filter service's sockets in ``run/filterd``), the node role
        with the simulated nodes' run directory (one per node: ``{node}``). ``--force``: the cluster owns these
        files, and its gpushare_client.lua timeout is set after the install (:data:`FILTER_TIMEOUT_ENV`)."""
        common = [*self.installed_command, "install", "--prefix", str(self.site_prefix),
                  "--slurm-conf-dir", str(self.root / "etc"), "--config-dir", str(self.site_config_dir), "--force"]
        return [[*common, "--role", "controller", "--role", "login", "--run-dir", str(self.root / "run")],
                [*common, "--role", "node", "--run-dir", self.node_run_dir]]

    def install_site(self) -> None:
        """Install the site files with the product's own ``install`` command (:meth:`install_commands`), as a
        site does: slurm.conf names what it wrote (job_submit.lua, cli_filter.lua, gpushare_client.lua next to
        slurm.conf; the Prolog/Epilog/TaskProlog wrappers), and the nodes' hooks run the command it names.
        Only the client's answer timeout is then set, when :data:`FILTER_TIMEOUT_ENV` asks for one.

        Raises:
            ClusterError: an install run failed (with its output).
        """
        for argv in self.install_commands():
            proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
            if proc.returncode != 0:
                raise ClusterError(f"'{' '.join(argv)}' failed (exit {proc.returncode}): "
                                   f"{(proc.stderr or proc.stdout).strip()[-2000:]}",
                                   hint=f"check the installation ({INSTALLED_ENV}, else this interpreter's package)")
        if os.environ.get(FILTER_TIMEOUT_ENV):
            client = self.root / "etc" / "gpushare_client.lua"
            text = set_lua_setting(client.read_text(), "timeout", str(float(os.environ[FILTER_TIMEOUT_ENV])))
            write_atomic(client, text, mode=0o644)

    def install_lib(self) -> None:
        """Copy the packages (``slurm_gpushare``, ``slurm_gpushare_dev`` and ``click``: modules and data
        files, no ``__pycache__``) to ``lib/``, world-readable, for :attr:`fake_gpu_app`: a job's user may not
        reach the project's tree or venv. Only changed files are rewritten; files a package no longer has
        are removed."""
        for package_dir in PACKAGE_DIRS:
            self._install_package(package_dir)

    def _install_package(self, package_dir: Path) -> None:
        dest = self.lib_dir / package_dir.name
        wanted: set[Path] = set()
        for src in sorted(package_dir.rglob("*")):
            rel = src.relative_to(package_dir)
            if "__pycache__" in rel.parts or src.suffix == ".pyc" or not src.is_file():
                continue
            wanted.add(rel)
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if not (target.is_file() and filecmp.cmp(src, target, shallow=False)):
                tmp = target.with_name(f".{target.name}.tmp")
                shutil.copyfile(src, tmp)
                os.replace(tmp, target)
            os.chmod(target, 0o644)
        for path in sorted(dest.rglob("*"), key=lambda q: -len(q.parts)):
            rel = path.relative_to(dest)
            if path.is_file() and rel not in wanted and "__pycache__" not in rel.parts:
                path.unlink()
            elif path.is_dir() and "__pycache__" not in rel.parts:
                if any(path.iterdir()):
                    os.chmod(path, 0o755)
                else:
                    path.rmdir()
        for d in (self.lib_dir, dest):
            os.chmod(d, 0o755)

    def start_filterd(self, *, timeout: float = 60.0) -> None:
        """Start ``slurm-gpushare filterd`` for this cluster (if not running) and wait for its socket.

        Raises:
            ClusterError: it died or did not listen within ``timeout`` (then it is stopped again).
        """
        if self.alive("filterd"):
            return
        self._start_step(lambda: self._start_filterd(timeout))

    def start_monitors(self, *, timeout: float = 60.0) -> None:
        """Start ``slurm-gpushare monitor`` for each node whose monitor is not running, and wait until
        each answers at :meth:`monitor_url` (or has written its textfile since).

        Each runs in the foreground of a session of its own, with the node's fake NVML
        (``GPUSHARE_NVML=fake:machines/<node>.json``) and the fake GPU process table; its pid goes to
        ``run/monitor-<node>.pid``, its stderr to ``log/monitor-<node>.log``.

        Raises:
            ClusterError: one died or did not answer within ``timeout`` (then the monitors this call
                started are stopped again; within ``up``, everything that ``up`` started).
        """
        if all(self.alive(f"monitor-{n}") for n in self.nodes):
            return
        self._start_step(lambda: self._start_monitors(timeout))

    def _start_step(self, start) -> None:
        """Run one start step; called on its own (not by ``up``), stop what it started when it fails."""
        own = self._start is None
        if own:
            self._begin_start()
        try:
            start()
        except BaseException as e:
            if own:
                note = self._undo_start()
                if isinstance(e, ClusterError) and note:
                    raise ClusterError(f"{e.message}\n{note}", hint=e.hint, source=e.source) from e
            raise
        finally:
            if own:
                self._start = None

    def _start_filterd(self, timeout: float) -> None:
        r = self.root
        policy = self.policy_file
        if not policy.exists():  # the shipped example (the built-in defaults), for an admin to edit and SIGHUP
            policy.parent.mkdir(parents=True, exist_ok=True)
            policy.write_text(self.initial_policy_text())
        argv = [*self.installed_command, "filterd", f"--socket={self.filterd_socket}",
                f"--controller-socket={self.controller_socket}",
                f"--machines={r / 'machines'}", f"--log={r / 'log' / 'filterd.log'}",
                f"--pid-file={self.pidfile('filterd')}", f"--policy={policy}"]
        self._mark_log("log/filterd.stderr")
        with open(r / "log" / "filterd.stderr", "ab") as err:
            proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                    start_new_session=True, cwd=r)
        self._record("filterd", proc)
        self._wait(lambda: self.alive("filterd") and _listening(self.filterd_socket)
                   and _listening(self.controller_socket), timeout,
                   "the filter service socket", log="log/filterd.stderr", died=lambda: proc.poll() is not None,
                   daemon_name="filterd")

    def _start_monitors(self, timeout: float) -> None:
        r = self.root
        for d in ("log", "run"):
            (r / d).mkdir(parents=True, exist_ok=True)
        started = []
        for node in self.nodes:  # start them all, then wait: they come up side by side
            daemon = f"monitor-{node}"
            if self.alive(daemon):
                continue
            argv = [*self.installed_command, "monitor", "--config", str(self.node_config),
                    "--node", node, "--listen", f"127.0.0.1:{self.monitor_port(node)}",
                    "--textfile", str(self.monitor_textfile(node))]
            env = dict(self.env)
            env[NVML_ENV] = f"fake:{r}/machines/{node}.json"
            env[PROCESS_TABLE_ENV] = str(self.fake_gpu_table(node))
            self._mark_log(f"log/{daemon}.log")
            since = time.time()
            with open(r / "log" / f"{daemon}.log", "ab") as err:
                proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                        start_new_session=True, cwd=r)
            _write_pidfile(self.pidfile(daemon), proc.pid)
            self._record(daemon, proc)
            started.append((node, proc, since))
        for node, proc, since in started:
            self._wait(functools.partial(self._monitor_answers, node, since), timeout,
                       f"its metrics at {self.monitor_url(node)}", log=f"log/monitor-{node}.log",
                       died=proc.poll, daemon_name=f"monitor-{node}")

    def _monitor_answers(self, node: str, since: float) -> bool:
        """``GET /metrics`` of ``node``'s monitor answers 200, or its textfile was written since ``since``."""
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # whatever http_proxy says
        try:
            with direct.open(self.monitor_url(node), timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (OSError, ValueError):  # refused, reset, an HTTP error status (urllib's errors are OSErrors)
            pass
        try:
            return self.monitor_textfile(node).stat().st_mtime >= since
        except OSError:
            return False

    def _start_munged(self) -> None:
        if self.alive("munged"):
            return
        r = self.root
        self._spawn("munged", ["munged", f"--key-file={r}/munge/munge.key", f"--socket={r}/munge/munge.sock",
                               f"--pid-file={self.pidfile('munged')}", f"--log-file={r}/log/munged.log",
                               f"--seed-file={r}/munge/munged.seed"])
        self._wait(lambda: (r / "munge" / "munge.sock").exists(), 10, "munged socket", log="log/munged.log")

    def _db_secret(self, user: str) -> str:
        """The MariaDB password of ``user`` (``root``, ``slurm``): random, made once, kept in
        ``db/<user>.password`` (0600, in the 0700 ``db`` directory). Without it any local user could
        connect as MariaDB's root (``mariadb-install-db`` leaves it without a password) and rewrite
        Slurm's accounting database."""
        d = self.root / "db"
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        path = d / f"{user}.password"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            pass
        password = secrets.token_urlsafe(24)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        return password

    def _start_dbd(self) -> None:
        r = self.root
        sock = r / "db" / "mysqld.sock"
        root_pw, slurm_pw = self._db_secret("root"), self._db_secret("slurm")
        client_cnf = r / "db" / "root.cnf"
        fd = os.open(client_cnf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"[client]\nuser=root\npassword={root_pw}\n")
        if not (r / "db" / "data" / "mysql").is_dir():
            _run(["mariadb-install-db", "--user=root", f"--datadir={r}/db/data",
                  "--auth-root-authentication-method=normal", "--skip-test-db"], log=r / "log" / "mariadb-install.log")
        if not self.alive("mysqld"):
            self._mark_log("log/mysqld.err")
            with open(r / "log" / "mysqld.out", "ab") as log:
                proc = subprocess.Popen(["mariadbd", "--user=root", f"--datadir={r}/db/data", f"--socket={sock}",
                                         f"--port={self.port_base + 3}", "--bind-address=127.0.0.1",
                                         f"--pid-file={self.pidfile('mysqld')}", f"--log-error={r}/log/mysqld.err",
                                         "--innodb-buffer-pool-size=64M"],
                                        stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
            self._record("mysqld", proc)
        sql = ["mariadb", f"--defaults-extra-file={client_cnf}", "-S", str(sock)]
        no_password = ["mariadb", "--no-defaults", "-S", str(sock), "-uroot"]

        def answers(argv: list[str]) -> bool:
            return subprocess.run([*argv, "-e", "select 1"], capture_output=True).returncode == 0

        self._wait(lambda: answers(sql) or answers(no_password), 30, "MariaDB", log="log/mysqld.err")
        if not answers(sql):  # a new database (or one of an older dev cluster): root gets its password
            host = socket.gethostname()
            _run([*no_password, "-e",
                  "".join(f"ALTER USER IF EXISTS 'root'@'{h}' IDENTIFIED BY '{root_pw}'; "
                          for h in ("localhost", "127.0.0.1", "::1", host))
                  + f"DROP USER IF EXISTS ''@'localhost', ''@'{host}'; FLUSH PRIVILEGES;"])
        # the database exists before slurmdbd first connects: slurmdbd 24.11 creates a missing one and then
        # reuses the handle of the failed connect, which MariaDB's client library 3.4 (Debian 13) has reset:
        # every query fails after ("Number of columns in result (=1) set exceeds maximum allowed number of
        # columns (=0)", fatal in _check_mysql_concat_is_sane; measured on 24.11.5; 26.05 reconnects)
        _run([*sql, "-e", "CREATE DATABASE IF NOT EXISTS slurm_acct_db; "
                          f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{slurm_pw}'; "
                          f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{slurm_pw}'; "
                          "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"])
        started_now = not self.alive("slurmdbd")
        if started_now:
            self._spawn("slurmdbd", ["slurmdbd"])
        # a slurmdbd started now must say so in what its log got since; one already running said it before
        self._wait(lambda: "slurmdbd version" in (self._log_since("log/slurmdbd.log") if started_now
                                                  else self._read("log/slurmdbd.log") or ""),
                   30, "slurmdbd", log="log/slurmdbd.log")

    def _spawn(self, daemon: str, argv: list[str]) -> None:
        """Start a self-daemonizing program and wait for its pid file to name this cluster's daemon."""
        self._mark_log(f"log/{daemon}.log")
        log = self.root / "log" / f"{daemon}.start.log"
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        log.write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            lines = _relevant_lines(proc.stdout + proc.stderr)
            raise ClusterError(f"{argv[0]} exited with {proc.returncode}" + "".join(f"\n{ln}" for ln in lines),
                               source=" ".join(argv))
        self._wait(lambda: self.alive(daemon), 15, f"{daemon} pid file", log=f"log/{daemon}.log")
        pid = self.pid(daemon)
        if self._start is not None and pid is not None:
            self._start.started.append((daemon, pid))

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

    def _wait(self, cond, timeout: float, what: str, *, log: str | None = None, daemon: str | None = None,
              died=None, daemon_name: str | None = None) -> None:
        """Poll ``cond`` with backoff; fail early when ``daemon`` (a pid-file name) is not running or
        ``died()`` is true, with the relevant lines ``log`` got since this start began."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        problem = f"timed out after {timeout:.0f} s waiting for {what}"
        while time.monotonic() < deadline:
            if cond():
                return
            if (daemon is not None and not self.alive(daemon)) or (died is not None and died()):
                problem = f"{daemon or daemon_name} died while waiting for {what}"
                break
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        tail = ""
        if log:
            lines = _relevant_lines(self._log_since(log))
            tail = (f"; {self.root / log} says:" + "".join(f"\n{ln}" for ln in lines) if lines
                    else f" (nothing new in {self.root / log})")
        raise ClusterError(problem + tail)

    # --- one 'up': what it started, and where the logs stood ---------------------------------

    def _begin_start(self) -> None:
        """Note the cluster's running daemons and the size of each log before this ``up`` starts anything."""
        marks = {}
        log_dir = self.root / "log"
        if log_dir.is_dir():
            for p in log_dir.iterdir():
                try:
                    marks[f"log/{p.name}"] = p.stat().st_size
                except OSError:
                    pass
        before = {pid for pids in self._scan().values() for pid in pids}
        self._start = _Start(before=before, marks=marks)

    def _mark_log(self, rel: str) -> None:
        """Remember where ``rel`` ends now, unless this ``up`` already noted it (files it had not seen
        yet are read from their start)."""
        if self._start is not None and rel not in self._start.marks:
            self._start.marks[rel] = _size(self.root / rel)

    def _log_since(self, rel: str) -> str:
        """What ``rel`` got since this start began (all of it when it was truncated meanwhile)."""
        offset = self._start.marks.get(rel, 0) if self._start is not None else 0
        try:
            with open(self.root / rel, "rb") as f:
                if os.fstat(f.fileno()).st_size < offset:
                    offset = 0
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _record(self, daemon: str, proc: subprocess.Popen) -> None:
        if self._start is not None:
            self._start.started.append((daemon, proc.pid))
            self._start.children.append(proc)

    def _undo_start(self) -> str:
        """Stop the daemons this ``up`` started (and only those); say which."""
        st = self._start
        if st is None:
            return ""
        pids = list(st.started)
        for daemon, found in self._scan().items():
            pids += [(daemon, p) for p in found if p not in st.before]
        order = {d: i for i, d in enumerate([f"{kind}-{n}" for kind in ("monitor", "slurmd") for n in self.nodes]
                                            + list(_STOP_ORDER))}
        stopped, seen = [], set()
        for daemon, pid in sorted(pids, key=lambda dp: order.get(dp[0], -1)):
            if pid in seen or pid in st.before or not pid_alive(pid) or not self.is_ours(daemon, pid):
                continue
            seen.add(pid)
            try:
                _stop_pid(pid, what=daemon)
            except ClusterError:
                continue
            stopped.append(f"{daemon} (pid {pid})")
            self.pidfile(daemon).unlink(missing_ok=True)
        for daemon, pid in st.started:  # those that died by themselves: their pid files name no one now
            if not pid_alive(pid) and self.pid(daemon) == pid:
                self.pidfile(daemon).unlink(missing_ok=True)
        for proc in st.children:
            proc.poll()
        return f"stopped what this 'up' had started: {', '.join(stopped)}" if stopped else ""

    # --- checks -------------------------------------------------------------------------------

    def _dir_problems(self) -> list[str]:
        r = str(self.root)
        bad = sorted({ch for ch in r if not _DIR_CHARS.fullmatch(ch)})
        if bad:
            return [f"--dir {r!r} contains {', '.join(_describe_char(c) for c in bad)}, which Slurm config files "
                    "cannot take (use letters, digits and . _ + @ - /)"]
        problems = []
        real = Path(os.path.realpath(r))
        for special in ("/proc", "/sys"):
            if real == Path(special) or Path(special) in real.parents:
                return [f"--dir {r} is under {special}, which cannot hold the cluster's files "
                        "(choose a directory such as /tmp/gpushare-dev)"]
        p = self.root
        while not os.path.lexists(p) and p != p.parent:
            p = p.parent
        if not p.is_dir():
            problems.append(f"--dir {r} is an existing file, not a directory" if p == self.root
                            else f"--dir {r} cannot be made: {p} is a file, not a directory")
        socks = [self.root / "munge" / "munge.sock", self.filterd_socket, self.controller_socket]
        if self.dbd:
            socks.append(self.root / "db" / "mysqld.sock")
        longest = max(socks, key=lambda s: len(os.fsencode(s)))
        n = len(os.fsencode(longest))
        if n > UNIX_SOCKET_PATH_MAX:
            problems.append(f"--dir {r} is too long: the socket path {longest} would be {n} bytes, over the "
                            f"{UNIX_SOCKET_PATH_MAX}-byte limit of unix sockets (use a shorter --dir)")
        return problems

    def _port_problems(self) -> list[str]:
        """Ports that a daemon of this cluster not running yet would listen on, but are taken."""
        b = self.port_base
        wanted = []  # (port, what it is for, pid-file name of the daemon that would listen there)
        if not self.alive("slurmctld"):
            wanted.append((b, "slurmctld, SlurmctldPort", "slurmctld"))
        if self.dbd and not self.alive("slurmdbd"):
            wanted.append((b + 2, "slurmdbd, DbdPort", "slurmdbd"))
        if self.dbd and not self.alive("mysqld"):
            wanted.append((b + 3, "MariaDB", "mysqld"))
        for i, name in enumerate(self.nodes, start=1):
            if not self.alive(f"slurmd-{name}"):
                wanted.append((b + SLURMD_PORT_OFFSET + i, f"slurmd of node {name}", f"slurmd-{name}"))
        for i, name in enumerate(self.nodes, start=1):
            if not self.alive(f"monitor-{name}"):
                wanted.append((b + MONITOR_PORT_OFFSET + i, f"monitor of node {name}", f"monitor-{name}"))
        problems = []
        found = None
        for port, what, daemon in wanted:
            for host in ("127.0.0.1", "0.0.0.0"):
                if _port_taken(host, port):
                    found = self._scan() if found is None else found
                    if found.get(daemon):  # the cluster's own daemon, running without a valid pid file
                        hint = (f"this cluster's {daemon} runs as pid {found[daemon][0]} without a valid pid "
                                f"file: run '{self.down_command}' first")
                    else:
                        hint = "stop what uses it, or choose another --port-base"
                    problems.append(f"port {port} ({what}) is already in use on {host} ({hint})")
                    break
        return problems

    def _config_differences(self, files: dict[str, str]) -> list[str]:
        """The setting lines in which the running configuration differs from ``files``."""
        diffs = []
        for rel in ("etc/slurm.conf", "etc/gres.conf"):
            cur = (self._read(rel) or "").splitlines()
            req = files.get(rel, "").splitlines()
            for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, cur, req, autojunk=False).get_opcodes():
                if tag != "equal":
                    diffs += [_describe_change(a, b) for a, b in itertools.zip_longest(cur[i1:i2], req[j1:j2])]
        return diffs

    def _scan(self) -> dict[str, list[int]]:
        """This cluster's live daemons, found in ``/proc`` (pid-file name -> PIDs), whatever the pid
        files say. Only processes :meth:`is_ours` can prove to be this cluster's are listed."""
        found: dict[str, list[int]] = {}
        me = os.getpid()
        for pid in psutil.pids():
            if pid == me:
                continue
            argv = _proc_argv(pid)
            daemon = _daemon_of(argv) if argv else None
            if daemon and self.is_ours(daemon, pid, strict=True) and pid_alive(pid):
                found.setdefault(daemon, []).append(pid)
        return found

    def _cancel_jobs(self) -> None:
        ids = self._slurm(["squeue", "-h", "-o", "%i"], check=False).split()
        if ids:
            self._slurm(["scancel", "--full", *ids], check=False)
            self._slurm(["scancel", *ids], check=False)
            try:
                self._wait(lambda: not self._slurm(["squeue", "-h", "-o", "%i"], check=False).split(),
                           30, "jobs to end")
            except ClusterError as e:
                print(f"warning: {e}", file=sys.stderr)

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


def _listening(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def job_python() -> str:
    """A Python 3.11+ interpreter that every user can run, for the programs jobs run (``bin/fake-gpu-app``).

    The base interpreter of this one (``os.path.realpath(sys.executable)``: a venv's ``bin/python`` is
    only a link to it) when every user can reach it; else the first of ``/usr/bin/python3``,
    ``/usr/local/bin/python3`` and ``python3`` on PATH that every user can reach and whose name
    (``python3.N`` once links are resolved) says 3.11 or later; else the base interpreter anyway (then
    only root's jobs can run it: a pyenv Python under root's 0700 home, for one).
    """
    base = os.path.realpath(sys.executable)
    if usable_by_all(base):
        return base
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3")):
        if not cand:
            continue
        real = os.path.realpath(cand)
        m = re.fullmatch(r"python3\.(\d+)", os.path.basename(real))
        if m and int(m.group(1)) >= 11 and usable_by_all(real):
            return real
    return base


def usable_by_all(path: str | os.PathLike) -> bool:
    """Whether every user may run ``path``: it is executable by others, and so is (searchable) every
    directory above it."""
    p = Path(os.path.realpath(path))
    try:
        if not (p.is_file() and p.stat().st_mode & stat.S_IXOTH):
            return False
        return all(d.stat().st_mode & stat.S_IXOTH for d in p.parents)
    except OSError:
        return False


def _write_pidfile(path: Path, pid: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{pid}\n")
    os.replace(tmp, path)


def _stop_pid(pid: int, timeout: float = 10.0, *, what: str = "daemon") -> None:
    """SIGTERM, wait up to ``timeout`` s, then SIGKILL (slurmd can ignore SIGTERM while registering).

    Raises:
        ClusterError: this user may not signal ``pid`` (not root).
    """
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    except PermissionError:
        raise ClusterError(f"not allowed to stop {what} (pid {pid})", hint="run as root") from None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.05)


def _proc_argv(pid: int) -> list[str] | None:
    """The command line of ``pid`` (None for a gone process, a zombie, a kernel thread or one this user
    may not read)."""
    try:
        return psutil.Process(pid).cmdline() or None
    except psutil.Error:
        return None


def _daemon_of(argv: list[str]) -> str | None:
    """Which dev-cluster daemon (pid-file name) a command line would be, judged by its program alone."""
    prog = os.path.basename(argv[0])
    if prog in ("munged", "slurmctld", "slurmdbd"):
        return prog
    if prog == "slurmd":
        node = _option(argv[1:], "-N")
        return f"slurmd-{node}" if node else None
    if prog in ("mariadbd", "mysqld"):
        return "mysqld"
    if prog.startswith("python") or prog == "slurm-gpushare":
        for prev, arg in itertools.pairwise(argv):
            if os.path.basename(prev) not in ("slurm_gpushare", "slurm-gpushare"):
                continue
            if arg == "filterd":
                return "filterd"
            if arg == "monitor":
                node = _option(argv, "--node")
                return f"monitor-{node}" if node else None
    return None


def _option(args: list[str], *names: str) -> str | None:
    """The value of the first ``--name=value``, ``--name value`` or ``-N value`` among ``args``."""
    for i, a in enumerate(args):
        for name in names:
            if a.startswith(name + "=") and name.startswith("--"):
                return a[len(name) + 1:]
            if a == name and i + 1 < len(args):
                return args[i + 1]
    return None


def _same_path(a: str | os.PathLike | None, b: str | os.PathLike) -> bool:
    return a is not None and os.path.realpath(a) == os.path.realpath(b)


def _is_file(p: Path) -> bool:
    try:
        return p.is_file()
    except OSError:
        return False


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _relevant_lines(text: str, n: int = 8) -> list[str]:
    """The last ``n`` error lines of a log (else its last lines), without the known-harmless ones."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not any(h in ln for h in _HARMLESS_LOG)]
    errors = [ln for ln in lines if "fatal" in ln.lower() or "error" in ln.lower()]
    return (errors or lines)[-n:]


def _describe_char(c: str) -> str:
    names = {" ": "a space", "\t": "a tab", "\n": "a newline"}
    return names.get(c, "whitespace" if c.isspace() else repr(c))


def _describe_change(running: str | None, requested: str | None, width: int = 160) -> str:
    """``running: X, requested: Y`` for one differing setting line; for two lines of the same entity
    (``NodeName=a ...``) only the first word and the words that differ."""
    if running and requested:
        a, b = running.split(), requested.split()
        if a and b and a[0] == b[0] and (len(a) > 1 or len(b) > 1):
            running = " ".join([a[0], *(w for w in a[1:] if w not in b)])
            requested = " ".join([b[0], *(w for w in b[1:] if w not in a)])

    def show(line: str | None) -> str:
        if line is None:
            return "(no such line)"
        return line if len(line) <= width else line[: width - 3] + "..."

    return f"running: {show(running)}, requested: {show(requested)}"


def _port_taken(host: str, port: int) -> bool:
    """Whether something listens on (or holds) ``host:port``; TIME_WAIT leftovers do not count."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        return False
    except OSError as e:
        return e.errno == errno.EADDRINUSE
    finally:
        s.close()


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


@click.command(name="dev-cluster", help=__doc__.split("\n\n")[0],
               epilog="exit status: 0 ok; 1 not running or a problem (status); 2 usage; 5 failure; "
                      "exec: the command's",
               context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("action", type=click.Choice(["up", "down", "status", "env", "exec", "product"]),
                metavar="up|down|status|env|exec|product")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option("--dir", "dir_", help=f"state directory (env GPUSHARE_DEV_DIR, default {DEFAULT_DIR})")
@click.option("--port-base", type=int, help=f"slurmctld port (env GPUSHARE_DEV_PORT, default {DEFAULT_PORT_BASE})")
@click.option("--cgroup", is_flag=True, help="confine devices with task/cgroup (cgroup v1)")
@click.option("--dbd", is_flag=True, help="run slurmdbd with a private MariaDB (sacct)")
@click.option("--slurm", "release", type=click.Choice(list(SUITES)), metavar="22.05|24.11|26.05",
              help="the Slurm release (up; default: this host's); one the host does not have runs in a root "
                   "filesystem built once from Debian's archive. Other actions use the cluster's own.")
@click.option("--json", "as_json", is_flag=True, help="status as JSON")
def cli(action: str, command: tuple[str, ...], dir_: str | None, port_base: int | None, cgroup: bool, dbd: bool,
        release: str | None, as_json: bool) -> int:
    """The command line; returns the exit status (see :func:`main`)."""
    try:
        if action == "product" and (len(command) != 1 or command[0] not in ("on", "off")):
            raise click.UsageError("product takes on or off: dev-cluster product off (plain Slurm: the product's "
                                   "slurm.conf lines removed), dev-cluster product on")
        if command and action not in ("exec", "product"):
            raise click.UsageError(f"unexpected argument {command[0]!r} ('exec -- COMMAND...' takes a command)")
        if action == "exec" and not command:
            raise click.UsageError("exec needs a command: dev-cluster exec -- sbatch --wrap hostname")
        cluster = DevCluster.default(dir_, port_base, cgroup=cgroup, dbd=dbd)
        saved = cluster.saved_options()
        ran = saved.get("slurm") if isinstance(saved.get("slurm"), str) else None
        if action == "up" and ran and ran != (release or host_release()) and cluster.alive("slurmctld"):
            raise ClusterError(f"the dev cluster in {cluster.root} runs Slurm {ran} (its cluster.json); "
                               f"this 'up' is for Slurm {release or host_release()}",
                               hint=f"run '{cluster.down_command}' first, or use another --dir/--port-base")
        if action == "up" and cluster.alive("slurmctld"):
            cluster.product = saved.get("product", True) is not False  # as 'product on|off' left it
        if action != "up":
            # down/status/env/exec act on the cluster as it was brought up, with its release
            if release and ran and release != ran:
                raise ClusterError(f"the dev cluster in {cluster.root} runs Slurm {ran}, not {release}",
                                   hint=f"drop --slurm: {action} uses the cluster's own release")
            if action == "exec" and not saved and not _is_file(cluster.slurm_conf):
                raise ClusterError(f"no dev cluster in {cluster.root}",
                                   hint=f"bring one up: scripts/dev-cluster up --dir {cluster.root}")
            cluster.cgroup = cluster.cgroup or saved.get("cgroup", False)
            cluster.dbd = cluster.dbd or saved.get("dbd", False)
            cluster.product = saved.get("product", True) is not False
            release = release or ran
            if port_base is None and isinstance(saved.get("port_base"), int):
                cluster.port_base = saved["port_base"]
        if needs_root(release):
            argv = [str(PROJECT / "scripts" / "dev-cluster"), action, "--dir", str(cluster.root), "--port-base",
                    str(cluster.port_base), *(["--cgroup"] if cluster.cgroup else []),
                    *(["--dbd"] if cluster.dbd else []), *(["--json"] if as_json else []),
                    *(["--", *command] if command else [])]
            if action == "env":
                print(f"# Slurm {release} runs in its own root filesystem: these exports serve commands run there, "
                      "with scripts/dev-cluster exec -- COMMAND", file=sys.stderr)
            rc = run_in_release(release, argv)
            assert rc is not None
            return rc
        if action == "up":
            cluster.up()
        elif action == "down":
            cluster.down()
        elif action == "product":
            cluster.set_product(command[0] == "on")
            print(f"dev cluster in {cluster.root}: the product's slurm.conf lines are {command[0]}")
        elif action == "env":
            print(cluster.env_exports())
        elif action == "exec":
            env = {**cluster.env, "GPUSHARE_FAKE_GPU_APP": str(cluster.fake_gpu_app)}
            sys.stdout.flush()
            try:
                return subprocess.run(list(command), env=env).returncode
            except FileNotFoundError:
                raise ClusterError(f"{command[0]}: command not found") from None
        else:
            return _print_status(cluster, as_json=as_json)
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. 'dev-cluster up | head': the work is done, only its output is cut
        _quiet_stdout()
    except (GpushareError, OSError) as e:
        print(f"dev-cluster: error: {e}", file=sys.stderr)
        return ClusterError.exit_code
    return 0


def main(argv: list[str] | None = None) -> int:
    """``dev-cluster up|down|status|env`` (see the module docstring); ``argv`` defaults to ``sys.argv[1:]``.

    Exit status: 0 done (``status``: every daemon of the cluster runs); 1 ``status``: no cluster in the
    directory, not running, or a daemon stopped or with a stale pid file; 2 usage (one
    ``dev-cluster: error:`` line); 5 failure. Returned, never raised as SystemExit.
    """
    try:
        return cli.main(args=argv, prog_name="dev-cluster", standalone_mode=False)
    except click.ClickException as e:
        print(f"dev-cluster: error: {' '.join(e.format_message().split())} (see dev-cluster --help)", file=sys.stderr)
        return 2
    except click.Abort:  # Ctrl-C while click reads input (it reads none)
        return 130


def _print_status(cluster: DevCluster, *, as_json: bool) -> int:
    """Print ``status``; 0 when every daemon of the cluster runs, else 1."""
    st = cluster.status()
    code = 0 if st["exists"] and st["ok"] else 1
    try:
        if as_json:
            print(json.dumps(st, indent=2))
        elif not st["exists"]:
            print(f"no dev cluster in {cluster.root}")
        else:
            for d, s in st["daemons"].items():
                state = "running" if s["alive"] else s.get("problem", "stopped")
                url = f"  {s['url']}" if "url" in s and s["alive"] else ""
                print(f"{d:<22} pid {s['pid'] or '-':<8} {state}{url}")
            for n, s in st["nodes"].items():
                print(f"node {n:<17} {s}")
            if not any(s["alive"] for s in st["daemons"].values()):
                print(f"dev cluster in {cluster.root} is not running")
            elif not st["ok"]:
                bad = [d for d, s in st["daemons"].items() if not s["alive"]]
                print(f"dev cluster in {cluster.root} is not fully running: {', '.join(bad)}")
        sys.stdout.flush()
    except BrokenPipeError:  # 'dev-cluster status | head'
        _quiet_stdout()
    return code


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so that the flush at exit does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
