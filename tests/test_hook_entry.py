"""The hooks' own entry point and what they ask slurmctld: a job that needs nothing from it never calls it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_gpushare.errors import SlurmError
from slurm_gpushare.node.context import HookContext
from slurm_gpushare.node.hook import parse_args, run
from slurm_gpushare.node.prolog import prolog
from slurm_gpushare_dev.cluster import packaged_machine
from tests.test_hooks import SHOW, _env, node  # noqa: F401  (the simulated node fixture)
from tests.test_hooks import _shard_job as shard_job

ROOT = Path(__file__).resolve().parents[1]


def _no_slurmctld(asked: list[str]):
    def job_record(job_id: str) -> str:
        asked.append(str(job_id))
        raise SlurmError("squeue did not answer within 30 s", hint="is slurmctld up? (scontrol ping)")
    return job_record


def _slurm_dir(n, node_name: str, machine_file: str, *, shards: bool) -> str:
    """A slurm.conf dir whose gres.conf gresconf generated for ``node_name`` (with or without shard lines)."""
    from slurm_gpushare.gresconf.render import generate_node_gres, render_gres_conf
    from slurm_gpushare.slurm.nodegres import GresOptions

    etc = n.root / f"etc-{node_name}"
    etc.mkdir(exist_ok=True)
    gres = generate_node_gres(packaged_machine(machine_file), node_name, GresOptions(shards=shards))
    (etc / "gres.conf").write_text(render_gres_conf([gres]))
    (etc / "slurm.conf").write_text("ClusterName=test\n")
    return str(etc / "slurm.conf")


def test_whole_gpu_and_mig_jobs_on_a_node_without_shards_never_ask_slurmctld(node, monkeypatch):  # noqa: F811
    asked: list[str] = []
    ctx = HookContext(node.ctx.config, "a100", job_record=_no_slurmctld(asked), drain=node.ctx.drain,
                      cancel=node.cancelled.append)
    env = {**_env("6"), "SLURM_JOB_GPUS": "3", "CUDA_VISIBLE_DEVICES": "3", "SLURM_JOB_UID": "0",
           "SLURM_JOB_GID": "0", "SLURM_CONF": _slurm_dir(node, "a100", "8x-a100-nv12-bridge.json", shards=False)}
    assert prolog(ctx, env) == 0
    assert asked == [] and node.cancelled == [] and node.drained == []
    assert sorted(p.name for p in ctx.job_dir("6").iterdir()) == ["run.json"]
    # a MIG slice: its environment names the slice's UUID, from slurmd's device index alone
    monkeypatch.setenv("GPUSHARE_NVML", f"fake:{node.root}/machines/mig.json")
    mig = HookContext(node.ctx.config, "mig", job_record=_no_slurmctld(asked), drain=node.ctx.drain,
                      cancel=node.cancelled.append)
    env = {**_env("8"), "SLURMD_NODENAME": "mig", "SLURM_JOB_GPUS": "4", "CUDA_VISIBLE_DEVICES": "4",
           "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0",
           "SLURM_CONF": _slurm_dir(node, "mig", "4x-h100-mig-mixed.json", shards=False)}
    assert prolog(mig, env) == 0
    assert (mig.job_dir("8") / "devices").read_text().startswith(" 4=MIG-")
    assert asked == [] and node.cancelled == [] and node.drained == []


def test_a_whole_gpu_job_on_a_node_with_shards_asks_slurmctld(node):  # noqa: F811
    # slurmd gives a shard:10 job the same Prolog variables as a gpu:1 job on that GPU: only the record tells
    asked: list[str] = []
    ctx = HookContext(node.ctx.config, "a100", job_record=_no_slurmctld(asked), drain=node.ctx.drain,
                      cancel=node.cancelled.append)
    env = {**_env("101"), "SLURM_CONF": _slurm_dir(node, "a100", "8x-a100-nv12-bridge.json", shards=True)}
    shard_job(node)
    assert prolog(ctx, env) == 0
    # three tries for the plan, then one for the AdminComment the user's reason is appended to (fail_job)
    assert asked == ["101"] * 4 and node.cancelled == ["101"] and node.drained == []


def test_a_multi_gpu_job_is_audited_against_slurmctld_also_without_shards(node):  # noqa: F811
    node.jobs["7"] = SHOW.format(job="7", node="a100", gres="gpu:a100:2", detail="gpu:a100:2(IDX:0,2)", ac="")
    env = {**_env("7"), "SLURM_JOB_GPUS": "0,2", "CUDA_VISIBLE_DEVICES": "0,2",
           "SLURM_CONF": _slurm_dir(node, "a100", "8x-a100-nv12-bridge.json", shards=False)}
    assert prolog(node.ctx, env) == 0
    assert "placement" in (node.ctx.job_dir("7") / "state.json").read_text()


def test_jobs_without_gpus_need_no_node_config_in_the_prolog_and_none_of_slurm_in_the_epilog(tmp_path):
    env = {"SLURM_JOB_ID": "5", "SLURMD_NODENAME": "a100"}
    assert run("prolog", str(tmp_path / "missing.toml"), env) == 0  # never read
    cfg = tmp_path / "node.toml"
    cfg.write_text(f'version = 1\nrun_dir = "{tmp_path}/run"\n')
    assert run("epilog", str(cfg), env) == 0 and not (tmp_path / "run").exists()
    assert run("prolog", str(tmp_path / "missing.toml"), {**env, "SLURM_JOB_GPUS": "0"}) == 1


@pytest.mark.parametrize("argv, want", [
    (["prolog"], ("prolog", None)),
    (["epilog", "--config", "/x.toml"], ("epilog", "/x.toml")),
    (["prolog", "--config=/y.toml"], ("prolog", "/y.toml")),
    (["prolog", "--help"], None), (["monitor"], None), ([], None), (["prolog", "--config"], None),
])
def test_hook_arguments_the_fast_entry_takes_and_those_it_leaves_to_click(argv, want):
    assert parse_args(argv) == want


def test_the_console_script_runs_the_hook_and_the_rest_of_the_cli(tmp_path):
    env = {**os.environ, "SLURM_JOB_ID": "5", "SLURMD_NODENAME": "a100"}
    env.pop("SLURM_JOB_GPUS", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    hook = subprocess.run([sys.executable, "-m", "slurm_gpushare", "hook", "prolog", "--config",
                           str(tmp_path / "none.toml")], capture_output=True, text=True, env=env, cwd=ROOT)
    assert hook.returncode == 0 and hook.stdout == hook.stderr == ""
    usage = subprocess.run([sys.executable, "-m", "slurm_gpushare", "hook", "--help"], capture_output=True,
                           text=True, env=env, cwd=ROOT)
    assert usage.returncode == 0 and "Run as slurmd's Prolog or Epilog" in usage.stdout


@pytest.mark.parametrize("text, want", [
    ("Name=gpu Type=a100 File=/dev/nvidia[0-7]\n", True),
    ("# Name=shard Count=80 File=/dev/nvidia0\nName=gpu File=/dev/nvidia0\n", True),
    ("Name=gpu File=/dev/nvidia0\nName=shard Count=80 File=/dev/nvidia0\n", False),
    ("AutoDetect=nvml\nname=SHARD Count=80\n", False),
    ("NodeName=other Name=shard Count=80 File=/dev/nvidia0\nNodeName=a100 Name=gpu File=/dev/nvidia0\n", True),
    ("NodeName=a[100-101] Name=shard Count=80 File=/dev/nvidia0\n", False),
    ("NodeName=a[101-102] Name=shard Count=80 File=/dev/nvidia0\n", True),
    ("NodeName=b,a100 Name=shard Count=80 File=/dev/nvidia0\n", False),
    ("NodeName=a1000 Name=shard Count=80 File=/dev/nvidia0\n", True),
    ("Name=gpu File=/dev/nvidia0\nInclude /etc/slurm/more-gres.conf\n", False),
    (None, False),
])
def test_a_gres_conf_without_shards_for_the_node_is_told_from_one_that_may_have_them(tmp_path, text, want):
    from slurm_gpushare.node.prolog import configures_no_shards

    path = tmp_path / "gres.conf"
    if text is not None:
        path.write_text(text)
    assert configures_no_shards(path, "a100") is want
