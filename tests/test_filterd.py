"""The filter service: protocol, inventory refresh, and the Lua client (lua5.1 + lua-socket) against it."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from slurm_gpushare.slurm.nodegres import node_gres
from slurm_gpushare.submit.policyfile import SitePolicy
from slurm_gpushare.submit.service import FilterService, InventoryCache, Log, serve
from slurm_gpushare_dev.cluster import DEFAULT_NODES, SITE, packaged_machine

LUA = shutil.which("lua5.1")


def _fmt(counts):
    return ",".join(f"{n}:{t}:{c}" if t else f"{n}:{c}" for (n, t), c in counts.items())


def fake_slurm(nodes: dict, partitions: dict[str, tuple[str, ...]], default: str = "gpu"):
    """What sinfo --json / scontrol -o show partition print for these nodes (Slurm 22.05 shapes)."""
    def source():
        sinfo = {"nodes": [{"name": n, "gres": _fmt(node_gres(m, n).counts), "state": "idle",
                            "partitions": [p for p, ns in partitions.items() if n in ns]} for n, m in nodes.items()]}
        parts = "\n".join(f"PartitionName={p} Default={'YES' if p == default else 'NO'} Nodes={','.join(ns)}"
                          for p, ns in partitions.items())
        return json.dumps(sinfo), parts
    return source


@pytest.fixture
def machines_dir(tmp_path):
    d = tmp_path / "machines"
    d.mkdir()
    for name, f in DEFAULT_NODES.items():
        (d / f"{name}.json").write_text(packaged_machine(f).to_json())
    return d


PARTS = {"gpu": tuple(DEFAULT_NODES), "pcie": ("rtx4090-pcie",)}


@pytest.fixture
def service(machines_dir):
    log = io.StringIO()
    nodes = {n: packaged_machine(f) for n, f in DEFAULT_NODES.items()}
    cache = InventoryCache(machines_dir, shard_unit_mib=1024, slurm_source=fake_slurm(nodes, PARTS), log=Log(log))
    cache.refresh("test")
    svc = FilterService(cache, SitePolicy(), Log(log))
    svc.log_text = log
    return svc


def ask(service, **req):
    return service.handle_line(json.dumps({"v": 1, "op": "submit", **req}))


def test_mig_where_it_fits_shard_elsewhere_with_audit(service):
    a = ask(service, tres_per_node="gres:gpushare:mem=10G", partition="gpu", admin_comment="keep me")
    assert a["action"] == "rewrite" and a["tres_per_node"] == "gres:gpu:h100_1g.10gb:1"
    assert a["admin_comment"].startswith("keep me [gpushare:v1 req=mem=10G grant=gres:gpu:h100_1g.10gb:1 kind=mig")
    b = ask(service, tres_per_node="gres:gpushare:mem=10G", partition="pcie")
    assert b["tres_per_node"] == "gres:shard:10" and "kind=mps" in b["admin_comment"]


def test_refusal_has_message_and_gres_errno(service):
    a = ask(service, tres_per_node="gres:gpushare:mem=200G")
    assert a["action"] == "reject" and a["errno"] == 2072
    assert a["message"].startswith("gpushare: ") and "200G" in a["message"]


def test_non_share_jobs_pass_and_garbage_never_raises(service):
    assert ask(service, tres_per_node="gres:gpu:1")["action"] == "pass"
    for line in ["not json", "[1,2]", '{"op": "explode"}', json.dumps({"tres_per_node": 5}), "\xff\xfe"]:
        a = service.handle_line(line)
        assert a["action"] == "reject" and a["message"].startswith("gpushare: ")


def test_cli_op_returns_prefixless_gres_and_marks_the_comment_and_submit_re_decides(service):
    c = service.handle_line(json.dumps({"op": "cli", "tres_per_node": "gres:gpushare:mem=10G", "partition": "pcie",
                                        "comment": "my run"}))
    assert c["gres"] == "shard:10" and c["comment"] == "my run gpushare-request=gres:gpushare:mem=10G"
    # what job_submit then sees: the decided TRES and the marked comment -> decided again, audited
    s = ask(service, tres_per_node="gres:shard:10", comment=c["comment"], partition="pcie")
    assert s["tres_per_node"] == "gres:shard:10" and s["comment"] == "my run"
    assert "via=cli_filter" in s["admin_comment"] and "req=mem=10G" in s["admin_comment"]
    # a forged marker only gets the forged request decided properly: never trusted as the result
    f = ask(service, tres_per_node="gres:gpu:h100:8", comment="gpushare-request=gres:gpushare:mem=10G",
            partition="pcie")
    assert f["tres_per_node"] == "gres:shard:10"


def test_stale_description_is_reported_and_not_used(machines_dir):
    nodes = {n: packaged_machine(f) for n, f in DEFAULT_NODES.items()}
    # Slurm says the MIG node has whole GPUs only: its description no longer matches -> not a candidate
    source = fake_slurm(nodes, PARTS)

    def stale():
        sinfo, parts = source()
        data = json.loads(sinfo)
        for n in data["nodes"]:
            if n["name"] == "h100-mig":
                n["gres"] = "gpu:h100:4,shard:h100:316"
        return json.dumps(data), parts
    log = io.StringIO()
    cache = InventoryCache(machines_dir, shard_unit_mib=1024, slurm_source=stale, log=Log(log))
    cache.refresh("test")
    inv = cache.current()
    assert not inv.nodes["h100-mig"].usable and "h100-mig" in inv.problems[0]
    svc = FilterService(cache, SitePolicy(), Log(log))
    a = ask(svc, tres_per_node="gres:gpushare:mem=10G", partition="gpu")
    assert a["tres_per_node"] == "gres:shard:10"  # no usable MIG slice left
    assert '"event": "inventory"' in log.getvalue() and "stale" in log.getvalue()


def test_directory_change_is_noticed(machines_dir, service):
    assert not service.cache.changed()
    time.sleep(0.01)
    (machines_dir / "rtx4090-pcie.json").touch()
    os.utime(machines_dir / "rtx4090-pcie.json", ns=(time.time_ns(), time.time_ns() + 10**9))
    assert service.cache.changed()


@pytest.fixture
def live(machines_dir):
    """serve() on a real unix socket in a thread (short /tmp path: unix sockets are limited to ~107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="gps-fd-", dir="/tmp"))
    sock = d / "f.sock"
    nodes = {n: packaged_machine(f) for n, f in DEFAULT_NODES.items()}
    ready = threading.Event()
    log = io.StringIO()
    t = threading.Thread(target=serve, args=(sock, machines_dir),
                         kwargs={"slurm_source": fake_slurm(nodes, PARTS), "ready": ready, "log_stream": log},
                         daemon=True)
    t.start()
    assert ready.wait(10)
    yield sock
    # the serving thread is a daemon thread; closing the socket file is enough for the test process
    shutil.rmtree(d, ignore_errors=True)


def run_lua(sock: Path, body: str) -> list[dict]:
    script = (f'local c = dofile("{SITE / "gpushare_client.lua"}")\n'
              f'c.settings.socket = "{sock}"\nc.settings.timeout = 1.0\n{body}')
    proc = subprocess.run([LUA, "-"], input=script, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.mark.skipif(LUA is None, reason="lua5.1 not installed (scripts/install-deps installs it)")
def test_lua_client_round_trip_keeps_one_connection(live):
    out = run_lua(live, """
for i = 1, 3 do
  local a, why = c.ask({v = 1, op = "submit", tres_per_node = "gres:gpushare:mem=10G", partition = "pcie"})
  print(c.encode({action = a.action, tres = a.tres_per_node, errno = a.errno or 0}))
end
local r = c.ask({v = 1, op = "submit", tres_per_node = "gres:gpushare:mem=abc"})
print(c.encode({action = r.action, message = r.message, errno = r.errno}))
print(c.encode({share = tostring(c.mentions_share("gres:gpu:1")), gp = tostring(c.mentions_gpushare("gres:shard:2"))}))
""")
    assert out[:3] == [{"action": "rewrite", "tres": "gres:shard:10", "errno": 0}] * 3
    assert out[3]["action"] == "reject" and out[3]["errno"] == 2072 and out[3]["message"].startswith("gpushare: mem=")
    assert out[4] == {"share": "false", "gp": "false"}


@pytest.mark.skipif(LUA is None, reason="lua5.1 not installed")
def test_lua_client_reports_a_dead_service_at_once(tmp_path):
    t0 = time.monotonic()
    out = run_lua(tmp_path / "nobody.sock", """
local a, why = c.ask({v = 1, op = "submit", tres_per_node = "gres:gpushare:mem=10G"})
print(c.encode({answer = tostring(a), why = why}))
""")
    assert out[0]["answer"] == "nil" and "cannot connect" in out[0]["why"]
    assert time.monotonic() - t0 < 5


@pytest.mark.skipif(LUA is None, reason="lua5.1 not installed")
def test_lua_json_decoder_handles_escapes():
    body = r"""
local t = c.decode([[{"a": "x\"y\\z\n\u00e9", "n": 2072, "t": true, "z": null}]])
print(c.encode({a = t.a, n = t.n, t = tostring(t.t), z = tostring(t.z)}))
print(c.encode({bad = tostring(c.decode([[{"a": }]]))}))
"""
    out = run_lua(Path("/nonexistent"), body)
    assert out[0] == {"a": 'x"y\\z\né', "n": 2072, "t": "true", "z": "nil"}
    assert out[1] == {"bad": "nil"}
