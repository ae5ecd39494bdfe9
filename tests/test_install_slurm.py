"""The dev cluster is a user of the installed product: its Lua shims, hook wrappers and TaskProlog are the
files ``slurm-gpushare install`` wrote (in CI: the install command of the built wheel, in a clean venv)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from slurm_gpushare_dev.cluster import FILTER_TIMEOUT_ENV, INSTALLED_ENV

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parent.parent


def _config(cluster) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "config"], env=cluster.env, capture_output=True, text=True,
                         check=True).stdout
    return {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in out.splitlines()) if v}


def test_the_cluster_runs_the_files_the_install_command_wrote(cluster):
    # the same install runs again, dry: every file it would write is there already, byte for byte, but the
    # client file, whose answer timeout the test session sets (and nothing else in it)
    for argv in cluster.install_commands():
        proc = subprocess.run([*argv, "--dry-run", "--diff"], capture_output=True, text=True)
        states = dict(reversed(line.split(": ", 1)) for line in proc.stdout.split("\n\n")[0].splitlines()
                      if line.startswith(("unchanged: ", "would ", "REFUSED")) and ": /" in line)
        client = str(cluster.root / "etc" / "gpushare_client.lua")
        # exit 1: the real install would refuse a changed file (here only the client file can be one)
        assert proc.returncode == (1 if states.get(client, "").startswith("REFUSED") else 0), proc.stderr
        assert {p: s for p, s in states.items() if p != client} and \
            {s for p, s in states.items() if p != client} == {"unchanged"}, proc.stdout
        if client in states and os.environ.get(FILTER_TIMEOUT_ENV):
            changed = [line for line in proc.stdout.splitlines()
                       if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))]
            assert [line[0] + line[1:].split("=")[0].strip() for line in changed] == ["-timeout", "+timeout"], changed
    conf = _config(cluster)
    etc = cluster.root / "etc"
    # slurmctld loads job_submit.lua, and the clients cli_filter.lua, from slurm.conf's directory
    assert conf["JobSubmitPlugins"] == "lua" and conf["CliFilterPlugins"] == "cli_filter/lua"
    assert Path(conf["SLURM_CONF"]).parent == etc and (etc / "job_submit.lua").is_file()
    assert conf["TaskProlog"] == str(cluster.site_config_dir / "taskprolog.sh")
    for hook in ("Prolog", "Epilog"):
        # 24.11 and later print each of several scripts as Prolog[i] (src/api/config_info.c at 24.11.5, 26.05.3)
        shim = Path(conf.get(hook) or conf[f"{hook}[0]"]).read_text().splitlines()[-1]
        assert shim.endswith(f"exec {cluster.site_config_dir}/{hook.lower()}.sh"), shim
        wrapper = (cluster.site_config_dir / f"{hook.lower()}.sh").read_text().splitlines()[-1]
        assert wrapper == (f"exec {' '.join(cluster.installed_command)} hook {hook.lower()} "
                           f"--config {cluster.node_config}") or \
            wrapper.startswith(f"exec {cluster.installed_command[0].removesuffix('/python')}"), wrapper


def test_the_installed_product_that_ci_names_is_not_the_source_tree(cluster):
    exe = os.environ.get(INSTALLED_ENV)
    if not exe:
        pytest.skip(f"{INSTALLED_ENV} is not set: the clusters use this interpreter's install command (.ci/run "
                    "sets it to the wheel's console script in a clean venv)")
    assert cluster.installed_command == [exe]
    python = Path(exe).read_text().splitlines()[0].removeprefix("#!").strip()
    where = subprocess.run([python, "-c", "import slurm_gpushare; print(slurm_gpushare.__file__)"],
                           capture_output=True, text=True, check=True, cwd="/").stdout.strip()
    assert not Path(where).resolve().is_relative_to(ROOT), where
    wrapper = (cluster.site_config_dir / "prolog.sh").read_text().splitlines()[-1]
    assert wrapper.startswith(f"exec {exe} hook prolog "), wrapper
    # the controller's filter service and the nodes' monitors are the installed product's too
    for daemon in ("filterd", *(f"monitor-{n}" for n in cluster.nodes)):
        pid = int(cluster.pidfile(daemon).read_text())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert exe.encode() in argv, (daemon, argv)


def test_a_job_gets_its_mps_share_through_the_installed_hooks(cluster, slurm):
    job = slurm.wait(slurm.sbatch("-p", "pcie", "--gres=gpushare:mem=10G", wrap="env | grep ^CUDA_MPS_ | sort"))
    assert job.state == "COMPLETED", (job.fields, job.output())
    env = dict(line.split("=", 1) for line in job.output().splitlines() if "=" in line)
    # written by the installed Prolog, printed by the installed TaskProlog
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10G"
    assert env["CUDA_MPS_PIPE_DIRECTORY"].startswith(f"{cluster.root}/run/gpushare/rtx4090-pcie/jobs/{job.id}/")
