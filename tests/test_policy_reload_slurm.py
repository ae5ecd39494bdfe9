"""Reloading the site policy on the real dev cluster (issue #15 item 3): an edited policy file and SIGHUP to the
running filterd change the next job's decision; a bad file and SIGHUP keep the old decisions and the log says
why; ``slurm-gpushare policy check`` shows the change beforehand, from the same inventory.

Decisions expected (docs/request-syntax.md, "What each request gets on the dev cluster"): ``mem=10G`` in
partition ``gpu`` is a ``1g.10gb`` MIG slice under the shipped policy (MIG first) and 10 shards (an MPS share)
when ``mode_order`` puts MPS first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import DEADLINE, bare, wait_until

pytestmark = pytest.mark.slurm

MPS_FIRST = 'version = 1\nmode_order = ["mps", "mig", "gpu"]\n'
BAD = 'version = 1\nmode_order = ["mps", "migs"]\n'


def _events(cluster, name: str) -> list[dict]:
    path = cluster.root / "log" / "filterd.log"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("event") == name]


def _hup_and_wait(cluster, event: str) -> dict:
    """SIGHUP the cluster's filterd (its pid file) and wait for the reload's ``event`` log line."""
    before = len(_events(cluster, event))
    os.kill(cluster.pid("filterd"), signal.SIGHUP)
    wait_until(lambda: len(_events(cluster, event)) > before, f"filterd logs {event} after SIGHUP")
    return _events(cluster, event)[-1]


def _granted(slurm) -> str:
    job = slurm.sbatch("-H", "-p", "gpu", "--gres=gpushare:mem=10G", wrap="true")
    return bare(slurm.show_job(job.id)["TresPerNode"])


def test_sighup_puts_an_edited_policy_in_force_and_a_bad_file_keeps_the_old_one(slurm):
    c = slurm.cluster
    policy = c.policy_file
    original = policy.read_text()
    try:
        assert _granted(slurm) == "gpu:h100_1g.10gb:1"
        policy.write_text(MPS_FIRST)
        line = _hup_and_wait(c, "policy")
        assert line["policy"] == str(policy) and line["reason"] == "SIGHUP", line
        assert _granted(slurm) == "shard:10"
        policy.write_text(BAD)
        rejected = _hup_and_wait(c, "policy_rejected")
        assert rejected["file"] == str(policy), rejected
        assert rejected["error"].startswith("mode_order must list some of mig, mps, gpu"), rejected
        assert 'mode_order = ["mig", "mps", "gpu"]' in rejected["hint"], rejected
        assert str(policy) in rejected["message"] and "still deciding with" in rejected["message"]
        assert c.alive("filterd")
        assert _granted(slurm) == "shard:10"  # the policy in force before the bad file
    finally:
        policy.write_text(original)
        _hup_and_wait(c, "policy")
    assert _granted(slurm) == "gpu:h100_1g.10gb:1"


def test_policy_check_shows_the_change_against_the_running_file(slurm, tmp_path):
    c = slurm.cluster
    new = tmp_path / "new.toml"
    new.write_text(MPS_FIRST)
    argv = [sys.executable, "-m", "slurm_gpushare", "policy", "check", str(new), "--against", str(c.policy_file),
            "--machines", str(c.root / "machines")]
    proc = subprocess.run(argv, env=c.env, capture_output=True, text=True, timeout=DEADLINE)
    assert proc.returncode == 0, proc.stderr
    assert f"compared with the running policy ({c.policy_file}) on 4 node(s), 4 usable" in proc.stdout
    assert "  --gres=gpushare:mem=10G -p gpu\n    - gpu:h100_1g.10gb:1 (mig)\n    + shard:10 (mps)\n" in proc.stdout
    new.write_text(BAD)
    bad = subprocess.run(argv, env=c.env, capture_output=True, text=True, timeout=DEADLINE)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith(f"slurm-gpushare: error: {new}: mode_order must list some of mig, mps, gpu")


def test_an_edited_gpushare_client_lua_applies_without_touching_job_submit_lua(slurm):
    """slurmctld loads job_submit.lua again only when its own mtime changes, so an edit of the settings in
    gpushare_client.lua changed nothing until then: the shim now reads the client file before each GPU-share
    job and loads a changed one (a broken one keeps the settings in force)."""
    c = slurm.cluster
    client, shim = c.root / "etc" / "gpushare_client.lua", c.root / "etc" / "job_submit.lua"
    original, shim_mtime = client.read_text(), shim.stat().st_mtime_ns
    assert str(c.controller_socket) in original
    try:
        client.write_text(original.replace(str(c.controller_socket), "/nonexistent/gpushare.sock"))
        refused = slurm.sbatch("-H", "-p", "gpu", "--gres=gpushare:mem=10G", wrap="true", check=False)
        assert refused.returncode != 0
        assert "cannot connect to /nonexistent/gpushare.sock" in refused.stderr, refused.stderr
        client.write_text(original)
        assert _granted(slurm) == "gpu:h100_1g.10gb:1"
        client.write_text("this is not Lua\n")
        assert _granted(slurm) == "gpu:h100_1g.10gb:1"  # the settings in force stay
        log = (c.root / "log" / "slurmctld.log").read_text(errors="replace")
        assert f"gpushare: {client} changed but does not load" in log
    finally:
        client.write_text(original)
    assert shim.stat().st_mtime_ns == shim_mtime
    assert _granted(slurm) == "gpu:h100_1g.10gb:1"
