"""The node monitor without Slurm: recorded `scontrol -d show job` text, the fake NVML with processes that
change over time, cgroup and `scontrol listpids` texts. Metrics are scraped over HTTP and parsed as
Prometheus text format."""

from __future__ import annotations

import json
import signal
import socket
import threading
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurm_gpushare.accounting.live import load_usage, save_usage, usage_path
from slurm_gpushare.accounting.record import UsageTracker
from slurm_gpushare.errors import SlurmError
from slurm_gpushare.hardware.fake import FakeNvml, ScheduledProcess
from slurm_gpushare.node.config import NodeConfig, parse_listen
from slurm_gpushare.node.membership import ProcFacts, job_of_cgroup, parse_listpids
from slurm_gpushare.node.metrics import metrics_text, serve
from slurm_gpushare.node.monitor import Monitor
from slurm_gpushare_dev.cluster import packaged_machine
from tests.conftest import DEADLINE, wait_until
from tests.jobjson import as_job_json

GIB = 1 << 30
MIB = 1 << 20

SHOW = """\
JobId={job} JobName=train
   UserId={user}({uid}) GroupId={user}({uid}) MCS_label=N/A
   Priority=1 Nice=0 Account={account} QOS=normal
   JobState=RUNNING Reason=None Dependency=(null)
   StartTime=2026-11-29T10:00:00 EndTime=Unknown Deadline=N/A
   Partition=gpu AllocNode:Sid=localhost:1
   NodeList=a100
   JOB_GRES={gres}
     Nodes=a100 CPU_IDs=0 Mem=100 GRES={detail}
   AdminComment={ac}
   TresPerNode=gres:{gres}
"""

# Slurm's task/cgroup (v1, several slurmd on one host) and `scontrol listpids '*' a100` as recorded
CGROUP = "12:pids:/\n5:devices:/slurm_a100/uid_1000/job_{job}/step_0/task_0\n1:name=systemd:/\n"
LISTPIDS = ("PID      JOBID    STEPID   LOCALID GLOBALID\n"
            "1002     201      0        1       1       \n"
            "2001     202      batch    0       0       \n"
            "2002     202      batch    -       -       \n"
            "3003     203      batch    0       0       \n")


class Clock:
    def __init__(self):
        self.t = 2_000_000_000.0

    def __call__(self):
        return self.t


class Node:
    """One simulated node: the 8x A100 machine, its fake NVML on a fake clock, three jobs."""

    def __init__(self, tmp_path: Path):
        self.clock = Clock()
        self.machine = packaged_machine("8x-a100-nv12-bridge.json")
        self.nvml = FakeNvml(self.machine, clock=self.clock)
        self.config = NodeConfig(run_dir=str(tmp_path / "run"))
        self.running = {"201", "202", "203"}
        self.jobs = {
            # alice: a 10G MPS share on GPU 0, two processes of 6000 MiB each (each under the per-client limit)
            "201": SHOW.format(job="201", user="alice", uid=1000, account="physics", gres="shard:10",
                               detail="shard:10(IDX:0)",
                               ac="[gpushare:v1 req=mem=10G grant=gres:shard:10 kind=mps mem=10240/10240MiB]"),
            # bob: a whole GPU (index 3), one process whose memory grows, a child without GPU use
            "202": SHOW.format(job="202", user="bob", uid=1001, account="chem", gres="gpu:a100:1",
                               detail="gpu:a100:1(IDX:3)", ac=""),
            # bob: a whole GPU (index 4) that runs nothing on it
            "203": SHOW.format(job="203", user="bob", uid=1001, account="chem", gres="gpu:a100:1",
                               detail="gpu:a100:1(IDX:4)", ac=""),
        }
        now = self.clock.t
        self.nvml.add_process(ScheduledProcess(1001, 0, now, ((0, 6000, 20),)))
        self.nvml.add_process(ScheduledProcess(1002, 0, now, ((0, 6000, 25),)))
        self.nvml.add_process(ScheduledProcess(2001, 3, now, ((0, 2000, 30), (10, 9000, 80), (20, 4000, 40))))
        self.nvml.add_process(ScheduledProcess(3001, 5, now, ((0, 700, 5),)))  # nobody's
        self.cgroups = {1001: CGROUP.format(job=201)}
        self.uids = {1001: 1000, 1002: 1000, 2001: 1001, 2002: 1001, 3001: 1002, 3003: 1001}  # /proc: real uids
        self.cgroup_owners: dict[str, int] = {}  # job cgroup path -> owner (default root)
        self.stepd_jobs: set[str] | None = {"201", "202", "203"}  # jobs with slurmstepds on the node
        self.listpids_calls = 0
        self.squeue_calls = 0
        self.log: list[str] = []
        self.killed: list[tuple[int, int]] = []  # (pid, signal): the fake pids are never signalled for real
        self.requeued: list[str] = []
        self.requeue_fails = False
        self.admin_comments: dict[str, str] = {}

    def requeue(self, job):
        if self.requeue_fails:
            raise SlurmError("scontrol requeue: Requested operation is presently disabled")
        self.requeued.append(job)

    def listpids(self, node):
        assert node == "a100"
        self.listpids_calls += 1
        if self.stepd_jobs is None:
            raise SlurmError("scontrol listpids * a100 exited 1: slurmstepd socket unreachable")
        return "".join(line + "\n" for line in LISTPIDS.splitlines()
                       if line.startswith("PID") or line.split()[1] in self.stepd_jobs)

    def running_jobs(self, node):
        self.squeue_calls += 1
        if self.running is None:
            raise SlurmError("squeue -h -w a100 exited 1: slurm_load_jobs error: Unable to contact slurm controller")
        return sorted(self.running)

    def monitor(self, cgroup_fs=None) -> Monitor:
        return Monitor(self.config, "a100", self.machine, self.nvml, running_jobs=self.running_jobs,
                       job_record=lambda j: as_job_json(self.jobs[j], j), listpids=self.listpids,
                       cgroup_of=lambda pid: self.cgroups.get(pid, "0::/\n"),
                       cgroup_owner=lambda cg: self.cgroup_owners.get(cg.path, 0),
                       proc_of=lambda pid: ProcFacts(self.uids[pid], 7) if pid in self.uids else None,
                       log=self.log.append, clock=self.clock, requeue=self.requeue,
                       kill=lambda pid, sig: self.killed.append((pid, sig)),
                       update_admin_comment=self.admin_comments.__setitem__, cgroup_fs=cgroup_fs)


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


def _families(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def _value(fams, name, **labels):
    hits = [s.value for s in fams[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (name, labels, fams.get(name))
    return hits[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cgroup_and_listpids_parsing():
    assert job_of_cgroup(CGROUP.format(job=42)) == "42"
    assert job_of_cgroup("0::/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0\n") == "77"
    assert job_of_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None
    assert job_of_cgroup("4:memory:/job_scheduler/x\n") is None  # not Slurm's job_<digits>/ layout
    assert parse_listpids(LISTPIDS) == {1002: "201", 2001: "202", 2002: "202", 3003: "203"}
    assert parse_listpids('"1.batch" does not look like a stepid\n') == {}


def test_samples_attribute_processes_and_keep_peaks(node):
    with node.monitor() as mon:
        snap = mon.sample()
        node.clock.t += 12
        mon.sample()
        node.clock.t += 12
        mon.sample()
        by = {(d.job_id, d.key): d for d in mon.snapshot.devices}
        assert set(by) == {("201", 0), ("202", 3), ("203", 4)}
        assert (by[("201", 0)].used_mib, by[("201", 0)].processes, by[("201", 0)].sm_percent) == (12000, 2, 45.0)
        assert (by[("202", 3)].used_mib, by[("202", 3)].sm_percent) == (4000, 40.0)
        assert (by[("203", 4)].used_mib, by[("203", 4)].processes) == (0, 0)
        usage = mon.tracker.usage("202")[3]
        assert (usage.peak_mib, usage.sm_peak, usage.samples) == (9000, 80.0, 3)
        assert usage.sm_mean == pytest.approx((30 + 80 + 40) / 3)
        # a whole GPU that runs nothing: used 0, and the GPU's own utilization (0 %), not "no data"
        idle = mon.tracker.usage("203")[4]
        assert (idle.peak_mib, idle.sm_mean) == (0, 0.0)
        gpu5 = next(g for g in snap.gpus if g.index == 5)
        assert (gpu5.unattributed_mib, gpu5.unattributed_processes) == (700, 1)
        # one listpids call per sample (the local slurmstepds), one squeue for the three samples
        assert (node.listpids_calls, node.squeue_calls) == (3, 1)
        # the Epilog's file holds the same peaks
        assert load_usage(node.config.run_dir, "202")[3].peak_mib == 9000


def test_over_limit_fires_for_two_processes_that_together_exceed_the_share(node):
    with node.monitor() as mon:
        mon.sample()
        assert _value(_families(_scrape_once(mon)), "gpushare_job_gpu_over_limit", hpc_job="201", gpu="0") == 1
        assert [line for line in node.log if "over limit" in line] == [
            "over limit: job 201 (alice) holds 12000 MiB on GPU 0, its share is 10240 MiB (2 process(es))"]
        mon.sample()  # still over: logged once per episode
        assert len([line for line in node.log if "over limit" in line]) == 1
        node.nvml.remove_process(1002)
        mon.sample()
        fams = _families(_scrape_once(mon))
        assert _value(fams, "gpushare_job_gpu_over_limit", hpc_job="201") == 0
        assert _value(fams, "gpushare_monitor_over_limit_episodes_total") == 1


def test_a_share_over_its_limit_for_the_grace_has_its_processes_there_killed(node):
    """Issue 27 (b): the MPS limit is per client process, so job 201's two processes of 6000 MiB each pin 12000
    MiB of its 10240 MiB share. After enforce_grace samples (3) the monitor kills those two processes, as root,
    and only those (bob's jobs on other GPUs are not touched), tells alice in the AdminComment, logs and counts."""
    with node.monitor() as mon:
        mon.sample()
        mon.sample()
        assert node.killed == []  # within the grace: not one blip
        mon.sample()
        assert node.killed == [(1001, signal.SIGKILL), (1002, signal.SIGKILL)]
        note = node.admin_comments["201"]
        assert note.startswith("[gpushare:v1 req=mem=10G ") and "gpushare: GPU 0 of a100: its 2 process(es) there " \
            "held 12000 MiB together, its share is 10240 MiB; the monitor killed 2 of its process(es) there " \
            "(pid 1001, 1002)." in note, note
        assert [line for line in node.log if line.startswith("enforce: ")] == [
            "enforce: job 201 (alice, partition gpu) on GPU 0 of a100: its 2 process(es) there held 12000 MiB "
            "together, its share is 10240 MiB: killed 2 of its process(es) there (pid 1001, 1002)"]
        mon.sample()  # the same episode (the fake processes outlive SIGKILL): acted on once
        assert len(node.killed) == 2
        assert _value(_families(_scrape_once(mon)), "gpushare_monitor_enforcements_total", action="kill") == 1
        # the episode ends; a new one is acted on again after its own grace
        node.nvml.remove_process(1002)
        mon.sample()
        node.cgroups[1003], node.uids[1003] = CGROUP.format(job=201), 1000
        node.nvml.add_process(ScheduledProcess(1003, 0, node.clock.t, ((0, 6000, 25),)))
        for _ in range(3):
            mon.sample()
        assert node.killed[2:] == [(1001, signal.SIGKILL), (1003, signal.SIGKILL)] and node.requeued == []


def test_enforcement_follows_the_partition_s_action_and_spares_a_reused_pid(node):
    from dataclasses import replace

    node.config = replace(node.config, enforce="requeue", enforce_partitions=(("gpu", "warn"),), enforce_grace=1)
    with node.monitor() as mon:
        mon.sample()  # job 201 runs in partition gpu: warned only
        assert node.killed == [] and node.requeued == []
        assert "the monitor warned (node.toml enforce = \"warn\")." in node.admin_comments["201"]
        assert _value(_families(_scrape_once(mon)), "gpushare_monitor_enforcements_total", action="warn") == 1
    node.config = replace(node.config, enforce_partitions=())
    with node.monitor() as mon:
        mon.sample()  # requeued; a job that cannot be requeued is killed instead
        assert node.requeued == ["201"] and node.killed == []
    node.requeue_fails = True
    node.config = replace(node.config, enforce_grace=2)
    with node.monitor() as mon:
        act = mon.enforce

        def pid_reused(e):  # pid 1002 ends and the kernel gives it to another process (another start) first
            mon._proc_of = lambda pid: ProcFacts(node.uids[pid], 8 if pid == 1002 else 7)
            act(e)

        mon.enforce = pid_reused
        mon.sample()
        mon.sample()
        assert node.killed == [(1001, signal.SIGKILL)]


def _scrape_once(mon) -> str:
    return metrics_text(mon)


def test_the_endpoint_is_prometheus_text_with_job_labels(node):
    port = _free_port()
    stop = threading.Event()
    with node.monitor() as mon:
        t = threading.Thread(target=serve, args=(mon,), kwargs=dict(
            interval_s=0.1, listen=f"127.0.0.1:{port}", textfile=None, stop=stop.is_set), daemon=True)
        t.start()

        def scraped() -> tuple[str, str] | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=DEADLINE) as r:
                    body, kind = r.read().decode(), r.headers["Content-Type"]
            except OSError:
                return None
            return (body, kind) if "gpushare_job_gpu_memory_used_bytes{" in body else None

        text, ctype = wait_until(scraped, "the monitor serving the job's metrics")
        stop.set()
        t.join(DEADLINE)
    assert ctype.startswith("text/plain")
    fams = _families(text)
    labels = dict(Hostname="a100", hpc_job="201", user="alice", account="physics", partition="gpu", gpu="0",
                  mode="mps", share="shard:10")
    assert _value(fams, "gpushare_job_gpu_memory_used_bytes", **labels) == 12000 * MIB
    assert _value(fams, "gpushare_job_gpu_memory_reserved_bytes", **labels) == 10 * GIB
    assert _value(fams, "gpushare_job_gpu_memory_requested_bytes", **labels) == 10 * GIB
    assert _value(fams, "gpushare_job_gpu_over_limit", **labels) == 1
    assert _value(fams, "gpushare_job_gpu_processes", **labels) == 2
    assert _value(fams, "gpushare_job_gpu_sm_utilization_ratio", **labels) == pytest.approx(0.45)
    whole = dict(hpc_job="202", user="bob", account="chem", gpu="3", mode="gpu", share="")
    assert _value(fams, "gpushare_job_gpu_memory_reserved_bytes", **whole) == 81920 * MIB
    assert _value(fams, "gpushare_job_gpu_memory_peak_bytes", **whole) == 2000 * MIB
    assert not [s for s in fams["gpushare_job_gpu_memory_requested_bytes"] if s.labels["hpc_job"] == "202"]
    assert _value(fams, "gpushare_gpu_unattributed_memory_bytes", gpu="5") == 700 * MIB
    assert _value(fams, "gpushare_gpu_memory_total_bytes", gpu="0") == 81920 * MIB
    assert _value(fams, "gpushare_monitor_samples_total") >= 1
    assert _value(fams, "gpushare_monitor_errors_total", kind="nvml") == 0
    # the UUID label is the GPU's NVML UUID
    with FakeNvml(node.machine) as nvml:
        uuid3 = nvml.uuid(3)
    assert _value(fams, "gpushare_job_gpu_memory_used_bytes", hpc_job="202", UUID=uuid3) == 2000 * MIB


def test_every_fact_has_one_label_named_as_dcgm_exporter_names_it(node):
    """docs/monitoring.md: gpu, UUID, pci_bus_id, device, modelName, Hostname (NVIDIA's dcgm-exporter's GPU
    labels) and hpc_job (its HPC job mapping's), then the product's user, account, partition, mode, share; no
    fact under two names (the monitor had node/Hostname, job_id/jobid, uuid/UUID and model/modelName)."""
    with node.monitor() as mon:
        mon.sample()
        fams = _families(_scrape_once(mon))
        gpu0 = node.machine.gpu(0)
        uuid0 = mon.machine.gpu(0).uuid
    device = {k: v for k, v in dict(gpu="0", UUID=uuid0, pci_bus_id=gpu0.pci_bus_id, device=f"nvidia{gpu0.minor}",
                                    modelName=gpu0.name, Hostname="a100").items() if v}  # a description may lack one
    assert {"gpu", "UUID", "device", "modelName", "Hostname"} <= set(device)
    want = dict(device, hpc_job="201", user="alice", account="physics", partition="gpu", mode="mps",
                share="shard:10")
    for name in ("gpushare_job_gpu_memory_used_bytes", "gpushare_job_gpu_memory_peak_bytes",
                 "gpushare_job_gpu_memory_reserved_bytes", "gpushare_job_gpu_memory_requested_bytes",
                 "gpushare_job_gpu_sm_utilization_ratio", "gpushare_job_gpu_processes", "gpushare_job_gpu_over_limit"):
        (sample,) = [s for s in fams[name] if s.labels["hpc_job"] == "201"]
        # off MIG, GPU_I_PROFILE and GPU_I_ID are empty: no label once Prometheus stores the series
        assert {k: v for k, v in sample.labels.items() if v} == want, name
    for name in ("gpushare_gpu_memory_total_bytes", "gpushare_gpu_memory_used_bytes",
                 "gpushare_gpu_unattributed_memory_bytes"):
        (gpu_sample,) = [s for s in fams[name] if s.labels["gpu"] == "0"]
        assert {k: v for k, v in gpu_sample.labels.items() if v} == device, name
    for name in ("gpushare_monitor_samples_total", "gpushare_monitor_last_sample_timestamp_seconds"):
        assert [s.labels for s in fams[name]] == [{"Hostname": "a100"}], name


def test_textfile_for_node_exporter(node, tmp_path):
    out = tmp_path / "textfile" / "gpushare.prom"
    with node.monitor() as mon:
        serve(mon, interval_s=1, listen=None, textfile=str(out), once=True)
    fams = _families(out.read_text())
    assert _value(fams, "gpushare_job_gpu_memory_used_bytes", hpc_job="203") == 0
    assert not list(out.parent.glob("*.tmp*"))  # written through a temporary file and a rename


def test_mig_devices_are_keyed_by_uuid_and_have_no_sm_data(tmp_path):
    machine = packaged_machine("4x-h100-mig-mixed.json")
    clock = Clock()
    nvml = FakeNvml(machine, clock=clock)
    with nvml:
        inst = next(i for i in nvml.gpu_instances(2) if i.profile == "1g.10gb")
    # slurmd numbers gpu records grouped by type: index 4 is the first 1g.10gb slice
    show = SHOW.format(job="301", user="carol", uid=1002, account="bio", gres="gpu:h100_1g.10gb:1",
                       detail="gpu:h100_1g.10gb:1(IDX:4)", ac="").replace("a100", "mig")
    nvml.add_process(ScheduledProcess(4001, 2, clock.t, ((0, 3000, 50),), gi_id=inst.gi_id))
    mon = Monitor(NodeConfig(run_dir=str(tmp_path / "run")), "mig", machine, nvml, running_jobs=lambda n: ["301"],
                  job_record=lambda j: as_job_json(show, j), listpids=lambda n: "PID JOBID\n4001 301 0 0 0\n",
                  cgroup_of=lambda pid: "", proc_of=lambda pid: ProcFacts(1002, 1), log=lambda line: None,
                  clock=clock)
    with mon:
        mon.sample()
        (d,) = mon.snapshot.devices
        assert (d.key, d.used_mib, d.sm_percent) == (inst.uuid, 3000, None)
        fams = _families(_scrape_once(mon))
    assert _value(fams, "gpushare_job_gpu_memory_reserved_bytes", hpc_job="301", mode="mig", share="1g.10gb",
                  GPU_I_ID=str(inst.gi_id)) > 0
    # as dcgm-exporter labels a MIG device: the parent GPU's UUID and index, the profile and the GPU instance
    with nvml:
        parent = nvml.uuid(2)
    assert _value(fams, "gpushare_job_gpu_memory_used_bytes", hpc_job="301", gpu="2", UUID=parent,
                  GPU_I_PROFILE="1g.10gb", GPU_I_ID=str(inst.gi_id)) == 3000 * MIB
    assert not [s for s in fams.get("gpushare_job_gpu_sm_utilization_ratio", []) if s.labels["hpc_job"] == "301"]
    assert not fams.get("gpushare_gpu_utilization_ratio") or all(
        s.labels["gpu"] not in ("2", "3") for s in fams["gpushare_gpu_utilization_ratio"])
    # the MIG layout: one info series per MIG device of the node, each with its GPU, profile and instance
    with nvml:
        layout = sorted((str(g), i.profile, str(i.gi_id)) for g in range(len(machine.gpus))
                        for i in nvml.gpu_instances(g))
    assert layout and sorted((s.labels["gpu"], s.labels["GPU_I_PROFILE"], s.labels["GPU_I_ID"])
                             for s in fams["gpushare_mig_device_info"]) == layout
    assert {s.value for s in fams["gpushare_mig_device_info"]} == {1}


def test_a_restarted_monitor_keeps_its_peaks(node):
    with node.monitor() as mon:
        node.clock.t += 12
        mon.sample()  # bob's job 202 at 9000 MiB
    node.clock.t += 12  # now 4000 MiB
    with node.monitor() as again:
        assert any("took back the usage of job(s) 201, 202, 203" in line for line in node.log)
        again.sample()
        assert again.tracker.usage("202")[3].peak_mib == 9000
        assert again.tracker.usage("202")[3].series_mib == (9000, 4000)  # the series goes on, too


def test_slurmctld_is_asked_once_per_jobs_interval_not_every_sample(node):
    with node.monitor() as mon:
        for _ in range(5):
            mon.sample()
            node.clock.t += 10
        assert (node.squeue_calls, node.listpids_calls) == (1, 5)  # listpids asks the local slurmstepds
        node.clock.t += 20
        mon.sample()
        assert node.squeue_calls == 2  # monitor_jobs_interval (60 s) has passed


def test_a_job_whose_steps_ended_leaves_the_metrics_and_its_file_waits_for_the_epilog(node):
    with node.monitor() as mon:
        node.clock.t += 12
        mon.sample()
        node.stepd_jobs = {"201", "203"}  # 202's steps have ended; its Epilog runs (squeue: COMPLETING)
        mon.sample()
        assert "202" in mon.tracker.jobs()  # no cgroup here: the next listpids tells (monitor_steps_interval)
        node.clock.t += 10
        mon.sample()
        assert "202" not in {d.job_id for d in mon.snapshot.devices} and "202" not in mon.tracker.jobs()
        assert usage_path(node.config.run_dir, "202").exists()  # the Epilog reads it
        node.running = {"201", "203"}  # the Epilog is done: squeue no longer lists 202
        node.clock.t += 61
        mon.sample()
        assert not usage_path(node.config.run_dir, "202").exists()
        assert usage_path(node.config.run_dir, "201").exists()


def test_a_job_between_steps_comes_back_with_its_peaks(node):
    with node.monitor() as mon:
        node.clock.t += 12
        mon.sample()  # 9000 MiB
        node.stepd_jobs = {"201", "203"}  # e.g. an salloc between two sruns: no slurmstepd of 202
        mon.sample()
        node.stepd_jobs = {"201", "202", "203"}
        node.clock.t += 12
        mon.sample()  # now 4000 MiB
        assert mon.tracker.usage("202")[3].peak_mib == 9000


def test_a_job_without_steps_is_found_by_squeue(node):
    node.stepd_jobs = {"201"}
    with node.monitor() as mon:
        mon.sample()
        assert {d.job_id for d in mon.snapshot.devices} == {"201", "202", "203"}


def test_slurmctld_down_loses_nothing(node):
    with node.monitor() as mon:
        mon.sample()
        node.running = None
        node.clock.t += 61
        mon.sample()  # squeue fails: jobs are kept and still sampled
        assert mon.tracker.usage("202")[3].samples == 2
        assert mon.errors_total["slurm"] == 1 and any("Unable to contact" in line for line in node.log)


def test_without_listpids_squeue_is_asked_at_every_listpids(node):
    node.stepd_jobs = None
    with node.monitor() as mon:
        mon.sample()
        mon.sample()  # within monitor_steps_interval and the lookup gap: neither is asked again
        assert (node.listpids_calls, node.squeue_calls) == (1, 1)
        node.clock.t += 10
        mon.sample()
        assert node.squeue_calls == 2 and mon.errors_total["slurm"] == 2
        # processes outside a job cgroup cannot be attributed: they count as unattributed
        assert {(d.job_id, d.used_mib) for d in mon.snapshot.devices} == {("201", 6000), ("202", 0), ("203", 0)}
        assert next(g for g in mon.snapshot.gpus if g.index == 3).unattributed_mib == 9000  # 2001, 10 s in


def test_nvml_failures_are_counted_not_fatal(node):
    with node.monitor() as mon:
        node.nvml.fail_next("nvmlDeviceGetComputeRunningProcesses", gpu=3)
        mon.sample()
        assert mon.errors_total["nvml"] == 1
        assert {d.job_id for d in mon.snapshot.devices} == {"201", "203"}  # the other GPUs were sampled
        assert mon.tracker.usage("202") == {}  # GPU 3 unread: no sample, not a made-up 0 MiB
        mon.sample()
        assert mon.tracker.usage("202")[3].samples == 1


def test_jobs_without_gpus_here_cost_no_usage_file(node):
    node.jobs["204"] = node.jobs["203"].replace("JobId=203", "JobId=204").replace(
        "   JOB_GRES=gpu:a100:1\n     Nodes=a100 CPU_IDs=0 Mem=100 GRES=gpu:a100:1(IDX:4)\n", "").replace(
        "TresPerNode=gres:gpu:a100:1", "TresPerNode=")
    node.running.add("204")
    with node.monitor() as mon:
        mon.sample()
        assert "204" in mon._jobs and not usage_path(node.config.run_dir, "204").exists()
        assert usage_path(node.config.run_dir, "203").exists()


def test_listen_addresses():
    assert parse_listen(":9817") == ("0.0.0.0", 9817)
    assert parse_listen("127.0.0.1:1") == ("127.0.0.1", 1)
    assert parse_listen("[::1]:9817") == ("::1", 9817)
    from slurm_gpushare.errors import InputError
    for bad in ("", "9817x", ":0", "host:70000"):
        with pytest.raises(InputError, match="no valid port"):
            parse_listen(bad)


def test_usage_file_round_trip(tmp_path):
    t = UsageTracker()
    t.add("5", 0, used_mib=100, sm_percent=10.0)
    t.add("5", "MIG-x", used_mib=7, sm_percent=None)
    save_usage(tmp_path, "5", "n", t)
    got = load_usage(tmp_path, "5")
    assert got == t.usage("5") and got[0].series_mib == (100,)
    # a file of a release without series: read with an empty series
    data = json.loads(usage_path(tmp_path, "5").read_text())
    for row in data["devices"]:
        del row["series_mib"], row["series_width"], row["series_samples"]
    usage_path(tmp_path, "5").write_text(json.dumps(data))
    old = load_usage(tmp_path, "5")
    assert old[0].peak_mib == 100 and old[0].series_mib == ()
    assert load_usage(tmp_path, "6") is None
    usage_path(tmp_path, "5").write_text("{")
    from slurm_gpushare.errors import InputError
    with pytest.raises(InputError, match="5.json"):
        load_usage(tmp_path, "5")
    with pytest.raises(InputError, match="not a Slurm job id"):
        usage_path(tmp_path, "../x")


def test_usage_summary_goes_into_the_admin_comment_of_running_jobs(node):
    from dataclasses import replace
    node.config = replace(node.config, admin_comment_summary=True, admin_comment_interval=60)
    updates: list[tuple[str, str]] = []
    mon = node.monitor()
    mon._update_admin_comment = lambda job, text: updates.append((job, text))
    with mon:
        mon.sample()
        assert mon.push_summaries() == ["201", "202", "203"]
        job, text = updates[0]
        # the request audit stays; the summary follows it
        assert text == ("[gpushare:v1 req=mem=10G grant=gres:shard:10 kind=mps mem=10240/10240MiB] "
                        "[gpushare-usage:v1 node=a100 mode=mps gpus=1 peak=12000/10240MiB sm=45.0/45.0]")
        node.clock.t += 30
        mon.sample()
        assert mon.push_summaries() == []  # not before admin_comment_interval
        node.clock.t += 31
        assert mon.push_summaries() == ["202"]  # only what changed (202's process grew)
    node.config = replace(node.config, admin_comment_summary=False)
    assert node.monitor().push_summaries() == []


def test_an_idle_sample_of_a_share_counts_zero_sm_like_a_whole_gpu(node):
    # bug found in a trial: an MPS share with no process in a sample got "no data" (left out of the mean)
    # while a whole GPU got 0 %, so MPS means (and GPU-hours used) were overstated
    node.nvml.remove_process(1001)
    node.nvml.remove_process(1002)
    with node.monitor() as mon:
        mon.sample()
        node.nvml.add_process(ScheduledProcess(1002, 0, node.clock.t, ((0, 1000, 50),)))
        node.clock.t += 1  # a new process outside any job cgroup: one listpids, at most one a second
        mon.sample()
        share = mon.tracker.usage("201")[0]
        assert (share.sm_mean, share.sm_peak, share.samples) == (25.0, 50.0, 2)


def test_a_bad_entry_of_the_fake_process_table_does_not_kill_the_monitor(node, tmp_path):
    # bug found in a trial: the fake's MachineDescriptionError was not caught, and the daemon exited
    import os
    table = tmp_path / "procs"
    table.mkdir()
    (table / f"{os.getpid()}.json").write_text("garbage")
    node.nvml = FakeNvml(node.machine, clock=node.clock, process_table=table)
    with node.monitor() as mon:
        mon.sample()
        assert mon.errors_total["nvml"] == 16  # processes and memory of 8 GPUs
        assert mon.snapshot.devices == [] and len(mon.snapshot.gpus) == 8  # nothing made up; still running
        (table / f"{os.getpid()}.json").unlink()
        mon.sample()
        assert {d.job_id for d in mon.snapshot.devices} == {"201", "202", "203"}


def test_a_machine_description_that_is_not_this_node_is_refused(node):
    from slurm_gpushare.errors import InputError
    node.machine = packaged_machine("4x-h100-mig-mixed.json")  # 4 GPUs; NVML serves the 8 A100s
    with pytest.raises(InputError, match="4 GPU.*NVML sees 8"):
        node.monitor().open()
    node.machine = packaged_machine("dgx-h100-8gpu-nv18.json")  # 8 GPUs, other memory
    with pytest.raises(InputError, match="GPU 0.*81559 MiB.*NVML.*81920 MiB"):
        node.monitor().open()


def test_stray_files_in_the_usage_directory_are_not_reported_each_sample(node):
    with node.monitor() as mon:
        mon.sample()
        (Path(node.config.run_dir) / "usage" / "notes.json").write_text("{}")
        for _ in range(3):
            node.clock.t += 61  # each sample asks squeue and cleans the usage directory
            mon.sample()
        assert mon.errors_total.get("usage-file", 0) == 0
        assert (Path(node.config.run_dir) / "usage" / "notes.json").exists()  # not ours: left alone


# --- the command line -------------------------------------------------------------------------------


@pytest.fixture
def cli_node(tmp_path, monkeypatch):
    machine = tmp_path / "a100.json"
    machine.write_text(packaged_machine("8x-a100-nv12-bridge.json").to_json())
    (tmp_path / "nvml.json").write_text(machine.read_text())
    config = tmp_path / "node.toml"
    config.write_text(f'version = 1\nrun_dir = "{tmp_path}/run"\nmachine = "{tmp_path}/{{node}}.json"\n')
    monkeypatch.setenv("GPUSHARE_NVML", f"fake:{tmp_path}/nvml.json")
    # Slurm's clients fail at once with an empty configuration ("ClusterName needs to be specified")
    monkeypatch.setenv("SLURM_CONF", "/dev/null")
    return tmp_path, config


def test_once_prints_prometheus_text_and_exits_1_when_something_failed(cli_node):
    from click.testing import CliRunner

    from slurm_gpushare.cli import main
    tmp_path, config = cli_node
    r = CliRunner().invoke(main, ["monitor", "--once", "--config", str(config), "--node", "a100"])
    assert r.exit_code == 1, r.output
    fams = _families(r.stdout)
    assert _value(fams, "gpushare_gpu_memory_total_bytes", gpu="7") == 81920 * MIB
    assert _value(fams, "gpushare_monitor_errors_total", kind="slurm") >= 1
    assert "problem(s) in this sample" in r.stderr and "scontrol listpids" in r.stderr


def test_once_into_an_unwritable_textfile_fails(cli_node):
    from click.testing import CliRunner

    from slurm_gpushare.cli import main
    tmp_path, config = cli_node
    (tmp_path / "file").write_text("")
    r = CliRunner().invoke(main, ["monitor", "--once", "--config", str(config), "--node", "a100",
                                  "--textfile", str(tmp_path / "file" / "x.prom")])
    assert r.exit_code == 1 and "cannot write" in r.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "0", "5000"])
def test_interval_must_be_a_number_of_seconds(cli_node, value):
    from click.testing import CliRunner

    from slurm_gpushare.cli import main
    _, config = cli_node
    r = CliRunner().invoke(main, ["monitor", "--config", str(config), "--interval", value])
    assert r.exit_code == 2 and "--interval" in r.stderr


def test_a_description_of_another_machine_is_a_clear_error(cli_node):
    from click.testing import CliRunner

    from slurm_gpushare.cli import main
    tmp_path, config = cli_node
    (tmp_path / "a100.json").write_text(packaged_machine("4x-h100-mig-mixed.json").to_json())
    r = CliRunner().invoke(main, ["monitor", "--once", "--config", str(config), "--node", "a100"])
    assert r.exit_code != 0 and "has 4 GPU(s); NVML sees" in r.stderr and "Traceback" not in r.output


def test_monitor_errors_say_what_would_work(cli_node, monkeypatch):
    from click.testing import CliRunner

    from slurm_gpushare.cli import main
    tmp_path, config = cli_node
    r = CliRunner().invoke(main, ["monitor", "--once", "--config", str(config), "--node", "nonode"])
    assert r.exit_code != 0 and "slurm-gpushare inventory -o" in r.stderr and "nonode.json" in r.stderr
    monkeypatch.setenv("GPUSHARE_NVML", "nvml")
    from tests.conftest import _nvml_unavailable
    if _nvml_unavailable() is not None:  # no driver here: the hint fits the monitor, not inventory's options
        r = CliRunner().invoke(main, ["monitor", "--once", "--config", str(config), "--node", "a100"])
        assert r.exit_code != 0 and "GPUSHARE_NVML=fake:" in r.stderr and "--from-topo" not in r.stderr


def test_an_address_that_is_not_this_hosts_is_not_called_a_busy_port(node):
    from slurm_gpushare.errors import InputError
    with node.monitor() as mon, pytest.raises(InputError, match="address of this host") as err:
        serve(mon, interval_s=1, listen="192.0.2.1:9817", textfile=None)
    assert "another port" not in str(err.value)


def test_a_bad_listen_address_is_refused_before_nvml_is_opened(cli_node, monkeypatch):
    # found reading the change: --listen 127.0.0.1:99999 on a node without a driver reported NVML, not the port
    from click.testing import CliRunner

    from slurm_gpushare.cli import main
    _, config = cli_node
    monkeypatch.setenv("GPUSHARE_NVML", "bogus")
    r = CliRunner().invoke(main, ["monitor", "--config", str(config), "--listen", "127.0.0.1:99999"])
    assert r.exit_code == 2 and "--listen" in r.stderr and "no valid port" in r.stderr and "NVML" not in r.stderr


def test_the_metrics_endpoint_is_local_unless_configured(tmp_path):
    """/metrics carries user and account labels: by default only this host reaches it."""
    from slurm_gpushare.node.config import load_node_config
    assert parse_listen(NodeConfig().monitor_listen) == ("127.0.0.1", 9817)
    (tmp_path / "node.toml").write_text("version = 1\nspool_dir = '/x'\n")
    assert parse_listen(load_node_config(tmp_path / "node.toml").monitor_listen)[0] == "127.0.0.1"
    (tmp_path / "node.toml").write_text("version = 1\nmonitor_listen = ':9900'\n")
    assert parse_listen(load_node_config(tmp_path / "node.toml").monitor_listen) == ("0.0.0.0", 9900)


# --- membership: cgroups first, Slurm's pid lists once per process, always the process owner's job -------------


def test_a_process_in_another_users_job_cgroup_is_not_charged_to_that_job(node):
    # bob's 2001 sits in alice's job 201 cgroup (22.05: alice may open a child cgroup of her step to others)
    node.cgroups[2001] = CGROUP.format(job=201).replace("task_0", "task_0/open")
    with node.monitor() as mon:
        mon.sample()
        node.clock.t += 1
        mon.sample()
        by = {(d.job_id, d.key): d for d in mon.snapshot.devices}
        assert (by[("201", 0)].used_mib, by[("201", 0)].processes) == (12000, 2)  # alice's two only
        assert ("201", 3) not in by
        # Slurm's pid list places it in bob's own job 202
        assert (by[("202", 3)].used_mib, by[("202", 3)].processes) == (2000, 1)
        fams = _families(metrics_text(mon))
        assert _value(fams, "gpushare_monitor_refused_attributions_total") == 1  # counted and logged once
        assert [line for line in node.log if line.startswith("not charged")] == [
            "not charged: pid 2001 (uid 1001) is in the cgroup of job 201, whose user is alice(1000)"]


def test_a_job_directory_that_is_not_roots_proves_nothing(node):
    node.cgroups[2001] = CGROUP.format(job=202)
    node.cgroup_owners["/slurm_a100/uid_1000/job_202"] = 1001  # made by bob, not by slurmstepd
    node.stepd_jobs = {"201", "203"}  # and no slurmstepd lists it
    with node.monitor() as mon:
        mon.sample()
        assert ("202", 3) not in {(d.job_id, d.key) for d in mon.snapshot.devices if d.processes}
        assert mon.attributed == {"cgroup": 1, "slurm": 1}  # 1001 by its cgroup, 1002 by listpids


def test_cgroups_answer_every_sample_and_listpids_is_asked_once_per_new_process(node):
    node.cgroups.update({1002: CGROUP.format(job=201), 2001: CGROUP.format(job=202)})
    node.config = NodeConfig(run_dir=node.config.run_dir, monitor_steps_interval=3600, monitor_save_interval=5)
    with node.monitor() as mon:
        for _ in range(50):
            node.clock.t += 0.01
            mon.sample()
        assert (node.listpids_calls, node.squeue_calls) == (1, 1)  # the first sample's, nothing since
        assert mon.attributed == {"cgroup": 3, "slurm": 0}
        # a new process outside any cgroup: one listpids (at most one a second), then its answer is kept
        node.nvml.add_process(ScheduledProcess(1003, 0, node.clock.t, ((0, 100, 1),)))
        node.uids[1003] = 1000
        node.clock.t += 1
        for _ in range(50):
            node.clock.t += 0.01
            mon.sample()
        assert node.listpids_calls == 2
        assert mon.attributed == {"cgroup": 3, "slurm": 0}  # 1003 is in no job's pid list: unattributed
        assert next(g for g in mon.snapshot.gpus if g.index == 0).unattributed_mib == 100


def test_a_job_named_by_its_cgroup_is_looked_up_once_and_must_run_here(node):
    records: list[str] = []
    node.jobs["204"] = node.jobs["202"].replace("JobId=202", "JobId=204").replace("IDX:3", "IDX:5")
    node.jobs["205"] = node.jobs["204"].replace("JobId=204", "JobId=205").replace("Nodes=a100", "Nodes=b100") \
        .replace("NodeList=a100", "NodeList=b100")
    node.nvml.add_process(ScheduledProcess(4001, 5, node.clock.t, ((0, 500, 1),)))
    node.nvml.add_process(ScheduledProcess(5001, 6, node.clock.t, ((0, 600, 1),)))
    node.uids.update({4001: 1001, 5001: 1001})
    node.cgroups.update({4001: CGROUP.format(job=204), 5001: CGROUP.format(job=205)})
    mon = node.monitor()
    record = mon._job_record
    mon._job_record = lambda j: records.append(j) or record(j)
    with mon:
        for _ in range(5):
            node.clock.t += 1
            mon.sample()
        by = {(d.job_id, d.key): d.used_mib for d in mon.snapshot.devices}
        assert by[("204", 5)] == 500 and "205" not in {d.job_id for d in mon.snapshot.devices}
        assert records.count("204") == 1 and records.count("205") == 1  # one lookup per job, not per sample
        assert any("job 205: a cgroup names it, but slurmctld has it RUNNING on b100" in line for line in node.log)
        assert next(g for g in mon.snapshot.gpus if g.index == 6).unattributed_mib == 600


def test_a_job_whose_cgroup_is_gone_leaves_the_metrics_at_once(node):
    node.cgroups[2001] = CGROUP.format(job=202).replace("uid_1000", "uid_1001")
    node.config = NodeConfig(run_dir=node.config.run_dir, monitor_steps_interval=3600)
    with node.monitor() as mon:
        mon.sample()
        node.clock.t += 0.5
        mon.sample()
        assert "202" in mon.tracker.jobs()
        # its last step ended: slurmstepd removed the job's cgroup (and its processes are gone)
        node.nvml.remove_process(2001)
        node.stepd_jobs = {"201", "203"}
        node.cgroup_owners["/slurm_a100/uid_1001/job_202"] = None
        node.clock.t += 0.01
        mon.sample()
        assert "202" not in mon.tracker.jobs() and "202" not in {d.job_id for d in mon.snapshot.devices}
        assert load_usage(node.config.run_dir, "202")[3].samples == 2  # written once more for the Epilog
        assert node.listpids_calls == 1


def test_usage_files_are_written_once_per_save_interval(node):
    node.config = NodeConfig(run_dir=node.config.run_dir, monitor_save_interval=1.0)
    with node.monitor() as mon:
        mon.sample()
        for _ in range(7):
            node.clock.t += 0.125
            mon.sample()
        assert load_usage(node.config.run_dir, "202")[3].samples == 1
        node.clock.t += 0.125
        mon.sample()
        assert load_usage(node.config.run_dir, "202")[3].samples == 9


def test_a_first_sample_and_a_new_peak_are_saved_at_once(node):
    """Seen in CI after the save interval came in: a job that ended within a second of its first sample had no
    peak in its record (the Epilog read no usage file yet). The first sample of a job's device and every new
    peak go out at once; samples that change no peak wait for the interval."""
    node.config = NodeConfig(run_dir=node.config.run_dir, monitor_save_interval=60.0)
    with node.monitor() as mon:
        mon.sample()
        assert load_usage(node.config.run_dir, "202")[3].peak_mib == 2000  # the first sample: at once
        node.clock.t += 5
        mon.sample()
        assert load_usage(node.config.run_dir, "202")[3].samples == 1  # no new peak: not written
        node.clock.t += 5.1
        mon.sample()  # process 2001 now holds 9000 MiB and 80 % SM
        saved = load_usage(node.config.run_dir, "202")[3]
        assert (saved.peak_mib, saved.sm_peak, saved.samples) == (9000, 80.0, 3)
        node.clock.t += 10
        mon.sample()  # 4000 MiB: below the peak
        assert load_usage(node.config.run_dir, "202")[3].samples == 3


@pytest.fixture
def share_daemon(node):
    """Job 204, a 10G share on GPU 1 run by this test's own user, with a Prolog's work done: its job directory
    (state ``ready``, the lock file) and its own MPS daemon (the stand-in) set to the share. Yields
    ``(node, job_dir, start)``: ``start(plan)`` starts the daemon as the Prolog does and returns it."""
    import os
    import shutil
    import tempfile
    from dataclasses import replace

    from slurm_gpushare_dev.cluster import MPS_STANDIN

    base = Path(tempfile.mkdtemp(prefix="gsmon-", dir="/tmp"))  # a control socket path fits 107 bytes
    base.chmod(0o755)
    node.config = replace(node.config, run_dir=str(base / "run"), mps_control=str(MPS_STANDIN),
                          mps_start_timeout=DEADLINE, mps_quit_timeout=2.0, mps_check_interval=1.0,
                          mps_env=(("PATH", "/usr/bin:/bin"), ("GPUSHARE_FAKE_MPS_LIFETIME_S", "120")))
    node.jobs["204"] = SHOW.format(
        job="204", user="carol", uid=os.geteuid(), account="bio", gres="shard:10", detail="shard:10(IDX:1)",
        ac="[gpushare:v1 req=mem=10G grant=gres:shard:10 kind=mps mem=10240/10240MiB]")
    node.running.add("204")
    node.stepd_jobs.add("204")
    node.nvml.add_process(ScheduledProcess(4001, 1, node.clock.t, ((0, 3000, 10),)))
    node.cgroups[4001], node.uids[4001] = CGROUP.format(job=204), os.geteuid()
    job_dir = base / "run" / "jobs" / "204"
    daemons = []

    def start(plan):
        from slurm_gpushare.node.context import HookContext, job_mps_settings
        from slurm_gpushare.node.jobdir import job_lock, make_job_dir, write_state

        with job_lock(job_dir):
            make_job_dir(job_dir)
            d = HookContext(node.config, "a100").mps("204", plan)
            daemons.append(d)
            d.start(job_mps_settings(d, plan))
            write_state(job_dir, {"phase": "ready"})
        return d

    yield node, job_dir, start
    for d in daemons:
        d.stop()
    shutil.rmtree(base, ignore_errors=True)


def test_a_share_that_raises_its_own_daemon_s_limit_is_acted_on_and_set_back(share_daemon):
    """Issue 27 (c): the job's daemon runs as the job's user, who can tell it
    ``set_device_pinned_mem_limit <server> 0 80G``. The monitor reads the daemon's settings back every
    mps_check_interval; found changed in two read-backs in a row, the job gets node.toml's enforce action
    (kill: its processes on the share's GPU) and the daemon is set back to the share."""
    node, job_dir, start = share_daemon
    with node.monitor() as mon:
        mon.sample()  # no job directory yet (the Prolog has not run): nothing read, nothing found
        daemon = start(mon._jobs["204"].plan)
        node.clock.t += 1
        mon.sample()
        assert [k for k in node.killed if k[0] == 4001] == []
        daemon.command("start_server -uid 0")
        server = daemon.server_pids()[0]
        assert daemon.command(f"set_device_pinned_mem_limit {server} 0 80G") == ""  # what the job may send
        node.clock.t += 1
        mon.sample()
        assert (4001, signal.SIGKILL) not in node.killed  # one read-back: not yet
        node.clock.t += 1
        mon.sample()
        assert (4001, signal.SIGKILL) in node.killed
        assert [k for k in node.killed if k[0] != 4001 and k[0] not in (1001, 1002)] == []  # nobody else's
        finding = (f"get_device_pinned_mem_limit {server} 0 shows '80G', set "
                   f"'set_device_pinned_mem_limit {server} 0 10G'")
        assert f"gpushare: GPU 1 of a100: {finding}; the monitor killed 1 of its process(es) there (pid 4001); " \
               "its MPS daemon's settings were set back." in node.admin_comments["204"], node.admin_comments["204"]
        assert [line for line in node.log if line.startswith("enforce: job 204")] == [
            f"enforce: job 204 (carol, partition gpu) on GPU 1 of a100: {finding}: killed 1 of its process(es) "
            "there (pid 4001); its MPS daemon's settings were set back"]
        assert daemon.command(f"get_device_pinned_mem_limit {server} 0") == "10G"
        # set back: the next read-back finds nothing; the episode ends
        node.clock.t += 1
        mon.sample()
        assert mon._jobs["204"].mps_drift == 0


def test_a_share_that_quits_its_own_daemon_is_acted_on_but_a_hook_at_work_is_not_the_job_s_doing(share_daemon):
    """Issue 27 (c): ``quit`` sent to its own daemon leaves the job's new processes outside MPS. Found in two
    read-backs, the job is warned (enforce = "warn"). A daemon the Epilog is stopping (it holds the job's lock)
    or a job directory the Prolog has not finished is not read at all."""
    from dataclasses import replace

    from slurm_gpushare.node.jobdir import job_lock, write_state

    node, job_dir, start = share_daemon
    node.config = replace(node.config, enforce="warn")
    with node.monitor() as mon:
        mon.sample()
        daemon = start(mon._jobs["204"].plan)
        with job_lock(job_dir):  # the Epilog, stopping the daemon under the job's lock
            daemon.stop()
            for _ in range(3):
                node.clock.t += 1
                mon.sample()
        assert "204" not in node.admin_comments and mon._jobs["204"].mps_drift == 0
        write_state(job_dir, {"phase": "mps"})  # a Prolog that has not finished
        for _ in range(3):
            node.clock.t += 1
            mon.sample()
        assert "204" not in node.admin_comments
        daemon = start(mon._jobs["204"].plan)
        node.clock.t += 1
        mon.sample()
        daemon.command("quit")  # the job's doing
        for _ in range(2):
            node.clock.t += 1
            mon.sample()
        assert "gpushare: GPU 1 of a100: its MPS control daemon is not running (quit by the job?); the monitor " \
               "warned (node.toml enforce = \"warn\")." in node.admin_comments["204"], node.admin_comments["204"]
        assert (4001, signal.SIGKILL) not in node.killed


def test_a_daemon_that_answers_late_on_a_busy_node_is_not_the_job_s_doing(share_daemon, monkeypatch):
    """A read-back whose front end gets no answer in time while the job's daemon runs (a loaded node: CI with 20
    shares on 2 cores) is logged and counted, and counts neither way: the job is not acted on however often it
    happens (it was a finding, and twice in a row killed the job's processes)."""
    import slurm_gpushare.node.monitor as monitor_module

    node, job_dir, start = share_daemon
    with node.monitor() as mon:
        mon.sample()
        start(mon._jobs["204"].plan)
        monkeypatch.setattr(monitor_module, "MPS_CHECK_TIMEOUT_S", 0.001)  # no front end answers that fast
        for _ in range(4):
            node.clock.t += 1
            mon.sample()
        assert "204" not in node.admin_comments and (4001, signal.SIGKILL) not in node.killed
        assert mon._jobs["204"].mps_drift == 0 and mon.errors_total.get("mps-check") == 4, mon.errors_total
        assert sum("job 204: its MPS daemon's settings not read back: " in line and "got no answer within 0.001 s"
                   in line for line in node.log) == 4, node.log


def test_a_share_that_stops_its_own_daemon_is_acted_on(share_daemon, monkeypatch):
    """A job's user may send SIGSTOP to the daemon (it runs as them): it then answers no read-back, and a busy
    node does not explain it. Found stopped in two read-backs, the job gets the enforce action; a stopped daemon
    is not set back (it would answer no ``set``)."""
    import os

    import slurm_gpushare.node.monitor as monitor_module

    node, job_dir, start = share_daemon
    monkeypatch.setattr(monitor_module, "MPS_CHECK_TIMEOUT_S", 0.5)
    with node.monitor() as mon:
        mon.sample()
        daemon = start(mon._jobs["204"].plan)
        pid = daemon.pid()
        os.kill(pid, signal.SIGSTOP)
        try:
            for _ in range(2):
                node.clock.t += 1
                mon.sample()
        finally:
            os.kill(pid, signal.SIGCONT)
        assert "gpushare: GPU 1 of a100: its MPS control daemon is stopped (a stop signal or a tracer: it answers " \
               "no client); the monitor killed 1 of its process(es) there (pid 4001)." in node.admin_comments["204"], \
            node.admin_comments.get("204")
        assert (4001, signal.SIGKILL) in node.killed


def test_a_share_s_process_outside_mps_is_acted_on_alone_within_the_share(node):
    """Issue 27 (a): a process of a share job that is not an MPS client (it unset CUDA_MPS_PIPE_DIRECTORY: a CUDA
    context of its own, with no MPS memory or SM limit; nvmlDeviceGetMPSComputeRunningProcesses does not list it)
    gets the enforce action after enforce_grace samples, even within the share, and only that process; a whole-GPU
    job's own context is nobody's concern."""
    now = node.clock.t
    for pid in (1001, 1002, 2001):
        node.nvml.remove_process(pid)
    node.nvml.add_process(ScheduledProcess(1001, 0, now, ((0, 3000, 20),), mps=True))
    node.nvml.add_process(ScheduledProcess(1002, 0, now, ((0, 2000, 25),), mps=False))  # 5000 MiB of 10240
    node.nvml.add_process(ScheduledProcess(2001, 3, now, ((0, 2000, 30),), mps=False))  # bob's whole GPU
    with node.monitor() as mon:
        mon.sample()
        mon.sample()
        assert node.killed == []  # within the grace
        mon.sample()
        assert node.killed == [(1002, signal.SIGKILL)]
        assert "gpushare: GPU 0 of a100: its process(es) 1002 ran outside MPS there (a CUDA context of their own: no " \
               "MPS memory or SM limit); the monitor killed 1 of its process(es) there (pid 1002)." \
               in node.admin_comments["201"], node.admin_comments["201"]
        assert "202" not in node.admin_comments
        mon.sample()  # the same episode: acted on once
        assert node.killed == [(1002, signal.SIGKILL)]


def test_a_gpu_whose_nvml_cannot_list_mps_clients_is_not_judged(node):
    """nvmlDeviceGetMPSComputeRunningProcesses NOT_SUPPORTED (an older driver): nothing is known to be outside MPS,
    so nothing is acted on; the failure is counted and logged once, and NVML is not asked again."""
    from slurm_gpushare.hardware.nvml import NVML_ERROR_NOT_SUPPORTED

    node.nvml.remove_process(1002)
    node.nvml.add_process(ScheduledProcess(1002, 0, node.clock.t, ((0, 2000, 25),), mps=False))
    node.nvml.fail_next("nvmlDeviceGetMPSComputeRunningProcesses", NVML_ERROR_NOT_SUPPORTED, times=1)
    with node.monitor() as mon:
        for _ in range(5):
            mon.sample()
        assert node.killed == [] and "201" not in node.admin_comments
        assert mon.errors_total.get("nvml") == 1, mon.errors_total


def test_a_passing_nvml_failure_skips_one_sample_of_the_outside_mps_check_and_a_node_wide_daemon_none(node):
    """NVML failing once (not NOT_SUPPORTED) costs that sample only: the process outside MPS is acted on after the
    grace counted from the samples that could look. With mps_mode = "per-gpu" (one daemon per GPU for every job
    there, whose servers cannot be told from a job's own processes) nothing is judged."""
    from dataclasses import replace

    node.nvml.remove_process(1002)
    node.nvml.add_process(ScheduledProcess(1002, 0, node.clock.t, ((0, 2000, 25),), mps=False))
    node.nvml.fail_next("nvmlDeviceGetMPSComputeRunningProcesses", times=1)
    with node.monitor() as mon:
        for _ in range(3):
            mon.sample()
        assert node.killed == [] and mon.errors_total.get("nvml") == 1
        mon.sample()
        assert node.killed == [(1002, signal.SIGKILL)]
    node.killed.clear()
    node.config = replace(node.config, mps_mode="per-gpu")
    with node.monitor() as mon:
        for _ in range(5):
            mon.sample()
        assert node.killed == []


def test_the_job_s_own_mps_daemon_on_its_gpu_is_not_outside_mps(share_daemon):
    """The job's control daemon and its servers hold contexts of their own on the GPU (NVIDIA lists an MPS server as
    a compute process, not an MPS client); with PrologFlags=Contain they sit in the job's cgroup. They are the
    share's machinery, never acted on."""
    node, job_dir, start = share_daemon
    with node.monitor() as mon:
        mon.sample()
        daemon = start(mon._jobs["204"].plan)
        pid = daemon.pid()
        node.nvml.add_process(ScheduledProcess(pid, 1, node.clock.t, ((0, 300, 0),), mps=False))
        node.cgroups[pid], node.uids[pid] = CGROUP.format(job=204), node.uids[4001]
        for _ in range(4):
            node.clock.t += 0.1
            mon.sample()
        assert [k for k in node.killed if k[0] == pid] == [] and "204" not in node.admin_comments


# --- the driver's memory limit on a share job's cgroup (issue 27 item 3) ----------------------------------


def _cgroup_fs(tmp_path: Path, *jobs: str):
    """A devices hierarchy mounted under ``tmp_path`` (mountinfo as the kernel writes it), with the job cgroups
    ``jobs`` of alice (uid 1000) made in it."""
    from slurm_gpushare.node.membership import CgroupFs

    point = tmp_path / "cgroup" / "devices"
    for job in jobs:
        (point / "slurm_a100" / "uid_1000" / f"job_{job}").mkdir(parents=True)
    return CgroupFs(f"36 25 0:31 / {point} rw,nosuid,nodev,noexec - cgroup cgroup rw,devices\n"), point


def _samples(mon: Monitor, node: Node, n: int) -> None:
    for _ in range(n):
        mon.sample()
        node.clock.t += 1


def test_a_share_job_gets_the_driver_s_limit_on_its_cgroup_once_and_a_whole_gpu_job_none(node, tmp_path):
    """Issue 27 item 3: where NVML has per-cgroup limits (nvmlDeviceSetMemoryLimits_v1), the share job 201 (10G on
    GPU 0) gets its share as soft and hard limit on its job cgroup, found through its process; once, not every
    sample. bob's whole-GPU job 202 gets none."""
    fs, point = _cgroup_fs(tmp_path, "201")
    node.cgroups[2001] = CGROUP.format(job=202).replace("uid_1000", "uid_1001")
    mon = node.monitor(fs)
    job_dir = str(point / "slurm_a100" / "uid_1000" / "job_201")
    with mon, node.nvml:
        mon.sample()
        limits = node.nvml.memory_limits(0, job_dir)
        assert (limits.soft_mib, limits.hard_mib) == (10240, 10240)
        assert [line for line in node.log if "driver" in line] == [
            f"job 201: the driver holds its processes to 10240 MiB on GPU 0 (cgroup {job_dir}, "
            "nvmlDeviceSetMemoryLimits_v1)"]
        node.clock.t += 1
        mon.sample()
        fams = _families(metrics_text(mon))
        assert _value(fams, "gpushare_monitor_gpu_memory_limits_total", outcome="set") == 1
        assert _value(fams, "gpushare_monitor_gpu_memory_limits_total", outcome="unsupported") == 0
        assert mon._jobs["202"].limit is None


def test_a_driver_without_per_cgroup_limits_is_asked_once_and_the_monitor_enforces_as_before(node, tmp_path):
    from slurm_gpushare.hardware.port import NVML_ERROR_FUNCTION_NOT_FOUND

    fs, _point = _cgroup_fs(tmp_path, "201", "204")
    node.jobs["204"] = node.jobs["201"].replace("JobId=201", "JobId=204").replace("IDX:0", "IDX:1")
    node.running.add("204")
    node.nvml.add_process(ScheduledProcess(4001, 1, node.clock.t, ((0, 1000, 5),)))
    node.uids[4001] = 1000
    node.cgroups[4001] = CGROUP.format(job=204)
    node.nvml.fail_next("nvmlDeviceSetMemoryLimits_v1", NVML_ERROR_FUNCTION_NOT_FOUND, times=5)
    mon = node.monitor(fs)
    with mon:
        _samples(mon, node, 3)
        said = [line for line in node.log if "driver" in line]
        assert len(said) == 1 and said[0].startswith(
            "job 201: no driver memory limit (nvmlDeviceSetMemoryLimits_v1(gpu 0, cgroup "), said  # once, not per job
        assert "[NVML_ERROR_FUNCTION_NOT_FOUND]" in said[0]
        assert said[0].endswith("); its MPS limit and the monitor's enforcement hold it")
        fams = _families(metrics_text(mon))
        assert _value(fams, "gpushare_monitor_gpu_memory_limits_total", outcome="unsupported") == 2  # both jobs
        assert len(node.nvml._pending) == 1 and node.nvml._pending[0][3] == 4  # NVML was asked once
        assert node.killed == [(1001, signal.SIGKILL), (1002, signal.SIGKILL)]  # 12000 MiB of 10240: as before


def test_gpu_memory_limit_off_sets_none(node, tmp_path):
    fs, point = _cgroup_fs(tmp_path, "201")
    node.config = NodeConfig(run_dir=node.config.run_dir, gpu_memory_limit="off")
    mon = node.monitor(fs)
    with mon, node.nvml:
        mon.sample()
        limits = node.nvml.memory_limits(0, str(point / "slurm_a100" / "uid_1000" / "job_201"))
        assert limits.hard_mib is None
        assert mon._jobs["201"].limit is None


def test_a_job_s_cgroup_made_anew_is_limited_again_and_a_prolog_s_limit_is_not_set_twice(node, tmp_path):
    """Found by a review: a requeued run of the job has a new cgroup of the same name (the old one's limits went
    with it), so the monitor sets the limit again; a limit the Prolog set (PrologFlags=RunInJob) and recorded in
    the job's state is not set, logged or counted a second time; a failed set is tried again, at most 3 times."""
    from slurm_gpushare.hardware.port import NVML_ERROR_UNKNOWN
    from slurm_gpushare.node.jobdir import write_state

    fs, point = _cgroup_fs(tmp_path, "201")
    job_dir = point / "slurm_a100" / "uid_1000" / "job_201"
    mon = node.monitor(fs)
    with mon, node.nvml:
        mon.sample()
        assert node.nvml.memory_limits(0, str(job_dir)).hard_mib == 10240
        gone = job_dir.with_name("old")
        job_dir.rename(gone)  # the run ends; the requeued run's cgroup is made again (another directory: cgroupfs
        job_dir.mkdir()       # numbers its directories anew, where this file system might reuse a freed number)
        gone.rmdir()
        node.clock.t += 1
        mon.sample()
        assert node.nvml.memory_limits(0, str(job_dir)).hard_mib == 10240
        assert len([line for line in node.log if "the driver holds" in line]) == 2
    # a Prolog that set it
    node2 = Node(tmp_path / "n2")
    fs2, point2 = _cgroup_fs(tmp_path / "n2", "201")
    where = str(point2 / "slurm_a100" / "uid_1000" / "job_201")
    jd = Path(node2.config.run_dir) / "jobs" / "201"
    jd.mkdir(parents=True)
    write_state(jd, {"gpu_memory_limit": {"outcome": "set", "cgroup": where, "gpus": [0], "mib": 10240}})
    mon2 = node2.monitor(fs2)
    with mon2, node2.nvml:
        mon2.sample()
        assert node2.nvml.memory_limits(0, where).hard_mib is None  # the fake's Prolog limit is not in this fake
        assert mon2._jobs["201"].limit.outcome == "set" and not [line for line in node2.log if "driver" in line]
    # a set that fails is tried again, three times in all
    node3 = Node(tmp_path / "n3")
    fs3, _ = _cgroup_fs(tmp_path / "n3", "201")
    node3.nvml.fail_next("nvmlDeviceSetMemoryLimits_v1", NVML_ERROR_UNKNOWN, times=10)
    mon3 = node3.monitor(fs3)
    with mon3:
        _samples(mon3, node3, 6)
        fams = _families(metrics_text(mon3))
        assert _value(fams, "gpushare_monitor_gpu_memory_limits_total", outcome="failed") == 3


def test_the_monitors_plan_of_a_job_carries_its_low_client_priority(node):
    """The monitor planned jobs without node.toml's low_priority_partitions/low_priority_qos, so a daemon it
    restores (check_mps) would lose set_default_client_priority 1; the Prolog's plan had it."""
    from dataclasses import replace

    node.config = replace(node.config, low_priority_qos=("NORMAL",))  # the jobs' QOS=normal; case does not matter
    with node.monitor() as mon:
        mon.sample()
        assert mon._jobs["201"].plan.client_priority == 1
    node.config = replace(node.config, low_priority_qos=(), low_priority_partitions=("gpu",))
    with node.monitor() as mon:
        mon.sample()
        assert mon._jobs["201"].plan.client_priority == 1
    node.config = replace(node.config, low_priority_partitions=())
    with node.monitor() as mon:
        mon.sample()
        assert mon._jobs["201"].plan.client_priority is None
