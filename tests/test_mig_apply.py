"""mig apply without Slurm daemons: the state machine on the fake NVML (opened from a description file, as the
dev cluster's hooks open it) with a recorded sequence of Slurm calls, a kill at every step and mid-step
followed by a rerun, the fallback to the old layout, and the errors for bad input."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

import slurm_gpushare.mig.apply as apply_mod
from slurm_gpushare.errors import InputError
from slurm_gpushare.gresconf.render import generate_node_gres, render_gres_conf, render_slurm_conf
from slurm_gpushare.hardware.fake import FakeNvml, derived_gpus
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.hardware.ports import open_nvml
from slurm_gpushare.mig.apply import KILL_ENV, STEPS, Apply, ApplyError
from slurm_gpushare.mig.demand import Request
from slurm_gpushare.mig.files import with_instances
from slurm_gpushare.mig.layout import current_layout, read_layout, same_profiles
from slurm_gpushare.mig.output import layout_json, mig_parted_yaml
from slurm_gpushare.mig.plan import plan_layout
from slurm_gpushare.slurm.gres import parse as parse_gres
from slurm_gpushare.slurm.node import NodeState
from slurm_gpushare.slurm.nodegres import GresOptions

ROOT = Path(__file__).resolve().parent.parent
MIXED = ROOT / "slurm_gpushare" / "data" / "machines" / "4x-h100-mig-mixed.json"
A100 = ROOT / "slurm_gpushare" / "data" / "machines" / "8x-a100-nv12-bridge.json"
NODE = "h100-mig"
OTHER = "a100-nvb"
OPTS = GresOptions(device_dir="/dev")

#: GPUs 2 and 3 of the mixed node hold 4g.40gb + 3x 1g.10gb; the target: 7x 1g.10gb on GPU 2, GPU 3 kept
SEVEN = [{"profile": "1g.10gb", "profile_id": 19, "start": s} for s in range(7)]


class Killed(Exception):
    """Stands in for SIGKILL in a unit test."""


class FakeSlurm:
    """slurmctld as apply sees it: one node's state and reason, its GPU jobs, the Gres= slurmctld shows
    (slurm.conf's once slurmctld restarted and slurmd started again), every call recorded."""

    def __init__(self, slurm_conf: Path, *, jobs: list[list[str]] | None = None, drained: str | None = None,
                 known=(NODE, OTHER)):
        self.calls: list[tuple] = []
        self.slurm_conf = slurm_conf
        self.jobs = list(jobs or [])
        self.reason = drained
        self.known = known
        self.gres = self._conf_gres()
        self.start = 1
        self.slurmd_up = True
        self.ctld_config = self._conf_gres()
        self.on_call = None
        #: what slurmctld says of the node, one entry per show once slurmd started again: "" (responding),
        #: "NR" (State=IDLE+NOT_RESPONDING, scontrol's long form) or "*" (IDLE*, the short form)
        self.after_start: list[str] = []

    def _conf_gres(self) -> str:
        line = next(ln for ln in self.slurm_conf.read_text().splitlines() if ln.startswith(f"NodeName={NODE} "))
        return next(kv for kv in line.split() if kv.startswith("Gres=")).split("=", 1)[1]

    def _call(self, *call) -> None:
        self.calls.append(call)
        if self.on_call:
            self.on_call(call)

    def node(self, node: str) -> NodeState:
        self._call("show", node)
        if node not in self.known:
            raise InputError(f"unknown node {node}")
        flag = self.after_start.pop(0) if self.start > 1 and self.after_start else ""
        state = "IDLE" + ("*" if flag == "*" else "") + ("+DRAIN" if self.reason else "") + \
            ("+NOT_RESPONDING" if flag == "NR" else "")
        return NodeState(state, self.reason, self.gres, str(self.start))

    def drain(self, node: str, reason: str) -> None:
        self._call("drain", node, reason)
        self.reason = reason

    def resume(self, node: str) -> None:
        self._call("resume", node)
        self.reason = None

    def gpu_jobs(self, node: str) -> list[str]:
        self._call("jobs", node)
        return self.jobs.pop(0) if self.jobs else []

    def stop_slurmd(self, node: str) -> None:
        self._call("stop-slurmd", node)
        self.slurmd_up = False

    def restart_slurmctld(self) -> None:
        self._call("restart-slurmctld")
        self.ctld_config = self._conf_gres()
        if self.slurmd_up:  # an old slurmd registers its old GRES against the new slurm.conf: Slurm drains
            self.reason = "gres/gpu count reported lower than configured"

    def start_slurmd(self, node: str) -> None:
        self._call("start-slurmd", node)
        self.slurmd_up = True
        self.start += 1
        self.gres = self.ctld_config


@pytest.fixture
def site(tmp_path):
    """A node's files: its description (served by the fake NVML from that file), gres.conf and slurm.conf of
    two nodes, a layout file."""
    m = Machine.load(MIXED)
    m = replace(m, hostname=NODE, gpus=tuple(derived_gpus(m)))
    other = Machine.load(A100)
    machine = tmp_path / f"{NODE}.json"
    machine.write_text(m.to_json())
    nodes = [generate_node_gres(m, NODE, OPTS), generate_node_gres(other, OTHER, OPTS)]
    (tmp_path / "gres.conf").write_text(render_gres_conf(nodes, header="site gres.conf"))
    (tmp_path / "slurm.conf").write_text("ClusterName=c\n" + render_slurm_conf(nodes) + "PartitionName=gpu Nodes=ALL\n")
    layout = {"version": 1, "nodes": {NODE: {"gpus": [
        {"index": 2, "name": m.gpu(2).name, "mig_enabled": True, "instances": SEVEN},
        {"index": 3, "name": m.gpu(3).name, "mig_enabled": True, "instances": [
            {"profile": "4g.40gb", "profile_id": 5, "start": 0},
            *({"profile": "1g.10gb", "profile_id": 19, "start": s} for s in (4, 5, 6))]},
    ]}}}
    (tmp_path / "layout.json").write_text(json.dumps(layout))
    return tmp_path


def make(site: Path, slurm: FakeSlurm, layout: str = "layout.json", **kw) -> Apply:
    kw.setdefault("poll_s", 0)
    kw.setdefault("open_port", lambda: open_nvml(f"fake:{site / f'{NODE}.json'}"))
    return Apply(node=NODE, layout=str(site / layout), targets=read_layout(site / layout, NODE),
                 machine_path=site / f"{NODE}.json", state_path=site / "run" / "mig-apply.json",
                 gres_conf=site / "gres.conf", slurm_conf=site / "slurm.conf", gres_options=OPTS,
                 run_dir=site / "run", slurm=slurm, out=lambda line: None, sleep=lambda s: None, **kw)


def run_once(job: Apply):
    state = job.read_state() or job.prepare()
    return job.run(state)


def nvml_layout(site: Path) -> dict[int, list[tuple[str, int]]]:
    """What a fresh fake NVML opened from the description file reports (another process's view)."""
    with open_nvml(f"fake:{site / f'{NODE}.json'}") as port:
        return {i: [(p.profile, p.start) for p in v] for i, v in current_layout(port, range(4)).items()}


def node_lines(text: str, node: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(f"NodeName={node} ")]


def assert_consistent(site: Path) -> None:
    """gres.conf's and slurm.conf's lines of the node are those rendered from what NVML reports."""
    machine = Machine.load(site / f"{NODE}.json")
    with open_nvml(f"fake:{site / f'{NODE}.json'}") as port:
        machine = with_instances(machine, port)
    want = generate_node_gres(machine, NODE, OPTS)
    assert node_lines((site / "gres.conf").read_text(), NODE) == [r.render(NODE) for r in want.records]
    conf_line = node_lines((site / "slurm.conf").read_text(), NODE)[0]
    assert f"Gres={want.gres_value}" in conf_line.split()


TARGET = {0: [], 1: [], 2: [("1g.10gb", s) for s in range(7)],
          3: [("4g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5), ("1g.10gb", 6)]}


def test_fake_nvml_opened_from_a_file_writes_mig_changes_back(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(Machine.load(MIXED).to_json())
    path.chmod(0o644)
    with open_nvml(f"fake:{path}") as port:
        gi = port.gpu_instances(2)[0].gi_id
        port.destroy_gpu_instance(2, gi)
    with open_nvml(f"fake:{path}") as again:
        assert gi not in {i.gi_id for i in again.gpu_instances(2)}
        made = again.create_gpu_instance(2, 19, 0)
    assert (path.stat().st_mode & 0o777) == 0o644
    with FakeNvml(Machine.load(path)) as third:
        assert made in third.gpu_instances(2)
        # without a path nothing is written
        before = path.read_text()
        third.destroy_gpu_instance(2, made.gi_id)
    assert path.read_text() == before


def test_apply_changes_the_layout_files_and_slurm_in_order(site):
    other_gres = node_lines((site / "gres.conf").read_text(), OTHER)
    other_conf = node_lines((site / "slurm.conf").read_text(), OTHER)
    slurm = FakeSlurm(site / "slurm.conf", jobs=[["7"], ["7"], []])
    state = run_once(make(site, slurm))
    assert state["goal"] == "target"
    assert nvml_layout(site) == TARGET
    assert_consistent(site)
    # the other node's lines are untouched
    assert node_lines((site / "gres.conf").read_text(), OTHER) == other_gres
    assert node_lines((site / "slurm.conf").read_text(), OTHER) == other_conf
    kinds = [c[0] for c in slurm.calls if c[0] != "show"]
    assert kinds == ["drain", "jobs", "jobs", "jobs", "stop-slurmd", "restart-slurmctld", "start-slurmd", "resume"]
    drain = next(c for c in slurm.calls if c[0] == "drain")
    assert drain[2].startswith("gpushare mig apply: to layout.json, state ")
    # slurm.conf's Gres= item by item (gres_matches, which apply waits on, accepts sums over types)
    assert sorted((i.name, i.type, i.count) for i in parse_gres(slurm.gres)) == \
        [("gpu", "h100", 2), ("gpu", "h100_1g.10gb", 10), ("gpu", "h100_4g.40gb", 1), ("shard", "", 158)]
    assert slurm.reason is None
    assert not (site / "run" / "mig-apply.json").exists()
    assert json.loads((site / "run" / "mig-apply.last.json").read_text())["step"] == "resume"


def test_a_second_apply_of_the_same_layout_does_nothing(site):
    job = make(site, FakeSlurm(site / "slurm.conf"))
    assert not same_profiles(job.prepare()["old"], job.prepare()["target"], placements=True)
    run_once(job)
    fresh = make(site, FakeSlurm(site / "slurm.conf")).prepare()
    assert same_profiles(fresh["old"], fresh["target"], placements=True)


def test_past_the_deadline_the_drain_is_undone_and_nothing_changes(site):
    before = nvml_layout(site)
    conf = (site / "gres.conf").read_text()
    clock = iter(range(0, 10_000, 30))
    slurm = FakeSlurm(site / "slurm.conf", jobs=[["41", "42"]] * 100)
    with pytest.raises(ApplyError, match=r"still runs GPU job\(s\) 41, 42 after 60 s: layout unchanged"):
        run_once(make(site, slurm, deadline_s=60, clock=lambda: float(next(clock))))
    assert nvml_layout(site) == before
    assert (site / "gres.conf").read_text() == conf
    assert [c[0] for c in slurm.calls if c[0] not in ("show", "jobs")] == ["drain", "resume"]
    assert slurm.reason is None
    assert not (site / "run" / "mig-apply.json").exists()


def test_a_node_drained_by_someone_else_is_left_drained(site):
    slurm = FakeSlurm(site / "slurm.conf", drained="disk replacement")
    run_once(make(site, slurm))
    assert nvml_layout(site) == TARGET
    assert not [c for c in slurm.calls if c[0] in ("drain", "resume")]
    assert slurm.reason == "disk replacement"


def test_a_reason_changed_meanwhile_is_not_resumed(site):
    slurm = FakeSlurm(site / "slurm.conf")

    def admin_redrains(call):
        if call[0] == "restart-slurmctld":
            slurm.reason = "bad DIMM"

    slurm.on_call = admin_redrains
    state = run_once(make(site, slurm))
    assert state["left_drained"] == "bad DIMM"
    assert "resume" not in [c[0] for c in slurm.calls]


KILL_POINTS = [*STEPS, "mig-change:1", "mig-change:3", "mig-change:5"]


@pytest.mark.parametrize("point", KILL_POINTS)
def test_killed_at_any_step_a_rerun_ends_resumed_in_the_target(site, monkeypatch, point):
    monkeypatch.setenv(KILL_ENV, point)

    def kill():
        raise Killed(point)

    slurm = FakeSlurm(site / "slurm.conf")
    with pytest.raises(Killed):
        run_once(make(site, slurm, kill=kill))
    saved = json.loads((site / "run" / "mig-apply.json").read_text())
    assert saved["reason"].startswith("gpushare mig apply:")  # a drained node has its record
    assert saved["node"] == NODE and saved["old"] and saved["target"]
    monkeypatch.delenv(KILL_ENV)
    run_once(make(site, slurm))
    assert nvml_layout(site) == TARGET
    assert_consistent(site)
    assert slurm.reason is None
    assert not (site / "run" / "mig-apply.json").exists()


def test_nvml_refusing_the_target_restores_the_old_layout(site):
    old = nvml_layout(site)
    path = site / f"{NODE}.json"
    slurm = FakeSlurm(site / "slurm.conf")

    calls = []

    def third_fails(gpu):  # the third create fails, once: an NVML error the placement rules did not foresee
        calls.append(gpu)
        return 999 if len(calls) == 3 else None

    def port():
        return FakeNvml(Machine.load(path), path=path, fail={"nvmlDeviceCreateGpuInstanceWithPlacement": third_fails})

    with pytest.raises(ApplyError, match="the target layout was refused.*old layout was restored"):
        run_once(make(site, slurm, open_port=port))
    assert nvml_layout(site) == old
    assert_consistent(site)
    assert slurm.reason is None


def test_dry_run_lists_the_steps_and_changes_nothing(site):
    before = (site / f"{NODE}.json").read_text()
    slurm = FakeSlurm(site / "slurm.conf")
    job = make(site, slurm)
    lines = job.describe(job.prepare())
    assert [ln.split(":")[0] for ln in lines] == ["drain", "wait-jobs", "stop-mps", "mig", "mig", "files", "slurm",
                                                  "resume"]
    assert "GPU 2: 1g.10gb@1 1g.10gb@2 1g.10gb@3 4g.40gb@4" not in "\n".join(lines)
    assert any("destroy 4g.40gb@0" in ln and ln.startswith("mig: GPU 2") for ln in lines)
    assert (site / f"{NODE}.json").read_text() == before
    assert [c[0] for c in slurm.calls] == ["show"]


def test_a_whole_node_plan_with_mig_modes_kept_is_applied(site):
    machine = Machine.load(site / f"{NODE}.json")
    free = plan_layout([machine], [Request(mem_mib=10 * 1024, weight=14)])
    kept = plan_layout([machine], [Request(mem_mib=10 * 1024, weight=14)], keep_mig_mode=True)
    assert [p.choice.geometry is not None for p in free.gpus] != [g.mig_enabled for g in machine.gpus]
    assert [p.choice.geometry is not None for p in kept.gpus] == [g.mig_enabled for g in machine.gpus]
    (site / "free.json").write_text(layout_json(free))
    (site / "kept.json").write_text(layout_json(kept))
    with pytest.raises(InputError, match="MIG off; the layout wants it on"):
        make(site, FakeSlurm(site / "slurm.conf"), layout="free.json").prepare()
    run_once(make(site, FakeSlurm(site / "slurm.conf"), layout="kept.json"))
    want = {p.gpu.index: sorted((i.profile.name, i.start) for i in p.choice.geometry.instances) if p.choice.geometry
            else [] for p in kept.gpus}
    assert {i: sorted(v) for i, v in nvml_layout(site).items()} == want
    assert_consistent(site)


def test_a_mig_parted_config_of_mig_plan_is_applied(site):
    machine = Machine.load(site / f"{NODE}.json")
    part = replace(machine, gpus=tuple(g for g in machine.gpus if g.mig_enabled))
    plan = plan_layout([part], [Request(mem_mib=10 * 1024, weight=14)])
    (site / "plan.yaml").write_text(mig_parted_yaml(plan))
    (site / "plan.json").write_text(layout_json(plan))
    for name in ("plan.yaml", "plan.json"):
        targets = read_layout(site / name, NODE)
        assert sorted(targets) == [2, 3]
    slurm = FakeSlurm(site / "slurm.conf")
    run_once(make(site, slurm, layout="plan.yaml"))
    got = nvml_layout(site)
    want = yaml.safe_load((site / "plan.yaml").read_text())["mig-configs"][f"gpushare-{NODE}"]
    for entry in want:
        for d in entry["devices"]:
            assert sorted(p for p, _ in got[d]) == sorted(p for p, n in entry["mig-devices"].items() for _ in range(n))
    assert_consistent(site)


@pytest.mark.parametrize("edit, message", [
    (lambda g: g.update(name="NVIDIA A100-SXM4-80GB"), "GPU 2 is a NVIDIA A100-SXM4-80GB in the layout"),
    (lambda g: g["instances"].__setitem__(1, {"profile": "1g.10gb", "profile_id": 19, "start": 0}),
     "invalid geometry: .*overlaps"),
    (lambda g: g["instances"].__setitem__(0, {"profile": "3g.40gb", "profile_id": 9, "start": 1}),
     "invalid geometry: .*cannot start at memory slice 1"),
    (lambda g: g["instances"].__setitem__(0, {"profile": "2g.12gb", "profile_id": 5, "start": 0}),
     "offers no MIG profile 2g.12gb"),
    (lambda g: g.update(mig_enabled=False, instances=[]), "GPU 2 has MIG on; the layout wants it off"),
])
def test_bad_layouts_are_refused_before_the_drain(site, edit, message):
    data = json.loads((site / "layout.json").read_text())
    edit(data["nodes"][NODE]["gpus"][0])
    (site / "layout.json").write_text(json.dumps(data))
    slurm = FakeSlurm(site / "slurm.conf")
    with pytest.raises(InputError, match=message):
        make(site, slurm).prepare()
    assert not [c for c in slurm.calls if c[0] != "show"]


def test_unknown_node_and_a_node_missing_from_the_layout(site):
    slurm = FakeSlurm(site / "slurm.conf", known=())
    with pytest.raises(InputError, match="unknown node h100-mig"):
        make(site, slurm).prepare()
    with pytest.raises(InputError, match="has no node gpu99"):
        read_layout(site / "layout.json", "gpu99")


def test_22_05_needs_a_slurmctld_restart_command(site, monkeypatch):
    monkeypatch.chdir(site)
    r = _cli(site, monkeypatch, NODE, "--layout", str(site / "layout.json"), "--dry-run")
    assert r.exit_code == 0
    from click.testing import CliRunner

    from slurm_gpushare.cli import main

    r = CliRunner().invoke(main, ["mig", "apply", NODE, "--layout", str(site / "layout.json"), "--config",
                                  str(site / "node.toml"), "--slurm-version", "22.05", "--dry-run"])
    assert r.exit_code == 2 and "give --restart-slurmctld CMD" in r.output, r.output


STUB_SCONTROL = """#!/bin/sh
# scontrol as slurmctld would answer for one node (show node), and 'not found' for any other: on stdout, as
# scontrol prints it
if [ "$1 $2" = "-d show" ] && [ "$4" = "h100-mig" ]; then
  echo "NodeName=h100-mig Arch=x86_64"
  echo "   Gres=gpu:h100:2(S:0),gpu:h100_4g.40gb:2(S:1),gpu:h100_1g.10gb:6(S:1),shard:158(S:0)"
  echo "   State=IDLE ThreadsPerCore=2"
  echo "   SlurmdStartTime=2026-12-02T01:00:00"
  exit 0
fi
echo "Node $4 not found"
exit 1
"""


def _cli(site: Path, monkeypatch, *args: str):
    from click.testing import CliRunner

    from slurm_gpushare.cli import main

    bin_dir = site / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(STUB_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    (site / "node.toml").write_text(f'version = 1\nrun_dir = "{site}/run"\nmachine = "{site}/{{node}}.json"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_CONF", str(site / "slurm.conf"))
    monkeypatch.setenv("GPUSHARE_NVML", f"fake:{site / f'{NODE}.json'}")
    return CliRunner().invoke(main, ["mig", "apply", *args, "--config", str(site / "node.toml"),
                                     "--slurm-version", "24.11"])


def test_cli_dry_run_prints_the_steps_and_changes_nothing(site, monkeypatch):
    before = {p.name: p.read_text() for p in site.iterdir() if p.is_file()}
    r = _cli(site, monkeypatch, NODE, "--layout", str(site / "layout.json"), "--dry-run")
    assert r.exit_code == 0, r.output
    assert "drain: scontrol update nodename=h100-mig state=drain reason=\"gpushare mig apply: to layout.json" \
        in r.output
    assert "mig: GPU 2: 4g.40gb@0 1g.10gb@4 1g.10gb@5 1g.10gb@6 -> 1g.10gb@0" in r.output
    assert {p.name: p.read_text() for p in site.iterdir() if p.is_file() and p.name in before} == before
    assert not (site / "run" / "mig-apply.json").exists()


def test_cli_unknown_node_is_one_line_and_exit_2(site, monkeypatch):
    data = json.loads((site / "layout.json").read_text())
    data["nodes"]["gpu99"] = data["nodes"][NODE]
    (site / "layout.json").write_text(json.dumps(data))
    r = _cli(site, monkeypatch, "gpu99", "--layout", str(site / "layout.json"), "--dry-run")
    assert r.exit_code == 2, r.output
    assert r.output.strip() == ("slurm-gpushare: error: node gpu99 is not in Slurm (scontrol show node: Node gpu99 "
                                "not found): give a node name from sinfo"), r.output


def test_a_slurm_command_s_error_quotes_stdout_when_stderr_is_empty(tmp_path):
    from slurm_gpushare.errors import SlurmError
    from slurm_gpushare.slurm import commands

    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\necho 'Node x not found'\nexit 1\n")
    tool.chmod(0o755)
    with pytest.raises(SlurmError) as e:
        commands.run([str(tool), "show"])
    assert str(e.value) == f"{tool} show exited 1: Node x not found"
    tool.write_text("#!/bin/sh\necho 'partial output'\necho 'the reason' >&2\nexit 1\n")
    with pytest.raises(SlurmError) as e:
        commands.run([str(tool), "show"])
    assert str(e.value) == f"{tool} show exited 1: the reason"


def test_stop_mps_stops_a_job_daemon_left_in_the_run_dir(site):
    import subprocess
    import time

    pipe = site / "run" / "jobs" / "77" / "mps" / "pipe"
    pipe.mkdir(parents=True)
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    # a process that looks like a job's MPS control daemon (its name and pipe directory)
    proc = subprocess.Popen(["bash", "-c", "exec -a nvidia-cuda-mps-control sleep 600"], env=env)
    try:
        from slurm_gpushare.node.jobdir import job_daemons

        deadline = time.monotonic() + 10
        while not any(d.pid == proc.pid for d in job_daemons(site / "run")):
            assert time.monotonic() < deadline, "the stand-in daemon is not found by process"
            time.sleep(0.05)
        make(site, FakeSlurm(site / "slurm.conf"))._stop_mps({})
        assert proc.wait(timeout=30) != 0  # signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_plan_keep_mig_mode_keeps_every_gpu_s_mode(tmp_path):
    from click.testing import CliRunner

    from slurm_gpushare.cli import main

    (tmp_path / "demand.csv").write_text("mem,count\n6G,10\n8G,8\n10G,4\n20G,1\ngpu,1\n")
    args = ["mig", "plan", str(MIXED), "--demand", str(tmp_path / "demand.csv")]
    rows = {}
    for flag in ((), ("--keep-mig-mode",)):
        r = CliRunner().invoke(main, [*args, *flag])
        assert r.exit_code == 0, r.output
        rows[flag] = [ln.split(None, 2)[2] for ln in r.output.splitlines() if ln.startswith("h100-mig ")]
    assert rows[()][0].endswith("7x 1g.10gb")  # free to turn MIG on
    assert [r.split("  ")[-1].strip() for r in rows[("--keep-mig-mode",)]] == \
        ["MIG off", "MIG off", "7x 1g.10gb", "7x 1g.10gb"]


# --- config files checked before the drain (hostlists, Include, global lines, missing, configless) ---


def _node_line_to_hostlist(site: Path) -> None:
    """slurm.conf: the node's line names it with the other node (NodeName=a100-nvb,h100-mig ...)."""
    conf = site / "slurm.conf"
    lines = [ln for ln in conf.read_text().splitlines() if not ln.startswith(f"NodeName={OTHER} ")]
    conf.write_text("\n".join(ln.replace(f"NodeName={NODE} ", f"NodeName={OTHER},{NODE} ") for ln in lines) + "\n")


def _gres_without_node_lines(site: Path, extra: str) -> None:
    conf = site / "gres.conf"
    keep = [ln for ln in conf.read_text().splitlines() if not ln.startswith(f"NodeName={NODE} ")]
    conf.write_text("\n".join([*keep, extra]) + "\n")


def _configless(site: Path) -> None:
    cache = site / "spool" / "conf-cache"
    cache.mkdir(parents=True)
    (site / "gres.conf").rename(cache / "gres.conf")


@pytest.mark.parametrize("edit, gres_conf, message", [
    (_node_line_to_hostlist, "gres.conf", r"slurm.conf:\d+: NodeName=a100-nvb,h100-mig names h100-mig among other "
                                          r"nodes: its Gres= is theirs too"),
    (lambda site: _gres_without_node_lines(site, "Include /etc/slurm/gres.d/nodes.conf"), "gres.conf",
     "gres.conf has no NodeName=h100-mig line but Include lines"),
    (lambda site: (site / "slurm.conf").write_text(
        "\n".join(ln for ln in (site / "slurm.conf").read_text().splitlines() if not ln.startswith(f"NodeName={NODE}"))
        + "\nInclude nodes.conf\n"), "gres.conf", "slurm.conf has no NodeName=h100-mig line but Include lines"),
    (lambda site: (site / "gres.conf").write_text(
        (site / "gres.conf").read_text().replace(f"NodeName={OTHER},", "XX").replace(
            f"NodeName={NODE} Name=gpu Type=h100 File=/dev/nvidia0", f"NodeName={NODE},{OTHER} Name=gpu Type=h100 "
            "File=/dev/nvidia0", 1)), "gres.conf", r"gres.conf:\d+: NodeName=h100-mig,a100-nvb names h100-mig among"),
    (lambda site: (site / "gres.conf").write_text((site / "gres.conf").read_text() + "Name=gpu File=/dev/nvidia7\n"),
     "gres.conf", r"gres.conf:\d+: Name=gpu without NodeName= applies to every node, h100-mig too"),
    (lambda site: (site / "gres.conf").unlink(), "gres.conf", r"gres.conf .*gres.conf does not exist \(a configless"),
    (_configless, "spool/conf-cache/gres.conf", "is slurmd's copy from slurmctld \\(configless\\)"),
])
def test_config_problems_are_refused_before_the_drain(site, edit, gres_conf, message):
    before = nvml_layout(site)
    slurm = FakeSlurm(site / "slurm.conf")
    edit(site)
    job = replace(make(site, slurm), gres_conf=site / gres_conf)
    with pytest.raises(InputError, match=message):
        job.prepare()
    assert [c[0] for c in slurm.calls] == ["show"]  # not drained
    assert nvml_layout(site) == before
    assert not (site / "run" / "mig-apply.json").exists()


def test_cli_dry_run_refuses_a_gres_conf_with_include_lines_in_one_line(site, monkeypatch):
    _gres_without_node_lines(site, "Include /etc/slurm/gres.d/nodes.conf")
    r = _cli(site, monkeypatch, NODE, "--layout", str(site / "layout.json"), "--gres-conf", str(site / "gres.conf"),
             "--dry-run")
    assert r.exit_code == 2, r.output
    assert "has no NodeName=h100-mig line but Include lines" in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


def test_a_name_line_with_nodename_later_is_the_node_s_and_other_global_lines_stay(site):
    conf = site / "gres.conf"
    first = node_lines(conf.read_text(), NODE)[0]
    fields = first.split()
    moved = " ".join([fields[1], fields[0], *fields[2:]])  # Name=gpu NodeName=h100-mig ...: the node's line too
    conf.write_text(conf.read_text().replace(first, moved) + "Name=nic File=/dev/infiniband/uverbs0\n")
    run_once(make(site, FakeSlurm(site / "slurm.conf")))
    text = conf.read_text()
    assert moved not in text
    assert [ln for ln in text.splitlines() if f"NodeName={NODE}" in ln] == node_lines(text, NODE)
    assert "Name=nic File=/dev/infiniband/uverbs0" in text.splitlines()
    assert_consistent(site)


# --- a rerun re-drains; the undo records before it resumes ---


def _killed_at(point: str, site: Path, slurm: FakeSlurm, monkeypatch, **kw) -> None:
    """Run apply until the test hook kills it at ``point``; the hook is off again afterwards."""
    monkeypatch.setenv(KILL_ENV, point)

    def kill():
        raise Killed(point)

    with pytest.raises(Killed):
        run_once(make(site, slurm, kill=kill, **kw))
    monkeypatch.delenv(KILL_ENV)


def test_a_rerun_after_a_kill_drains_again_and_waits_for_gpu_jobs_before_touching_gpus(site, monkeypatch):
    before = nvml_layout(site)
    slurm = FakeSlurm(site / "slurm.conf")
    _killed_at("wait-jobs", site, slurm, monkeypatch)
    slurm.reason = None  # an admin resumed the node meanwhile; a job got its GPUs
    slurm.jobs = [["9"], ["9"], []]
    slurm.calls.clear()
    seen = []
    slurm.on_call = lambda call: seen.append((call[0], nvml_layout(site) == before))
    run_once(make(site, slurm))
    kinds = [k for k, _ in seen if k != "show"]
    assert kinds[:4] == ["drain", "jobs", "jobs", "jobs"], kinds
    assert all(unchanged for k, unchanged in seen if k in ("drain", "jobs"))
    assert nvml_layout(site) == TARGET
    assert slurm.reason is None  # apply owns the drain it set again: resumed at the end


def test_a_rerun_whose_gpu_jobs_outlast_the_deadline_leaves_the_node_drained(site, monkeypatch):
    slurm = FakeSlurm(site / "slurm.conf")
    _killed_at("stop-mps", site, slurm, monkeypatch)
    before = nvml_layout(site)
    slurm.reason = None
    slurm.jobs = [["9"]] * 100
    with pytest.raises(ApplyError, match=r"runs GPU job\(s\) 9 again .* the node stays drained"):
        run_once(make(site, slurm, **_deadline_kw()))
    assert nvml_layout(site) == before
    assert (slurm.reason or "").startswith("gpushare mig apply:")
    assert (site / "run" / "mig-apply.json").exists()


def _deadline_kw() -> dict:
    """A deadline of 60 s and a clock that moves 30 s per reading."""
    clock = iter(range(0, 10_000, 30))
    return {"deadline_s": 60, "clock": lambda: float(next(clock))}


def test_killed_while_undoing_at_the_deadline_the_rerun_finishes_the_undo(site, monkeypatch):
    before = nvml_layout(site)
    slurm = FakeSlurm(site / "slurm.conf", jobs=[["41"]] * 100)
    _killed_at("undo", site, slurm, monkeypatch, **_deadline_kw())
    saved = json.loads((site / "run" / "mig-apply.json").read_text())
    assert saved["goal"] == "undone"  # recorded before the resume
    assert (slurm.reason or "").startswith("gpushare mig apply:")  # still drained, and the state file says why
    slurm.jobs = []  # the jobs ended meanwhile: still, the rerun only finishes the undo
    with pytest.raises(ApplyError, match="had given up waiting .* drain undone, layout unchanged"):
        run_once(make(site, slurm))
    assert slurm.reason is None
    assert nvml_layout(site) == before
    assert not (site / "run" / "mig-apply.json").exists()


def test_killed_right_after_the_undo_s_resume_a_rerun_does_not_touch_the_resumed_node(site):
    before = nvml_layout(site)
    slurm = FakeSlurm(site / "slurm.conf", jobs=[["41"]] * 100)
    resume = slurm.resume

    def resume_then_die(node):
        resume(node)
        raise Killed("after resume")

    slurm.resume = resume_then_die  # type: ignore[method-assign]
    with pytest.raises(Killed):
        run_once(make(site, slurm, **_deadline_kw()))
    assert slurm.reason is None  # resumed
    slurm.resume = resume  # type: ignore[method-assign]
    slurm.jobs = []
    with pytest.raises(ApplyError, match="had given up waiting"):
        run_once(make(site, slurm))
    assert nvml_layout(site) == before  # a resumed node's GPUs were never changed
    assert not [c for c in slurm.calls if c[0] in ("drain", "stop-slurmd")][1:]
    assert not (site / "run" / "mig-apply.json").exists()


# --- one apply at a time ---


def test_a_second_apply_of_the_node_is_refused_naming_the_holder(site):
    job = make(site, FakeSlurm(site / "slurm.conf"))
    with job.locked() as path:
        assert path.read_text().strip() == str(os.getpid())
        with pytest.raises(InputError, match=rf"another mig apply of h100-mig is running \(pid {os.getpid()}"):
            with make(site, FakeSlurm(site / "slurm.conf")).locked():
                pass
    with make(site, FakeSlurm(site / "slurm.conf")).locked():  # released with the first
        pass


def test_cli_second_apply_exits_2_while_another_holds_the_lock(site, monkeypatch):
    import subprocess
    import time

    lock = site / "run" / "mig-apply.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX)\nos.write(fd, f'{os.getpid()}\\n'.encode())\n"
                               "print('held', flush=True)\ntime.sleep(600)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = nvml_layout(site)
        start = time.monotonic()
        r = _cli(site, monkeypatch, NODE, "--layout", str(site / "layout.json"))
        assert r.exit_code == 2, r.output
        assert f"another mig apply of h100-mig is running (pid {holder.pid}" in r.output
        assert time.monotonic() - start < 30  # refused, not waited for
        assert nvml_layout(site) == before
    finally:
        holder.kill()
        holder.wait()


# --- a symlinked gres.conf stays a link ---


def test_a_symlinked_gres_conf_is_written_through_to_its_target(site):
    real_dir = site / "shared-etc"
    real_dir.mkdir()
    (site / "gres.conf").rename(real_dir / "gres.conf")
    (real_dir / "gres.conf").chmod(0o640)
    (site / "gres.conf").symlink_to(real_dir / "gres.conf")
    run_once(make(site, FakeSlurm(site / "slurm.conf")))
    assert (site / "gres.conf").is_symlink()
    assert os.readlink(site / "gres.conf") == str(real_dir / "gres.conf")
    assert ((real_dir / "gres.conf").stat().st_mode & 0o777) == 0o640
    assert not [p.name for p in real_dir.iterdir() if p.name != "gres.conf"]  # no temporary file left
    assert_consistent(site)


# --- malformed layouts: one line, exit 2 ---


def _layout_edit(site: Path, edit) -> Path:
    data = json.loads((site / "layout.json").read_text())
    edit(data)
    (site / "bad.json").write_text(json.dumps(data))
    return site / "bad.json"


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(nodes=[NODE]), "'nodes' is not a mapping"),
    (lambda d: d["nodes"].update({NODE: [1, 2]}), "'gpus' is not a list"),
    (lambda d: d["nodes"][NODE]["gpus"].__setitem__(0, [2, True]), "GPU entry 0 is not a mapping"),
    (lambda d: d["nodes"][NODE]["gpus"][0].update(index="two"), "index 'two' is not a whole number"),
    (lambda d: d["nodes"][NODE]["gpus"][0].update(index=2.5), "index 2.5 is not a whole number"),
    (lambda d: d["nodes"][NODE]["gpus"][0].update(mig_enabled="false"), "mig_enabled 'false' is not true or false"),
    (lambda d: d["nodes"][NODE]["gpus"][0].update(instances={"a": 1}), "'instances' is not a list"),
    (lambda d: d["nodes"][NODE]["gpus"][0].update(instances=SEVEN * 3), "21 instances, more than any GPU holds"),
    (lambda d: d["nodes"][NODE]["gpus"][0]["instances"][0].update(start=-1), "start -1 is out of range"),
    (lambda d: d["nodes"][NODE]["gpus"][0]["instances"][0].update(profile=7), "profile 7 is not a MIG profile name"),
    (lambda d: d["nodes"][NODE]["gpus"].append(d["nodes"][NODE]["gpus"][0]), "GPU 2 is listed twice"),
])
def test_malformed_layout_json_is_one_input_error(site, edit, message):
    with pytest.raises(InputError, match=message):
        read_layout(_layout_edit(site, edit), NODE)


@pytest.mark.parametrize("entries, message", [
    ("[1, 2]", "entry 0 is not a mapping"),
    ("{devices: [2]}", "the config is not a list"),
    ("[{devices: [2], mig-enabled: true, mig-devices: [1g.10gb]}]", "mig-devices is not a mapping"),
    ("[{devices: [2], mig-enabled: true, mig-devices: {1g.10gb: 100000000}}]",
     "count of 1g.10gb 100000000 is out of range 0..16"),
    ("[{devices: [2], mig-enabled: true, mig-devices: {1g.10gb: -1}}]", "count of 1g.10gb -1 is out of range"),
    ("[{devices: [2], mig-enabled: true, mig-devices: {1g.10gb: 1.5}}]", "count of 1g.10gb 1.5 is not a whole"),
    ("[{devices: 2, mig-enabled: true, mig-devices: {1g.10gb: 1}}]", "devices 2 is not a list of GPU indices"),
    ("[{devices: [2], mig-enabled: 'yes', mig-devices: {1g.10gb: 1}}]", "mig-enabled 'yes' is not true or false"),
    ("[{devices: [2], mig-enabled: true, mig-devices: {1g.10gb: 10, 2g.20gb: 10}}]",
     "20 instances per GPU, more than any GPU holds"),
    ("[{devices: [2], mig-enabled: true}, {devices: [2], mig-enabled: true}]", "GPU 2 is in two entries"),
])
def test_malformed_mig_parted_configs_are_one_input_error(site, entries, message):
    (site / "bad.yaml").write_text(f"version: v1\nmig-configs:\n  gpushare-{NODE}: {entries}\n")
    with pytest.raises(InputError, match=message):
        read_layout(site / "bad.yaml", NODE)


@pytest.mark.parametrize("text", [
    json.dumps({"version": 1, "nodes": {NODE: {"gpus": [[2, True]]}}}),
    "mig-configs:\n  gpushare-h100-mig: [{devices: [2], mig-enabled: true, mig-devices: [x]}]\n",
    "mig-configs: [1]\n",
])
def test_cli_malformed_layout_is_one_line_and_exit_2(site, monkeypatch, text):
    (site / "bad.layout").write_text(text)
    r = _cli(site, monkeypatch, NODE, "--layout", str(site / "bad.layout"), "--dry-run")
    assert r.exit_code == 2, (r.output, r.exception)
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output, r.output


DEEP = 100_000


@pytest.mark.parametrize(("name", "text", "message"), [
    # nested deeper than the parsers go: one error, no RecursionError
    ("L.json", "[" * DEEP + "]" * DEEP, "L.json: JSON nested too deeply"),
    ("L.yaml", "[" * DEEP + "]" * DEEP, "L.yaml: YAML nested too deeply"),
    ("L.layout", '{"version": 1, "nodes": ' + "[" * DEEP, "L.layout: JSON nested too deeply"),
    # the kind is judged from the name, else a first "{": the error is that parser's, on one line
    ("L.json", '{"version": 1,\n "nodes": {]}', "L.json: not valid JSON: line 2 column 12 (Expecting property name"),
    ("L.layout", '\n  {"version": 1 "nodes": {}}',
     "L.layout: not valid JSON: line 2 column 17 (Expecting ',' delimiter)"),
    ("L.yaml", "version: v1\nmig-configs:\n  gpushare-h100-mig: [{devices: [2]\n  x: 1\n",
     "L.yaml: not valid YAML: line 4 column 3 (expected ',' or '}', but got '<scalar>')"),
    ("L.yml", "version: v1\nmig-configs: a: b\n", "L.yml: not valid YAML: line 2 column 15 (mapping values are not "
     "allowed here)"),
    ("L.conf", "mig-configs:\n\t- x\n", "L.conf: not valid YAML: line 2 column 1 (found character '\\t' that cannot "
     "start any token)"),
])
def test_unreadable_layouts_are_one_line(site, name, text, message):
    (site / name).write_text(text)
    with pytest.raises(InputError) as e:
        read_layout(site / name, NODE)
    assert str(e.value).startswith(f"--layout {site / message}"), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(version=2), "version 2 is not a layout version this slurm-gpushare reads (it reads 1)"),
    (lambda d: d.pop("version"), "version None is not a layout version this slurm-gpushare reads (it reads 1)"),
    (lambda d: d.update(version="1"), "version '1' is not a layout version"),
    (lambda d: d["nodes"][NODE].update(gpus=[]), "node h100-mig: 'gpus' is empty: the layout changes no GPU"),
])
def test_layouts_of_another_version_or_of_no_gpu_are_refused(site, edit, message):
    with pytest.raises(InputError) as e:
        read_layout(_layout_edit(site, edit), NODE)
    assert message in str(e.value), str(e.value)


def test_a_mig_parted_config_of_another_version_or_no_gpu_is_refused(site):
    entry = "[{devices: [2], mig-enabled: true}]"
    (site / "v2.yaml").write_text(f"version: v2\nmig-configs:\n  gpushare-{NODE}: {entry}\n")
    with pytest.raises(InputError, match="version 'v2' is not a mig-parted config version this slurm-gpushare reads"):
        read_layout(site / "v2.yaml", NODE)
    (site / "none.yaml").write_text(f"version: v1\nmig-configs:\n  gpushare-{NODE}: []\n")
    with pytest.raises(InputError, match="gpushare-h100-mig: the config is empty: the layout changes no GPU"):
        read_layout(site / "none.yaml", NODE)


def test_a_profile_id_that_contradicts_the_profile_name_is_refused_naming_both(site):
    data = json.loads((site / "layout.json").read_text())
    data["nodes"][NODE]["gpus"][1]["instances"][0]["profile_id"] = 5000
    (site / "layout.json").write_text(json.dumps(data))
    slurm = FakeSlurm(site / "slurm.conf")
    with pytest.raises(InputError) as e:
        make(site, slurm).prepare()
    assert "GPU 3: profile_id 5000 is not the id of 4g.40gb (5 on NVIDIA H100" in str(e.value), str(e.value)
    assert not [c for c in slurm.calls if c[0] != "show"]
    data["nodes"][NODE]["gpus"][1]["instances"][0]["profile_id"] = "5"
    (site / "layout.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="GPU 3: profile_id '5' is not a whole number"):
        read_layout(site / "layout.json", NODE)


@pytest.mark.parametrize("edit", [
    lambda d: d.update(version=2),
    lambda d: d["nodes"][NODE].update(gpus=[]),
    lambda d: d["nodes"][NODE]["gpus"][1]["instances"][0].update(profile_id=5000),
])
def test_cli_dry_run_refuses_what_apply_would_refuse(site, monkeypatch, edit):
    bad = _layout_edit(site, edit)
    r = _cli(site, monkeypatch, NODE, "--layout", str(bad), "--dry-run")
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and "drain" not in r.output, r.output


@pytest.mark.parametrize("flags", [
    # responding at the first look, then not for a few seconds after the slurmctld restart (as seen on 22.05)
    ["", "NR", "NR", ""],
    ["", "*", "", "*", ""],
])
def test_success_waits_until_the_node_responds_steadily(site, flags):
    slurm = FakeSlurm(site / "slurm.conf")
    slurm.after_start = list(flags)
    seen_at_resume = []
    slurm.on_call = lambda call: seen_at_resume.append(list(slurm.after_start)) if call[0] == "resume" else None
    run_once(make(site, slurm))
    assert seen_at_resume == [[]], seen_at_resume  # every not-responding look came before the resume
    assert not slurm.reason


def test_a_node_that_does_not_respond_stays_drained_and_apply_says_so(site):
    slurm = FakeSlurm(site / "slurm.conf")
    slurm.after_start = ["NR"] * 1000
    clock = iter(range(0, 100000, 1))
    with pytest.raises(apply_mod.ApplyError) as e:
        run_once(make(site, slurm, slurm_timeout_s=30, clock=lambda: float(next(clock))))
    assert "after 30 s" in str(e.value) and "State=IDLE+DRAIN+NOT_RESPONDING" in str(e.value), str(e.value)
    assert slurm.reason and slurm.reason.startswith("gpushare mig apply")
    assert not [c for c in slurm.calls if c[0] == "resume"]


def test_a_node_that_stops_responding_after_registering_stays_drained(site):
    slurm = FakeSlurm(site / "slurm.conf")
    slurm.after_start = [""] + ["NR", ""] * 1000  # never three responding looks in a row
    clock = iter(range(0, 100000, 1))
    with pytest.raises(apply_mod.ApplyError) as e:
        run_once(make(site, slurm, slurm_timeout_s=30, clock=lambda: float(next(clock))))
    assert "no h100-mig responding on 3 polls in a row (State= without NOT_RESPONDING) after 30 s" in str(e.value)
    assert not [c for c in slurm.calls if c[0] == "resume"]
