"""``slurm-gpushare accounting ingest`` and ``slurm-gpushare report`` through click's CliRunner."""

from __future__ import annotations

import json

from click.testing import CliRunner

from slurm_gpushare.accounting.spool import Spool
from slurm_gpushare.cli import main
from tests.accounting.test_report import T0, fixture


def _spool(tmp_path):
    sp = Spool(tmp_path / "spool", node="a100", clock=lambda: T0)
    path = sp.append(fixture())
    with open(path, "ab") as f:
        f.write(b"not json\n")
    return path


def test_ingest_reports_counts_and_warns_with_file_and_line(tmp_path, target):
    path = _spool(tmp_path)
    db = target
    r = CliRunner().invoke(main, ["accounting", "ingest", "--spool", str(tmp_path / "spool"), "--db", db])
    assert r.exit_code == 0, r.output
    assert f"slurm-gpushare: warning: {path}:6: not a JSON record" in r.output
    assert "ingested 5 record(s) from 1 file(s); 0 already stored; 1 line(s) skipped; 5 record(s) in" in r.output
    r = CliRunner().invoke(main, ["accounting", "ingest", "--spool", str(path), "--db", db])
    assert "ingested 0 record(s)" in r.output and "warning" not in r.output


def test_report_formats_and_views(tmp_path, monkeypatch, target):
    _spool(tmp_path)
    db = target
    CliRunner().invoke(main, ["accounting", "ingest", "--spool", str(tmp_path / "spool"), "--db", db])
    table = CliRunner().invoke(main, ["report", "--db", db])
    assert table.exit_code == 0, table.output
    assert table.output.startswith("GPU usage by user\nUSER ") and "TOTAL" in table.output
    monkeypatch.setenv("GPUSHARE_ACCOUNTING_DB", db)
    data = json.loads(CliRunner().invoke(main, ["report", "--by", "account", "--format", "json"]).output)
    assert {r["account"]: r["jobs"] for r in data["rows"]} == {"physics": 2, "chem": 2}
    out = CliRunner().invoke(main, ["report", "--by", "job", "--format", "csv"]).output
    assert out.splitlines()[0].startswith("job,array,user,account,partition,model,mode,share,gpus,hours,mem_asked_mib")
    waste = CliRunner().invoke(main, ["report", "--waste"]).output
    assert "gpushare:mem=24G:2" in waste and "gpushare:mem=5G" in waste
    period = CliRunner().invoke(main, ["report", "--since", "@%d" % (T0 + 3600), "--until", "@%d" % (T0 + 7200)])
    assert "(local time)" in period.output.splitlines()[0]


def test_errors_are_one_line(tmp_path):
    r = CliRunner().invoke(main, ["report", "--db", str(tmp_path / "none.db")])
    assert r.exit_code == 1 and r.output.startswith("slurm-gpushare: error: no accounting database at")
    assert r.output.count("\n") == 1
    _spool(tmp_path)
    db = str(tmp_path / "acct.db")
    CliRunner().invoke(main, ["accounting", "ingest", "--spool", str(tmp_path / "spool"), "--db", db])
    r = CliRunner().invoke(main, ["report", "--db", db, "--since", "last tuesday"])
    assert r.exit_code == 2 and "--since 'last tuesday' is not a time" in r.output and r.output.count("\n") == 1
    r = CliRunner().invoke(main, ["accounting", "ingest", "--spool", str(tmp_path / "nope"), "--db", db])
    assert r.exit_code == 2 and "does not exist" in r.output


def test_ingest_of_a_missing_spool_leaves_no_empty_database(tmp_path):
    # found in a trial: the database was created before the spool was found missing
    from click.testing import CliRunner

    from slurm_gpushare.cli import main
    db = tmp_path / "db" / "acct.db"
    r = CliRunner().invoke(main, ["accounting", "ingest", "--spool", str(tmp_path / "nope"), "--db", str(db)])
    assert r.exit_code == 2 and "does not exist" in r.stderr and not db.exists()


def test_waste_with_a_group_is_refused_not_ignored(tmp_path):
    from click.testing import CliRunner

    from slurm_gpushare.cli import main
    r = CliRunner().invoke(main, ["report", "--waste", "--by", "user", "--db", str(tmp_path / "x.db")])
    assert r.exit_code == 2 and "--waste lists jobs" in r.stderr


def test_limit_without_waste_is_refused_and_limit_keeps_the_most_wasteful(tmp_path, target):
    _spool(tmp_path)
    CliRunner().invoke(main, ["accounting", "ingest", "--spool", str(tmp_path / "spool"), "--db", target])
    r = CliRunner().invoke(main, ["report", "--limit", "1", "--db", target])
    assert r.exit_code == 2 and "--limit applies to --waste" in r.stderr
    r = CliRunner().invoke(main, ["report", "--waste", "--limit", "-1", "--db", target])
    assert r.exit_code == 2 and "--limit" in r.stderr
    one = json.loads(CliRunner().invoke(main, ["report", "--waste", "--limit", "1", "--format", "json",
                                               "--db", target]).output)
    everything = json.loads(CliRunner().invoke(main, ["report", "--waste", "--limit", "0", "--format", "json",
                                                      "--db", target]).output)
    assert len(everything["rows"]) == 2 and one["rows"] == everything["rows"][:1] and one["left_out"] == 1
