"""docs/mps.md stays true to the tree: the tests it cites exist, and the TaskProlog variables it lists
are the ones a job's plan exports (``JobPlan.env`` with its daemon's ``MpsDaemon.client_env``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from slurm_gpushare.node.mps import MpsDaemon
from slurm_gpushare.node.plan import JobPlan

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "mps.md"
TASKPROLOG = ROOT / "slurm_gpushare" / "data" / "site" / "taskprolog.sh"

#: ``tests/<file>.py::test_name`` as the "Verified here" section cites a test.
CITED_TEST = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")
#: An environment variable name in backquotes, at the start of a table row.
TABLE_VARIABLE = re.compile(r"^\|\s*`([A-Z][A-Z0-9_]*)`\s*\|", re.M)


def section(text: str, heading: str) -> str:
    """The body of the markdown section whose heading line contains ``heading``, up to the next heading
    of the same or a higher level."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(#+)\s", line)
        if m and heading in line:
            level = len(m.group(1))
            body = []
            for following in lines[i + 1:]:
                n = re.match(r"^(#+)\s", following)
                if n and len(n.group(1)) <= level:
                    break
                body.append(following)
            return "\n".join(body)
    raise AssertionError(f"{DOC.relative_to(ROOT)} has no section {heading!r}")


def defined_tests(path: Path) -> set[str]:
    """Names of the test functions defined in a test module (module level and in classes)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")}


def test_every_test_named_in_verified_here_exists():
    cited = CITED_TEST.findall(section(DOC.read_text(), "Verified here"))
    assert cited, "the 'Verified here' section names no test"
    missing = []
    for rel, name in cited:
        path = ROOT / rel
        if not path.is_file():
            missing.append(f"{rel} (no such file)")
        elif name not in defined_tests(path):
            missing.append(f"{rel}::{name}")
    assert missing == [], f"docs/mps.md cites tests that do not exist: {missing}"


def test_taskprolog_variables_are_those_jobplan_exports():
    documented = set(TABLE_VARIABLE.findall(section(DOC.read_text(), "TaskProlog")))
    assert documented, "the TaskProlog section of docs/mps.md lists no variable"
    # every field set, so that every variable the plan can export is exported
    daemon = MpsDaemon("/run/gpushare/jobs/1/mps/pipe", "/run/gpushare/jobs/1/mps/log", visible_devices="")
    mps = JobPlan("mps", "1", 1000, 1000, (0, 1), "GPU-a,GPU-b", 10240, 25, client_priority=1)
    exported = set(mps.env(daemon.client_env())) | set(JobPlan("mig", "2", visible_devices="MIG-a").env())
    # CUDA_VISIBLE_DEVICES is not in the env file: taskprolog.sh prints Slurm's own value for the task,
    # translated through the plan's devices table, with an export line of its own
    exported |= set(re.findall(r'echo "export ([A-Z][A-Z0-9_]*)=', TASKPROLOG.read_text()))
    assert sorted(documented - exported) == [], "docs/mps.md lists variables the TaskProlog does not export"
    assert sorted(exported - documented) == [], "the TaskProlog exports variables docs/mps.md does not list"
