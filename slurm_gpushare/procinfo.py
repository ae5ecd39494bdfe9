"""Facts about local processes from ``/proc``, for every layer (the fake NVML's process table, the dev
cluster's daemons)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie has exited; only its parent has not reaped it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
