"""The layering and import rules of docs/architecture.md, enforced: import-linter contracts, banned imports,
and "importing does nothing"."""

from __future__ import annotations

import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import slurm_gpushare

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run([str(BIN / "lint-imports"), "--config", str(cwd / "setup.cfg"), "--no-cache"],
                          cwd=cwd, env=env, capture_output=True, text=True)


def test_layer_contracts_are_kept():
    proc = _lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "broken" in proc.stdout and " 0 broken" in proc.stdout


def test_layer_contracts_fail_when_a_lower_layer_imports_a_higher_one(tmp_path):
    for package in ("slurm_gpushare", "slurm_gpushare_dev"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "setup.cfg", tmp_path / "setup.cfg")
    machine = tmp_path / "slurm_gpushare" / "hardware" / "machine.py"
    machine.write_text(machine.read_text() + "\nimport slurm_gpushare.gresconf.render  # noqa: E402,F401\n")
    proc = _lint_imports(tmp_path)
    assert proc.returncode != 0
    assert "slurm_gpushare.hardware.machine -> slurm_gpushare.gresconf.render" in proc.stdout


def _modules() -> list[str]:
    # __main__ runs the command line when imported, by design
    return sorted(m.name for m in pkgutil.walk_packages(slurm_gpushare.__path__, "slurm_gpushare.")
                  if not m.name.endswith("__main__"))


def test_only_the_nvml_port_imports_pynvml():
    proc = subprocess.run([str(BIN / "ruff"), "check", "--select", "TID251", "--no-cache", "slurm_gpushare"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_importing_any_module_does_nothing():
    """Every module imports in a fresh interpreter of its own (as pip-tools' import test does): alone, so that
    none imports only because another module imported first, without loading pynvml or changing the
    environment."""
    from concurrent.futures import ThreadPoolExecutor

    code = (
        "import importlib, os, sys\n"
        "before = dict(os.environ)\n"
        "importlib.import_module(sys.argv[1])\n"
        "assert 'pynvml' not in sys.modules, 'pynvml imported at import time'\n"
        "assert dict(os.environ) == before, 'environment changed at import time'\n"
    )

    def alone(module: str) -> tuple[str, int, str]:
        proc = subprocess.run([sys.executable, "-c", code, module], capture_output=True, text=True, cwd=ROOT)
        return module, proc.returncode, proc.stderr[-2000:]

    modules = _modules()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(alone, modules))
    assert len(results) == len(modules) > 50
    assert [r for r in results if r[1] != 0] == []


def _import_graph():
    """Module -> the product's modules it imports anywhere in its text (module level or inside a function),
    each resolved to the module that defines it (``from pkg import name`` of a function: ``pkg``)."""
    import ast

    import networkx as nx

    files = {}
    for path in (ROOT / "slurm_gpushare").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def module_of(name: str) -> str:
        while name not in files:
            name = name.rpartition(".")[0]
        return name

    graph = nx.DiGraph()
    for name, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                if target.startswith("slurm_gpushare.") and module_of(target) != name:
                    graph.add_edge(name, module_of(target))
    return graph


def test_no_import_circle_hides_in_a_function():
    """A function-local import that closes a circle of modules (``slurm.commands`` <-> ``slurm.release``,
    ``cli.hardware`` <-> ``cli.placement``) hides a tangle the layer contracts cannot see. The only circles
    allowed are click's registration: the group ``slurm_gpushare.cli`` imports the modules that add
    commands to it, and they import the group."""
    import networkx as nx

    graph = _import_graph()
    assert graph.has_edge("slurm_gpushare.cli.placement", "slurm_gpushare.cli.hardware")  # the walk sees imports
    graph.remove_node("slurm_gpushare.cli")
    assert list(nx.simple_cycles(graph)) == []


def test_documented_packages_are_the_packages_on_disk():
    # docs/architecture.md's package table names every package of the tree, and nothing else
    text = (ROOT / "docs" / "architecture.md").read_text()
    documented = set(re.findall(r"^\| `(slurm_gpushare[a-z_.]*)` \|", text, re.M))
    on_disk = {".".join(p.parent.relative_to(ROOT).parts)
               for top in ("slurm_gpushare", "slurm_gpushare_dev")
               for p in (ROOT / top).rglob("__init__.py") if "__pycache__" not in p.parts}
    on_disk.discard("slurm_gpushare")  # the root package; its modules are listed in the text below the table
    assert documented == on_disk
    top_modules = {p.stem for p in (ROOT / "slurm_gpushare").glob("*.py") if p.stem != "__init__"}
    for name in top_modules:
        assert f"`{name}`" in text, f"docs/architecture.md does not mention slurm_gpushare/{name}.py"


HEAVY = ("numpy", "scipy", "networkx", "pynvml")


def _loaded_in_fresh_interpreter(code: str) -> set[str]:
    probe = code + "\nimport sys\nprint(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in %r)))\n" % (
        HEAVY,)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


def test_the_controller_path_loads_no_numpy_scipy_or_networkx(tmp_path):
    # `slurm-gpushare filterd --help`, then a whole decision through the service's own inventory cache
    help_run = ("import sys\nfrom click.testing import CliRunner\nfrom slurm_gpushare.cli import main\n"
                "r = CliRunner().invoke(main, ['filterd', '--help'])\nassert r.exit_code == 0, r.output\n")
    assert _loaded_in_fresh_interpreter(help_run) == set()
    machines = tmp_path / "machines"
    machines.mkdir()
    for f in ("8x-a100-nv12-bridge.json", "4x-h100-mig-mixed.json"):
        (machines / f).write_bytes((ROOT / "slurm_gpushare" / "data" / "machines" / f).read_bytes())
    decision = (
        "import io, json\n"
        "from pathlib import Path\n"
        "from slurm_gpushare.hardware.machine import Machine\n"
        "from slurm_gpushare.slurm.nodegres import node_gres\n"
        "from slurm_gpushare.submit.policyfile import SitePolicy\n"
        "from slurm_gpushare.submit.cache import InventoryCache\n"
        "from slurm_gpushare.submit.log import Log\n"
        "from slurm_gpushare.submit.service import FilterService\n"
        f"d = Path({str(machines)!r})\n"
        "ms = {p.stem: Machine.load(p) for p in d.glob('*.json')}\n"
        "fmt = lambda c: ','.join(f'{n}:{t}:{k}' if t else f'{n}:{k}' for (n, t), k in c.items())\n"
        "meta = {'Slurm': {'version': {'major': 22, 'minor': 5, 'micro': 8}}}\n"
        "sinfo = json.dumps({'meta': meta, 'nodes': [{'name': n, 'gres': fmt(node_gres(m, n).counts),\n"
        "                    'state': 'idle', 'partitions': ['gpu']} for n, m in ms.items()]})\n"
        "parts = 'PartitionName=gpu Default=YES Nodes=' + ','.join(ms)\n"
        "cache = InventoryCache(d, slurm_source=lambda: (sinfo, parts), log=Log(io.StringIO()))\n"
        "cache.refresh('test')\n"
        "svc = FilterService(cache, Log(io.StringIO()))\n"
        "a = svc.handle_line(json.dumps({'op': 'submit', 'tres_per_node': 'gres:gpushare:mem=10G'}))\n"
        "assert a['action'] == 'rewrite', a\n"
    )
    assert _loaded_in_fresh_interpreter(decision) == set()


def _hook_modules(code: str, env: dict[str, str]) -> set[str]:
    """Top-level packages a fresh interpreter holds after ``code`` (the hook run in-process)."""
    probe = ("import sys\n" + code + "\nprint(' '.join(sorted({m.split('.')[0] for m in sys.modules})), "
             "file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                          env={k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CUDA_"))} | env)
    return set(proc.stderr.split())


def test_the_node_hooks_load_no_cli_framework_numpy_scipy_networkx_or_pynvml(tmp_path):
    # slurmd starts the Prolog and Epilog for every job: `slurm-gpushare hook ...` takes the hook's own entry
    # (slurm_gpushare.__main__ -> slurm_gpushare.node.hook), never click and the other commands
    run = ("import sys\nsys.argv = ['slurm-gpushare', 'hook', '{which}', '--config', {cfg!r}]\n"
           "from slurm_gpushare.__main__ import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n")
    cfg = tmp_path / "node.toml"
    cfg.write_text(f'version = 1\nrun_dir = "{tmp_path}/run"\n')
    no_gpu = {"SLURM_JOB_ID": "5", "SLURMD_NODENAME": "n1"}
    prolog = _hook_modules(run.format(which="prolog", cfg=str(cfg)), no_gpu)
    assert "slurm_gpushare" in prolog and not prolog & {"click", "psutil", "tomllib", *HEAVY}
    epilog = _hook_modules(run.format(which="epilog", cfg=str(cfg)), no_gpu)
    assert "tomllib" in epilog and not epilog & {"click", "psutil", *HEAVY}
    # a GPU job's hooks: everything they can need, still no click and nothing heavy
    full = _hook_modules("import slurm_gpushare.node.hook, slurm_gpushare.node.prolog, slurm_gpushare.node.epilog",
                         {})
    assert "psutil" in full and not full & {"click", *HEAVY}
    # nor the accounting store (SQLite, and the process pool of its ingest): the hooks write the spool only;
    # importing it cost each GPU job's Prolog and Epilog about 40 ms (benchmarks/plain_jobs)
    # (with what the hooks import inside their functions for a one-GPU or MPS job)
    lazy = ("slurm_gpushare.accounting.spool", "slurm_gpushare.accounting.live", "slurm_gpushare.accounting.record",
            "slurm_gpushare.node.records", "slurm_gpushare.node.mps", "slurm_gpushare.node.shared_mps",
            "slurm_gpushare.slurm.nodegres", "slurm_gpushare.slurm.conf", "slurm_gpushare.slurm.hostlist")
    gpu_job = _hook_modules("import slurm_gpushare.node.hook, slurm_gpushare.node.prolog, slurm_gpushare.node.epilog, "
                            + ", ".join(lazy), {})
    assert "psutil" in gpu_job and not gpu_job & {"click", *HEAVY, "sqlite3", "multiprocessing", "concurrent"}, \
        gpu_job & {"click", *HEAVY, "sqlite3", "multiprocessing", "concurrent"}


def test_the_task_prolog_runs_no_python():
    # the TaskProlog runs before every task: plain shell that prints what the Prolog prepared
    text = (ROOT / "slurm_gpushare" / "data" / "site" / "taskprolog.sh").read_text()
    assert text.startswith("#!/bin/sh\n")
    code = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    runs = re.compile(r"(^|[;&|(`]|\bthen|\bdo|\bexec)\s*(\S*/)?(python[0-9.]*|slurm-gpushare)(\s|$)")
    assert code and not [line for line in code if runs.search(line)]
    assert runs.search("exec /usr/bin/python3 -m x") and runs.search("if x; then slurm-gpushare hook")


def test_package_data_globs_ship_every_data_file_and_each_matches_something():
    # a built wheel holds the product's .py modules and what [tool.setuptools.package-data] names: an
    # installation takes its site files from there (no repository needed); the dev kit is not in the wheel
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = setuptools["package-data"]
    assert set(globs) == {"slurm_gpushare"}
    assert setuptools["packages"]["find"]["include"] == ["slurm_gpushare", "slurm_gpushare.*"]
    for package, patterns in globs.items():
        base = ROOT / package
        data = {p.relative_to(base) for p in base.rglob("*")
                if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
        matched = {pattern: {p.relative_to(base) for p in base.glob(pattern) if p.is_file()} for pattern in patterns}
        assert not [pattern for pattern, files in matched.items() if not files], f"{package}: globs matching nothing"
        assert data == set().union(*matched.values()), f"{package}: data files no glob ships"


def test_ruff_finds_nothing_in_the_package_and_the_tests():
    # the whole configured rule set (pyproject.toml), docstrings of the public API included
    proc = subprocess.run([str(BIN / "ruff"), "check", "--no-cache", "slurm_gpushare", "slurm_gpushare_dev", "tests"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_is_clean():
    # configured in pyproject.toml ([tool.mypy]: the product and the dev package)
    proc = subprocess.run([str(BIN / "mypy"), "--no-incremental", "--cache-dir", "/dev/null"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found" in proc.stdout
