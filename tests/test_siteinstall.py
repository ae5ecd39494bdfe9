"""``slurm-gpushare install``: each role's site files, this installation's paths, no edited file replaced
silently; the wheel carries the files; one version, printed by --version."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpushare import __version__, siteinstall
from slurm_gpushare.cli import main
from slurm_gpushare.errors import ConfigError, InputError

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "slurm_gpushare" / "data" / "site"
CMD = ("/opt/gpushare/bin/slurm-gpushare",)


def layout(tmp_path: Path, **kw) -> siteinstall.Layout:
    return siteinstall.Layout.under(tmp_path / "p", command=CMD, **kw)


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_each_role_installs_its_files_where_slurm_and_systemd_look_for_them(tmp_path):
    lay = layout(tmp_path)
    p = tmp_path / "p"
    got = {role: {str(f.path.relative_to(p)) for f in siteinstall.plan([role], lay)} for role in siteinstall.ROLES}
    # every role gets the man pages, one per command, where man looks for locally installed software
    pages = {f"usr/local/share/man/man1/{n}" for n in siteinstall.man_page_names()}
    assert "usr/local/share/man/man1/slurm-gpushare-jobstats.1" in pages and len(pages) > 10
    assert all(pages <= files for files in got.values())
    got = {role: files - pages for role, files in got.items()}
    # slurmctld loads job_submit.lua from slurm.conf's directory; the clients load cli_filter.lua from there
    # (slurm.conf(5) JobSubmitPlugins=lua, CliFilterPlugins=cli_filter/lua); units go to /etc/systemd/system
    assert got == {
        "controller": {"etc/slurm/job_submit.lua", "etc/slurm/gpushare_client.lua", "etc/slurm/cli_filter.lua",
                       "etc/systemd/system/slurm-gpushare-filterd.service", "etc/slurm/gpushare/gpushare.toml.example",
                       "etc/slurm/gpushare/epilog_slurmctld.sh"},
        "node": {"etc/slurm/gpushare/prolog.sh", "etc/slurm/gpushare/epilog.sh", "etc/slurm/gpushare/taskprolog.sh",
                 "etc/systemd/system/slurm-gpushare-monitor.service", "etc/slurm/gpushare/node.toml.example"},
        "login": {"etc/slurm/cli_filter.lua", "etc/slurm/gpushare_client.lua"},
    }
    every = {f.source for f in siteinstall.plan(siteinstall.ROLES, lay)}
    assert every == ({f"slurm_gpushare/data/site/{f.name}" for f in SHIPPED.iterdir()}
                     | {f"slurm_gpushare/data/man/{n}" for n in siteinstall.man_page_names()})


def test_the_files_name_this_installation_and_the_layout_and_no_placeholder_is_left(tmp_path):
    lay = layout(tmp_path, run_dir="/run/gps")
    files = {f.path.name: f for f in siteinstall.plan(siteinstall.ROLES, lay)}
    cfg = tmp_path / "p/etc/slurm/gpushare"
    assert files["prolog.sh"].text.splitlines()[-1] == f"exec {CMD[0]} hook prolog --config {cfg}/node.toml"
    assert files["epilog.sh"].text.splitlines()[-1] == f"exec {CMD[0]} hook epilog --config {cfg}/node.toml"
    unit = files["slurm-gpushare-filterd.service"].text
    assert (f"ExecStart={CMD[0]} filterd --socket /run/gps/filterd/filterd.sock --controller-socket "
            f"/run/gps/filterd/controller.sock --machines {cfg}/machines --default-policy {cfg}/gpushare.toml"
            ) in unit.splitlines()
    # systemd.exec(5): relative to /run; systemd removes the innermost directory when the unit stops or restarts,
    # so filterd's sockets have a directory of their own below the node's run dir (controller and node on one
    # host: a filterd restart took the running jobs' MPS pipes, claims and job directories with it)
    assert "RuntimeDirectory=gps/filterd" in unit.splitlines()
    assert f"Environment=SLURM_CONF={tmp_path}/p/etc/slurm/slurm.conf" in unit.splitlines()
    assert f"ExecStart={CMD[0]} monitor --config {cfg}/node.toml" in files["slurm-gpushare-monitor.service"].text
    client = files["gpushare_client.lua"].text
    assert 'socket = "/run/gps/filterd/filterd.sock",' in client
    assert 'controller_socket = "/run/gps/filterd/controller.sock",' in client
    assert 'RUN_DIR="/run/gps"' in files["taskprolog.sh"].text.splitlines()
    assert 'run_dir = "/run/gps"' in files["node.toml.example"].text.splitlines()
    for f in files.values():
        assert not re.search(r"@[A-Z_]+@", f.text), f.path
        assert "/usr/local/bin/slurm-gpushare" not in f.text, f.path
    assert {f.path.name: f.mode for f in files.values() if f.mode != 0o644} == {
        "prolog.sh": 0o755, "epilog.sh": 0o755, "taskprolog.sh": 0o755, "epilog_slurmctld.sh": 0o755}


def test_a_template_may_run_the_interpreter_and_an_unknown_placeholder_is_refused(tmp_path, monkeypatch):
    # for wrappers that run one module of the package: @PYTHON@ is this installation's interpreter
    (tmp_path / "prolog.sh").write_text("#!/bin/sh\nexec @PYTHON@ -m slurm_gpushare.x prolog\n")
    (tmp_path / "epilog.sh").write_text("#!/bin/sh\nexec @PYHTON@ -m x\n")
    monkeypatch.setattr(siteinstall, "site_data", lambda: tmp_path)
    lay = siteinstall.Layout.under(tmp_path / "p", command=CMD)
    assert siteinstall.render("prolog.sh", lay).splitlines()[-1] == f"exec {os.path.abspath(sys.executable)} -m " \
        "slurm_gpushare.x prolog"
    with pytest.raises(ConfigError, match="@PYHTON@") as e:
        siteinstall.render("epilog.sh", lay)
    assert "@PYTHON@" in e.value.hint


def test_the_shipped_wrappers_and_units_hard_code_no_command_path():
    for name in ("prolog.sh", "epilog.sh", "slurm-gpushare-filterd.service", "slurm-gpushare-monitor.service"):
        text = (SHIPPED / name).read_text()
        assert "@SLURM_GPUSHARE@" in text and "/usr/local/bin" not in text and "/usr/bin/slurm-gpushare" not in text


def test_a_run_dir_outside_run_gets_no_runtime_directory_and_node_run_dirs_stay_on_the_node(tmp_path):
    unit = siteinstall.render("slurm-gpushare-filterd.service", layout(tmp_path, run_dir="/var/lib/gps"))
    assert not [line for line in unit.splitlines() if line.startswith("RuntimeDirectory=")]
    node = layout(tmp_path, run_dir="/run/gps/{node}")
    assert 'RUN_DIR="/run/gps/{node}"' in siteinstall.render("taskprolog.sh", node)
    with pytest.raises(InputError, match=r"holds \{node\}"):
        siteinstall.plan(["controller"], node)


@pytest.mark.parametrize("kw", [{"config_dir": "/etc/my gps"}, {"slurm_conf_dir": "/etc/$x"}, {"run_dir": "run/x"},
                                {"run_dir": "/run/a%b"}])
def test_paths_the_files_cannot_carry_are_refused(tmp_path, kw):
    with pytest.raises(InputError) as e:
        layout(tmp_path, **kw)
    assert e.value.hint


def test_an_unknown_role_names_the_known_ones(tmp_path):
    with pytest.raises(InputError, match="unknown role compute") as e:
        siteinstall.plan(["compute"], layout(tmp_path))
    assert "controller, node, login" in e.value.hint


def test_install_writes_then_leaves_unchanged_files_alone(tmp_path):
    lay = layout(tmp_path)
    files = siteinstall.plan(["node"], lay)
    assert {o.state for o in siteinstall.install(files, lay)} == {"new"}
    for f in files:
        assert f.path.read_text() == f.text and f.path.stat().st_mode & 0o777 == f.mode
    assert {o.state for o in siteinstall.install(files, lay)} == {"unchanged"}
    manifest = json.loads(lay.manifest.read_text())["files"]
    assert set(manifest) == {str(f.path) for f in files}
    assert not list(tmp_path.rglob(".*.tmp*"))


def test_an_edited_file_is_refused_and_nothing_is_written_unless_force(tmp_path):
    lay = layout(tmp_path)
    siteinstall.install(siteinstall.plan(["node"], lay), lay)
    prolog = lay.config_dir / "prolog.sh"
    prolog.write_text(prolog.read_text() + "# site edit\n")
    (lay.config_dir / "taskprolog.sh").unlink()
    files = siteinstall.plan(["node"], lay)
    with pytest.raises(ConfigError, match=re.escape(str(prolog))) as e:
        siteinstall.install(files, lay)
    assert "--force" in e.value.hint and "nothing was written" in e.value.hint
    assert prolog.read_text().endswith("# site edit\n") and not (lay.config_dir / "taskprolog.sh").exists()
    states = {o.file.path.name: o.state for o in siteinstall.install(files, lay, force=True)}
    assert states["prolog.sh"] == "replace" and states["taskprolog.sh"] == "new"
    assert not prolog.read_text().endswith("# site edit\n")


def test_a_file_the_last_install_wrote_and_nobody_changed_is_upgraded(tmp_path):
    lay = layout(tmp_path)
    siteinstall.install(siteinstall.plan(["node"], lay), lay)
    # what an older version wrote, recorded in the manifest by that install
    old = siteinstall.Layout.under(tmp_path / "p", command=("/opt/old/bin/slurm-gpushare",))
    siteinstall.install(siteinstall.plan(["node"], old), old, force=True)
    outcomes = siteinstall.install(siteinstall.plan(["node"], lay), lay)
    states = {o.file.path.name: o.state for o in outcomes}
    assert states == {"prolog.sh": "upgrade", "epilog.sh": "upgrade", "slurm-gpushare-monitor.service": "upgrade",
                      "taskprolog.sh": "unchanged", "node.toml.example": "unchanged",
                      **{n: "unchanged" for n in siteinstall.man_page_names()}}
    assert CMD[0] in (lay.config_dir / "prolog.sh").read_text()


def test_dry_run_writes_nothing_and_reports_a_refusal(tmp_path):
    p = tmp_path / "p"
    r = run("install", "--role", "controller", "--prefix", str(p), "--dry-run")
    assert r.exit_code == 0 and not p.exists()
    assert f"would write: {p}/etc/slurm/job_submit.lua" in r.output.splitlines()
    assert run("install", "--role", "controller", "--prefix", str(p)).exit_code == 0
    lua = p / "etc/slurm/job_submit.lua"
    lua.write_text(lua.read_text().replace("fail_policy", "fail_policy_x"))
    r = CliRunner().invoke(main, ["install", "--role", "controller", "--prefix", str(p), "--dry-run", "--diff"])
    # the check says in its status that the real install would refuse (ansible --check fails the same way)
    assert r.exit_code == 1 and "REFUSED" in r.output and "+++ " in r.output, r.output
    r = CliRunner().invoke(main, ["install", "--role", "controller", "--prefix", str(p), "--dry-run", "--force"])
    assert r.exit_code == 0 and "REFUSED" not in r.output, r.output
    assert "fail_policy_x" in lua.read_text()
    r = CliRunner().invoke(main, ["install", "--role", "controller", "--prefix", str(p)])
    assert r.exit_code == 2 and "job_submit.lua" in r.output and "--force" in r.output
    # the same check as one JSON object (what Ansible or a cron job parses): the refusal, its diff, the status
    r = CliRunner().invoke(main, ["install", "--role", "controller", "--prefix", str(p), "--dry-run", "--diff",
                                  "--format", "json"])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    states = {Path(f["path"]).name: f for f in doc["files"]}
    assert states["job_submit.lua"]["state"] == "refused" and "+++ " in states["job_submit.lua"]["diff"]
    assert states["cli_filter.lua"]["state"] == "unchanged" and "diff" not in states["cli_filter.lua"]
    assert states["job_submit.lua"]["roles"] == ["controller"]
    assert doc["exit_status"] == 1 and doc["dry_run"] is True and doc["roles"] == ["controller"]
    assert any(line.startswith("JobSubmitPlugins=lua") for line in doc["slurm_conf_lines"])
    fresh = CliRunner().invoke(main, ["install", "--role", "login", "--prefix", str(tmp_path / "q"), "--format",
                                      "json"])
    assert fresh.exit_code == 0 and {f["state"] for f in json.loads(fresh.stdout)["files"]} == {"new"}


def test_a_directory_that_cannot_be_written_is_one_clear_error(tmp_path):
    blocker = tmp_path / "p" / "etc"
    blocker.parent.mkdir()
    blocker.write_text("a file where the install needs a directory\n")
    r = CliRunner().invoke(main, ["install", "--role", "node", "--prefix", str(tmp_path / "p")])
    assert r.exit_code == 2 and r.output.startswith(f"slurm-gpushare: error: {blocker} is not a directory")
    assert "--prefix" in r.output and "Traceback" not in r.output


def test_the_printed_slurm_conf_lines_name_the_written_files(tmp_path):
    p = tmp_path / "p"
    r = run("install", "--role", "controller", "--role", "node", "--prefix", str(p))
    lines = [line.split("#")[0].strip() for line in r.output.split("slurm.conf lines")[1].splitlines()[1:]]
    conf = dict(line.split("=", 1) for line in lines if line)
    assert conf["JobSubmitPlugins"] == "lua" and conf["CliFilterPlugins"] == "cli_filter/lua"
    assert conf["PrologFlags"] == "Alloc"
    for key, name in (("Prolog", "prolog.sh"), ("Epilog", "epilog.sh"), ("TaskProlog", "taskprolog.sh")):
        assert conf[key] == f"{p}/etc/slurm/gpushare/{name}" and os.access(conf[key], os.X_OK)


def test_this_installation_is_the_running_script_else_the_venvs_else_python_m(tmp_path):
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    assert siteinstall.this_installation("x/__main__.py", str(venv / "python")) == (
        str(venv / "python"), "-m", "slurm_gpushare")  # the venv's python, not the interpreter it links to
    (venv / "slurm-gpushare").write_text("#!/bin/sh\n")
    (venv / "slurm-gpushare").chmod(0o755)
    assert siteinstall.this_installation("x/__main__.py", str(venv / "python")) == (str(venv / "slurm-gpushare"),)
    script = tmp_path / "local" / "slurm-gpushare"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    assert siteinstall.this_installation(str(script), str(venv / "python")) == (str(script),)


def test_the_version_comes_from_one_place():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "slurm_gpushare.__version__"}
    assert metadata.version("slurm-gpushare") == __version__
    assert run("--version").output == f"slurm-gpushare, version {__version__}\n"
    assert f"## {__version__}" in (ROOT / "CHANGELOG.md").read_text()


def test_the_wheel_carries_the_site_files_the_machines_and_the_licence(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = tmp_path.glob("slurm_gpushare-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    site = {n.removeprefix("slurm_gpushare/data/site/") for n in names if n.startswith("slurm_gpushare/data/site/")}
    assert site == {f.name for f in SHIPPED.iterdir()}
    man = {n.removeprefix("slurm_gpushare/data/man/") for n in names if n.startswith("slurm_gpushare/data/man/")}
    assert "slurm-gpushare.1" in man and man == set(siteinstall.man_page_names())
    machines = ROOT / "slurm_gpushare/data/machines"
    assert {f"slurm_gpushare/data/machines/{f.name}" for f in machines.iterdir()} <= names
    dist = f"slurm_gpushare-{__version__}.dist-info"
    assert f"{dist}/licenses/LICENSE" in names
    meta = zipfile.ZipFile(wheel).read(f"{dist}/METADATA").decode()
    assert "License-Expression: GPL-2.0-or-later" in meta.splitlines()
    assert "Provides-Extra: slurm" not in meta  # pyslurm is not used
    # the product only: the dev kit (dev cluster, stand-in MPS control) stays in the checkout
    assert not [n for n in names if n.startswith("slurm_gpushare_dev/") or "fake_mps" in n or n.startswith("tests/")]
    # matplotlib (report --plot) is the plot extra, not a dependency of every node
    requires = [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist: matplotlib")]
    assert requires and all("extra ==" in ln for ln in requires), requires
    assert "Provides-Extra: plot" in meta.splitlines()
    assert "GNU GENERAL PUBLIC LICENSE" in (ROOT / "LICENSE").read_text()[:200]


def test_the_controller_gets_the_slurmctld_epilog_with_this_installations_paths(tmp_path):
    """The EpilogSlurmctld wrapper names the installed command and the config directory's step directory,
    and the printed slurm.conf lines name it (slurm.conf(5) EpilogSlurmctld)."""
    lay = siteinstall.Layout(slurm_conf_dir=tmp_path / "etc/slurm", config_dir=tmp_path / "etc/slurm/gpushare",
                             systemd_dir=tmp_path / "etc/systemd/system", command=("/opt/gps/bin/slurm-gpushare",))
    (f,) = [f for f in siteinstall.plan(["controller"], lay) if f.path.name == "epilog_slurmctld.sh"]
    text = f.text
    assert 'SLURM_GPUSHARE="/opt/gps/bin/slurm-gpushare"' in text, text
    assert f'BEFORE_DIR="{tmp_path}/etc/slurm/gpushare/epilog_slurmctld.d"' in text, text
    assert "@" not in text.replace("[gpushare:u1", ""), text
    assert any(line.startswith(f"EpilogSlurmctld={tmp_path}/etc/slurm/gpushare/epilog_slurmctld.sh")
               for line in siteinstall.slurm_conf_lines(["controller"], lay))


def test_a_directory_where_a_file_goes_is_one_clear_error_and_nothing_is_written(tmp_path):
    lay = layout(tmp_path)
    (lay.config_dir / "prolog.sh").mkdir(parents=True)
    files = siteinstall.plan(["node"], lay)
    for force in (False, True):
        with pytest.raises(InputError, match=re.escape(f"{lay.config_dir / 'prolog.sh'} is a directory")) as e:
            siteinstall.install(files, lay, force=force)
        assert e.value.hint
    assert [p.name for p in lay.config_dir.iterdir()] == ["prolog.sh"]
    r = CliRunner().invoke(main, ["install", "--role", "node", "--prefix", str(tmp_path / "p"), "--dry-run"])
    assert r.exit_code == 2 and "is a directory" in r.output and "Traceback" not in r.output


def test_an_empty_prefix_is_refused_not_taken_as_the_current_directory(tmp_path, monkeypatch):
    # --prefix "$PREFIX" with PREFIX unset: os.path.abspath("") is the working directory
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["install", "--role", "node", "--prefix", ""])
    assert r.exit_code == 2 and "--prefix" in r.output and list(tmp_path.iterdir()) == []


def test_a_wrapper_that_lost_its_mode_gets_it_back(tmp_path):
    # slurmd cannot run a Prolog that is not executable (and drains the node): the content is what the
    # install writes, so nothing of the site's is lost by restoring the mode
    lay = layout(tmp_path)
    siteinstall.install(siteinstall.plan(["node"], lay), lay)
    prolog = lay.config_dir / "prolog.sh"
    prolog.chmod(0o644)
    states = {o.file.path.name: o.state for o in siteinstall.install(siteinstall.plan(["node"], lay), lay)}
    assert states["prolog.sh"] == "mode" and states["epilog.sh"] == "unchanged"
    assert prolog.stat().st_mode & 0o777 == 0o755


def test_a_prefix_the_files_cannot_carry_is_named_as_the_prefix(tmp_path):
    # the admin gave --prefix, not --slurm-conf-dir: the error names what was typed
    r = CliRunner().invoke(main, ["install", "--role", "node", "--prefix", str(tmp_path / "my stage")])
    assert r.exit_code == 2 and r.output.startswith(f"slurm-gpushare: error: --prefix '{tmp_path / 'my stage'}' ")
    assert not (tmp_path / "my stage").exists()


def test_diff_without_dry_run_shows_what_is_replaced_and_writes_it(tmp_path):
    """Found by a reviewer (issue #15): --diff without --dry-run was ignored silently. It now shows how each
    file that is replaced changes (as ``ansible --diff`` does; --dry-run --diff writes nothing), and where
    the install refuses, how the refused files would change, before the error."""
    p = tmp_path / "p"
    assert run("install", "--role", "node", "--prefix", str(p), "--run-dir", "/run/a").exit_code == 0
    taskprolog = p / "etc/slurm/gpushare/taskprolog.sh"
    r = run("install", "--role", "node", "--prefix", str(p), "--run-dir", "/run/b", "--diff")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert f"replaced (unchanged since the last install): {taskprolog}" in lines
    assert '-RUN_DIR="/run/a"' in lines and '+RUN_DIR="/run/b"' in lines, r.output
    assert f"--- {taskprolog}" in lines and f"+++ {taskprolog} (this install)" in lines, r.output
    assert 'RUN_DIR="/run/b"' in taskprolog.read_text()
    epilog = p / "etc/slurm/gpushare/epilog.sh"
    epilog.write_text(epilog.read_text() + "# a site edit\n")
    r = CliRunner().invoke(main, ["install", "--role", "node", "--prefix", str(p), "--run-dir", "/run/c", "--diff"])
    assert r.exit_code == 2 and "-# a site edit" in r.output.splitlines(), r.output
    assert "slurm-gpushare: error: 1 file(s) differ" in r.output and "nothing was written" in r.output
    assert "# a site edit" in epilog.read_text() and 'RUN_DIR="/run/b"' in taskprolog.read_text()


@pytest.mark.parametrize("where", ["file-for-dir", "dir-for-manifest", "unwritable-dir"])
def test_the_dry_run_reports_what_stops_the_real_install_and_the_real_one_writes_nothing(tmp_path, where,
                                                                                      monkeypatch):
    """Found by a reviewer (issue #15): where a directory (or file) stood in the install's way, --dry-run said
    "would write" and the real install failed (with a directory at the manifest's path, after writing every
    other file). Both now stop before writing, with the same line naming the path and what to do."""
    p = tmp_path / "p"
    if where == "file-for-dir":
        p.mkdir()
        (p / "etc").write_text("a file where the install needs a directory\n")
        blocker, says = p / "etc", f"{p / 'etc'} is not a directory, where the install needs one"
    elif where == "dir-for-manifest":
        blocker = p / "etc/slurm/gpushare" / siteinstall.MANIFEST
        blocker.mkdir(parents=True)
        says = f"{blocker} is a directory, where the install writes a file"
    else:
        blocker = p / "etc"
        blocker.mkdir(parents=True)
        real_access = os.access
        monkeypatch.setattr(siteinstall.os, "access", lambda path, mode: real_access(path, mode)
                            and Path(path) != blocker)  # as a user who cannot write there (the tests run as root)
        says = f"cannot write {blocker}: permission denied"
    before = sorted(str(x) for x in tmp_path.rglob("*"))
    for dry in (["--dry-run"], []):
        r = CliRunner().invoke(main, ["install", "--role", "node", "--role", "controller", "--prefix", str(p), *dry])
        assert r.exit_code == 2, (dry, r.output)
        assert r.output.startswith(f"slurm-gpushare: error: {says}"), (dry, r.output)
        assert "would write" not in r.output and "Traceback" not in r.output and "(" in r.output, r.output
        assert sorted(str(x) for x in tmp_path.rglob("*")) == before, dry


def test_a_console_script_run_through_a_link_names_the_venvs_script(tmp_path):
    """install.md links the venv's script into /usr/local/sbin; the install run through that link wrote the
    link's path into the wrappers and units, not the venv's script (the docs say the files run this venv's
    slurm-gpushare): a link removed or pointed at another venv changed what every Prolog runs."""
    venv = tmp_path / "opt" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    (venv / "slurm-gpushare").write_text("#!/bin/sh\n")
    (venv / "slurm-gpushare").chmod(0o755)
    link = tmp_path / "usr/local/sbin/slurm-gpushare"
    link.parent.mkdir(parents=True)
    link.symlink_to(venv / "slurm-gpushare")
    assert siteinstall.this_installation(str(link), str(venv / "python")) == (str(venv / "slurm-gpushare"),)
    # a link to another installation's script than the running interpreter's: that script, by its real path
    other = tmp_path / "other" / "slurm-gpushare"
    other.parent.mkdir()
    other.write_text("#!/bin/sh\n")
    link.unlink()
    link.symlink_to(other)
    assert siteinstall.this_installation(str(link), str(venv / "python")) == (str(other),)


@pytest.mark.parametrize("umask", [0o000, 0o077])
def test_directories_get_0755_whatever_the_umask_and_a_writable_one_is_repaired(tmp_path, umask):
    """Issue 28 item 5: under umask 000 the directory holding the root-run Prolog/Epilog was made 0777 (any user
    could replace them); under 077, 0700 (login users' srun could not read cli_filter.lua)."""
    lay = layout(tmp_path)
    files = siteinstall.plan(["node", "login"], lay)
    old = os.umask(umask)
    try:
        siteinstall.install(files, lay)
    finally:
        os.umask(old)
    made = {d for f in files for d in (f.path.parent, *f.path.parent.parents) if tmp_path in d.parents}
    assert made and {oct(d.stat().st_mode & 0o777) for d in made} == {"0o755"}, \
        {str(d): oct(d.stat().st_mode & 0o777) for d in made}
    # a directory already there and writable by others is made 0755 before anything is written into it
    cfg = tmp_path / "p/etc/slurm/gpushare"
    cfg.chmod(0o777)
    siteinstall.install(files, lay)
    assert cfg.stat().st_mode & 0o777 == 0o755


def test_a_writable_directory_of_another_owner_is_refused(tmp_path):
    lay = layout(tmp_path)
    files = siteinstall.plan(["node"], lay)
    cfg = tmp_path / "p/etc/slurm/gpushare"
    cfg.mkdir(parents=True)
    cfg.chmod(0o777)
    os.chown(cfg, 12345, 12345)
    with pytest.raises(InputError, match="writable by others and owned by uid 12345"):
        siteinstall.install(files, lay)
    assert not list(cfg.iterdir())


def test_the_default_sockets_agree_everywhere_and_lie_below_the_node_run_dir_in_their_own_directory(tmp_path):
    """filterd's defaults, the shipped gpushare_client.lua and a default install name the same two sockets, in
    <run dir>/filterd: the unit's RuntimeDirectory, which systemd removes at every stop and restart, is never
    the directory the node hooks keep running jobs' state in (one host with both roles)."""
    from slurm_gpushare.cli.service import DEFAULT_CONTROLLER_SOCKET, DEFAULT_SOCKET

    run = siteinstall.DEFAULT_RUN_DIR
    assert (DEFAULT_SOCKET, DEFAULT_CONTROLLER_SOCKET) == (f"{run}/filterd/filterd.sock",
                                                           f"{run}/filterd/controller.sock")
    shipped = (SHIPPED / "gpushare_client.lua").read_text()
    assert f'socket = "{DEFAULT_SOCKET}",' in shipped
    assert f'controller_socket = "{DEFAULT_CONTROLLER_SOCKET}",' in shipped
    files = {f.path.name: f for f in siteinstall.plan(siteinstall.ROLES, layout(tmp_path))}
    unit = files["slurm-gpushare-filterd.service"].text.splitlines()
    assert f"RuntimeDirectory={run.removeprefix('/run/')}/filterd" in unit
    assert f'run_dir = "{run}"' in files["node.toml.example"].text.splitlines()


# --- uninstall ---------------------------------------------------------------------------------------------

def _installed(tmp_path: Path, *roles: str, **kw) -> siteinstall.Layout:
    lay = layout(tmp_path, **kw)
    siteinstall.install(siteinstall.plan(roles, lay), lay)
    return lay


def _uninstall(tmp_path: Path, *args: str):
    return CliRunner().invoke(main, ["uninstall", "--prefix", str(tmp_path / "p"), *args])


def test_uninstall_removes_what_install_wrote_and_leaves_edited_files_and_the_sites_own(tmp_path):
    lay = _installed(tmp_path, "controller", "node")
    (lay.config_dir / "node.toml").write_text("version = 1\n")  # the site's own file
    edited = lay.config_dir / "prolog.sh"
    edited.write_text(edited.read_text() + "# site change\n")
    r = _uninstall(tmp_path, "--role", "node", "--role", "controller", "--run-dir", str(tmp_path / "run"))
    assert r.exit_code == 0, r.output
    assert f"left (changed since the last install wrote it, or not written by it): {edited}" in r.output
    assert "systemctl daemon-reload" in r.output
    left = sorted(str(p.relative_to(tmp_path / "p")) for p in (tmp_path / "p").rglob("*") if p.is_file())
    assert left == ["etc/slurm/gpushare/install-manifest.json", "etc/slurm/gpushare/node.toml",
                    "etc/slurm/gpushare/prolog.sh"]
    manifest = json.loads(lay.manifest.read_text())
    assert list(manifest["files"]) == [str(edited)] and manifest["roles"] == []
    # the edited file removed by hand: the manifest goes too
    edited.unlink()
    assert _uninstall(tmp_path, "--role", "node", "--run-dir", str(tmp_path / "run")).exit_code == 0
    assert not lay.manifest.exists()


def test_uninstall_is_refused_while_slurm_conf_names_the_files_and_dry_run_says_so(tmp_path):
    lay = _installed(tmp_path, "controller", "node")
    inc = lay.slurm_conf_dir / "hooks.conf"
    inc.write_text(f"Prolog={lay.config_dir}/prolog.sh\nEpilog=/etc/slurm/site-epilog.sh\n")
    (lay.slurm_conf_dir / "slurm.conf").write_text(
        "ClusterName=c\nSlurmctldHost=h\nJobSubmitPlugins=lua\nCliFilterPlugins=cli_filter/lua\nInclude hooks.conf\n")
    before = sorted(p for p in (tmp_path / "p").rglob("*"))
    dry = _uninstall(tmp_path, "--role", "node", "--role", "controller", "--dry-run")
    assert dry.exit_code == 1, dry.output
    r = _uninstall(tmp_path, "--role", "node", "--role", "controller")
    assert r.exit_code == 2 and "nothing was removed" in r.output, r.output
    for out in (dry.output, r.output):
        assert "JobSubmitPlugins=lua" in out and "CliFilterPlugins=cli_filter/lua" in out
        assert f"hooks.conf:1: Prolog={lay.config_dir}/prolog.sh" in out and "site-epilog" not in out
    assert sorted(p for p in (tmp_path / "p").rglob("*")) == before
    # the node role alone: only the Prolog line is in the way
    r = _uninstall(tmp_path, "--role", "node")
    assert r.exit_code == 2 and "Prolog=" in r.output and "JobSubmitPlugins" not in r.output, r.output


def test_uninstall_of_the_node_role_waits_for_the_jobs_on_the_node(tmp_path):
    run = tmp_path / "run"
    _installed(tmp_path, "node", run_dir=str(run))
    (run / "jobs" / "4711").mkdir(parents=True)
    r = _uninstall(tmp_path, "--role", "node", "--run-dir", str(run))
    assert r.exit_code == 2 and "1 job(s) still have their directory" in r.output and "4711" in r.output, r.output
    (run / "jobs" / "4711").rmdir()
    assert _uninstall(tmp_path, "--role", "node", "--run-dir", str(run)).exit_code == 0


def test_uninstall_of_one_role_keeps_the_files_another_installed_role_uses(tmp_path):
    lay = _installed(tmp_path, "controller", "login")
    r = _uninstall(tmp_path, "--role", "login")
    assert r.exit_code == 0, r.output
    assert (lay.slurm_conf_dir / "cli_filter.lua").exists() and (lay.slurm_conf_dir / "gpushare_client.lua").exists()
    assert "left (a file of a role this host keeps)" in r.output
    assert json.loads(lay.manifest.read_text())["roles"] == ["controller"]
    r = _uninstall(tmp_path, "--role", "controller")
    assert r.exit_code == 0 and not (lay.slurm_conf_dir / "cli_filter.lua").exists(), r.output
