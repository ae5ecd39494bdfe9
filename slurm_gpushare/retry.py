"""Calling again what may fail for a moment: a Slurm command racing a job step that ends, slurmctld
busy while a Prolog asks for a job's record."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def retry(call: Callable[[], T], *, waits: Sequence[float], again: Callable[[Exception], bool],
          sleep: Callable[[float], None] = time.sleep) -> T:
    """Call ``call()``; while it raises an error that ``again`` accepts, wait and call it again.

    ``call`` runs at most ``1 + len(waits)`` times: once at once, then once after each wait.

    Args:
        call: what to do; its result is returned.
        waits: seconds to wait before each further try, in order (``(0.5, 1.0)``: three tries in all).
        again: whether an error is worth another try (a passing state); an error it refuses is raised
            at once.
        sleep: how to wait (tests pass a recorder).

    Returns:
        The first result of ``call``.

    Raises:
        Exception: the error of the last try, or the first one ``again`` refused, as ``call`` raised it.
    """
    for wait in waits:
        try:
            return call()
        except Exception as e:
            if not again(e):
                raise
        sleep(wait)
    return call()
