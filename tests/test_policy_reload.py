"""Reloading the filter service (SIGHUP): the site policy and the inventory are replaced together, and a
policy file that is not valid keeps the policy in force and is logged (issue #15 item 3).

The decisions compared here come from the documented rules (docs/request-syntax.md) on the dev
cluster's packaged machines: ``mem=10G`` in partition ``gpu`` is a ``1g.10gb`` MIG slice under the
default ``mode_order`` (MIG first), and an MPS share of ceil(10 GiB / shard unit) shards when MPS comes
first; a shard unit of 2 GiB makes that ``shard:5``, of 1 GiB ``shard:10``.
"""

from __future__ import annotations

import io
import json
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from slurm_gpushare.slurm.nodegres import GresOptions, node_gres
from slurm_gpushare.submit.cache import InventoryCache, PolicySource, reload
from slurm_gpushare.submit.daemon import serve
from slurm_gpushare.submit.log import Log
from slurm_gpushare.submit.protocol import MAGIC, frame
from slurm_gpushare.submit.service import FilterService
from slurm_gpushare_dev.cluster import DEFAULT_NODES, packaged_machine
from tests.conftest import DEADLINE, wait_until
from tests.test_filterd import META_22_05, PARTS, _fmt, machines_dir  # noqa: F401  (a fixture)

NODES = {n: packaged_machine(f) for n, f in DEFAULT_NODES.items()}
MIG_10G = "gres:gpu:h100_1g.10gb:1"
MPS_FIRST_2G = 'version = 1\nmode_order = ["mps", "mig", "gpu"]\nshard_unit = "2G"\n'


class Slurm:
    """sinfo --json / scontrol show partition of the dev cluster's nodes, with the GRES gres.conf has for
    ``unit`` MiB shards (the generator's rule: each GPU's memory // unit), and a gate that holds a build."""

    def __init__(self, unit: int = 1024):
        self.unit = unit
        self.hold = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.down = False

    def __call__(self):
        if self.down:
            from slurm_gpushare.errors import SlurmError
            raise SlurmError("slurmctld is not answering", source="sinfo --json")
        if self.hold:
            self.entered.set()
            assert self.release.wait(DEADLINE)
        opts = GresOptions(shard_unit_mib=self.unit)
        sinfo = {"meta": META_22_05,
                 "nodes": [{"name": n, "gres": _fmt(node_gres(m, n, opts).counts), "state": "idle",
                            "partitions": [p for p, ns in PARTS.items() if n in ns]} for n, m in NODES.items()]}
        parts = "\n".join(f"PartitionName={p} Default={'YES' if p == 'gpu' else 'NO'} Nodes={','.join(ns)}"
                          for p, ns in PARTS.items())
        return json.dumps(sinfo), parts


@pytest.fixture
def setup(tmp_path, request):
    machines = request.getfixturevalue("machines_dir")  # tests/test_filterd.py's: the packaged machines
    policy_file = tmp_path / "gpushare.toml"
    policy_file.write_text("version = 1\n")
    source = PolicySource(policy_file)
    slurm = Slurm()
    log = io.StringIO()
    cache = InventoryCache(machines, slurm_source=slurm, log=Log(log), policy=source.load())
    assert cache.refresh("start")
    return cache, FilterService(cache, Log(log)), source, slurm, log, policy_file


def grant(service, gres="gres:gpushare:mem=10G", partition="gpu"):
    a = service.handle_line(json.dumps({"op": "submit", "tres_per_node": gres, "partition": partition}))
    return a.get("tres_per_node") if a["action"] == "rewrite" else a["action"] + ": " + a.get("message", "")


def events(log, name):
    return [r for r in map(json.loads, log.getvalue().splitlines()) if r["event"] == name]


def test_a_reload_puts_the_new_policy_and_its_inventory_in_force_together(setup):
    """SIGHUP refreshed only the inventory: an edited policy changed nothing until a restart. While the new
    inventory is being built, requests are decided with the old policy and the old inventory; afterwards with
    the new ones, never with the new policy and the old inventory (that would give shard:10)."""
    cache, service, source, slurm, log, policy_file = setup
    assert grant(service) == MIG_10G
    old = cache.state()
    policy_file.write_text(MPS_FIRST_2G)
    slurm.unit, slurm.hold = 2048, True  # gres.conf regenerated for 2 GiB shards
    t = threading.Thread(target=reload, args=(cache, source, Log(log)))
    t.start()
    assert slurm.entered.wait(DEADLINE)
    assert grant(service) == MIG_10G and cache.state() is old  # mid-reload: the old pair, whole
    slurm.release.set()
    t.join(DEADLINE)
    new = cache.state()
    assert new.policy.source == str(policy_file) and new.policy.mode_order == ("mps", "mig", "gpu")
    assert new.policy.shard_unit_mib == 2048 and new.inventory.shard_unit_mib == 2048
    assert all(n.usable for n in new.inventory.nodes.values()), new.inventory.problems
    assert grant(service) == "gres:shard:5"
    [line] = events(log, "policy")
    assert line["policy"] == str(policy_file) and line["reason"] == "SIGHUP"


def test_requests_during_reloads_never_see_a_policy_with_another_policys_inventory(setup):
    """Answers while reloads flip between two policies (and two shard units) are always one pair's answer."""
    cache, service, source, slurm, log, policy_file = setup
    seen: set[str] = set()
    stop = threading.Event()

    def ask_all_the_time():
        while not stop.is_set():
            seen.add(grant(service))

    t = threading.Thread(target=ask_all_the_time)
    t.start()
    try:
        for i in range(20):
            new = i % 2 == 0
            policy_file.write_text(MPS_FIRST_2G if new else "version = 1\n")
            slurm.unit = 2048 if new else 1024
            assert reload(cache, source, Log(log))
    finally:
        stop.set()
        t.join(DEADLINE)
    assert seen <= {MIG_10G, "gres:shard:5"}, seen


@pytest.mark.parametrize("text, error", [
    ('version = 1\nmode_order = ["mig", "gpus"]\n', "mode_order must list some of mig, mps, gpu"),
    ("version = 1\nmax_count = 'eight'\n", "max_count must be a whole number"),
    ('version = 1\nmode_order = ["mps"\n', "not valid TOML"),
    ("version = 1\n[mig]\nfitt = 'exact'\n", "unknown key mig.fitt"),
    ("mode_order = ['mps']\n", "the policy file has no version"),
    # hostile numbers, bytes and nesting: a ConfigError each, never an exception that would end the refresher
    ("version = 1\n[jobstats]\nlow_sm = " + "9" * 400 + "\n", "jobstats.low_sm is too large a number (400 digits)"),
    ("version = 1\nmax_count = " + "9" * 5000 + "\n", "not a policy file tomllib can read: ValueError"),
    ("version = 1\nx = " + "[" * 3000 + "]" * 3000 + "\n", "not a policy file tomllib can read: RecursionError"),
    (b'version = 1\n[jobstats]\nfooter = "Caf\xe9"\n', "the policy file is not UTF-8 text (byte 36: b'\\xe9')"),
])
def test_a_bad_policy_keeps_the_old_one_and_one_log_line_says_why(setup, text, error):
    cache, service, source, slurm, log, policy_file = setup
    before = cache.state()
    policy_file.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert reload(cache, source, Log(log)) is False
    assert cache.state().policy is before.policy  # the old policy, whole
    assert cache.state() is not before  # the inventory was still refreshed (for the old policy)
    assert grant(service) == MIG_10G
    [line] = events(log, "policy_rejected")
    assert line["file"] == str(policy_file) and line["error"].startswith(error), line
    assert line["hint"], line  # what would work
    assert line["kept"] == str(policy_file)
    assert str(policy_file) in line["message"] and error in line["message"] and "still deciding with" in line["message"]
    assert not events(log, "policy")


def test_a_vanished_policy_file_keeps_the_old_policy(setup):
    cache, service, source, slurm, log, policy_file = setup
    policy_file.write_text(MPS_FIRST_2G)
    slurm.unit = 2048
    assert reload(cache, source, Log(log))
    policy_file.unlink()
    assert reload(cache, source, Log(log)) is False
    assert grant(service) == "gres:shard:5"
    assert "cannot read the policy file" in events(log, "policy_rejected")[0]["error"]


def test_a_policy_whose_inventory_cannot_be_built_waits_and_comes_in_with_the_next_one(setup):
    cache, service, source, slurm, log, policy_file = setup
    policy_file.write_text(MPS_FIRST_2G)
    slurm.down, slurm.unit = True, 2048
    assert reload(cache, source, Log(log)) is False
    assert grant(service) == MIG_10G  # the old pair stays in force
    assert cache.pending is not None and cache.shard_unit_mib == 2048
    slurm.down = False
    assert cache.refresh("periodic")
    assert grant(service) == "gres:shard:5" and cache.pending is None


def on_defaults(request, slurm, log, default: Path):
    """A cache and a service started without a policy file (filterd without --policy, ``default`` absent)."""
    source = PolicySource(None, default)
    cache = InventoryCache(request.getfixturevalue("machines_dir"), slurm_source=slurm, log=Log(log),
                           policy=source.load())
    assert cache.refresh("start") and cache.policy.source == "built-in defaults"
    return cache, FilterService(cache, Log(log)), source


def test_without_a_policy_file_the_lookup_is_made_again_on_each_reload(setup, tmp_path, request):
    _cache, _service, _source, slurm, log, _policy_file = setup
    default = tmp_path / "etc" / "gpushare.toml"
    cache, service, source = on_defaults(request, slurm, log, default)
    assert reload(cache, source, Log(log)) and cache.policy.source == "built-in defaults"
    default.parent.mkdir()
    default.write_text(MPS_FIRST_2G)
    slurm.unit = 2048
    assert reload(cache, source, Log(log)) and cache.policy.source == str(default)
    assert grant(service) == "gres:shard:5"


def test_a_default_policy_file_removed_keeps_the_policy_in_force_and_says_why(setup, tmp_path, request):
    """Found by a reviewer (issue #15): the installed unit runs filterd without --policy, so the lookup of its
    default file is made again on each reload; a gpushare.toml deleted (or not yet copied back by a config
    tool) and a SIGHUP put the built-in defaults in force silently. A reload that finds no file now keeps
    the policy in force and logs why, as a file that is not valid does; only a service that runs on the
    built-in defaults (it never had a file) stays on them."""
    _cache, _service, _source, slurm, log, _policy_file = setup
    default = tmp_path / "etc" / "gpushare.toml"
    cache, service, source = on_defaults(request, slurm, log, default)
    default.parent.mkdir()
    default.write_text(MPS_FIRST_2G)
    slurm.unit = 2048
    assert reload(cache, source, Log(log)) and cache.policy.source == str(default)
    default.unlink()
    assert reload(cache, source, Log(log)) is False
    assert cache.policy.source == str(default) and grant(service) == "gres:shard:5"
    [line] = events(log, "policy_rejected")
    assert line["file"] == str(default) and line["kept"] == str(default), line
    assert line["error"].startswith(f"the policy file {default} is gone"), line
    assert "put it back" in line["hint"] and "version = 1" in line["hint"], line
    assert "still deciding with" in line["message"], line
    # the file back: read again, as any file
    default.write_text(MPS_FIRST_2G.replace("2G", "1G"))
    slurm.unit = 1024
    assert reload(cache, source, Log(log)) and grant(service) == "gres:shard:10"


def test_a_service_on_the_built_in_defaults_stays_on_them_without_a_file(setup, tmp_path, request):
    _cache, _service, _source, slurm, log, _policy_file = setup
    cache, _service, source = on_defaults(request, slurm, log, tmp_path / "none" / "gpushare.toml")
    assert reload(cache, source, Log(log)) and cache.policy.source == "built-in defaults"
    assert reload(cache, source, Log(log)) and not events(log, "policy_rejected")


def _ask_socket(path: Path, req: dict) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(DEADLINE)
        s.connect(str(path))
        s.sendall(frame("1", req))
        data = b""
        while b"\n" not in data:
            data += s.recv(4096)
        head, _, body = data.partition(b"\n")
        magic, _id, length = head.decode().split()
        assert magic == MAGIC
        while len(body) < int(length):
            body += s.recv(4096)
        return json.loads(body)


def test_serve_reloads_on_the_signal_and_keeps_serving_after_a_bad_file(setup):
    """The service's reload path (what its SIGHUP handler sets) reads the policy file again."""
    _cache, _service, _source, slurm, _log, policy_file = setup
    d = Path(tempfile.mkdtemp(prefix="gps-rl-", dir="/tmp"))
    sock = d / "f.sock"
    ready, stop, hup = threading.Event(), threading.Event(), threading.Event()
    log = io.StringIO()
    t = threading.Thread(target=serve, args=(sock, policy_file.parent / "machines"),
                         kwargs={"slurm_source": slurm, "ready": ready, "log_stream": log, "stop": stop,
                                 "policy_path": policy_file, "reload_event": hup}, daemon=True)
    t.start()
    try:
        assert ready.wait(DEADLINE)
        req = {"op": "submit", "tres_per_node": "gres:gpushare:mem=10G", "partition": "gpu"}
        assert _ask_socket(sock, req)["tres_per_node"] == MIG_10G
        policy_file.write_text(MPS_FIRST_2G)
        slurm.unit = 2048
        hup.set()
        wait_until(lambda: _ask_socket(sock, req).get("tres_per_node") == "gres:shard:5", "the new policy in force")
        policy_file.write_text("version = 1\nmode_order = []\n")
        hup.set()
        wait_until(lambda: '"policy_rejected"' in log.getvalue(), "the bad policy logged")
        assert _ask_socket(sock, req)["tres_per_node"] == "gres:shard:5"
    finally:
        stop.set()
        t.join(DEADLINE)
        shutil.rmtree(d, ignore_errors=True)


def test_filterd_looks_up_the_default_policy_it_is_given(tmp_path, monkeypatch):
    """The installed unit names its --config-dir's gpushare.toml (--default-policy): without it, filterd read
    /etc/slurm/gpushare/gpushare.toml whatever --config-dir the admin installed with."""
    from click.testing import CliRunner

    import slurm_gpushare.submit.daemon as daemon
    from slurm_gpushare.cli import main

    seen = {}
    monkeypatch.setattr(daemon, "serve", lambda *a, **kw: seen.update(kw) or 0)
    (tmp_path / "machines").mkdir()
    args = ["filterd", "--socket", str(tmp_path / "s.sock"), "--controller-socket", "",
            "--machines", str(tmp_path / "machines")]
    r = CliRunner().invoke(main, [*args, "--default-policy", str(tmp_path / "site" / "gpushare.toml")])
    assert r.exit_code == 0, r.output
    assert seen["default_policy_path"] == tmp_path / "site" / "gpushare.toml" and seen["policy_path"] is None
    r = CliRunner().invoke(main, args)
    assert seen["default_policy_path"] == Path("/etc/slurm/gpushare/gpushare.toml"), r.output


def test_a_bad_policy_after_one_that_waits_says_which_policy_decides(setup):
    """Found in review: a valid policy waiting for an inventory (slurmctld down at its reload), then a reload of a
    file made invalid: the refresh of that reload puts the waiting policy in force, while the log line said the
    service was "still deciding with" the one in force before. The line now says what decides after the reload."""
    cache, service, source, slurm, log, policy_file = setup
    policy_file.write_text(MPS_FIRST_2G)
    slurm.down, slurm.unit = True, 2048
    assert reload(cache, source, Log(log)) is False and cache.pending is not None
    slurm.down = False
    policy_file.write_text('version = 1\nmode_order = ["mps"\n')
    assert reload(cache, source, Log(log)) is False
    assert grant(service) == "gres:shard:5" and cache.pending is None  # the waiting one came in
    [line] = events(log, "policy_rejected")
    assert line["kept"] == str(policy_file) and line["in_force"] == "the version read at an earlier reload", line
    assert "the version of it read at an earlier reload" in line["message"], line
    # slurmctld down again at the bad reload: the waiting policy still waits, and the line says so
    policy_file.write_text("version = 1\n")
    slurm.down, slurm.unit = True, 1024
    assert reload(cache, source, Log(log)) is False and cache.pending is not None
    policy_file.write_text('version = 1\nmode_order = ["mps"\n')
    assert reload(cache, source, Log(log)) is False
    line = events(log, "policy_rejected")[-1]
    assert line["in_force"] == "unchanged" and "waits for an inventory" in line["message"], line
