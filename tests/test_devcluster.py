"""The dev cluster: real slurmctld/slurmd with simulated GPUs from machine descriptions."""

from __future__ import annotations

import io
import json
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from slurm_gpushare.errors import ClusterError
from slurm_gpushare.gresconf.render import generate_node_gres
from slurm_gpushare.hardware.fake import FakeNvml
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.node.config import parse_node_config
from slurm_gpushare.slurm.nodegres import GresOptions
from slurm_gpushare.submit.policyfile import parse_policy
from slurm_gpushare_dev.cluster import (
    DEFAULT_DIR,
    DEFAULT_NODES,
    DevCluster,
    _stop_pid,
    job_python,
    main,
    packaged_machine,
    pid_alive,
)
from tests.conftest import DEADLINE, Job, spooled_records, wait_until


def test_render_has_one_node_line_and_gres_per_machine(tmp_path):
    c = DevCluster.default(tmp_path, 20000)
    files = c.render()
    conf = files["etc/slurm.conf"]
    for name, m in c.nodes.items():
        line = next(ln for ln in conf.splitlines() if ln.startswith(f"NodeName={name} "))
        assert f"Gres={generate_node_gres(m, name).gres_value}" in line
        assert "NodeAddr=127.0.0.1" in line
    ports = sorted(int(p) for p in re.findall(r" Port=(\d+)", conf))
    assert ports == [20011, 20012, 20013, 20014]
    assert "SlurmctldPort=20000" in conf and "SlurmdParameters=config_overrides" in conf
    gres = files["etc/gres.conf"]
    assert gres.splitlines()[1] == "AutoDetect=off"
    assert str(tmp_path / "dev" / "h100-nvs" / "nvidia0") in gres


def test_a_shard_unit_of_the_gres_options_reaches_node_toml_and_the_first_policy(tmp_path):
    # benchmarks/packing's fixed-fractions cluster: 4 shards per A100 80GB. The Prolog checks gres.conf
    # against node.toml's shard_unit and the filter's inventory counts shards in the policy's unit: both
    # must be the gres.conf's, or the first job drains the node
    m = packaged_machine("8x-a100-nv12-bridge.json")
    c = DevCluster(tmp_path, 20000, {"a": m, "b": m},
                   gres_options={n: GresOptions(shard_unit_mib=20480) for n in ("a", "b")})
    files = c.render()
    assert "Name=shard Count=4 " in files["etc/gres.conf"]
    assert parse_node_config(files["etc/gpushare/node.toml"].replace("{node}", "a")).shard_unit_mib == 20480
    assert parse_policy(c.initial_policy_text()).shard_unit_mib == 20480
    default = DevCluster.default(tmp_path / "d", 20000)
    assert "shard_unit =" not in default.render()["etc/gpushare/node.toml"]
    assert parse_policy(default.initial_policy_text()).shard_unit_mib == 1024
    mixed = DevCluster(tmp_path / "m", 20000, {"a": m, "b": m}, gres_options={"a": GresOptions(shard_unit_mib=20480)})
    with pytest.raises(ClusterError, match="one shard unit for all nodes.*a: 20G, b: 1G"):
        mixed.check_settings()


def test_default_cluster_has_three_gpu_models_and_a_mig_node():
    c = DevCluster.default("/tmp/unused", 20000)
    models = {g.model for m in c.nodes.values() for g in m.gpus}
    assert {"h100", "a100", "rtx4090"} <= models
    assert any(g.mig_enabled and g.mig_instances for m in c.nodes.values() for g in m.gpus)
    assert list(c.nodes) == list(DEFAULT_NODES)


@pytest.mark.slurm
def test_nodes_idle_with_their_gres(cluster, slurm):
    out = slurm.run(["sinfo", "-h", "-N", "-o", "%N|%T|%G"]).stdout
    rows = {n: (st, g) for n, st, g in (line.split("|") for line in out.splitlines())}
    assert set(rows) == set(cluster.nodes)
    for name, m in cluster.nodes.items():
        state, gres = rows[name]
        assert state == "idle", (name, state)
        expected = generate_node_gres(m, name)
        for (gname, gtype), count in expected.counts.items():
            if gname == "gpu":
                assert re.search(rf"gpu:{re.escape(gtype)}:{count}\b", gres), (name, gres)
        shown = slurm.run(["scontrol", "-o", "show", "node", name]).stdout
        assert f"gpu:{m.gpus[0].model}" in shown
    models = {g.model for m in cluster.nodes.values() for g in m.gpus}
    assert len(models) >= 3


@pytest.mark.slurm
def test_gpu_job_sees_cuda_visible_devices(slurm):
    job = slurm.wait(slurm.sbatch("--gres=gpu:1", "-p", "gpu", wrap="env | sort"))
    assert job.state == "COMPLETED", job.fields
    env = dict(line.split("=", 1) for line in job.output().splitlines() if "=" in line)
    assert re.fullmatch(r"\d+", env.get("CUDA_VISIBLE_DEVICES", "")), job.output()
    assert env["SLURM_JOB_GPUS"] == env["CUDA_VISIBLE_DEVICES"]


@pytest.mark.slurm
def test_typed_gpu_request_lands_on_that_model(cluster, slurm):
    job = slurm.wait(slurm.sbatch("--gres=gpu:rtx4090:2", wrap="echo $CUDA_VISIBLE_DEVICES"))
    assert job.state == "COMPLETED", job.fields
    assert job.fields["NodeList"] == "rtx4090-pcie"
    assert len(job.output().strip().split(",")) == 2


def test_product_off_renders_plain_slurm_on_the_same_nodes(tmp_path):
    on = DevCluster.default(tmp_path, 30000, dbd=True)
    off = DevCluster.default(tmp_path, 30000, dbd=True)
    off.product = False
    conf_on, conf_off = on.render()["etc/slurm.conf"], off.render()["etc/slurm.conf"]
    for line in on.product_lines():
        assert line in conf_on.splitlines() and line not in conf_off, line
    assert [ln for ln in conf_on.splitlines() if ln not in on.product_lines() and not ln.startswith("#")] == \
        [ln for ln in conf_off.splitlines() if not ln.startswith("#")]
    assert {k for k in on.product_lines() for k in [k.split("=")[0]]} == {
        "PrologFlags", "Prolog", "Epilog", "TaskProlog", "JobSubmitPlugins", "CliFilterPlugins", "EpilogSlurmctld"}
    assert on.render()["etc/gres.conf"] == off.render()["etc/gres.conf"]
    assert json.loads(off.render()["cluster.json"])["product"] is False


def test_product_takes_on_or_off(capsys):
    assert main(["product", "maybe", "--dir", "/nonexistent/x"]) == 2
    assert "product takes on or off" in capsys.readouterr().err


@pytest.mark.slurm
def test_product_off_and_on_again_on_the_running_cluster(cluster, slurm):
    """The same daemons with and without the product's slurm.conf lines: with them a gpushare request gets
    the TaskProlog's lines (a shared GPU's MPS pipe); without them the same request is plain Slurm's refusal
    (no job_submit.lua, no cli_filter.lua), and a GPU job sees Slurm's environment, nothing of the product."""
    pids = {d: cluster.pid(d) for d in ("filterd", *(f"monitor-{n}" for n in cluster.nodes))}
    wrap = "env | grep -E '^(CUDA_MPS_PIPE_DIRECTORY|CUDA_VISIBLE_DEVICES)=' | sort"

    def env_of(job) -> dict[str, str]:
        job = slurm.wait(job)
        assert job.state == "COMPLETED", job.fields
        return dict(line.split("=", 1) for line in job.output().splitlines() if "=" in line)

    try:
        cluster.set_product(False)
        assert json.loads((cluster.root / "cluster.json").read_text())["product"] is False
        config = slurm.run(["scontrol", "show", "config"]).stdout
        assert not re.search(r"^(TaskProlog|Prolog|Epilog)\s*=\s*/", config, re.M), config
        refused = slurm.sbatch("--gres=gpushare:mem=10G", wrap=wrap, check=False)
        assert refused.returncode != 0, refused.stdout
        env = env_of(slurm.sbatch("--gres=gpu:h100:1", "-w", "h100-nvs", wrap=wrap))
        assert list(env) == ["CUDA_VISIBLE_DEVICES"], env
    finally:
        cluster.set_product(True)
    env = env_of(slurm.sbatch("--gres=gpushare:mem=10G", "-p", "nomig", wrap=wrap))
    assert env.get("CUDA_MPS_PIPE_DIRECTORY", "").startswith("/"), env
    assert {d: cluster.pid(d) for d in pids} == pids  # the product's own daemons ran throughout


@pytest.mark.slurm
def test_up_twice_is_harmless(cluster):
    before = {d: cluster.pid(d) for d in cluster.daemons()}
    cluster.up(out=open(os.devnull, "w"))
    after = {d: cluster.pid(d) for d in cluster.daemons()}
    assert before == after and all(after.values())
    assert cluster.all_idle()


@pytest.mark.slurm
def test_down_leaves_no_daemon_of_the_cluster(cluster):
    # a second, one-node cluster beside the session's one: other directory, other ports
    # (munged needs every parent of its socket executable by all: not pytest's 0700 tmp_path)
    root = Path(tempfile.mkdtemp(prefix="gpushare-down-test-", dir="/tmp"))
    os.chmod(root, 0o755)
    small = DevCluster(root / "c2", cluster.port_base + 100,
                       {"downtest": cluster.nodes["rtx4090-pcie"]})
    small.up(out=open(os.devnull, "w"))
    pids = {d: small.pid(d) for d in small.daemons()}
    assert all(pids.values()) and all(pid_alive(p) for p in pids.values())
    small.down(out=open(os.devnull, "w"))
    assert [d for d, p in pids.items() if pid_alive(p)] == []
    assert not list((root / "c2" / "run").glob("*.pid"))
    # the session's cluster is untouched
    assert cluster.alive("slurmctld") and cluster.all_idle()
    shutil.rmtree(root)


# --- helpers for the tests below --------------------------------------------------------------


def _fake(argv0: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    """A sleeping Python whose /proc/<pid>/cmdline reads ``argv0 -c <code> ARGS`` (a stand-in daemon)."""
    proc = subprocess.Popen([argv0, "-c", "import time; time.sleep(120)", *args], executable=sys.executable,
                            env=env, stdin=subprocess.DEVNULL)
    # Popen returns once exec has begun; the kernel sets the new command line a moment later
    wait_until(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes(), f"the command line of pid {proc.pid}")
    return proc


def _end(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def _world_readable_dir(prefix: str) -> Path:
    """A fresh directory under /tmp that every user may enter (pytest's tmp_path is 0700)."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(root, 0o755)
    return root


def _small(cluster: DevCluster, offset: int, node: str) -> DevCluster:
    """A one-node cluster beside the session's one: its own directory under /tmp, its own ports."""
    return DevCluster(_world_readable_dir("gpushare-dc-") / "c", cluster.port_base + offset,
                      {node: cluster.nodes["rtx4090-pcie"]})


def _processes_of(c: DevCluster) -> list[tuple[int, str]]:
    """Every live process that names the cluster's directory or runs with its SLURM_CONF (not via devcluster)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and (str(c.root) in cmd or f"SLURM_CONF={c.slurm_conf}".encode() in env) and pid_alive(int(entry.name)):
            found.append((int(entry.name), cmd))
    return found


def _unimportable_python(cwd: Path) -> str | None:
    """An interpreter (with -I) that cannot import slurm_gpushare, or None."""
    for cand in ("/usr/bin/python3", os.path.realpath(sys.executable)):
        if os.access(cand, os.X_OK) and subprocess.run([cand, "-I", "-c", "import slurm_gpushare"], cwd=cwd,
                                                       capture_output=True).returncode != 0:
            return cand
    return None


DEVNULL = open(os.devnull, "w")  # the clusters' progress output goes nowhere
WRAPPER = Path(__file__).resolve().parent.parent / "scripts" / "dev-cluster"
IMPORT_HINT = "run as root, or install the package for this user: pip install -e ."


# --- 1. pid files are verified before a PID is reported or signalled -------------------------


def test_status_reports_a_pid_file_naming_another_process_as_stale(tmp_path, capsys):
    root = tmp_path / "c"
    (root / "run").mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        (root / "run" / "slurmctld.pid").write_text(f"{sleeper.pid}\n")
        c = DevCluster.default(root, 21000)
        assert not c.alive("slurmctld")
        st = c.status()["daemons"]["slurmctld"]
        assert st["alive"] is False and st["pid"] == sleeper.pid
        assert st["problem"] == f"stale pid file (pid {sleeper.pid} is not this cluster's slurmctld)"
        assert main(["status", "--dir", str(root)]) == 1
        out = capsys.readouterr().out
        assert f"stale pid file (pid {sleeper.pid} is not this cluster's slurmctld)" in out
        assert "running" not in out.split("slurmctld", 1)[1].splitlines()[0]
        assert sleeper.poll() is None
    finally:
        _end(sleeper)


def test_down_never_signals_a_process_that_is_not_the_clusters(tmp_path):
    root = tmp_path / "c"
    (root / "run").mkdir(parents=True)
    c = DevCluster(root, 21000, {"stale-node": packaged_machine("8x-rtx4090-pcie.json")})
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        for d in ("munged", "slurmctld", "filterd", "slurmd-stale-node"):
            c.pidfile(d).write_text(f"{sleeper.pid}\n")
        out = io.StringIO()
        assert c.down(out=out) == []
        assert sleeper.poll() is None, "down signalled a process that is not the cluster's"
        assert f"munged: stale pid file (pid {sleeper.pid} is not this cluster's munged)" in out.getvalue()
        assert not list((root / "run").glob("*.pid"))
    finally:
        _end(sleeper)


def test_is_ours_needs_the_program_and_this_cluster(tmp_path):
    c = DevCluster(tmp_path / "c", 21000, {"n1": packaged_machine("8x-rtx4090-pcie.json")})
    other = tmp_path / "other"
    env = dict(os.environ, SLURM_CONF=str(c.slurm_conf))
    other_env = dict(os.environ, SLURM_CONF=str(other / "etc" / "slurm.conf"))
    cases = [  # (pid-file name, fake process, expected)
        ("munged", _fake("munged", f"--socket={c.root}/munge/munge.sock"), True),
        ("munged", _fake("munged", f"--socket={other}/munge/munge.sock"), False),
        ("munged", _fake("slurmctld", f"--socket={c.root}/munge/munge.sock"), False),
        ("slurmctld", _fake("slurmctld", env=env), True),
        ("slurmctld", _fake("slurmctld", env=other_env), False),
        ("slurmctld", _fake("slurmd", env=env), False),
        ("slurmd-n1", _fake("slurmd", "-N", "n1", env=env), True),
        ("slurmd-n1", _fake("slurmd", "-N", "n2", env=env), False),
        ("slurmd-n1", _fake("slurmd", "-N", "n1", env=other_env), False),
        ("filterd", _fake("python3", "-m", "slurm_gpushare", "filterd", f"--socket={c.filterd_socket}"), True),
        ("filterd", _fake("python3", "-m", "slurm_gpushare", "filterd", f"--socket={other}/run/filterd.sock"), False),
        ("monitor-n1", _fake("python3", "-m", "slurm_gpushare", "monitor", "--config", str(c.node_config),
                             "--node", "n1"), True),
        ("monitor-n1", _fake("python3", "-m", "slurm_gpushare", "monitor", f"--config={c.node_config}",
                             "--node=n1"), True),
        ("monitor-n1", _fake("python3", "-m", "slurm_gpushare", "monitor", "--config", str(c.node_config),
                             "--node", "n2"), False),
        ("monitor-n1", _fake("python3", "-m", "slurm_gpushare", "monitor", "--config",
                             f"{other}/etc/gpushare/node.toml", "--node", "n1"), False),
        ("monitor-n1", _fake("python3", "-m", "slurm_gpushare", "filterd", "--config", str(c.node_config),
                             "--node", "n1"), False),
        ("mysqld", _fake("mariadbd", f"--datadir={c.root}/db/data"), True),
        ("mysqld", _fake("mariadbd", f"--datadir={other}/db/data"), False),
    ]
    try:
        got = [(d, p.args[0], c.is_ours(d, p.pid)) for d, p, _ in cases]
        assert got == [(d, p.args[0], want) for d, p, want in cases]
    finally:
        for _, p, _ in cases:
            _end(p)


@pytest.mark.slurm
def test_down_stops_the_real_daemons_behind_stale_pid_files(cluster):
    small = _small(cluster, 400, "staletest")
    sleeper = subprocess.Popen(["sleep", "120"])
    real = {}
    try:
        small.up(out=DEVNULL)
        real = {d: small.pid(d) for d in ("slurmctld", "slurmd-staletest")}
        for d in real:
            small.pidfile(d).write_text(f"{sleeper.pid}\n")
        st = small.status()["daemons"]
        assert st["slurmctld"]["alive"] is False
        assert st["slurmctld"]["problem"].startswith(
            f"stale pid file (pid {sleeper.pid} is not this cluster's slurmctld); "
            f"this cluster's slurmctld runs as pid {real['slurmctld']}")
        out = io.StringIO()
        small.down(out=out)
        assert sleeper.poll() is None
        assert [d for d, p in real.items() if pid_alive(p)] == []
        assert _processes_of(small) == []
        assert "stale pid file" in out.getvalue()
        assert not list((small.root / "run").glob("*.pid"))
    finally:
        _end(sleeper)
        for d, p in real.items():  # whatever happened, let down find the real daemons
            small.pidfile(d).write_text(f"{p}\n")
        small.down(out=DEVNULL)
        shutil.rmtree(small.root.parent)


# --- 2. settings are checked before anything starts; a failed up stops what it started -------


@pytest.mark.parametrize("port_base, dir_name, expected", [
    (100, "c", "--port-base 100 is out of range"),
    (65530, "c", "--port-base 65530 is out of range: the cluster uses ports 65530..65574"),
    (65500, "c", "the nodes' slurmd 65511..65514, their monitors 65541..65544), which must lie within "
                 "1024..65535 (use a --port-base from 1024 to 65491)"),
    (21000, "with space", "contains a space, which Slurm config files cannot take"),
    (21000, "hash#dir", "contains '#', which Slurm config files cannot take"),
    (21000, "x" * 100, "(use a shorter --dir)"),
])
def test_up_rejects_bad_settings_before_starting_anything(tmp_path, monkeypatch, port_base, dir_name, expected):
    def must_not_start(self, files):
        raise AssertionError("up went on to prepare and start the cluster")

    monkeypatch.setattr(DevCluster, "_prepare", must_not_start)
    c = DevCluster.default(tmp_path / dir_name, port_base)
    with pytest.raises(ClusterError) as e:
        c.up(out=DEVNULL)
    assert expected in str(e.value)
    assert len(str(e.value).splitlines()) == 1
    assert not c.root.exists()


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_up_names_a_port_already_in_use(tmp_path, monkeypatch, host):
    monkeypatch.setattr(DevCluster, "_prepare", lambda self, files: pytest.fail("up went on to start"))
    with socket.socket() as s:
        s.bind((host, 0))
        s.listen()
        port = s.getsockname()[1]
        c = DevCluster.default(tmp_path / "c", port)
        with pytest.raises(ClusterError, match=rf"port {port} \(slurmctld, SlurmctldPort\) is already in use"):
            c.up(out=DEVNULL)


@pytest.mark.parametrize("kind", ["file", "below a file", "proc"])
def test_up_with_an_unusable_dir_is_one_error_line(tmp_path, capsys, kind):
    f = tmp_path / "afile"
    f.write_text("not a directory\n")
    d = {"file": f, "below a file": f / "sub", "proc": Path("/proc/gpushare-dev-test")}[kind]
    assert main(["up", "--dir", str(d), "--port-base", "21000"]) == 5
    err = capsys.readouterr().err
    assert err.startswith(f"dev-cluster: error: --dir {d} ") and len(err.splitlines()) == 1, err
    assert f.read_text() == "not a directory\n"


def test_a_failed_start_shows_only_this_starts_log_lines_without_pmix(tmp_path):
    c = DevCluster(tmp_path / "c", 21000, {"n1": packaged_machine("8x-rtx4090-pcie.json")})
    log = c.root / "log" / "slurmctld.log"
    log.parent.mkdir(parents=True)
    log.write_text("[old] error: OLD RUN: something that is fixed by now\n")
    c._begin_start()
    with open(log, "a") as f:
        f.write("[new] error: Couldn't load specified plugin name for mpi/pmix_v4: Plugin init() callback failed\n"
                "[new] error: MPI: Cannot create context for mpi/pmix\n"
                "[new] error:  mpi/pmix_v4: init: (null) [0]: mpi_pmix.c:195: pmi/pmix: can not load PMIx library\n"
                "[new] fatal: NEW RUN: the real cause\n")
    with pytest.raises(ClusterError) as e:
        c._wait(lambda: False, 0.1, "slurmctld answering ping", log="log/slurmctld.log")
    text = str(e.value)
    assert "NEW RUN: the real cause" in text
    assert "OLD RUN" not in text and "pmix" not in text


@pytest.mark.slurm
def test_failed_up_stops_only_the_daemons_it_started(cluster, monkeypatch):
    small = _small(cluster, 200, "failtest")
    try:
        small.up(out=DEVNULL)
        kept = {d: small.pid(d) for d in ("munged", "slurmctld", "filterd")}
        _stop_pid(small.pid("slurmd-failtest"))
        monkeypatch.setattr(DevCluster, "_up_resuming_drained", lambda self: False)
        with pytest.raises(ClusterError) as e:
            small.up(timeout=1, out=DEVNULL)
        assert "waiting for all nodes in service" in str(e.value)
        assert "stopped what this 'up' had started: slurmd-failtest (pid" in str(e.value)
        assert {d: small.pid(d) for d in kept} == kept and all(pid_alive(p) for p in kept.values())
        assert not any("slurmd -N failtest" in cmd for _, cmd in _processes_of(small))

        monkeypatch.undo()
        small.down(out=DEVNULL)
        monkeypatch.setattr(DevCluster, "_up_resuming_drained", lambda self: False)
        with pytest.raises(ClusterError) as e:
            small.up(timeout=1, out=DEVNULL)
        for d in ("munged", "slurmctld", "filterd", "slurmd-failtest"):
            assert f"{d} (pid" in str(e.value)
        assert _processes_of(small) == []
    finally:
        monkeypatch.undo()
        small.down(out=DEVNULL)
        shutil.rmtree(small.root.parent)


# --- 3. down without root, status into a closed pipe, status exit codes ---------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a daemon the test user may not signal")
def test_down_as_an_unprivileged_user_is_a_cluster_error():
    root = _world_readable_dir("gpushare-dc-") / "c"
    (root / "run").mkdir(parents=True)
    os.chmod(root, 0o755)
    os.chmod(root / "run", 0o755)
    c = DevCluster(root, 21000, {"n1": packaged_machine("8x-rtx4090-pcie.json")})
    munged = _fake("munged", f"--socket={root}/munge/munge.sock")  # runs as root
    try:
        c.pidfile("munged").write_text(f"{munged.pid}\n")
        r, w = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through the pipe
            try:
                os.close(r)
                os.setgroups([])
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
                try:
                    c.down(out=DEVNULL)
                    msg = "no error"
                except BaseException as e:  # noqa: BLE001
                    msg = f"{type(e).__name__}: {e}"
                os.write(w, msg.encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            msg = f.read()
        os.waitpid(child, 0)
        assert msg.startswith("ClusterError: "), msg
        assert "run as root" in msg
        assert munged.poll() is None
    finally:
        _end(munged)
        shutil.rmtree(root.parent)


def test_status_into_a_closed_pipe_exits_quietly(tmp_path):
    r, w = os.pipe()
    os.close(r)  # like 'status | head' after head has gone
    try:
        proc = subprocess.run([sys.executable, "-m", "slurm_gpushare_dev.cluster", "status", "--dir",
                               str(tmp_path / "none")], stdout=w, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(w)
    assert proc.stderr == ""
    assert proc.returncode == 1


@pytest.mark.parametrize("as_json", [False, True])
def test_status_without_a_cluster_says_so_and_exits_1(tmp_path, capsys, as_json):
    d = tmp_path / "none"
    assert main(["status", "--dir", str(d), *(["--json"] if as_json else [])]) == 1
    out = capsys.readouterr().out
    if as_json:
        st = json.loads(out)
        assert st["exists"] is False and st["ok"] is False
    else:
        assert out == f"no dev cluster in {d}\n"


@pytest.mark.parametrize("argv, words", [
    (["sideways"], "'sideways' is not one of 'up', 'down', 'status', 'env', 'exec'"),
    (["exec"], "exec needs a command: dev-cluster exec -- sbatch --wrap hostname"),
    (["status", "extra"], "unexpected argument 'extra'"),
    (["up", "--slurm", "23.11"], "'23.11' is not one of '22.05', '24.11', '26.05'"),
    ([], "Missing argument 'up|down|status|env|exec|product'. Choose from: up, down, status, env, exec, product"),
    (["status", "--port-base", "high"], "'high' is not a valid integer"),
    (["status", "--bogus"], "No such option '--bogus'"),
])
def test_usage_errors_return_2_with_one_line(argv, words, capsys):
    # main(argv) returns the exit status, usage errors included (scripts/dev-cluster exits with it)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("dev-cluster: error: ") and words in err and len(err.splitlines()) == 1, err


def test_exec_runs_a_client_of_the_clusters_release_with_its_config(cluster, capfd):
    # the one runner of the tests and the demo: the command gets the cluster's SLURM_CONF and fake GPU app,
    # and its exit status is dev-cluster's
    saved = json.loads((cluster.root / "cluster.json").read_text())
    assert saved["slurm"] == cluster.slurm_release
    script = 'echo "$SLURM_CONF $GPUSHARE_FAKE_GPU_APP"; scontrol ping | grep -c UP; exit 3'
    rc = main(["exec", "--dir", str(cluster.root), "--", "sh", "-c", script])
    out = capfd.readouterr().out.split("\n")
    assert rc == 3
    assert out[:2] == [f"{cluster.slurm_conf} {cluster.fake_gpu_app}", "1"]
    assert main(["exec", "--dir", str(cluster.root), "--", "no-such-program-here"]) == 5
    assert "no-such-program-here: command not found" in capfd.readouterr().err


def test_help_returns_0(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "up|down|status|env" in out and "--port-base" in out and "exit status" in out


@pytest.mark.parametrize("as_json", [False, True])
def test_status_of_a_stopped_cluster_exits_1(tmp_path, capsys, as_json):
    c = DevCluster.default(tmp_path / "c", 21000)
    for rel, text in c.render().items():
        (c.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (c.root / rel).write_text(text)
    assert main(["status", "--dir", str(c.root), *(["--json"] if as_json else [])]) == 1
    out = capsys.readouterr().out
    if as_json:
        st = json.loads(out)
        assert st["exists"] is True and not any(s["alive"] for s in st["daemons"].values())
    else:
        assert "munged                 pid -        stopped" in out
        assert out.endswith(f"dev cluster in {c.root} is not running\n")


# --- 4. a refused up names what differs ---------------------------------------------------------


def test_up_refusal_names_the_differing_settings(tmp_path, monkeypatch):
    monkeypatch.setattr(DevCluster, "_check_programs", lambda self: None)
    monkeypatch.setattr(DevCluster, "_port_problems", lambda self: [], raising=False)
    monkeypatch.setattr(DevCluster, "_prepare", lambda self, files: pytest.fail("up went on to start"))
    running = DevCluster.default(tmp_path / "c", 21000)
    for rel, text in running.render().items():
        (running.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (running.root / rel).write_text(text)
    ctld = _fake("slurmctld", env=dict(os.environ, SLURM_CONF=str(running.slurm_conf)))
    try:
        running.pidfile("slurmctld").parent.mkdir(parents=True, exist_ok=True)
        running.pidfile("slurmctld").write_text(f"{ctld.pid}\n")
        with pytest.raises(ClusterError) as e:
            DevCluster.default(running.root, 21000, cgroup=True).up(out=DEVNULL)
        assert "running: TaskPlugin=task/none, requested: TaskPlugin=task/cgroup" in str(e.value)
        with pytest.raises(ClusterError) as e:
            DevCluster.default(running.root, 21100).up(out=DEVNULL)
        assert "running: SlurmctldPort=21000, requested: SlurmctldPort=21100" in str(e.value)
        assert "running: NodeName=h100-nvs Port=21011, requested: NodeName=h100-nvs Port=21111" in str(e.value)
        assert "more differing lines" in str(e.value)
    finally:
        _end(ctld)


@pytest.mark.slurm
def test_up_with_other_options_on_the_running_cluster_names_them(cluster):
    with pytest.raises(ClusterError, match=r"running: TaskPlugin=task/none, requested: TaskPlugin=task/cgroup"):
        DevCluster.default(cluster.root, cluster.port_base, cgroup=True).up(out=DEVNULL)
    assert cluster.all_idle()


# --- 5. up shows each node's whole GRES --------------------------------------------------------


@pytest.mark.slurm
def test_up_prints_each_nodes_full_gres(cluster, slurm):
    out = io.StringIO()
    cluster.up(out=out)
    lines = out.getvalue().splitlines()
    gres = dict(line.split("|") for line in slurm.run(["sinfo", "-h", "-N", "-o", "%N|%G"]).stdout.splitlines())
    assert set(gres) == set(cluster.nodes)
    for node, g in gres.items():
        rows = [ln for ln in lines if ln.split()[:1] == [node]]
        assert len(rows) == 1, rows
        assert rows[0].split()[-1] == g


# --- 6. the wrapper explains a Python that cannot import the package -------------------------


def test_wrapper_explains_a_python_that_cannot_import_the_package(tmp_path):
    py = _unimportable_python(tmp_path)
    if py is None:
        pytest.skip("no Python here that lacks slurm_gpushare")
    proc = subprocess.run([str(WRAPPER), "status", "--dir", str(tmp_path / "none")], cwd=tmp_path,
                          env=dict(os.environ, GPUSHARE_PYTHON=f"{py} -I"), capture_output=True, text=True)
    assert proc.returncode == 5
    assert proc.stderr.startswith("dev-cluster: error: ") and IMPORT_HINT in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr


def test_wrapper_with_an_unusable_venv_python_says_what_to_do(tmp_path):
    py = _unimportable_python(tmp_path)
    if py is None:
        pytest.skip("no Python here that lacks slurm_gpushare")
    # a copy of the repository's layout whose .venv/bin/python leads nowhere this user can go
    (tmp_path / "repo" / "scripts").mkdir(parents=True)
    shutil.copy(WRAPPER, tmp_path / "repo" / "scripts" / "dev-cluster")
    (tmp_path / "repo" / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / "repo" / ".venv" / "bin" / "python").symlink_to("/nonexistent/.pyenv/versions/3.11/bin/python3")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").write_text(f'#!/bin/sh\nexec {py} -I "$@"\n')
    os.chmod(tmp_path / "bin" / "python3", 0o755)
    env = {k: v for k, v in os.environ.items() if k != "GPUSHARE_PYTHON"}
    env["PATH"] = f"{tmp_path / 'bin'}:/usr/bin:/bin"
    proc = subprocess.run([str(tmp_path / "repo" / "scripts" / "dev-cluster"), "status"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 5
    assert ".venv/bin/python is not usable by this user" in proc.stderr and IMPORT_HINT in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.slurm
def test_cgroup_option_confines_a_job_to_its_own_fake_gpu(cluster):
    root = Path(tempfile.mkdtemp(prefix="gpushare-cg-test-", dir="/tmp"))
    os.chmod(root, 0o755)
    c = DevCluster(root / "c", cluster.port_base + 500, {"cgnode": cluster.nodes["rtx4090-pcie"]}, cgroup=True)
    c.up(out=open(os.devnull, "w"))
    try:
        dev = c.device_dir("cgnode")
        out = root / "out.txt"
        script = (f"for f in {dev}/nvidia0 {dev}/nvidia1; do head -c1 $f 2>&1 | head -1; done; "
                  "grep devices /proc/self/cgroup")
        proc = subprocess.run(["sbatch", "--parsable", "-w", "cgnode", "--gres=gpu:1", f"--output={out}",
                               "--wrap", script], env=c.env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        wait_until(lambda: out.exists() and "devices" in out.read_text(), f"the job's output in {out}")
        text = out.read_text()
        assert "nvidia0" in text and "No such device or address" in text  # its own GPU: no driver behind it
        assert "nvidia1" in text and "Operation not permitted" in text  # another GPU: the cgroup says no
        assert "slurm_cgnode" in text
    finally:
        c.down(out=open(os.devnull, "w"))
        shutil.rmtree(root, ignore_errors=True)


# --- 7. jobs "use" the fake GPUs; one monitor per node watches them ----------------------------

GIB = 1 << 30


def _write_rendered(c: DevCluster) -> None:
    """The cluster's rendered files on disk, without starting anything (no Slurm, no root)."""
    for rel, text in c.render().items():
        (c.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (c.root / rel).write_text(text)


def test_node_side_files_point_every_fake_nvml_at_the_process_table(tmp_path):
    c = DevCluster.default(tmp_path / "c", 20000)
    files = c.render()
    for hook in ("prolog", "epilog"):
        line = files[f"scripts/{hook}.sh"].splitlines()[-1]
        assert f'GPUSHARE_FAKE_GPU_PROCESSES="{c.root}/fake-gpu-procs/$SLURMD_NODENAME" ' in line
        assert f'GPUSHARE_NVML="fake:{c.root}/machines/$SLURMD_NODENAME.json"' in line
    cfg = parse_node_config(files["etc/gpushare/node.toml"])
    assert cfg.monitor_interval == 0.5
    assert cfg.spool_dir == str(c.accounting_spool) and cfg.machine == f"{c.root}/machines/{{node}}.json"
    # one table per node: an entry names only a GPU index, which every node has
    assert c.fake_gpu_table("a100-nvb") == c.root / "fake-gpu-procs" / "a100-nvb"


def test_each_node_has_a_monitor_after_the_slurmds_on_port_base_plus_40(tmp_path):
    c = DevCluster.default(tmp_path / "c", 20000)
    names = c.daemons()
    assert names[-8:] == [f"slurmd-{n}" for n in c.nodes] + [f"monitor-{n}" for n in c.nodes]
    assert [c.monitor_url(n) for n in c.nodes] == [f"http://127.0.0.1:{p}/metrics" for p in (20041, 20042, 20043,
                                                                                          20044)]
    assert c.monitor_textfile("a100-nvb") == c.root / "metrics" / "a100-nvb.prom"
    with pytest.raises(KeyError):
        c.monitor_port("no-such-node")


def test_up_names_a_monitor_port_already_in_use(tmp_path, monkeypatch):
    monkeypatch.setattr(DevCluster, "_prepare", lambda self, files: pytest.fail("up went on to start"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        if port - 41 < 1024:
            pytest.skip("the kernel gave a port too low to serve as a monitor port")
        c = DevCluster.default(tmp_path / "c", port - 41)
        with pytest.raises(ClusterError, match=rf"port {port} \(monitor of node h100-nvs\) is already in use"):
            c.check_settings()


def test_env_exports_slurm_conf_and_the_fake_gpu_app(tmp_path, capsys):
    assert main(["env", "--dir", str(tmp_path / "c")]) == 0
    assert capsys.readouterr().out == (f"export SLURM_CONF={tmp_path}/c/etc/slurm.conf\n"
                                       f"export GPUSHARE_FAKE_GPU_APP={tmp_path}/c/bin/fake-gpu-app\n")


def test_install_lib_copies_the_package_world_readable_without_caches(tmp_path):
    c = DevCluster.default(tmp_path / "c", 20000)
    stale = c.lib_dir / "slurm_gpushare" / "gone.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("# a module the package no longer has\n")
    c.install_lib()
    lib = c.lib_dir / "slurm_gpushare"
    dev = c.lib_dir / "slurm_gpushare_dev"
    assert (dev / "fakeapp.py").read_text() == (Path(__file__).parent.parent / "slurm_gpushare_dev" / "fakeapp.py"
                                                ).read_text()
    assert (lib / "data" / "machines" / DEFAULT_NODES["a100-nvb"]).is_file()
    assert not stale.exists()
    for tree in (lib, dev):
        assert not [p for p in tree.rglob("*") if "__pycache__" in p.parts or p.suffix == ".pyc"]
        assert all(p.stat().st_mode & 0o777 == (0o755 if p.is_dir() else 0o644) for p in [tree, *tree.rglob("*")])


def test_the_lib_copy_reads_a_running_jobs_gres_index_list_as_a_user_does(tmp_path):
    """A user's ``jobstats`` of a running job (tests/test_dbd_slurm.py runs it from ``lib/``) reads the job's
    record from slurmctld, whose ``IDX:0-1`` lists need ClusterShell: the copy carries it (it was missing,
    and jobstats failed with ModuleNotFoundError before saying whose job it was)."""
    c = DevCluster.default(tmp_path / "c", 20000)
    c.install_lib()
    code = ("from slurm_gpushare.slurm.hostlist import parse_id_list; import ClusterShell; "
            "print(list(parse_id_list('0-1')), ClusterShell.__file__)")
    out = subprocess.run([job_python(), "-s", "-c", code], env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(c.lib_dir)},
                         cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("[0, 1] " + str(c.lib_dir)), out.stdout


def test_fake_gpu_app_registers_on_the_jobs_gpus_from_the_lib_copy(tmp_path):
    c = DevCluster(tmp_path / "c", 20000, {"n1": packaged_machine("8x-a100-nv12-bridge.json")})
    _write_rendered(c)
    c.install_lib()
    table = c.fake_gpu_table("n1")
    table.mkdir(parents=True)
    text = c.render()["bin/fake-gpu-app"]
    assert text.splitlines()[-1] == f'exec {job_python()} -s -m slurm_gpushare_dev.fakeapp "$@"'
    os.chmod(c.fake_gpu_app, 0o755)
    # as in a job: slurmd sets SLURMD_NODENAME and CUDA_VISIBLE_DEVICES; nothing of the project's venv
    env = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "n1", "CUDA_VISIBLE_DEVICES": "3"}
    app = subprocess.Popen([str(c.fake_gpu_app), "--mem", "3G", "--sm", "30", "--seconds", "30"], env=env,
                           cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        with FakeNvml(Machine.load(c.root / "machines" / "n1.json"), process_table=table) as nvml:
            wait_until(lambda: nvml.processes(3) or app.poll() is not None, "the app in the fake GPU table")
            got = [(p.pid, p.used_memory_mib, p.sm_util) for p in nvml.processes(3)]
            assert got == [(app.pid, 3072, 30.0)], \
                app.stderr.read() if app.poll() is not None else "not registered in time"
            assert nvml.processes(2) == ()
    finally:
        app.terminate()
        app.wait(DEADLINE)
    assert not list(table.glob("*.json")), "the app left its table entry behind"


def test_fake_gpu_app_outside_a_job_says_so(tmp_path):
    c = DevCluster(tmp_path / "c", 20000, {"n1": packaged_machine("8x-a100-nv12-bridge.json")})
    _write_rendered(c)
    os.chmod(c.fake_gpu_app, 0o755)
    proc = subprocess.run([str(c.fake_gpu_app), "--mem", "1G"], env={"PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True)
    assert proc.returncode == 64
    assert proc.stderr.startswith("fake-gpu-app: error: not in a job on a simulated node")


def test_a_monitor_that_dies_at_start_is_a_cluster_error_with_its_log(tmp_path):
    c = DevCluster(_world_readable_dir("gpushare-dc-") / "c", 21000, {"n1": packaged_machine("8x-rtx4090-pcie.json")})
    try:
        _write_rendered(c)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))  # bound, never listening: the monitor cannot have the port
            c.port_base = s.getsockname()[1] - 41
            _write_rendered(c)
            with pytest.raises(ClusterError) as e:
                c.start_monitors(timeout=DEADLINE)  # it dies first: the wait ends then
        text = str(e.value)
        assert text.startswith(f"monitor-n1 died while waiting for its metrics at {c.monitor_url('n1')}; "
                               f"{c.root}/log/monitor-n1.log says:"), text
        assert f"cannot listen on 127.0.0.1:{c.port_base + 41}" in text
        assert not c.pidfile("monitor-n1").exists() and _processes_of(c) == []
    finally:
        shutil.rmtree(c.root.parent)


def _job_user() -> str:
    """An unprivileged user to submit as (a job's user cannot reach root's venv or home)."""
    try:
        return pwd.getpwnam("nobody").pw_name
    except KeyError:
        return "root"


def _spool_records(c: DevCluster, job_id: str) -> list[dict]:
    return [r for r in spooled_records(c.accounting_spool) if r.get("job_id") == job_id]


@pytest.mark.slurm
def _metrics(url: str) -> str:
    return urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=DEADLINE).read().decode()


@pytest.mark.slurm
def test_an_unprivileged_jobs_fake_gpu_use_reaches_the_monitor_and_the_accounting(cluster, slurm):
    assert all(cluster.alive(f"monitor-{n}") for n in cluster.nodes)
    assert all(stat.S_IMODE(cluster.fake_gpu_table(n).stat().st_mode) == 0o1777 for n in cluster.nodes)
    user = _job_user()
    out_dir = cluster.root / "test-output" / "any-user"
    out_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(out_dir, 0o1777)
    out = out_dir / f"job-{time.monotonic_ns()}.out"
    # the app runs until the test has seen it in the monitor's metrics (the file ``go`` appears), then ends on
    # SIGTERM as it would at a job's end (exit 143, its own handler)
    go = out_dir / f"go-{time.monotonic_ns()}"
    proc = slurm.run(["runuser", "-u", user, "--", "sbatch", "--parsable", "-D", str(out_dir), f"--output={out}",
                      "-w", "a100-nvb", "--gres=gpu:1", "--wrap",
                      f"{cluster.fake_gpu_app} --mem 6G --sm 40 --seconds 600 & app=$!; "
                      f"until [ -e {go} ]; do sleep 0.2; done; kill $app; wait $app; echo app exited $?"])
    job = proc.stdout.strip().split(";")[0]
    slurm.submitted.append(job)
    metrics = ""

    def used() -> float | None:
        nonlocal metrics
        metrics = _metrics(cluster.monitor_url("a100-nvb"))
        found = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                 if line.startswith("gpushare_job_gpu_memory_used_bytes{") and f'hpc_job="{job}"' in line]
        return found[0] if found else None

    wait_until(lambda: used() == 6 * GIB, f"job {job}'s 6 GiB in the monitor's metrics", describe=lambda: metrics)
    assert f'user="{user}"' in metrics
    # the node's own table only: GPU 0 of another node shows nothing of it
    other = _metrics(cluster.monitor_url("h100-nvs"))
    gpu0 = [line for line in other.splitlines() if line.startswith("gpushare_gpu_memory_used_bytes{")
            and 'gpu="0"' in line]
    assert len(gpu0) == 1 and gpu0[0].endswith(" 0.0"), other
    go.touch()
    done = slurm.wait(Job(job, output_path=out))
    assert done.state == "COMPLETED", (done.fields, done.output())
    assert "app exited 143" in done.output()
    [rec] = wait_until(lambda: _spool_records(cluster, job), f"the accounting record of job {job}")
    assert (rec["user"], rec["node"], rec["mem_peak_mib"]) == (user, "a100-nvb", 6144), rec


@pytest.mark.slurm
def test_up_restarts_a_stopped_monitor_while_jobs_run(cluster, slurm):
    # found in a trial: up waited for every node to be IDLE, so it timed out while a job ran, and then
    # stopped the monitor it had just started
    job = slurm.sbatch("-p", "pcie", "--gres=gpu:1", wrap="sleep 600")
    slurm.wait(job, states={"RUNNING"})
    _stop_pid(cluster.pid("monitor-rtx4090-pcie"))
    assert not cluster.alive("monitor-rtx4090-pcie")
    cluster.up(out=DEVNULL)  # waiting for IDLE it would time out: the job runs for 10 minutes
    assert cluster.alive("monitor-rtx4090-pcie")
    assert slurm.show_job(job.id)["JobState"] == "RUNNING"


def test_exec_on_a_directory_without_a_cluster_says_so(tmp_path, capsys):
    # (env prints the exports of a cluster still to come: its paths follow from the directory alone)
    argv = ["exec", "--dir", str(tmp_path / "none"), "--", "sinfo"]
    assert main(argv) == 5
    err = capsys.readouterr().err
    assert f"no dev cluster in {tmp_path / 'none'}" in err and "scripts/dev-cluster up --dir" in err


@pytest.mark.parametrize("action", ["status", "env", "down"])
def test_slurm_option_naming_another_release_than_the_clusters_is_refused(tmp_path, capsys, action):
    (tmp_path / "cluster.json").write_text(json.dumps({"slurm": "24.11", "port_base": 20100, "nodes": []}))
    assert main([action, "--dir", str(tmp_path), "--slurm", "26.05"]) == 5
    err = capsys.readouterr().err
    assert f"the dev cluster in {tmp_path} runs Slurm 24.11, not 26.05" in err and "drop --slurm" in err


def test_up_of_another_release_on_a_running_cluster_names_both_releases(cluster, capsys):
    other = next(r for r in ("22.05", "24.11", "26.05") if r != cluster.slurm_release)
    assert main(["up", "--dir", str(cluster.root), "--port-base", str(cluster.port_base), "--slurm", other]) == 5
    err = capsys.readouterr().err
    assert f"runs Slurm {cluster.slurm_release} (its cluster.json); this 'up' is for Slurm {other}" in err
    assert f"scripts/dev-cluster down --dir {cluster.root}" in err


def test_down_command_names_the_directory_unless_it_is_the_default(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUSHARE_DEV_DIR", raising=False)
    assert DevCluster.default(DEFAULT_DIR).down_command == "scripts/dev-cluster down"
    assert DevCluster.default(tmp_path).down_command == f"scripts/dev-cluster down --dir {tmp_path}"


def test_a_directory_of_another_release_starts_its_slurm_state_afresh(tmp_path):
    # 26.05's slurmctld dies on 22.05's saved state ("Can not recover assoc_usage state, incompatible version")
    c = DevCluster.default(tmp_path / "c", 20000)
    for sub in ("spool/ctld", "spool/d-h100-nvs", "spool/gpushare-accounting", "db/data/mysql", "demo"):
        (c.root / sub).mkdir(parents=True)
        (c.root / sub / "state").write_text("x")
    (c.root / "spool/slurm-release").write_text("21.08\n")
    out = io.StringIO()
    c._forget_state_of_another_release(out)
    assert not (c.root / "spool/ctld").exists() and not (c.root / "spool/d-h100-nvs").exists()
    assert not (c.root / "db/data").exists()
    assert not (c.root / "spool/gpushare-accounting").exists()  # its records name job ids the new state reuses
    assert not (c.root / "demo").exists()  # and so does the demo's accounting database
    assert "was last up with Slurm 21.08: its Slurm state" in out.getvalue()
    assert (c.root / "spool/slurm-release").read_text() == f"{c.slurm_release}\n"
    # the same release: nothing goes
    (c.root / "spool/ctld").mkdir()
    c._forget_state_of_another_release(out)
    assert (c.root / "spool/ctld").is_dir()
    # state without the marker (an older dev cluster, of any release) starts afresh too
    (c.root / "spool/slurm-release").unlink()
    c._forget_state_of_another_release(out)
    assert not (c.root / "spool/ctld").exists() and "last up with a Slurm release it did not record" in out.getvalue()
    # a new directory: nothing to forget, the marker is written
    fresh = DevCluster.default(tmp_path / "fresh", 20000)
    fresh._forget_state_of_another_release(out)
    assert (fresh.root / "spool/slurm-release").read_text() == f"{fresh.slurm_release}\n"
