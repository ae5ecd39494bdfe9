"""mig apply against real slurmctld and slurmd (a dev cluster of its own: the MIG node and a node it must not
touch): a job on the other node keeps running, the MIG node gets the new layout, gres.conf matches what
NVML (the fake, from the node's description file) reports, slurmctld shows the new GRES, and jobs
submitted afterwards get the new slices; then apply is SIGKILLed (a real process, killed by its PID
through the test hook ``GPUSHARE_MIG_APPLY_KILL_AFTER``) at each step and rerun."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gpushare.gresconf.render import generate_node_gres
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.hardware.ports import open_nvml
from slurm_gpushare.mig.apply import KILL_ENV, REASON_PREFIX
from slurm_gpushare.mig.demand import Request
from slurm_gpushare.mig.files import with_instances
from slurm_gpushare.mig.layout import current_layout
from slurm_gpushare.mig.output import layout_json
from slurm_gpushare.mig.plan import plan_layout
from slurm_gpushare.slurm.node import gres_matches, parse_node
from slurm_gpushare.slurm.nodegres import GresOptions
from slurm_gpushare.slurm.release import RECONFIGURE_RESTARTS, Release
from slurm_gpushare_dev.cluster import DevCluster
from tests.conftest import TEST_PORT, job_trail, private_cluster, wait_until

pytestmark = pytest.mark.slurm

MIG = "h100-mig"
OTHER = "rtx4090-pcie"
NODES = {MIG: "4x-h100-mig-mixed.json", OTHER: "8x-rtx4090-pcie.json"}

#: stop one daemon of the dev cluster by its pid file as systemd stops a unit (Debian's slurmd.service keeps
#: systemd's TimeoutStopSec, 90 s): SIGTERM, then SIGKILL if it still runs after @GRACE@ s (a zombie is gone).
#: A slurmd of 24.11 once stayed past apply's 120 s for its site command in CI, so a SIGKILL is written to
#: stop.log beside the script, with the state of each thread, and the module warns with it.
#: Start it again as a site would (it daemonizes).
STOP = """\
#!/bin/sh
pid=$(cat "@ROOT@/run/$1.pid" 2>/dev/null)
alive() {
  state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -c1)
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}
[ -n "$pid" ] && alive || exit 0
kill "$pid"
deadline=$(( $(date +%s) + @GRACE@ ))
killed=""
while alive; do
  if [ -z "$killed" ] && [ "$(date +%s)" -ge "$deadline" ]; then
    killed=yes
    {
      echo "$(date +%FT%T) $1 (pid $pid) still running @GRACE@ s after SIGTERM: SIGKILL; its threads:"
      for t in /proc/"$pid"/task/*; do
        echo "  $(cat "$t/comm") $(sed 's/.*) //' "$t/stat" | cut -c1) $(cat "$t/wchan")"
      done
    } >> "@ROOT@/../stop.log" 2>&1
    kill -9 "$pid"
  fi
  sleep 0.1
done
"""
#: seconds :data:`STOP` waits after SIGTERM (systemd's default is 90; apply gives a site command 120)
STOP_GRACE_S = 60
START_SLURMD = """\
#!/bin/sh
exec env SLURM_CONF="@ROOT@/etc/slurm.conf" slurmd -N "$1"
"""
RESTART_SLURMCTLD = """\
#!/bin/sh
"@ROOT@/../stop" slurmctld
exec env SLURM_CONF="@ROOT@/etc/slurm.conf" slurmctld
"""


def site_scripts(c: DevCluster, root: Path) -> None:
    """Write the site's commands (``stop``, ``start-slurmd``, ``restart-slurmctld``) of cluster ``c`` into
    ``root`` and set ``c.scripts`` to it (the MIG tests of this module and of tests/test_mig_acceptance_slurm.py)."""
    for name, text in (("stop", STOP), ("start-slurmd", START_SLURMD), ("restart-slurmctld", RESTART_SLURMCTLD)):
        (root / name).write_text(text.replace("@ROOT@", str(c.root)).replace("@GRACE@", str(STOP_GRACE_S)))
        (root / name).chmod(0o755)
    c.scripts = root  # type: ignore[attr-defined]


def warn_of_kills(root: Path) -> None:
    """Warn with ``stop.log`` when :data:`STOP` had to SIGKILL a daemon (the test itself goes on)."""
    if (root / "stop.log").exists():
        warnings.warn(f"a daemon needed SIGKILL to stop:\n{(root / 'stop.log').read_text()}", stacklevel=1)


@pytest.fixture(scope="module")
def mc():
    for c, root in private_cluster("gps-migapply-", TEST_PORT + 700, NODES):
        site_scripts(c, root)
        c.layouts = _layouts(c, root)  # type: ignore[attr-defined]
        yield c
        warn_of_kills(root)


def _layouts(c: DevCluster, root: Path) -> dict[str, Path]:
    """Two layouts of the MIG node: 'small', mig plan's for the whole node with MIG modes kept and a demand of
    10 GB requests (7x 1g.10gb on each MIG GPU), and 'today' (the packaged 4g.40gb + 3x 1g.10gb)."""
    machine = Machine.load(c.root / "machines" / f"{MIG}.json")
    mig_gpus = replace(machine, gpus=tuple(g for g in machine.gpus if g.mig_enabled))
    small = plan_layout([machine], [Request(mem_mib=10 * 1024, weight=14)], keep_mig_mode=True)
    out = {"small": root / "small.json", "today": root / "today.json"}
    out["small"].write_text(layout_json(small))
    doc = {"version": 1, "nodes": {MIG: {"gpus": [
        {"index": g.index, "name": g.name, "mig_enabled": True,
         "instances": [{"profile": i.profile, "profile_id": next(p.profile_id for p in g.mig_profiles
                                                                   if p.name == i.profile), "start": i.start}
                       for i in g.mig_instances]} for g in mig_gpus.gpus]}}}
    out["today"].write_text(json.dumps(doc))
    return out


def _apply(c: DevCluster, layout: Path, *, kill_after: str | None = None, deadline: int = 300):
    env = {**c.env, "GPUSHARE_NVML": f"fake:{c.root}/machines/{MIG}.json"}
    env.pop(KILL_ENV, None)
    if kill_after:
        env[KILL_ENV] = kill_after
    argv = [sys.executable, "-m", "slurm_gpushare", "mig", "apply", MIG, "--layout", str(layout),
            "--config", str(c.node_config), "--device-dir", str(c.device_dir(MIG)),
            "--stop-slurmd", f"{c.scripts}/stop slurmd-{{node}}", "--start-slurmd",  # type: ignore[attr-defined]
            f"{c.scripts}/start-slurmd {{node}}", "--deadline", str(deadline)]  # type: ignore[attr-defined]
    if Release.parse(c.slurm_release or "22.05") < RECONFIGURE_RESTARTS:  # later: the default, scontrol reconfigure
        argv += ["--restart-slurmctld", f"{c.scripts}/restart-slurmctld"]  # type: ignore[attr-defined]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(p: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out + err


def _node(c: DevCluster, node: str):
    return parse_node(subprocess.run(["scontrol", "show", "node", node], env=c.env, capture_output=True,
                                     text=True).stdout)


def _state_file(c: DevCluster) -> Path:
    return Path(c.node_run_dir.replace("{node}", MIG)) / "mig-apply.json"


def _layout_now(c: DevCluster) -> dict[int, list[tuple[str, int]]]:
    with open_nvml(f"fake:{c.root}/machines/{MIG}.json") as port:
        return {i: sorted((p.profile, p.start) for p in v) for i, v in current_layout(port, [2, 3]).items()}


def _wanted(layout: Path) -> dict[int, list[tuple[str, int]]]:
    doc = json.loads(layout.read_text())["nodes"][MIG]["gpus"]
    return {g["index"]: sorted((i["profile"], i["start"]) for i in g["instances"]) for g in doc if g["mig_enabled"]}


def _consistent(c: DevCluster) -> None:
    """gres.conf's and slurm.conf's lines of the MIG node are those rendered from what NVML reports now, and
    slurmctld shows that Gres=."""
    machine = Machine.load(c.root / "machines" / f"{MIG}.json")
    with open_nvml(f"fake:{c.root}/machines/{MIG}.json") as port:
        machine = with_instances(machine, port)
    release = Release.parse(c.slurm_release) if c.slurm_release else None
    want = generate_node_gres(machine, MIG, GresOptions(device_dir=str(c.device_dir(MIG)), release=release))
    gres_conf = (c.root / "etc" / "gres.conf").read_text()
    assert [ln for ln in gres_conf.splitlines() if ln.startswith(f"NodeName={MIG} ")] == \
        [r.render(MIG) for r in want.records]
    conf = next(ln for ln in c.slurm_conf.read_text().splitlines() if ln.startswith(f"NodeName={MIG} "))
    assert f"Gres={want.gres_value}" in conf.split()
    assert gres_matches(_node(c, MIG).gres, want.gres_value), (_node(c, MIG).gres, want.gres_value)


def _sbatch(c: DevCluster, *args: str, wrap: str) -> str:
    p = subprocess.run(["sbatch", "--parsable", *args, "--wrap", wrap], env=c.env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0]


def _job(c: DevCluster, job: str) -> dict[str, str]:
    text = subprocess.run(["scontrol", "show", "job", job], env=c.env, capture_output=True, text=True).stdout
    return dict(kv.split("=", 1) for kv in text.split() if "=" in kv)


def _ended(c: DevCluster, job: str) -> str | None:
    state = _job(c, job).get("JobState", "")
    return state if state not in ("", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING") else None


def test_apply_changes_the_mig_node_only_and_new_jobs_get_the_new_slices(mc):
    c = mc
    small = c.layouts["small"]  # type: ignore[attr-defined]
    gate = c.root / f"gate-{os.urandom(3).hex()}"
    other = _sbatch(c, "-w", OTHER, "--gres=gpu:1", wrap=f"while [ ! -e {gate}.other ]; do sleep 0.2; done")
    on_mig = _sbatch(c, "-w", MIG, "--gres=gpu:h100_1g.10gb:1", wrap=f"while [ ! -e {gate} ]; do sleep 0.2; done")
    try:
        wait_until(lambda: _job(c, other).get("JobState") == "RUNNING" and _job(c, on_mig).get("JobState") ==
                   "RUNNING", "both jobs running")
        other_start = _job(c, other)["StartTime"]
        p = _apply(c, small)
        # apply drains the MIG node and waits for its job
        wait_until(lambda: (_node(c, MIG).reason or "").startswith(REASON_PREFIX) and _state_file(c).exists()
                   and json.loads(_state_file(c).read_text()).get("step") == "wait-jobs", "apply waiting for jobs",
                   describe=lambda: f"{_node(c, MIG)}")
        assert _layout_now(c) != _wanted(small)
        gate.touch()
        rc, out = _finish(p)
        assert rc == 0, out
        assert _layout_now(c) == _wanted(small)
        _consistent(c)
        n = _node(c, MIG)
        assert not n.drained, n
        # the other node's job was never touched
        assert _job(c, other)["JobState"] == "RUNNING" and _job(c, other)["StartTime"] == other_start
        assert _ended(c, on_mig) == "COMPLETED"
        # 7 slices of 1g.10gb on one GPU-node: only the new layout has them (the old one had 6)
        with open_nvml(f"fake:{c.root}/machines/{MIG}.json") as port:
            uuids = {i.uuid for g in (2, 3) for i in port.gpu_instances(g)}
        out_file = c.root / f"out-{os.urandom(3).hex()}"
        seven = _sbatch(c, "-w", MIG, "--gres=gpu:h100_1g.10gb:7", f"--output={out_file}",
                        wrap='echo "CVD=$CUDA_VISIBLE_DEVICES"')
        assert wait_until(lambda: _ended(c, seven), f"job {seven}") == "COMPLETED"
        cvd = re.search(r"CVD=(\S*)", out_file.read_text()).group(1).split(",")  # type: ignore[union-attr]
        assert len(cvd) == 7 and set(cvd) <= uuids, (cvd, uuids)
        # gpushare requests of 10G slices, 7 on one node: the filter service takes the new layout once its
        # inventory is refreshed (on its next interval after slurmctld shows the node's new GRES)
        out_file2 = c.root / f"out-{os.urandom(3).hex()}"
        argv = ["sbatch", "--parsable", "-w", MIG, "--gres=gpushare:mem=10G+mode=mig:7", f"--output={out_file2}",
                "--wrap", 'echo "CVD=$CUDA_VISIBLE_DEVICES"']
        tried: list[str] = []

        def submitted() -> str | None:
            p = subprocess.run(argv, env=c.env, capture_output=True, text=True)
            tried.append(p.stderr.strip())
            return p.stdout.strip().split(";")[0] if p.returncode == 0 else None

        share = wait_until(submitted, "the gpushare job accepted", describe=lambda: tried[-1])
        assert wait_until(lambda: _ended(c, share), f"job {share}") == "COMPLETED", _job(c, share)
        cvd2 = re.search(r"CVD=(\S*)", out_file2.read_text()).group(1).split(",")  # type: ignore[union-attr]
        assert len(cvd2) == 7 and set(cvd2) <= uuids
    finally:
        gate.touch()
        Path(f"{gate}.other").touch()
        wait_until(lambda: _ended(c, other), f"job {other} to end")


def _other_layout(c: DevCluster) -> Path:
    """The layout of the two that the MIG node is not in now."""
    layouts = c.layouts  # type: ignore[attr-defined]
    return layouts["today"] if _layout_now(c) == _wanted(layouts["small"]) else layouts["small"]


def _waiting_for(c: DevCluster) -> list[str] | None:
    try:
        return json.loads(_state_file(c).read_text()).get("waiting_for") or None
    except (OSError, ValueError):
        return None


@pytest.mark.parametrize("ask", [("--gpus=1",), ("--ntasks=1", "--gpus-per-task=1"), ("--gpus-per-node=1",)])
def test_a_job_that_asked_gpus_in_any_form_holds_the_apply_until_it_ends(mc, ask):
    """--gpus and --gpus-per-task leave squeue's tres-per-node (%b) empty: apply must see the GPUs slurmctld
    allocated to the job on the node."""
    c = mc
    target, before = _other_layout(c), _layout_now(c)
    gate = c.root / f"gate-{os.urandom(3).hex()}"
    job = _sbatch(c, "-w", MIG, *ask, wrap=f"while [ ! -e {gate} ]; do sleep 0.2; done")
    p = None
    try:
        wait_until(lambda: _job(c, job).get("JobState") == "RUNNING", f"job {job} running")
        p = _apply(c, target)
        assert wait_until(lambda: _waiting_for(c), "apply waiting for the job",
                          describe=lambda: f"apply exited {p.poll()}" if p and p.poll() is not None else
                          _state_file(c).read_text() if _state_file(c).exists() else "no state file") == [job]
        assert p.poll() is None and _layout_now(c) == before
        gate.touch()
        rc, out = _finish(p)
        assert rc == 0, out
        assert _ended(c, job) == "COMPLETED", job_trail(c, job)
        assert _layout_now(c) == _wanted(target)
        _consistent(c)
    finally:
        gate.touch()
        if p is not None and p.poll() is None:
            _finish(p)
        wait_until(lambda: _ended(c, job), f"job {job} to end")


KILL_POINTS = ("drain", "wait-jobs", "stop-mps", "mig-change:3", "mig", "files", "slurm", "resume")


def test_killed_at_each_step_a_rerun_ends_resumed_and_consistent(mc):
    c = mc
    for point in KILL_POINTS:
        target = _other_layout(c)
        before = _layout_now(c)
        p = _apply(c, target, kill_after=point)
        rc, out = _finish(p)
        assert rc == -9, f"{point}: {rc} {out}"  # SIGKILL by its own PID
        state = json.loads(_state_file(c).read_text())
        assert state["node"] == MIG and state["reason"].startswith(REASON_PREFIX), state
        n = _node(c, MIG)
        if point != "resume":  # drained, and the state file says why
            assert n.drained and n.reason == state["reason"], (point, n)
        rc, out = _finish(_apply(c, target))
        assert rc == 0, f"rerun after a kill at {point}: {out}"
        assert not _state_file(c).exists()
        assert _layout_now(c) in (_wanted(target), before)
        assert _layout_now(c) == _wanted(target)
        _consistent(c)
        wait_until(lambda: not _node(c, MIG).drained, f"{MIG} resumed after the kill at {point}")
