"""filterd's structured log: one JSON object per line, request fields cut to size, a per-uid budget of
``decision`` lines."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any


class Log:
    """Structured log: one JSON object per line (``ts``, ``event`` and the event's fields)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.lock = threading.Lock()

    def __call__(self, event: str, **fields) -> None:
        """Write one JSON line: ``ts`` (epoch seconds), ``event`` and ``fields``."""
        self.write([{"ts": round(time.time(), 3), "event": event, **fields}])

    def write(self, records: list[dict]) -> None:
        """Write records made before (each with its ``ts`` and ``event``), one JSON line each, and flush once."""
        if not records:
            return
        text = "".join(_line(rec) for rec in records)
        with self.lock:
            self.stream.write(text)
            self.stream.flush()


def _line(rec: dict) -> str:
    """One record as a JSON line; a record that cannot be encoded (a value nested too deeply) is written as its
    event and the reason, never raised into the service."""
    try:
        return json.dumps(rec, default=str) + "\n"
    except (ValueError, TypeError, RecursionError) as e:
        return json.dumps({"ts": rec.get("ts"), "event": str(rec.get("event"))[:100],
                           "error": f"record not written: {type(e).__name__}"}) + "\n"


def loggable(value: Any) -> Any:
    """``value`` for a log record when it is a string, number, bool or None; else the first 200 characters of
    its type name and length (a request's field may be any JSON: nested arbitrarily deep, it would fail the
    record's encoding)."""
    if isinstance(value, str) and len(value) > LOGGED_CHARS:
        return f"{value[:LOGGED_CHARS]}...(+{len(value) - LOGGED_CHARS} characters)"
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return f"<{type(value).__name__} of {len(value) if hasattr(value, '__len__') else '?'}>"[:200]


#: The most characters of one string a log record keeps of a request (a user may send 64 KB fields).
LOGGED_CHARS = 300


class DecisionLogBudget:
    """How many ``decision`` lines one peer uid of the public socket may write per window; what is over is counted
    and said in one ``decisions_not_logged`` line per window (a user's flood of requests wrote 286 MiB to the log
    in 10 s). slurmctld's and root's requests are always logged: they are the audit of real submissions.

    Args:
        per_uid: decision lines per uid and window.
        window_s: the window, seconds (monotonic clock).
    """

    def __init__(self, per_uid: int, window_s: float):
        self.per_uid = per_uid
        self.window_s = window_s
        self._start: float | None = None
        self._logged: dict[int, int] = {}
        self._dropped: dict[int, int] = {}

    def allow(self, uid: int, *, now: float) -> bool:
        """Whether ``uid``'s next decision line is written (at ``now``); counts it either way."""
        if self._start is None or now - self._start >= self.window_s:
            self._start, self._logged = now, {}
        n = self._logged.get(uid, 0) + 1
        self._logged[uid] = n
        if n <= self.per_uid:
            return True
        self._dropped[uid] = self._dropped.get(uid, 0) + 1
        return False

    def summary(self, *, now: float) -> dict[str, int] | None:
        """The lines left out per uid (as strings, for JSON) once the window is over, then forgotten; None before
        that or when nothing was left out."""
        if not self._dropped or self._start is None or now - self._start < self.window_s:
            return None
        out, self._dropped = {str(k): v for k, v in sorted(self._dropped.items())}, {}
        return out
