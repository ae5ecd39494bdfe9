"""The Grafana dashboard (etc/grafana/slurm-gpushare.json) against Debian's real Prometheus: ``/usr/bin/prometheus``
scrapes the dev cluster's node monitors while a gpushare job's fake GPU app holds memory, and every panel's
PromQL (its Grafana variables replaced by that job's node, id and user) returns that job's data through
Prometheus' HTTP API; so do the variables' ``label_values`` queries. Also: the series of a MIG job carry
dcgm-exporter's ``GPU_I_PROFILE``/``GPU_I_ID`` and the parent GPU's ``UUID`` once stored by Prometheus, and the
dcgm-exporter join docs/monitoring.md gives works (``promtool test rules``, no cluster)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import DEADLINE, IN_RELEASE, TEST_PORT, wait_until

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "etc" / "grafana" / "slurm-gpushare.json"
#: The administrators' dashboard: per account, and the MIG layout beside the MIG devices in use
ADMIN_DASHBOARD = ROOT / "etc" / "grafana" / "slurm-gpushare-admin.json"
#: beside the session's cluster (TEST_PORT .. +44) and below the other tests' clusters (+300, +600, +650)
PROMETHEUS_PORT = TEST_PORT + 90
GIB = 1 << 30
NODE = "rtx4090-pcie"
MIG_NODE = "h100-mig"
#: The cluster label the test's scrape config adds, as docs/monitoring.md tells sites to
CLUSTER = "devcluster"
#: The test jobs' account
ACCOUNT = "physics"


def dashboard(path: Path = DASHBOARD) -> dict:
    return json.loads(path.read_text())


def panel_queries(dash: dict) -> list[tuple[str, str, str]]:
    """(panel title, refId, PromQL) of every target of every panel (rows' nested panels too)."""
    out = []
    for panel in dash["panels"]:
        for p in [panel, *panel.get("panels", [])]:
            out += [(p["title"], t["refId"], t["expr"]) for t in p.get("targets", [])]
    return out


def substitute(expr: str, values: dict[str, str]) -> str:
    """``expr`` with Grafana's ``$name`` and ``${name}`` replaced by ``values[name]``.

    Raises:
        AssertionError: a variable is left that ``values`` has no value for.
    """
    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        assert name in values, f"no value for ${name} in {expr!r}"
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


def test_the_dashboard_selects_by_its_variables_and_names_only_monitor_metrics():
    dash = dashboard()
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "cluster", "Hostname", "user", "jobid"]
    queries = panel_queries(dash)
    assert len(queries) >= 9 and len({t for t, _, _ in queries}) == len(dash["panels"])
    metrics = set(re.findall(r"\b(gpushare_[a-z_]+)\b", " ".join(e for _, _, e in queries)))
    assert metrics >= {"gpushare_job_gpu_memory_used_bytes", "gpushare_job_gpu_memory_peak_bytes",
                       "gpushare_job_gpu_memory_reserved_bytes", "gpushare_job_gpu_memory_requested_bytes",
                       "gpushare_job_gpu_sm_utilization_ratio", "gpushare_job_gpu_over_limit",
                       "gpushare_gpu_memory_used_bytes", "gpushare_gpu_memory_total_bytes"}
    for title, ref, expr in queries:
        # every panel follows the cluster and node selection; a job panel the user and job selection too
        assert 'cluster=~"$cluster", Hostname=~"$Hostname"' in expr, (title, ref)
        if "gpushare_job_" in expr:
            assert 'hpc_job=~"$jobid"' in expr and 'user=~"$user"' in expr, (title, ref)
        assert not re.search(r"\b(jobid|job_id|node|uuid|model)=", expr), (title, ref)  # the labels of old
    for panel in dash["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_the_admin_dashboard_sums_per_account_and_follows_cluster_and_node():
    dash = dashboard(ADMIN_DASHBOARD)
    assert dash["schemaVersion"] == 41 and dash["uid"] != dashboard()["uid"]
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource", "cluster", "Hostname", "account"]
    queries = panel_queries(dash)
    assert len({t for t, _, _ in queries}) == len(dash["panels"]) >= 6
    text = " ".join(e for _, _, e in queries)
    assert "sum by (account)" in text and "gpushare_mig_device_info" in text and 'mode="mig"' in text
    for title, ref, expr in queries:
        for selector in re.findall(r"\bgpushare_\w+\{[^}]*\}", expr):
            assert 'cluster=~"$cluster", Hostname=~"$Hostname"' in selector, (title, ref, selector)
            if "gpushare_job_" in selector and "mode=" not in selector:
                assert 'account=~"$account"' in selector, (title, ref, selector)
    for panel in dash["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def _prometheus_binary(name: str = "prometheus") -> str:
    """The path of Debian's ``prometheus`` (or ``promtool``, same package); skips without it, fails instead
    under ``GPUSHARE_REQUIRE_SLURM=1`` on the host (CI installs it; a release's root does not have it)."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
    if found:
        return found
    reason = (f"Debian's prometheus is not installed, no {name} "
              "(scripts/install-deps installs it: apt-get install prometheus)")
    if IN_RELEASE is None and os.environ.get("GPUSHARE_REQUIRE_SLURM") == "1":
        pytest.fail(f"GPUSHARE_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


def _get(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


@pytest.fixture
def prometheus(cluster):
    """Debian's prometheus, run directly (no systemd, no init script): its own config scraping each simulated
    node's monitor every second, its own data dir, a port of this session; stopped by its pid."""
    binary = _prometheus_binary()
    root = Path(cluster.root) / "prometheus"
    shutil.rmtree(root, ignore_errors=True)
    (root / "data").mkdir(parents=True)
    targets = [f"127.0.0.1:{cluster.monitor_port(n)}" for n in cluster.nodes]
    (root / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: slurm-gpushare\n"
        f"    static_configs:\n      - targets: {json.dumps(targets)}\n        labels:\n          cluster: {CLUSTER}\n")
    url = f"http://127.0.0.1:{PROMETHEUS_PORT}"
    log = open(root / "prometheus.log", "w")
    proc = subprocess.Popen([binary, f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'data'}",
                             f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                tail = (root / "prometheus.log").read_text()[-2000:]
                raise AssertionError(f"prometheus exited {proc.returncode}: {tail}")
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                    return r.status == 200
            except (OSError, urllib.error.HTTPError):
                return False

        wait_until(ready, f"prometheus ready at {url}")
        yield url
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(DEADLINE)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def _query(url: str, expr: str) -> list[dict]:
    body = _get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert body is not None and body.get("status") == "success", (expr, body)
    return body["data"]["result"]


@pytest.mark.slurm
def test_every_panel_returns_the_running_jobs_data_from_prometheus(cluster, slurm, prometheus):
    app = shlex.quote(str(cluster.fake_gpu_app))
    # an account of their own (no slurmdbd here: slurmctld takes the name as given), for the admin dashboard
    job = slurm.sbatch("-p", "pcie", "-A", ACCOUNT, "--gres=gpushare:mem=10G",
                       wrap=f"{app} --mem 3G --sm 30 --seconds 300")
    mig = slurm.sbatch("-w", MIG_NODE, "-A", ACCOUNT, "--gres=gpu:h100_1g.10gb:1", wrap=f"{app} --mem 2G --seconds 300")
    slurm.wait_started(job)
    slurm.wait_started(mig)

    # stored once Prometheus scraped the monitors after the apps registered their memory
    def scraped() -> bool:
        return all(_query(prometheus, f'gpushare_job_gpu_memory_used_bytes{{hpc_job="{j.id}"}} > 0')
                   for j in (job, mig))

    wait_until(scraped, f"prometheus storing jobs {job.id} and {mig.id} using GPU memory",
               describe=lambda: _get(f"{prometheus}/api/v1/targets"))

    values = {"cluster": CLUSTER, "Hostname": NODE, "jobid": job.id, "user": "root", "datasource": "unused"}
    dash = dashboard()
    results = _every_panel(prometheus, dash, values)
    for (title, _ref), result in results.items():
        for series in result:
            labels = series["metric"]
            assert labels.get("hpc_job", job.id) == job.id and labels.get("Hostname", NODE) == NODE, (title, labels)
            assert labels.get("cluster", CLUSTER) == CLUSTER, (title, labels)

    def one(title: str, ref: str = "A") -> float:
        (series,) = results[(title, ref)]
        return float(series["value"][1])

    assert one("GPU memory used per job") == 3 * GIB
    assert one("GPU memory peak per job") == 3 * GIB
    assert one("GPU memory reserved per job") == one("GPU memory requested per job") == 10 * GIB
    assert one("SM utilization per job") == pytest.approx(0.3)
    assert one("Over limit") == 0
    assert one("Reserved but unused GPU memory (waste)") == 7 * GIB
    assert one("Waste on the selected nodes", "C") == 7 * GIB
    labels = results[("GPU memory used per job", "A")][0]["metric"]
    assert labels["user"] == "root" and labels["modelName"] and labels["UUID"].startswith("GPU-")
    assert "GPU_I_PROFILE" not in labels  # empty off MIG: Prometheus keeps no label

    # the variables' label_values(...) queries list this node, user and job
    _variables_list(prometheus, dash, values)

    # a MIG job's series carry dcgm-exporter's MIG labels, with the parent GPU's UUID
    (series,) = _query(prometheus, f'gpushare_job_gpu_memory_reserved_bytes{{hpc_job="{mig.id}"}}')
    labels = series["metric"]
    assert labels["GPU_I_PROFILE"] == "1g.10gb" and labels["GPU_I_ID"].isdigit(), labels
    assert labels["UUID"].startswith("GPU-") and labels["Hostname"] == MIG_NODE and "uuid" not in labels

    # the administrators' dashboard, over both nodes and the jobs' account
    admin = dashboard(ADMIN_DASHBOARD)
    assert results[("GPU memory used per job", "A")][0]["metric"]["account"] == ACCOUNT
    values = {"cluster": CLUSTER, "Hostname": f"{NODE}|{MIG_NODE}", "account": ACCOUNT, "datasource": "unused"}
    results = _every_panel(prometheus, admin, values)
    per_account = {r["metric"]["account"]: float(r["value"][1])
                   for r in results[("GPU memory reserved and used per account", "A")]}
    assert per_account[ACCOUNT] >= 10 * GIB  # the share, and the MIG slice
    layout = {r["metric"]["GPU_I_PROFILE"]: float(r["value"][1])
              for r in results[("MIG devices per profile: in the layout and in use", "A")]}
    in_use = {r["metric"]["GPU_I_PROFILE"]: float(r["value"][1])
              for r in results[("MIG devices per profile: in the layout and in use", "B")]}
    assert in_use == {"1g.10gb": 1} and layout["1g.10gb"] >= 1, (layout, in_use)
    _variables_list(prometheus, admin, values)


def _every_panel(prometheus: str, dash: dict, values: dict[str, str]) -> dict[tuple[str, str], list[dict]]:
    """Each panel query's result with the variables replaced by ``values``; every one must return data."""
    results = {}
    for title, ref, expr in panel_queries(dash):
        promql = substitute(expr, values)
        result = _query(prometheus, promql)
        assert result, f"panel {title!r} ({ref}) returned no data: {promql}"
        results[(title, ref)] = result
    return results


def _variables_list(prometheus: str, dash: dict, values: dict[str, str]) -> None:
    """Each query variable's ``label_values`` lists the value (every alternative of an ``a|b`` value) used."""
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
        assert m, var["query"]
        match, label = substitute(m.group(1), values), m.group(2)
        body = _get(f"{prometheus}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": match}))
        assert body and set(values[var["name"]].split("|")) <= set(body["data"]), (var["name"], body)


def test_the_documented_dcgm_join_gives_each_job_its_gpus_dcgm_figure(tmp_path):
    promtool = _prometheus_binary("promtool")
    text = (ROOT / "docs" / "monitoring.md").read_text()
    (join,) = re.findall(r"`(DCGM_FI_DEV_GPU_UTIL [^`\n]*group_right[^`\n]*)`", text)
    # dcgm-exporter's shape (render_metrics.go), and two gpushare jobs sharing that GPU, as the monitor labels them
    dcgm = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",pci_bus_id="00000000:07:00.0",device="nvidia0",' \
           'modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}'
    jobs = [f'{{gpu="0",UUID="GPU-a",Hostname="n1",hpc_job="{j}",user="{u}",mode="mps"}}'
            for j, u in (("1", "alice"), ("2", "bob"))]
    spec = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": dcgm, "values": "40 40"},
                         *({"series": "gpushare_job_gpu_memory_reserved_bytes" + j, "values": f"{n} {n}"}
                           for j, n in zip(jobs, (10737418240, 21474836480), strict=True))],
        "promql_expr_test": [{"expr": join, "eval_time": "1m",
                              "exp_samples": [{"labels": j, "value": 40} for j in jobs]}]}]}
    (tmp_path / "join.yml").write_text(json.dumps(spec))  # YAML is a superset of JSON
    out = subprocess.run([promtool, "test", "rules", str(tmp_path / "join.yml")], capture_output=True, text=True,
                         timeout=DEADLINE)
    assert out.returncode == 0, out.stdout + out.stderr
