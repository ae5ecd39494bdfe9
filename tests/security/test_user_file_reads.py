"""Root reads a file in a directory a job's user owns only through the one bounded reader (issue 26 item 1).

The user-owned directories of a job are its MPS pipe and log directories (``MpsDaemon.pipe_dir``,
``log_dir``: the daemon runs as the job's user and writes there). Every read of a path built from them in the
product goes through :func:`slurm_gpushare.atomicfile.read_user_file` (no-follow, non-blocking, a regular file
of the expected owner, bounded). This test reads the product's source and fails on any other read of such a
path: ``open``, ``os.open``, ``Path.open``/``read_text``/``read_bytes``, ``json.load``/``tomllib.load``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "slurm_gpushare"
#: Names of the user-owned directories, as the code names them.
USER_DIRS = ("pipe_dir", "log_dir", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
READ_METHODS = ("read_text", "read_bytes", "open")
READ_FUNCTIONS = ("open", "os.open", "io.open")


def _names(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.add(n.value)
    return out


def _user_path(node: ast.AST) -> bool:
    return any(name in _names(node) for name in USER_DIRS)


def reads_of_user_paths(source: str, filename: str) -> list[str]:
    """``file:line`` of each read whose path expression is built from a user-owned directory."""
    found = []
    for call in (n for n in ast.walk(ast.parse(source, filename)) if isinstance(n, ast.Call)):
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in READ_METHODS:
            # path.read_text(), (pipe_dir / "x").open(): the object is the path
            if func.attr != "open" or not isinstance(func.value, ast.Name) or func.value.id not in ("os", "io"):
                if _user_path(func.value):
                    found.append(f"{filename}:{call.lineno}")
                    continue
        name = ast.unparse(func)
        if name in READ_FUNCTIONS and call.args and _user_path(call.args[0]):
            found.append(f"{filename}:{call.lineno}")
    return found


def test_the_check_finds_the_reads_it_is_meant_to_find():
    bad = (
        "def f(self):\n"
        "    a = (self.pipe_dir / PID_FILE).read_text()\n"
        "    b = open(self.log_dir / 'control.log')\n"
        "    c = os.open(os.path.join(env['CUDA_MPS_PIPE_DIRECTORY'], 'x'), os.O_RDONLY)\n"
        "    d = (self.log_dir / 'x').open()\n"
        "    e = read_user_file(self.pipe_dir / PID_FILE, max_bytes=32)\n"
        "    f = (self.run_dir / 'state.json').read_text()\n"
    )
    assert reads_of_user_paths(bad, "x.py") == ["x.py:2", "x.py:3", "x.py:4", "x.py:5"]


def test_no_read_of_a_user_owned_directory_bypasses_the_bounded_reader():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "atomicfile.py":  # the reader itself
            continue
        found += reads_of_user_paths(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert found == [], "reads of a user-owned directory outside atomicfile.read_user_file: " + ", ".join(found)
