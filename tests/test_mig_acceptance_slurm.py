"""MIG layouts that follow demand, end to end on a dev cluster of its own (the MIG node and a node it must not
touch): a trace of gpushare jobs, most of them 5-10 GB, runs on the MIG node; the Epilogs spool its records
and ``accounting ingest`` loads them; ``mig plan --store`` proposes, from that accounting, a layout that strands
less memory than today's (both numbers printed and compared here); ``mig apply`` puts it on the node while a
job on the other node keeps running; and gpushare jobs submitted afterwards run on the new slices, more of
them at once than today's layout holds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_gpushare.hardware.ports import open_nvml
from tests.conftest import DEADLINE, TEST_PORT, private_cluster, wait_until
from tests.test_mig_apply_slurm import (
    MIG,
    NODES,
    OTHER,
    _apply,
    _consistent,
    _ended,
    _finish,
    _job,
    _layout_now,
    _node,
    _sbatch,
    _wanted,
    site_scripts,
    warn_of_kills,
)

pytestmark = pytest.mark.slurm

CLI = [sys.executable, "-m", "slurm_gpushare"]
#: the trace: (memory asked, seconds it runs); 11 of its 12 requests ask 5-10 GB
TRACE = [("5G", 4), ("6G", 4), ("8G", 4), ("10G", 4), ("7G", 4), ("5G", 4), ("9G", 4), ("6G", 4), ("8G", 4),
         ("10G", 4), ("5G", 4), ("30G", 4)]


@pytest.fixture(scope="module")
def mc():
    for c, root in private_cluster("gps-migaccept-", TEST_PORT + 800, NODES, extra_partitions={"mig": (MIG,)}):
        site_scripts(c, root)
        c.work = root  # type: ignore[attr-defined]
        yield c
        warn_of_kills(root)


def _gpushare(c, mem: str, *args: str, wrap: str) -> str:
    """Submit a gpushare job to the MIG node's partition (the filter service may be between inventories)."""
    argv = ["sbatch", "--parsable", "-p", "mig", f"--gres=gpushare:mem={mem}", *args, "--wrap", wrap]
    tried: list[str] = []

    def submitted() -> str | None:
        p = subprocess.run(argv, env=c.env, capture_output=True, text=True)
        tried.append(p.stderr.strip())
        return p.stdout.strip().split(";")[0] if p.returncode == 0 else None

    return wait_until(submitted, f"gpushare mem={mem} accepted", describe=lambda: tried[-1])


def _mig_uuids(c) -> set[str]:
    with open_nvml(f"fake:{c.root}/machines/{MIG}.json") as port:
        return {i.uuid for g in range(port.device_count()) for i in port.gpu_instances(g)}


def test_a_plan_from_the_accounting_of_a_trace_is_applied_and_serves_more_jobs_at_once(mc):
    c = mc
    work: Path = c.work  # type: ignore[attr-defined]
    db = work / "accounting.db"
    # 1. the trace, all submitted at once: it queues on today's slices
    jobs = [_gpushare(c, mem, wrap=f"sleep {secs}") for mem, secs in TRACE]
    for j in jobs:
        assert wait_until(lambda j=j: _ended(c, j), f"trace job {j}", DEADLINE * 4) == "COMPLETED", _job(c, j)

    # 2. its accounting
    def ingested() -> bool:
        p = subprocess.run([*CLI, "accounting", "ingest", "--spool", str(c.accounting_spool), "--db", str(db)],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        r = subprocess.run([*CLI, "report", "--db", str(db), "--by", "job", "--format", "json"],
                           capture_output=True, text=True)
        return r.returncode == 0 and set(jobs) <= {str(row["job"]) for row in json.loads(r.stdout)["rows"]}

    wait_until(ingested, "the trace's records ingested")

    # 3. the plan, from that accounting, against today's layout of the node
    out_dir = work / "plan"
    p = subprocess.run([*CLI, "mig", "plan", str(c.root / "machines" / f"{MIG}.json"), "--store", str(db),
                        "--partition", "mig", "--keep-mig-mode", "--output-dir", str(out_dir)],
                       capture_output=True, text=True, env=c.env)
    assert p.returncode == 0, p.stdout + p.stderr
    print(p.stdout)  # the numbers, in the test's output
    stranded = {k: int(v) for k, v in re.findall(r"^(today|plan):\n(?:  .*\n)*?  stranded memory +\S+ \((\d+) MiB\)",
                                                 p.stdout, re.M)}
    assert set(stranded) == {"today", "plan"} and stranded["plan"] < stranded["today"], p.stdout
    layout = out_dir / "layout.json"
    today = _layout_now(c)
    assert _wanted(layout) != today, p.stdout

    # 4. applied while a job runs on the other node
    gate = work / f"gate-{os.urandom(3).hex()}"
    other = _sbatch(c, "-w", OTHER, "--gres=gpu:1", wrap=f"while [ ! -e {gate} ]; do sleep 0.2; done")
    try:
        wait_until(lambda: _job(c, other).get("JobState") == "RUNNING", "the other node's job running")
        other_start = _job(c, other)["StartTime"]
        rc, out = _finish(_apply(c, layout))
        assert rc == 0, out
        assert _layout_now(c) == _wanted(layout)
        _consistent(c)
        assert not _node(c, MIG).drained
        assert _job(c, other)["JobState"] == "RUNNING" and _job(c, other)["StartTime"] == other_start
    finally:
        gate.touch()
    # 5. gpushare jobs of the trace's sizes afterwards: on the new slices, more at once than today's could hold
    uuids = _mig_uuids(c)
    # a 6G request is given the smallest slice that holds it, 1g.10gb (docs/request-syntax.md)
    small = sum(1 for g in _wanted(layout).values() for prof, _s in g if prof == "1g.10gb")
    assert small > sum(1 for g in today.values() for prof, _s in g if prof == "1g.10gb"), (today, layout)
    hold = work / f"hold-{os.urandom(3).hex()}"
    outs = [work / f"out-{i}-{os.urandom(2).hex()}" for i in range(small)]
    after = [_gpushare(c, "6G", f"--output={o}", wrap=f'echo "CVD=$CUDA_VISIBLE_DEVICES"; '
                                                     f"while [ ! -e {hold} ]; do sleep 0.2; done") for o in outs]
    try:
        wait_until(lambda: all(_job(c, j).get("JobState") == "RUNNING" for j in after),
                   f"{len(after)} jobs of 6G running at once",
                   describe=lambda: str({j: _job(c, j).get("JobState") for j in after}))
        wait_until(lambda: all(o.exists() and "CVD=" in o.read_text() for o in outs), "every job's output")
        seen = [re.search(r"CVD=(\S*)", o.read_text()).group(1) for o in outs]  # type: ignore[union-attr]
        assert len(set(seen)) == len(seen) and set(seen) <= uuids, (seen, uuids)
    finally:
        hold.touch()
    for j in after:
        assert wait_until(lambda j=j: _ended(c, j), f"job {j}") == "COMPLETED"
