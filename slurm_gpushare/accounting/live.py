"""What the node monitor measured so far for each running job, handed to the Epilog through a file.

The monitor (``slurm-gpushare monitor``) rewrites ``<run_dir>/usage/<job id>.json`` after every sample
(write to a temporary file, then rename: a reader never sees half a file). The Epilog reads it for the
job's accounting records (:func:`load_usage`) and removes it; the monitor removes files of jobs that
no longer run on the node, and reads the files back when it restarts, so a restarted monitor keeps
the peaks it had.

File format (version 1)::

    {"v": 1, "job_id": "1234", "node": "a100-nvb", "updated": 1764400000.5,
     "devices": [{"key": 0, "peak_mib": 6144, "sm_sum": 410.0, "sm_n": 9, "sm_peak": 62.0, "samples": 9,
                  "series_mib": [2048, 6144, 4096, 5120, 6144], "series_width": 2, "series_samples": 9},
                 {"key": "MIG-...", "peak_mib": 1020, "sm_sum": 0.0, "sm_n": 0, "sm_peak": null, "samples": 9,
                  "series_mib": [...], "series_width": 2, "series_samples": 9}]}

``key`` is the NVML index of a GPU, or the MIG device UUID; memory in MiB, SM in percent of the GPU
(:class:`~slurm_gpushare.accounting.record.UsageTracker`). ``series_*`` is the memory series (at most 32
values); a device row without them (a file of an earlier release) is read with an empty series.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from slurm_gpushare.accounting.record import Usage, UsageTracker
from slurm_gpushare.atomicfile import write_atomic
from slurm_gpushare.errors import InputError

USAGE_VERSION = 1


def usage_dir(run_dir: str | Path) -> Path:
    """``<run_dir>/usage``."""
    return Path(run_dir) / "usage"


def usage_path(run_dir: str | Path, job_id: str) -> Path:
    """``<run_dir>/usage/<job id>.json``.

    Raises:
        InputError: a job id that is not decimal digits (``_`` allowed for array tasks).
    """
    if not _is_job_id(job_id):
        raise InputError(f"job id {job_id!r} is not a Slurm job id")
    return usage_dir(run_dir) / f"{job_id}.json"


def save_usage(run_dir: str | Path, job_id: str, node: str, tracker: UsageTracker) -> Path:
    """Write the job's running totals (replaced whole, :func:`~slurm_gpushare.atomicfile.write_atomic`; not
    flushed to disk: the monitor rewrites it every sample). Returns the path."""
    path = usage_path(run_dir, job_id)
    if not path.parent.is_dir():  # root's: usage names the job's user
        path.parent.parent.mkdir(parents=True, exist_ok=True)
        path.parent.mkdir(mode=0o700, exist_ok=True)
    data = {"v": USAGE_VERSION, "job_id": job_id, "node": node, "updated": round(time.time(), 3),
            "devices": tracker.state(job_id)}
    return write_atomic(path, json.dumps(data, separators=(",", ":")), mode=0o600, fsync=False)


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise InputError(f"usage file is not readable JSON: {e}", source=str(path)) from None
    if not isinstance(data, dict) or data.get("v") != USAGE_VERSION or not isinstance(data.get("devices"), list):
        raise InputError(f"not a version-{USAGE_VERSION} usage file", source=str(path))
    return data


def load_usage(run_dir: str | Path, job_id: str) -> dict[int | str, Usage] | None:
    """The monitor's usage of a job per device key, or None when the monitor wrote nothing for it.

    Raises:
        InputError: the file exists but is not a valid usage file (names it).
    """
    rows = load_state(run_dir, job_id)
    if rows is None:
        return None
    tracker = UsageTracker()
    tracker.restore(job_id, rows)
    return tracker.usage(job_id)


def load_state(run_dir: str | Path, job_id: str) -> list[dict] | None:
    """The job's running totals as :meth:`~slurm_gpushare.accounting.record.UsageTracker.state` rows, or
    None without a file (for :meth:`~slurm_gpushare.accounting.record.UsageTracker.restore`).

    Raises:
        InputError: the file exists but is not a valid usage file (names it).
    """
    data = _read(usage_path(run_dir, job_id))
    return None if data is None else data["devices"]


def remove_usage(run_dir: str | Path, job_id: str) -> None:
    """Remove the job's usage file (missing is fine)."""
    usage_path(run_dir, job_id).unlink(missing_ok=True)


def restore_all(run_dir: str | Path, tracker: UsageTracker) -> tuple[list[str], list[str]]:
    """Load every usage file into ``tracker`` (a restarted monitor). Returns ``(job ids restored,
    problems)``; an unreadable file is a problem (named), not an error."""
    restored: list[str] = []
    problems: list[str] = []
    d = usage_dir(run_dir)
    if not d.is_dir():
        return restored, problems
    for path in sorted(d.glob("*.json")):
        if not _is_job_id(path.stem):
            continue
        try:
            data = _read(path)
            if data is None:
                continue
            tracker.restore(path.stem, data["devices"])
            restored.append(path.stem)
        except InputError as e:
            problems.append(str(e))
    return restored, problems


def usage_files(run_dir: str | Path) -> list[str]:
    """Job ids that have a usage file (other files in the directory are not ours and are ignored)."""
    d = usage_dir(run_dir)
    return sorted(p.stem for p in d.glob("*.json") if _is_job_id(p.stem)) if d.is_dir() else []


def _is_job_id(text: str) -> bool:
    return bool(text) and text.replace("_", "").isdigit()
