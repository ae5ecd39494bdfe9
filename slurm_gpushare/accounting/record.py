"""The accounting record: what one job reserved and used on one GPU, versioned (``"v": 4``).

One :class:`UsageRecord` per job, step, node and GPU device (a whole GPU, the GPU an MPS share lives
on, or one MIG device), written by the Epilog as one JSON line (:meth:`UsageRecord.to_json`) and read
back strictly (:meth:`UsageRecord.from_json`): every key of its version must be present, no other key is
allowed, types are checked, and a record of an unknown version is refused naming the version.

Versions: 4 added ``submit`` (slurmctld's submit time of the run: a job id Slurm gives the same user again,
after a lost StateSaveLocation or MaxJobId wrapping, is a record of its own). A line of versions 1 to 3 is
still read, as the version-4 record with ``submit`` 0 (unknown). 3 added the memory series
(``mem_series_mib``, ``mem_series_width``: the job's memory over time, see :class:`UsageTracker`). A
version-1 or version-2 line is read without a series (both ``null``). 2 added ``restart`` (the job's restart count,
``SLURM_JOB_RESTART_COUNT``: every run of a requeued job is a record of its own). A version-1 line is
still read, as the record of a job's first run (``restart`` 0): so the store keeps one row per run
whichever release wrote it.

Units: memory in MiB (as NVML reports it), times in epoch seconds (UTC), utilization in percent of
the whole GPU (0-100). A measurement that does not exist is ``null``/None, never 0: NVML does not report
SM utilization for MIG devices (``nvmlDeviceGetUtilizationRates`` answers ``NOT_SUPPORTED`` on a
MIG-enabled GPU) nor on some older GPUs, and a job the monitor never sampled has no peaks at all.

The node side builds records (:func:`slurm_gpushare.node.records.records_for_job`) from what the
Epilog already has and what the monitor measured (:class:`Usage` per GPU, see :class:`UsageTracker`).

Jobs that got GPUs through ``--gres=gpu:N``, ``--gpus=N`` or ``--gpus-per-node=N`` all become records
the same way: Slurm turns each into a ``gres/gpu`` allocation with device indices, which is what
``scontrol -d show job`` lists (``GRES=gpu:a100:2(IDX:0-1)``) and what the plan is built from.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

from slurm_gpushare.errors import InputError
from slurm_gpushare.slurm.admincomment import RUNNING

#: Version of the record format; the ``"v"`` key of every JSON line written.
RECORD_VERSION = 4
#: Versions read (1: without ``restart``, read as restart 0; 1 and 2: without the memory series; 1 to 3:
#: without ``submit``, read as 0).
READ_VERSIONS = (1, 2, 3, 4)
#: Most buckets in a memory series (:class:`UsageTracker`): when all are full, adjacent pairs merge.
SERIES_LEN = 32

#: The modes a record can have: a MIG device, an MPS share of a GPU, a whole GPU.
MODES = ("mig", "mps", "gpu")
#: The states of a job's run after which Slurm runs the job again (sacct's State; a record's ``exit_state``
#: says ``REQUEUED`` of a run that was requeued)
RERUN_STATES = ("REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL")


class RecordError(InputError):
    """A record (or JSON line) that is not a valid record. ``source`` names file and line."""


@dataclass(frozen=True)
class Usage:
    """What the monitor measured for one job on one GPU device.

    Attributes:
        peak_mib: highest GPU memory the job's processes held together, MiB (sum of
            ``nvmlDeviceGetComputeRunningProcesses`` ``usedGpuMemory`` of its processes), or None.
        sm_mean: mean SM utilization over the samples that had it, percent of the GPU, or None.
        sm_peak: highest sampled SM utilization, percent, or None.
        samples: number of samples taken (0: never sampled).
        series_mib: the memory series: per bucket of ``series_width`` consecutive samples, the most
            memory the job held in it, MiB (a sample without a memory reading counts 0); at most
            :data:`SERIES_LEN` buckets, the first from the first sample, the last possibly not full.
            Empty: never sampled (or only by a monitor of a release without series).
        series_width: samples per bucket (1, 2, 4, ...: doubles whenever the buckets are full).
    """

    peak_mib: int | None = None
    sm_mean: float | None = None
    sm_peak: float | None = None
    samples: int = 0
    series_mib: tuple[int, ...] = ()
    series_width: int = 1


class UsageTracker:
    """Running peaks and means per job and GPU device, fed sample by sample (for the node monitor).

    Keys are whatever identifies a device for the caller: the NVML index of a GPU (``int``) or, for
    MIG devices, the MIG device UUID (``str``), as :func:`~slurm_gpushare.node.records.records_for_job` looks them up.

    Besides peaks and means it keeps each device's memory series in constant space (:attr:`Usage.series_mib`):
    a sample goes into the last bucket (its max) while that holds fewer than ``width`` samples, else into a
    new bucket; when :data:`SERIES_LEN` buckets are full, adjacent pairs merge (their max) and ``width``
    doubles. So 10,000 samples are at most 32 numbers, each the peak of an equal stretch of the run.

    Example::

        tracker = UsageTracker()
        tracker.add("1234", 0, used_mib=2048, sm_percent=35.0)   # each sampling interval
        ...
        usage = tracker.pop("1234")                               # in the Epilog: {0: Usage(...)}
    """

    def __init__(self) -> None:
        # job id -> key -> [peak_mib, sm_sum, sm_n, sm_peak, samples, series, width, series_n]
        # (series_n: samples in the series; fewer than samples after restoring a row without one)
        self._jobs: dict[str, dict[int | str, list]] = {}

    def add(self, job_id: str, key: int | str, *, used_mib: int | None, sm_percent: float | None) -> bool:
        """Record one sample of a job on a device: memory its processes hold (MiB) and SM utilization
        (percent), either None when NVML gave nothing. Returns whether a peak rose (or this is the device's
        first sample): what the Epilog's record would miss if it were not saved now."""
        per_job = self._jobs.setdefault(str(job_id), {})
        rose = key not in per_job
        acc = per_job.setdefault(key, [None, 0.0, 0, None, 0, [], 1, 0])
        if used_mib is not None:
            rose = rose or acc[0] is None or used_mib > acc[0]
            acc[0] = used_mib if acc[0] is None else max(acc[0], used_mib)
        if sm_percent is not None:
            acc[1] += sm_percent
            acc[2] += 1
            rose = rose or acc[3] is None or sm_percent > acc[3]
            acc[3] = sm_percent if acc[3] is None else max(acc[3], sm_percent)
        acc[4] += 1
        series, width, n = acc[5], acc[6], acc[7]
        mib = used_mib or 0
        if n >= len(series) * width:  # the last bucket is full (or there is none)
            if len(series) >= SERIES_LEN:
                series[:] = [max(series[i:i + 2]) for i in range(0, len(series), 2)]
                acc[6] = width * 2
            series.append(mib)
        elif mib > series[-1]:
            series[-1] = mib
        acc[7] = n + 1
        return rose

    def usage(self, job_id: str) -> dict[int | str, Usage]:
        """The job's usage so far, per device key (empty when never sampled)."""
        return {k: Usage(a[0], (a[1] / a[2]) if a[2] else None, a[3], a[4], tuple(a[5]), a[6])
                for k, a in self._jobs.get(str(job_id), {}).items()}

    def pop(self, job_id: str) -> dict[int | str, Usage]:
        """:meth:`usage`, then forget the job."""
        out = self.usage(job_id)
        self._jobs.pop(str(job_id), None)
        return out

    def jobs(self) -> tuple[str, ...]:
        """Ids of the jobs with samples."""
        return tuple(self._jobs)

    def state(self, job_id: str) -> list[dict[str, Any]]:
        """The job's running totals as JSON-able rows (``key``, ``peak_mib``, ``sm_sum``, ``sm_n``,
        ``sm_peak``, ``samples``, ``series_mib``, ``series_width``, ``series_samples``), for :meth:`restore`
        after a monitor restart."""
        return [{"key": k, "peak_mib": a[0], "sm_sum": a[1], "sm_n": a[2], "sm_peak": a[3], "samples": a[4],
                 "series_mib": list(a[5]), "series_width": a[6], "series_samples": a[7]}
                for k, a in self._jobs.get(str(job_id), {}).items()]

    def restore(self, job_id: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Take back what :meth:`state` gave (replacing what the tracker holds for the job). A row without
        the series keys (written by a monitor of an earlier release) restores with an empty series: the
        series then starts from the next sample.

        Raises:
            InputError: a row without the keys of :meth:`state` or with wrong types.
        """
        acc: dict[int | str, list] = {}
        try:
            for r in rows:
                key = r["key"]
                if type(key) not in (int, str):
                    raise TypeError(f"key {key!r}")
                peak, sm_peak = r["peak_mib"], r["sm_peak"]
                series, width, n = r.get("series_mib", []), r.get("series_width", 1), r.get("series_samples", 0)
                if (type(series) is not list or len(series) > SERIES_LEN
                        or not all(type(x) is int and x >= 0 for x in series)):
                    raise TypeError(f"series_mib {series!r}: a list of at most {SERIES_LEN} MiB values")
                if type(width) is not int or width < 1 or type(n) is not int or not 0 <= n <= len(series) * width:
                    raise ValueError(f"series_width {width!r}, series_samples {n!r} do not fit the series")
                acc[key] = [None if peak is None else int(peak), float(r["sm_sum"]), int(r["sm_n"]),
                            None if sm_peak is None else float(sm_peak), int(r["samples"]), series, width, n]
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"usage state of job {job_id} is not valid ({e})") from None
        self._jobs[str(job_id)] = acc


#: :meth:`UsageRecord.saw_more` in SQL, for an upsert's ``DO UPDATE ... WHERE``: the new row (``excluded``)
#: against the stored one (its columns unqualified)
SAW_MORE_SQL = '(excluded."samples", excluded."end" - excluded."start") > ("samples", "end" - "start")'


@dataclass(frozen=True)
class UsageRecord:
    """One run's reservation and use of one GPU device on one node (format version 4).

    Attributes:
        job_id: Slurm job id (``SLURM_JOB_ID``; for an array task its own id), decimal digits.
        restart: how often Slurm had restarted the job before this run (``SLURM_JOB_RESTART_COUNT`` of
            slurmd's Prolog/Epilog environment; 0 for the first run, 1 after one ``scontrol requeue``).
        submit: when slurmctld says the run was submitted (``SubmitTime`` of ``scontrol show job``, as the
            Prolog saw it), epoch seconds; 0 unknown (a record of versions 1 to 3, or a run whose Prolog did not
            record it). Slurm sets it anew when it requeues a job, and slurmdbd keys a job's row by id and submit
            time: with ``restart`` it tells apart two jobs Slurm gave one id (a lost StateSaveLocation,
            MaxJobId wrapping), even of one user.
        array_job_id, array_task_id: the array's job id and the task index, None outside arrays.
        step: the job step (``batch``, ``0``, ...), ``""`` for the whole allocation (what the Epilog
            writes).
        user, account, partition, node: as slurmctld recorded them; ``""`` when unknown.
        gpu_index: NVML index of the GPU (the parent GPU for a MIG device).
        gpu_uuid: ``GPU-...`` or, for a MIG device, ``MIG-...`` (``nvmlDeviceGetUUID``); ``""`` unknown.
        gpu_model: short model (``h100``, ``a100``, ``rtx4090``; :func:`~slurm_gpushare.hardware.machine.gpu_model`).
        gpu_memory_mib: total memory of the GPU (the parent for MIG), MiB.
        mode: ``mig`` (a MIG device), ``mps`` (an MPS memory share) or ``gpu`` (a whole GPU).
        share: the MIG profile (``1g.10gb``), the MPS GRES (``shard:10``) or ``""`` for a whole GPU.
        mem_asked_mib: memory asked per device (``gpushare:mem=``), MiB; None when nothing was asked
            (plain ``--gres=gpu:N``, ``mode=gpu``).
        sm_asked_percent: compute share asked (``sm=``), percent; None when not asked.
        mem_granted_mib: memory the job could use on the device: the MPS pinned-memory limit, the MIG
            profile's memory, the whole GPU's memory; MiB.
        start, end: when the job started and ended, epoch seconds; ``end >= start``.
        mem_peak_mib: peak memory the job's processes held on the device, MiB; None = no data.
        sm_mean_percent, sm_peak_percent: mean and peak SM utilization of the device while the job
            ran, percent of the whole GPU; None = no data (MIG, unsupported GPU, never sampled).
        samples: how many monitor samples the peaks come from (0: none).
        mem_series_mib: memory over time: per bucket of ``mem_series_width`` consecutive samples the most
            memory the job held on the device, MiB, at most :data:`SERIES_LEN` buckets (:class:`UsageTracker`);
            None = no data (never sampled, or a record of format 1 or 2). Time axis: the samples are
            the monitor's, one per interval from the job's first sample on, so bucket ``i`` covers about
            ``[start + i * width * d, start + (i + 1) * width * d)`` with ``d = (end - start) / samples``;
            the last bucket may be partly filled. A tuple in Python, a JSON list in the line.
        mem_series_width: samples per bucket of the series (1, 2, 4, ...); None exactly when the series is.
        exit_state: ``COMPLETED``, ``FAILED`` or ``SIGNALED`` (:func:`exit_from_env`), ``REQUEUED`` (a run that was
            requeued: the Epilog saw a restart count above its run's), or Slurm's state.
        exit_code: ``exit:signal`` as Slurm prints it (``0:0``, ``1:0``, ``0:9``); ``""`` unknown.
        placement_cost: the placement's cost from the topology-aware placement; None until it exists.
        v: the format version, :data:`RECORD_VERSION`.
    """

    job_id: str
    user: str
    account: str
    partition: str
    node: str
    gpu_index: int
    gpu_uuid: str
    gpu_model: str
    gpu_memory_mib: int
    mode: str
    share: str
    mem_asked_mib: int | None
    sm_asked_percent: int | None
    mem_granted_mib: int
    start: int
    end: int
    mem_peak_mib: int | None = None
    sm_mean_percent: float | None = None
    sm_peak_percent: float | None = None
    samples: int = 0
    exit_state: str = ""
    exit_code: str = ""
    array_job_id: str | None = None
    array_task_id: int | None = None
    step: str = ""
    placement_cost: float | None = None
    restart: int = 0
    submit: int = 0
    mem_series_mib: tuple[int, ...] | None = None
    mem_series_width: int | None = None
    v: int = RECORD_VERSION

    def __post_init__(self) -> None:
        if type(self.mem_series_mib) is list:  # from JSON
            object.__setattr__(self, "mem_series_mib", tuple(self.mem_series_mib))
        _check(self.to_dict())

    @property
    def key(self) -> tuple[str, int, int, str, str, int, str, int]:
        """What makes a record unique: job, run (restart count and submit time), step, node, GPU index and UUID,
        version."""
        return (self.job_id, self.restart, self.submit, self.step, self.node, self.gpu_index, self.gpu_uuid, self.v)

    def saw_more(self, other: UsageRecord) -> bool:
        """Whether this record of a device saw more of the run than ``other`` (a record of the same key: an
        Epilog run again for a run spools a second, emptier one): more monitor samples, else a longer span.
        Where two records share a key, the sacct segment and the store both keep the one that saw more
        (:data:`SAW_MORE_SQL` is this comparison for the store's upsert)."""
        return ((self.samples or 0), self.end - self.start) > ((other.samples or 0), other.end - other.start)

    @property
    def duration_s(self) -> int:
        """``end - start``, seconds."""
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        """The record as the JSON object (keys in :data:`FIELDS` order, ``v`` first; the series a list)."""
        data = {name: getattr(self, name) for name in FIELDS}
        if self.mem_series_mib is not None:
            data["mem_series_mib"] = list(self.mem_series_mib)
        return data

    def row(self) -> tuple:
        """The store's row of the record (:func:`row_from_json`'s)."""
        return _row(self.to_dict())

    def to_json(self) -> str:
        """One line of compact JSON, no newline (ASCII only: names are escaped)."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Any, *, source: str | None = None) -> UsageRecord:
        """Build from a decoded JSON object, strictly (see module docstring).

        Raises:
            RecordError: not an object, another version, unknown or missing keys, a wrong type or range.
        """
        return cls(**_check(data, source))

    @classmethod
    def from_json(cls, line: str | bytes, *, source: str | None = None) -> UsageRecord:
        """Parse one JSON line (see :meth:`from_dict`).

        Raises:
            RecordError: not JSON, or not a valid record.
        """
        return cls.from_dict(_decode(line, source), source=source)


#: The JSON keys of a version-4 record, in the order they are written (``v`` first).
FIELDS: tuple[str, ...] = ("v", "job_id", "restart", "submit", "array_job_id", "array_task_id", "step", "user",
                           "account", "partition", "node", "gpu_index", "gpu_uuid", "gpu_model", "gpu_memory_mib",
                           "mode", "share", "mem_asked_mib", "sm_asked_percent", "mem_granted_mib", "start",
                           "end", "mem_peak_mib", "sm_mean_percent", "sm_peak_percent", "samples",
                           "mem_series_mib", "mem_series_width", "exit_state", "exit_code", "placement_cost")
_FIELD_SET = frozenset(FIELDS)
#: Keys of a version-3 record (no submit time).
FIELDS_V3: tuple[str, ...] = tuple(name for name in FIELDS if name != "submit")
#: Keys of a version-2 record (no memory series either).
FIELDS_V2: tuple[str, ...] = tuple(name for name in FIELDS_V3 if name not in ("mem_series_mib", "mem_series_width"))
#: Keys of a version-1 record (no ``restart`` either).
FIELDS_V1: tuple[str, ...] = tuple(name for name in FIELDS_V2 if name != "restart")
_FIELD_SETS = {1: frozenset(FIELDS_V1), 2: frozenset(FIELDS_V2), 3: frozenset(FIELDS_V3), 4: _FIELD_SET}
assert _FIELD_SET == {f.name for f in fields(UsageRecord)}

_STR, _INT, _NUM, _SERIES = "str", "int", "num", "series"
# name -> (kind, may be None)
_TYPES: dict[str, tuple[str, bool]] = {
    "v": (_INT, False), "job_id": (_STR, False), "restart": (_INT, False), "submit": (_INT, False),
    "array_job_id": (_STR, True), "array_task_id": (_INT, True),
    "step": (_STR, False), "user": (_STR, False), "account": (_STR, False), "partition": (_STR, False),
    "node": (_STR, False), "gpu_index": (_INT, False), "gpu_uuid": (_STR, False), "gpu_model": (_STR, False),
    "gpu_memory_mib": (_INT, False), "mode": (_STR, False), "share": (_STR, False),
    "mem_asked_mib": (_INT, True), "sm_asked_percent": (_INT, True), "mem_granted_mib": (_INT, False),
    "start": (_INT, False), "end": (_INT, False), "mem_peak_mib": (_INT, True), "sm_mean_percent": (_NUM, True),
    "sm_peak_percent": (_NUM, True), "samples": (_INT, False), "mem_series_mib": (_SERIES, True),
    "mem_series_width": (_INT, True), "exit_state": (_STR, False),
    "exit_code": (_STR, False), "placement_cost": (_NUM, True),
}
_CHECKS = tuple((name, *_TYPES[name]) for name in FIELDS)
_NON_NEGATIVE = ("restart", "submit", "gpu_index", "gpu_memory_mib", "mem_granted_mib", "samples", "mem_peak_mib",
                 "mem_asked_mib")


def _decode(line: str | bytes, source: str | None) -> Any:
    try:
        return json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        raise RecordError(f"not a JSON record: {e}", source=source) from None


def _check(data: Any, source: str | None = None) -> dict[str, Any]:
    """The record object of the current version that ``data`` is (an object of an earlier version is upgraded:
    ``v`` 4 and ``submit`` 0, for versions 1 and 2 no series, for version 1 ``restart`` 0; anything else is
    ``data`` itself).

    Raises:
        RecordError: ``data`` is not a valid record object of a version this release reads.
    """
    if type(data) is not dict:
        raise RecordError(f"a record is a JSON object, not {type(data).__name__}", source=source)
    version = data.get("v")
    if version not in READ_VERSIONS or type(version) is not int:
        if "v" not in data:
            raise RecordError('no "v" key: not a slurm-gpushare usage record', source=source)
        raise RecordError(f"record version {version!r}; this slurm-gpushare reads versions "
                          f"{', '.join(map(str, READ_VERSIONS))}",
                          hint="ingest it with the slurm-gpushare release that wrote it, or upgrade",
                          source=source)
    keys = _FIELD_SETS[version]
    if data.keys() != keys:
        extra = sorted(set(data) - keys)
        missing = sorted(keys - set(data))
        parts = ([f"unknown key(s) {', '.join(extra)}"] if extra else []) + \
                ([f"missing key(s) {', '.join(missing)}"] if missing else [])
        raise RecordError(f"version-{version} record with {'; '.join(parts)}", source=source)
    if version == 1:
        data = {**data, "restart": 0}
    if version < 3:
        data = {**data, "mem_series_mib": None, "mem_series_width": None}
    if version < RECORD_VERSION:
        data = {**data, "v": RECORD_VERSION, "submit": 0}
    for name, kind, nullable in _CHECKS:
        value = data[name]
        t = type(value)
        if value is None:
            if nullable:
                continue
        elif kind is _STR:
            if t is str:
                continue
        elif kind is _INT:
            if t is int:
                continue
        elif kind is _SERIES:
            if (t is list or t is tuple) and all(type(x) is int for x in value):
                continue
        elif t is int or t is float:
            continue
        want = {"str": "a string", "int": "an integer", "num": "a number", "series": "a list of integers"}[kind]
        raise RecordError(f"{name} is {value!r}, not {want}{' or null' if nullable else ''}", source=source)
    if not data["job_id"]:
        raise RecordError("job_id is empty", source=source)
    if data["mode"] not in MODES:
        raise RecordError(f"mode is {data['mode']!r}, not one of {', '.join(MODES)}", source=source)
    if data["end"] < data["start"]:
        raise RecordError(f"end {data['end']} is before start {data['start']}", source=source)
    for name in _NON_NEGATIVE:
        if data[name] is not None and data[name] < 0:
            raise RecordError(f"{name} is negative ({data[name]})", source=source)
    for name in ("sm_asked_percent", "sm_mean_percent", "sm_peak_percent"):
        value = data[name]
        if value is not None and not 0 <= value <= 100:
            raise RecordError(f"{name} is {value}, not a percentage (0-100)", source=source)
    problem = _series_problem(data["mem_series_mib"], data["mem_series_width"])
    if problem:
        raise RecordError(problem, source=source)
    return data


def _series_problem(series: Sequence[int] | None, width: int | None) -> str:
    """What is wrong with a record's memory series (types already checked), ``""`` when nothing."""
    if (series is None) != (width is None):
        return (f"mem_series_mib is {series!r} but mem_series_width {width!r}: both are null (no series) "
                "or neither is")
    if series is None or width is None:
        return ""
    if width < 1:
        return f"mem_series_width is {width}, not at least 1 sample per bucket"
    if len(series) > SERIES_LEN:
        return f"mem_series_mib has {len(series)} values, more than {SERIES_LEN}"
    if any(x < 0 for x in series):
        return "mem_series_mib has a negative value"
    return ""


_SERIES_AT = FIELDS.index("mem_series_mib")


def _row(data: dict[str, Any]) -> tuple:
    """The store's row of a checked record object: values in :data:`FIELDS` order, the series as
    :func:`series_text`."""
    row = [data[name] for name in FIELDS]
    row[_SERIES_AT] = series_text(row[_SERIES_AT])
    return tuple(row)


def series_text(series: Sequence[int] | None) -> str | None:
    """The store's text of a memory series: ``"512,2048,1024"`` (``""`` for an empty one), None for none."""
    return None if series is None else ",".join(map(str, series))


def series_from_text(text: str | None) -> tuple[int, ...] | None:
    """:func:`series_text` back."""
    if text is None:
        return None
    return tuple(int(x) for x in text.split(",")) if text else ()


def row_from_json(line: str | bytes, *, source: str | None = None) -> tuple:
    """Parse and check one JSON line into a tuple of values in :data:`FIELDS` order (the store's row),
    without building a :class:`UsageRecord` (same checks as :meth:`UsageRecord.from_json`; a line of an
    earlier version gives the row of its version-4 record; the series as :func:`series_text`).

    Raises:
        RecordError: not JSON, or not a valid record.
    """
    return _row(_check(_decode(line, source), source))


_FIELD_LIST = list(FIELDS)
_NONE = type(None)
_MODE_SET = frozenset(MODES)
_ALLOWED: dict[str, frozenset[type]] = {
    name: frozenset({str} if kind is _STR else {int} if kind is _INT else {list} if kind is _SERIES else {int, float})
    | ({_NONE} if nullable else frozenset())
    for name, kind, nullable in _CHECKS}
_PERCENT = ("sm_asked_percent", "sm_mean_percent", "sm_peak_percent")
_COL = {name: i for i, name in enumerate(FIELDS)}
_IN_ORDER = operator.itemgetter(*FIELDS)
_AT_LEAST_0 = partial(operator.le, 0)
_AT_MOST_100 = partial(operator.ge, 100)
_NOT_NONE = partial(operator.is_not, None)


def _rows_checked_by_column(data: list) -> list[tuple] | None:
    """The rows of many decoded records when all of them pass, checked column by column in C-level
    loops (``map``, ``all``, ``set``): about a tenth of the cost of checking record by record. None when
    anything is off: then :func:`_check` looks at each record and names what is wrong. Accepts
    nothing :func:`_check` refuses."""
    if not data:
        return []
    if not all(map(dict.__instancecheck__, data)) or set(map(len, data)) != {len(FIELDS)}:
        return None
    try:
        rows = list(map(_IN_ORDER, data))  # every key present (and, by the count, no other)
    except KeyError:
        return None
    columns = list(zip(*rows, strict=True))
    for name, col in zip(FIELDS, columns, strict=True):
        if not set(map(type, col)) <= _ALLOWED[name]:
            return None
    c = _COL
    if (set(columns[c["v"]]) != {RECORD_VERSION} or not all(columns[c["job_id"]])
            or not set(columns[c["mode"]]) <= _MODE_SET
            or not all(map(operator.ge, columns[c["end"]], columns[c["start"]]))):
        return None
    for name in _NON_NEGATIVE:
        if not all(map(_AT_LEAST_0, filter(_NOT_NONE, columns[c[name]]))):
            return None
    for name in _PERCENT:
        values = list(filter(_NOT_NONE, columns[c[name]]))
        # written as 0 <= x and 100 >= x, so that NaN (which json accepts) fails both
        if not (all(map(_AT_LEAST_0, values)) and all(map(_AT_MOST_100, values))):
            return None
    series, widths = columns[_SERIES_AT], columns[c["mem_series_width"]]
    if any(s is not None or w is not None for s, w in zip(series, widths, strict=True)):
        for s, w in zip(series, widths, strict=True):
            if s is not None and not all(type(x) is int for x in s) or _series_problem(s, w):
                return None
        return [_row(dict(zip(FIELDS, row, strict=True))) for row in rows]
    return rows


def rows_from_lines(lines: list[bytes]) -> tuple[list[tuple], list[tuple[int, str]]]:
    """Parse many JSON lines at once (ingest's fast path): ``(rows, errors)``, rows in :data:`FIELDS`
    order, errors as ``(position in lines, reason)``. Blank lines are neither. Same checks as
    :meth:`UsageRecord.from_json`.
    """
    items = [(i, line) for i, line in enumerate(lines) if line.strip()]
    # One json.loads of "[l1,l2,...]" costs half as much as one call per line. It is used only when
    # every line is one braced object (so no line can swallow or split another) and the count agrees;
    # otherwise (a corrupt line) each line is parsed alone.
    if all(line[:1] == b"{" and line.rstrip()[-1:] == b"}" for _, line in items):
        try:
            data = json.loads(b"[" + b",".join(line for _, line in items) + b"]")
        except (ValueError, UnicodeDecodeError):
            data = None
        if data is not None and len(data) == len(items):
            rows = _rows_checked_by_column(data)
            if rows is not None:
                return rows, []
    rows, errors = [], []
    for i, line in items:
        try:
            rows.append(row_from_json(line))
        except RecordError as e:
            errors.append((i, e.message))
    return rows, errors


# --- what the Epilog knows -> records --------------------------------------------------------------


def exit_from_env(env: Mapping[str, str]) -> tuple[str, str]:
    """``(exit_state, exit_code)`` of a job from slurmd's Epilog environment.

    ``SLURM_JOB_EXIT_CODE2`` is ``exit:signal`` (``0:0``); without it ``SLURM_JOB_EXIT_CODE`` is the
    raw wait status (measured on 22.05.8). State: ``COMPLETED`` (0:0), ``FAILED`` (non-zero exit),
    ``SIGNALED`` (killed by a signal: a cancel, a time limit or the OOM killer; ``sacct`` tells which),
    or ``""`` when neither variable is set.
    """
    code = env.get("SLURM_JOB_EXIT_CODE2", "")
    if not code:
        raw = env.get("SLURM_JOB_EXIT_CODE", "")
        if not raw.isdigit():
            return "", ""
        status = int(raw)
        code = f"{(status >> 8) & 0xFF}:{status & 0x7F}"
    return exit_from_code(code)


def exit_from_code(code: str) -> tuple[str, str]:
    """``(exit_state, exit_code)`` from Slurm's ``exit:signal`` (``ExitCode=`` of ``scontrol show job``):
    ``0:0`` COMPLETED, ``1:0`` FAILED, ``0:15`` SIGNALED; ``""`` for an empty code."""
    if not code:
        return "", ""
    exit_status, _, signal = code.partition(":")
    if signal not in ("", "0"):
        return "SIGNALED", code
    return ("COMPLETED" if exit_status == "0" else "FAILED"), code


# --- the summary for Slurm's own accounting (AdminComment) -------------------------------------------



def summary_segment(records: Sequence[UsageRecord]) -> str:
    """One job's usage on one node as a compact AdminComment segment
    (:data:`~slurm_gpushare.slurm.admincomment.RUNNING`, pure), e.g.
    ``[gpushare-usage:v1 node=a100 mode=gpu gpus=2 peak=20480/81920MiB sm=50.0/90.0]``.

    ``peak``: the highest peak of the job's devices over the memory granted per device (MiB); ``sm``:
    the mean of the devices' mean SM utilization (averaged, never summed) and the highest peak,
    percent. ``-`` where there is no data (MIG, not sampled). Values hold no space and no bracket.

    Raises:
        InputError: no records, or records of several jobs or nodes.
    """
    if not records:
        raise InputError("no records to summarize")
    if len({(r.job_id, r.node) for r in records}) != 1:
        raise InputError("a usage summary is of one job on one node")
    r0 = records[0]
    peaks = [r.mem_peak_mib for r in records if r.mem_peak_mib is not None]
    means = [r.sm_mean_percent for r in records if r.sm_mean_percent is not None]
    sm_peaks = [r.sm_peak_percent for r in records if r.sm_peak_percent is not None]
    peak = f"{max(peaks)}/{max(r.mem_granted_mib for r in records)}MiB" if peaks else "-"
    sm = f"{sum(means) / len(means):.1f}/{max(sm_peaks):.1f}" if means and sm_peaks else "-"
    modes = ",".join(sorted({r.mode for r in records}))
    node = "".join(c if c.isalnum() or c in "-_." else "?" for c in r0.node)
    return RUNNING.format([f"node={node}", f"mode={modes}", f"gpus={len(records)}", f"peak={peak}", f"sm={sm}"])


def _summary_node(body: str | None) -> str | None:
    """The node a running summary's tokens name first (``node=NAME``), None when they do not."""
    first = (body or "").split(" ", 1)[0]
    return first[len("node="):] if first.startswith("node=") and len(first) > len("node=") else None


def merge_summary(admin_comment: str | None, segment: str) -> str:
    """Put a summary segment into an AdminComment, replacing an earlier one of the same node and keeping
    everything else (the request audit, other nodes' summaries, other tools' text)."""
    m = RUNNING.pattern.match(segment)
    node = _summary_node(m.group(2)) if m else None
    rest = RUNNING.pattern.sub(lambda x: "" if node is not None and _summary_node(x.group(2)) == node
                               else x.group(0), admin_comment or "").strip()
    return f"{rest} {segment}" if rest else segment
