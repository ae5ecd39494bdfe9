"""Two real unprivileged users for the hostile-user tests: created once per session when absent."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

#: The attacker and the bystander (or two users sharing a node).
USERS = ("gpushare-alice", "gpushare-bob")


@pytest.fixture(scope="session")
def users() -> dict[str, int]:
    """The two users (``useradd`` when absent; needs root): name -> uid."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create and become test users")
    for name in USERS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True)
    return {name: pwd.getpwnam(name).pw_uid for name in USERS}


@contextlib.contextmanager
def public_tmp(prefix: str, mode: int) -> Iterator[Path]:
    """A fresh directory under /tmp that the test users can reach (pytest's tmp_path lies under a 0700
    directory), made with ``mode`` and removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(mode)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
