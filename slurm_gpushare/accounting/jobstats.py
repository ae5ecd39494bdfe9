"""One job's GPU usage for its user: what it asked for, was granted, peaked at and used, per GPU device, a
compact terminal chart of it, and the request to make next time (``slurm-gpushare jobstats JOBID``).

Memory over time is a sparkline of the record's memory series (:attr:`UsageRecord.mem_series_mib`): one
column per bucket, ``▁`` to ``█`` in eighths of the memory granted (a full column is the limit; a bucket
above it shows ``!``), between ``▕`` and ``▏``, with the time it covers. Only the accounting store has the
series: Slurm's AdminComment usage segment keeps peaks only.

The records come from the accounting store where the caller may read it, else from Slurm's own accounting
(the job's ``[gpushare:u1 ...]`` AdminComment segment, :mod:`slurm_gpushare.accounting.sacct`). Who may see
a job is decided from what its user cannot write (:func:`may_see`): the job's uid as slurmdbd or slurmctld
recorded it, and the caller's real uid; an administrator is root, SlurmUser, or a Slurm ``AdminLevel`` of
Operator or Administrator (``sacctmgr show user``). Nothing of Comment, JobName or AdminComment counts.

The suggestion (:func:`suggest`): the highest peak of the job's devices plus the site's headroom (the
policy's ``headroom``, default 0.2 = 20%), rounded up to what the site offers for that GPU model: the
smallest MIG profile that holds it for a job that ran on MIG slices, else whole shard units (an MPS share,
1 GiB by default); a whole GPU from the policy's ``whole_gpu.threshold`` of a GPU's memory on. A job that
did not complete and peaked near its limit is never told to ask for less than it had.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from slurm_gpushare.accounting.record import RERUN_STATES, UsageRecord
from slurm_gpushare.errors import InputError
from slurm_gpushare.hardware.machine import MigProfile, nominal_gpu_mib, nominal_profile_mib
from slurm_gpushare.memsize import format_mib
from slurm_gpushare.slurm.gres import GresItem

#: A failed job whose peak reached this share of what it was granted may have failed for want of memory.
NEAR_LIMIT = 0.9
#: Width of the terminal chart's bars, characters.
BAR_WIDTH = 32
_EIGHTHS = " ▏▎▍▌▋▊▉"
_LEVELS = "▁▂▃▄▅▆▇█"


class NotYours(InputError):
    """The caller is neither the job's user nor a Slurm administrator."""


@dataclass(frozen=True)
class Offer:
    """What a site offers on one GPU model, for rounding a suggestion.

    Attributes:
        gpu_mib: a whole GPU's memory (MiB, NVML's total).
        mig_mib: nominal sizes of the MIG profiles the site's MIG-enabled GPUs of the model offer (MiB).
    """

    gpu_mib: int
    mig_mib: tuple[int, ...] = ()


@dataclass(frozen=True)
class Suggestion:
    """A request for next time: ``request`` (``gpushare:mem=8G``, or ``gpushare:mem=8G:2``), ``mib`` per
    device, and ``why`` (one line: peak, headroom, what it was rounded to)."""

    request: str
    mib: int
    why: str


def suggest(peak_mib: int, offer: Offer, *, headroom: float = 0.2, unit_mib: int = 1024, on_mig: bool = False,
            whole_threshold: float = 1.0, count: int = 1, at_least_mib: int = 0) -> Suggestion:
    """The request that fits a job that peaked at ``peak_mib`` per device (see the module docstring).

    The need is the peak plus ``headroom`` (or ``at_least_mib`` when more). From ``whole_threshold`` of a
    GPU's nominal memory on it is a whole GPU's size. A job that ran on a MIG slice (``on_mig``) gets the
    smallest MIG profile size of the model that holds the need (by the profile's name, as the policy's
    nominal fit takes it: a slice is what it would get again); any other job whole shard units.

    Args:
        peak_mib: the highest peak of the job's devices, MiB.
        offer: the model's GPU memory and MIG profile sizes.
        headroom: fraction added to the peak (0.2 = 20%).
        unit_mib: the shard unit: an MPS share is a whole number of them.
        on_mig: the job ran on MIG slices.
        whole_threshold: from this fraction of a GPU's memory on, a request gets a whole GPU.
        count: devices per node (more than one: ``gpushare:mem=...:N``).
        at_least_mib: never suggest less (a job that may have failed for want of memory).

    Raises:
        InputError: a negative peak or headroom, a unit or count below 1.

    >>> suggest(6000, Offer(24564)).request
    'gpushare:mem=8G'
    >>> suggest(7000, Offer(81559, (10240, 20480, 40960)), on_mig=True).request
    'gpushare:mem=10G'
    """
    if peak_mib < 0 or headroom < 0 or unit_mib < 1 or count < 1:
        raise InputError(f"cannot suggest a request for peak {peak_mib} MiB, headroom {headroom}, unit {unit_mib} "
                         f"MiB, count {count}")
    need = max(1, math.ceil(peak_mib * (1.0 + headroom)))
    why = (f"peak {peak_mib} MiB + {headroom:.0%} headroom = {need} MiB" if peak_mib else
           "it held no GPU memory when sampled: the smallest request; does it need a GPU?")
    if at_least_mib > need:
        need = at_least_mib
        why = f"it did not complete and peaked near its limit: at least the {format_mib(need)} it had"
    gpu = nominal_gpu_mib(offer.gpu_mib)
    slices = [size for size in sorted(set(offer.mig_mib)) if need <= size < gpu] if on_mig else []
    if need >= whole_threshold * gpu:
        mib = gpu
        why += f", a whole GPU ({format_mib(gpu)})"
        if need > gpu:
            why += ": more than one GPU holds, spread the work over more GPUs"
    elif slices:
        mib = slices[0]
        why += f", the smallest MIG slice that holds it ({format_mib(mib)})"
    else:
        mib = min(gpu, math.ceil(need / unit_mib) * unit_mib)
        why += f", rounded up to whole {format_mib(unit_mib)} shard units"
    body = GresItem("gpushare", f"mem={format_mib(mib)}", count if count > 1 else None).body
    return Suggestion(body, mib, why)


@dataclass(frozen=True)
class SuggestRule:
    """The site's one rule for the request to make next time, shared by jobstats and ``report --waste``: the
    policy's ``headroom``, shard unit (``unit_mib``) and ``whole_gpu.threshold`` (``whole_threshold``), and the
    GPU models' offers from the site's machine descriptions (:func:`offers_from_machines`; a model without one
    is judged by what the job's own records say)."""

    headroom: float = 0.2
    unit_mib: int = 1024
    whole_threshold: float = 1.0
    offers: Mapping[str, Offer] = field(default_factory=dict)

    def offer(self, model: str, gpu_mib: int, mig_mib: Iterable[int] = ()) -> Offer:
        """The site's offer for ``model``, else one made of the job's own GPU memory and MIG slice sizes (MiB)."""
        return self.offers.get(model) or Offer(gpu_mib, tuple(sorted(set(mig_mib))))

    def suggest(self, peak_mib: int, offer: Offer, *, on_mig: bool = False, count: int = 1,
                at_least_mib: int = 0) -> Suggestion:
        """:func:`suggest` with the rule's headroom, unit and threshold.

        Raises:
            InputError: as :func:`suggest`.
        """
        return suggest(peak_mib, offer, headroom=self.headroom, unit_mib=self.unit_mib, on_mig=on_mig,
                       whole_threshold=self.whole_threshold, count=count, at_least_mib=at_least_mib)


def mig_slice_mib(share: str, granted_mib: int) -> int:
    """The nominal size of the MIG slice a record names (its ``share``, a profile name such as ``1g.10gb``: 10240),
    else what was granted (MiB)."""
    return nominal_profile_mib(MigProfile(share, 0, 0, granted_mib, 0))


@dataclass(frozen=True)
class DeviceStats:
    """One GPU device of a job's run: the record's figures, as shown."""

    record: UsageRecord

    @property
    def asked_mib(self) -> int | None:
        """What the job asked for per device (``gpushare:mem=``), or None when it asked for no size."""
        return self.record.mem_asked_mib

    @property
    def used_pct(self) -> float | None:
        """Peak over what was asked (or granted when nothing was asked), percent; None without a peak."""
        r = self.record
        base = r.mem_asked_mib or r.mem_granted_mib
        return None if r.mem_peak_mib is None or not base else r.mem_peak_mib * 100.0 / base


@dataclass(frozen=True)
class JobHeader:
    """What Slurm's accounting says of the job's run (``sacct``, :func:`parse_job_header`), for the header.

    Attributes:
        name: the job's name (the user's own text: shown cut to :data:`NAME_CHARS` printable characters).
        state: its state (``COMPLETED``, ``FAILED``, ``RUNNING``...).
        nodes, cpus: nodes and CPU cores allocated.
        mem_mib: host memory allocated (AllocTRES ``mem=``), MiB; None when not stated.
        gpus: GPUs allocated (AllocTRES ``gres/gpu=``; ``gres:gpu`` before 23.11), 0 for a share or none.
        qos, partition: as slurmdbd recorded them.
        start: start of the run, epoch seconds (None: it never started).
        elapsed_s: run time so far or in all, seconds.
        limit_s: the time limit, seconds; None for ``UNLIMITED``, 0 (sbatch: no limit) or not stated.
        incomplete: slurmdbd's row of the run (the one that started when slurmctld's job did) names another
            uid than slurmctld's owner of the job (seen on Slurm 22.05: uid 0, name ``allocation``, QOS
            ``Unknown``, no partition), so its name, QOS, partition and time limit are not shown.
    """

    name: str
    state: str
    nodes: int
    cpus: int
    mem_mib: int | None
    gpus: int
    qos: str
    partition: str
    start: int | None
    elapsed_s: int
    limit_s: int | None
    incomplete: bool = False

    @property
    def limit_used_pct(self) -> float | None:
        """Run time over the time limit, percent; None without a limit."""
        return None if not self.limit_s else self.elapsed_s * 100.0 / self.limit_s

    def to_dict(self) -> dict:
        """The fields, and ``limit_used_pct`` (two decimals)."""
        used = self.limit_used_pct
        return {"name": self.name, "state": self.state, "nodes": self.nodes, "cpus": self.cpus,
                "mem_mib": self.mem_mib, "gpus": self.gpus, "qos": self.qos, "partition": self.partition,
                "start": self.start, "elapsed_s": self.elapsed_s, "limit_s": self.limit_s,
                "limit_used_pct": None if used is None else round(used, 2), "incomplete": self.incomplete}


#: The most characters of a job name the header shows.
NAME_CHARS = 64


def _int(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


def _tres(alloc_tres: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in alloc_tres.split(",") if "=" in item)


def parse_job_header(text: str, job_id: str, start: int | None = None, *, names: str = "",
                     owner_uid: int | None = None) -> JobHeader | None:
    """The header of run ``start`` of job ``job_id`` (the run that started then; None: its most recent run) from
    :func:`~slurm_gpushare.slurm.commands.sacct_job_header` output (no user text: one line per run); None when
    sacct lists no such run. The name is the user's own text, which sacct prints as written, newlines included, so
    it comes apart (``names``: :func:`~slurm_gpushare.slurm.commands.sacct_job_names` output): the first line of
    that run, so a name that holds a forged row names only itself. It keeps printable characters only (it goes to an
    administrator's terminal: no escape sequence passes), at most :data:`NAME_CHARS`; empty without ``names``.
    ``owner_uid``: the job's uid as slurmctld holds it (None: not known); then only the owner's rows and the
    row that started at ``start`` are taken, and that row naming another uid is :attr:`JobHeader.incomplete`,
    its name, QOS, partition and time limit left out."""
    from slurm_gpushare.memsize import parse_mib

    rows = []
    for line in text.splitlines():
        f = line.split("|")
        if len(f) == 11 and f[0] == job_id:
            rows.append(f)
    if owner_uid is not None:  # another user's older job of the id (slurmctld's state lost) is not this run
        rows = [f for f in rows if _int(f[10]) == owner_uid or (start is not None and _int(f[1]) == start)]
    if start is not None and any(_int(f[1]) == start for f in rows):
        rows = [f for f in rows if _int(f[1]) == start]
    if not rows:
        return None
    f = max(rows, key=lambda f: _int(f[1]) or 0)
    tres = _tres(f[5])
    try:
        mem = parse_mib(tres["mem"], default_unit="M") if "mem" in tres else None
    except InputError:
        mem = None
    gpus = _int(tres.get("gres/gpu", tres.get("gres:gpu", "0"))) or 0
    limit = _int(f[9])
    prefix = f"{job_id}|{f[1]}|"
    raw = next((line[len(prefix):] for line in names.splitlines() if line.startswith(prefix)), "")
    name = "".join(ch for ch in raw if ch.isprintable())
    header = JobHeader(name=name[:NAME_CHARS] + ("..." if len(name) > NAME_CHARS else ""),
                       state=f[2].split(" ", 1)[0], nodes=_int(f[3]) or 0, cpus=_int(f[4]) or 0, mem_mib=mem,
                       gpus=gpus, qos=f[6], partition=f[7], start=_int(f[1]), elapsed_s=_int(f[8]) or 0,
                       limit_s=None if not limit else limit * 60)  # 0: no limit (sbatch(1) --time=0)
    if owner_uid is not None and _int(f[10]) != owner_uid:
        return replace(header, name="", qos="", partition="", limit_s=None, incomplete=True)
    return header


@dataclass(frozen=True)
class JobStats:
    """A job's records (every run, every device) and the suggestion for next time.

    Attributes:
        job_id, user, account, partition: of the job.
        devices: per run and device, in the records' order.
        suggestion: None when no device has a measured peak.
        source: where the records came from (``store``, ``sacct``).
        header: what Slurm's accounting says of the job's last run (None: sacct did not say).
    """

    job_id: str
    user: str
    account: str
    partition: str
    devices: tuple[DeviceStats, ...]
    suggestion: Suggestion | None
    source: str
    header: JobHeader | None = None
    notes: tuple[str, ...] = ()
    notes_footer: str = ""


@dataclass(frozen=True)
class NotesRule:
    """When jobstats writes an efficiency note (the site policy's ``[jobstats]`` table): a peak GPU memory below
    ``low_memory`` percent of what the job asked for, a mean SM utilization below ``low_sm`` percent, a GPU never
    used; ``footer`` is the site's line under them."""

    low_sm: float = 15.0
    low_memory: float = 50.0
    footer: str = ""

    def notes(self, run: Sequence[UsageRecord], suggestion: Suggestion | None) -> tuple[str, ...]:
        """The notes on one run's records (one line each, without the footer)."""
        peaks = [r.mem_peak_mib for r in run if r.mem_peak_mib is not None]
        if not peaks:
            return ()  # never sampled (MIG, a job shorter than the interval): nothing is known
        if max(peaks) == 0:
            samples = sum(r.samples for r in run)
            when = f"in {samples} sample{'' if samples == 1 else 's'}" if samples else "when sampled"
            return (f"it used no GPU memory {when}: a job that does not need a GPU starts sooner without one",)
        out = []
        idle = [r for r in run if r.mem_peak_mib == 0]
        if idle:
            out.append(f"{len(idle)} of its {len(run)} GPU devices held no memory when sampled ("
                       + ", ".join(f"{r.node} GPU {r.gpu_index}" for r in idle) + "): it may need fewer GPUs")
        peak = max(peaks)
        asked_any = any(r.mem_asked_mib for r in run)
        asked = max(r.mem_asked_mib or r.mem_granted_mib for r in run)
        pct = peak * 100.0 / asked if asked else 100.0
        if pct < self.low_memory:
            line = (f"its GPU memory peaked at {format_mib(peak)} of the {format_mib(asked)} it "
                    f"{'asked for' if asked_any else 'was granted'} ({pct:.0f}%, below the site's "
                    f"{self.low_memory:g}%)")
            if suggestion is not None and suggestion.mib < asked:
                line += f": next time ask for --gres={suggestion.request}"
            out.append(line)
        means = [r.sm_mean_percent for r in run if r.sm_mean_percent is not None and r.mode != "mig"]
        if means and (mean := sum(means) / len(means)) < self.low_sm:
            out.append(f"its mean SM utilization was {mean:.0f}% (below the site's {self.low_sm:g}%): it may run as "
                       "well on a smaller share (sm=) or fewer GPUs")
        return tuple(out)


def offers_from_machines(machines: Iterable, *, mig_enabled: bool = True) -> dict[str, Offer]:
    """Per GPU model, the largest GPU memory and the nominal sizes of the MIG profiles of its MIG-enabled GPUs
    (:class:`~slurm_gpushare.hardware.machine.Machine` descriptions; none when ``mig_enabled`` is off)."""
    gpu: dict[str, int] = {}
    mig: dict[str, set[int]] = {}
    for m in machines:
        for g in m.gpus:
            gpu[g.model] = max(gpu.get(g.model, 0), g.memory_mib)
            if g.mig_enabled and mig_enabled:
                mig.setdefault(g.model, set()).update(nominal_profile_mib(p) for p in g.mig_profiles)
    return {model: Offer(mib, tuple(sorted(mig.get(model, ())))) for model, mib in gpu.items()}


def _offer_for(records: Sequence[UsageRecord], offers: Mapping[str, Offer]) -> Offer:
    """The offer of the records' GPU model: the site's, else what the records themselves say (the GPU's memory,
    and the MIG slice the job had)."""
    model = records[0].gpu_model
    if model in offers:
        return offers[model]
    slices = tuple(mig_slice_mib(r.share, r.mem_granted_mib) for r in records if r.mode == "mig" and r.share)
    # a record without the GPU's memory (0: not known when it was written) has what it was granted, as the store's
    # GPU share and report --waste take it
    return Offer(max(r.gpu_memory_mib if r.gpu_memory_mib > 0 else r.mem_granted_mib for r in records), slices)


def current_job(records: Iterable[UsageRecord], *, submit: int | None = None,
                restarts: int | None = None) -> list[UsageRecord]:
    """Of the records of one job id (and owner), those of the current job: its newest run and, going back, each
    earlier run while that run was requeued (``exit_state`` in :data:`RERUN_STATES`) at a lower restart count,
    as sacct without ``-D`` shows one job of an id. A job id Slurm gave again (a lost StateSaveLocation, MaxJobId
    wrapping) is another job, even of one user: its runs have other submit times (records of version 4). Sorted
    by run.

    ``submit`` and ``restarts``: slurmctld's ``SubmitTime`` and ``Restarts`` of the job of that id while it still
    knows it; then the current run is the one of that submit time, and where it has no records yet (it runs) only
    its earlier runs are shown (none for a first run). Runs whose submit time is not known (``submit`` 0:
    records of releases before version 4, or an Epilog that did not reach slurmctld) are chosen by start, restart
    count and state alone.
    """
    runs: dict[tuple[int, int], list[UsageRecord]] = {}
    for r in records:
        runs.setdefault((r.restart, r.submit), []).append(r)
    # runs in the order they started (a later run of a job, and a later job of a reused id, starts later); a
    # submit time 0 (not known) is never read as older than a known one
    newest_first = sorted(runs, key=lambda k: (max(r.start for r in runs[k]), k[1]), reverse=True)
    if not newest_first:
        return []
    if submit and newest_first[0][1] and any(k[1] for k in newest_first):
        own = [k for k in newest_first if k[1] == submit]
        if own:
            keep, later = [own[0]], own[0][0]
            older = newest_first[newest_first.index(own[0]) + 1:]
        elif not restarts:
            return []
        else:
            keep, later = [], restarts
            older = [k for k in newest_first if k[1] < submit]
    else:
        keep, later, older = [newest_first[0]], newest_first[0][0], newest_first[1:]
    for k in older:
        if k[0] >= later or not any(r.exit_state in RERUN_STATES for r in runs[k]):
            break
        keep.append(k)
        later = k[0]
    return sorted((r for k in keep for r in runs[k]), key=lambda r: r.restart)


def job_stats(job_id: str, records: Sequence[UsageRecord], *, source: str, rule: SuggestRule = SuggestRule(),
              header: JobHeader | None = None, user: str | None = None, notes: NotesRule | None = None) -> JobStats:
    """The job's stats from its records (all runs); the suggestion is from its last run, by the site's ``rule``,
    and so are the efficiency notes, where ``notes`` is given (None: the site turned them off).

    ``user`` is the job's owner as slurmctld (else sacct's UID) names it; None: the user the records name
    (slurmdbd has been seen recording uid 0 for a user's job, so its row may say ``root``).

    Raises:
        InputError: no records.
    """
    if not records:
        raise InputError(f"job {job_id} has no GPU usage records",
                         hint="a job without GPUs has none; a job that just ended may not have them yet "
                              "(the usage segment is written after the job ends)")
    last = max(r.restart for r in records)
    run = [r for r in records if r.restart == last]
    peaks = [r.mem_peak_mib for r in run if r.mem_peak_mib is not None]
    suggestion = None
    if peaks:
        peak = max(peaks)
        granted = max(r.mem_granted_mib for r in run)
        failed = any(r.exit_state not in ("COMPLETED", "") for r in run)
        at_least = granted if failed and peak >= NEAR_LIMIT * granted else 0
        nodes = {r.node for r in run}
        per_node = max(1, len(run) // max(1, len(nodes)))
        suggestion = rule.suggest(peak, _offer_for(run, rule.offers), on_mig=all(r.mode == "mig" for r in run),
                                  count=per_node, at_least_mib=at_least)
    r0 = records[0]
    found = notes.notes(run, suggestion) if notes is not None else ()
    return JobStats(job_id, user or r0.user, r0.account, r0.partition, tuple(DeviceStats(r) for r in records),
                    suggestion, source, header, found, notes.footer if notes is not None and found else "")


# --- rendering -----------------------------------------------------------------------------------------

def bar(value: float, scale: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of ``value`` out of ``scale`` in ``width`` characters, eighths of a cell resolved
    (``█``, ``▌``...), padded with spaces.

    >>> bar(1, 2, 4)
    '██  '
    """
    if scale <= 0 or value <= 0:
        return " " * width
    eighths = min(width * 8, round(value / scale * width * 8))
    full, part = divmod(eighths, 8)
    text = "█" * full + (_EIGHTHS[part] if part else "")
    return text.ljust(width)


def sparkline(series: Sequence[int], limit: int) -> str:
    """One character per value, ``▁`` (up to an eighth of ``limit``) to ``█`` (the limit), ``!`` above it.

    >>> sparkline([0, 1024, 4096, 8192, 9000], 8192)
    '▁▁▄█!'
    """
    if limit <= 0:
        return "?" * len(series)
    return "".join("!" if v > limit else _LEVELS[max(0, math.ceil(v * 8 / limit) - 1)] for v in series)


def format_span(seconds: float, *, hour_digits: int = 1) -> str:
    """``45 s``, ``12.5 min``, ``3.2 h`` (``hour_digits`` decimals of hours, from two hours on)."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.{hour_digits}f} h"


def series_line(r: UsageRecord, width: int = BAR_WIDTH) -> str | None:
    """The ``used`` line (memory over time) of a record with a memory series (None without one): the sparkline on the
    granted memory, the time it covers and each column's share of it (see :attr:`UsageRecord.mem_series_mib`)."""
    series, per = r.mem_series_mib, r.mem_series_width
    if not series or not per:
        return None
    samples = r.samples or len(series) * per
    step = r.duration_s / samples  # seconds a sample
    # the last bucket may be partly filled; a series restored from a monitor without one covers the end only
    covered = min(samples, len(series) * per)
    line = sparkline(series, r.mem_granted_mib)
    granted = format_mib(r.mem_granted_mib) if r.mem_granted_mib % 1024 == 0 else f"{r.mem_granted_mib}M"
    return (f"  {'used':<8} ▕{line}▏{'':<{max(0, width - len(line) - 2)}}  over {format_span(covered * step)}, "
            f"{format_span(per * step)} a column ({per} sample{'' if per == 1 else 's'}), "
            f"full height = granted {granted}")


def chart(dev: DeviceStats, width: int = BAR_WIDTH) -> list[str]:
    """Three bars on one scale (the largest of asked, granted, peak): asked, granted, peak; then SM mean and
    peak on a 0-100% scale, and memory over time (:func:`series_line`) when the record has a series. A value
    without data reads ``no data``."""
    r = dev.record
    scale = max(x for x in (r.mem_asked_mib or 0, r.mem_granted_mib, r.mem_peak_mib or 0, 1))

    def line(label: str, mib: int | None, note: str = "") -> str:
        if mib is None:
            return f"  {label:<8} {'':<{width}}  no data"
        return f"  {label:<8} {bar(mib, scale, width)}  {format_mib(mib) if mib % 1024 == 0 else f'{mib}M'}{note}"

    used = dev.used_pct
    out = [line("asked", r.mem_asked_mib) if r.mem_asked_mib is not None else f"  {'asked':<8} (no size: granted "
           "what the request named)",
           line("granted", r.mem_granted_mib),
           line("peak", r.mem_peak_mib, "" if used is None else
                f" ({used:.0f}% of what it {'asked' if r.mem_asked_mib else 'was granted'})")]
    if r.sm_mean_percent is None:
        out.append(f"  {'SM':<8} {'':<{width}}  no data (MIG devices and unsampled jobs have none)")
    else:
        peak = f", peak {r.sm_peak_percent:.0f}%" if r.sm_peak_percent is not None else ""
        out.append(f"  {'SM mean':<8} {bar(r.sm_mean_percent, 100.0, width)}  {r.sm_mean_percent:.0f}%{peak}")
    over_time = series_line(r, width)
    if over_time:
        out.append(over_time)
    return out


def to_text(stats: JobStats) -> str:
    """The terminal view: a header, per device its line and chart, the suggestion, the efficiency notes and the
    site's footer under them."""
    out = [f"job {stats.job_id}  user {stats.user or '-'}  account {stats.account or '-'}  partition "
           f"{stats.partition or '-'}  "
           f"(from the {'accounting database' if stats.source == 'store' else 'job AdminComment in sacct'})"]
    if stats.header is not None:
        out += header_lines(stats.header)
    if stats.source != "store":
        out.append("(memory over time is kept only in the accounting database, not in sacct's AdminComment)")
    runs = sorted({d.record.restart for d in stats.devices})
    for d in stats.devices:
        r = d.record
        run = f"run {r.restart}  " if len(runs) > 1 else ""
        minutes = r.duration_s / 60.0
        out.append("")
        out.append(f"{run}{r.node} GPU {r.gpu_index}  {r.gpu_model} ({format_mib(nominal_gpu_mib(r.gpu_memory_mib))})"
                   f"  {r.mode}{' ' + r.share if r.share else ''}  {minutes:.1f} min  {r.exit_state or '-'}"
                   f"{' ' + r.exit_code if r.exit_code else ''}  {r.samples} sample{'' if r.samples == 1 else 's'}")
        out += chart(d)
    out.append("")
    if stats.suggestion is None:
        out.append("next time: no suggestion (no device has a measured peak: MIG jobs and jobs shorter than the "
                   "monitor's interval may have none)")
    else:
        out.append(f"next time: --gres={stats.suggestion.request}   ({stats.suggestion.why})")
    if stats.notes:
        out.append("notes:")
        out += [f"  - {note}" for note in stats.notes]
        if stats.notes_footer:
            out.append(f"  {stats.notes_footer}")
    return "\n".join(out) + "\n"


def header_lines(h: JobHeader) -> list[str]:
    """The header's lines below the job line: name, state and what was allocated; start, run time and time
    limit use."""
    import time

    mem = "-" if h.mem_mib is None else (format_mib(h.mem_mib) if h.mem_mib % 1024 == 0 else f"{h.mem_mib}M")
    first = (f"  name {h.name or '-'}  state {h.state or '-'}  nodes {h.nodes}  cores {h.cpus}  CPU memory {mem}  "
             f"GPUs {h.gpus}  QOS {h.qos or '-'}")
    start = "not started" if h.start is None else "started " + time.strftime("%Y-%m-%d %H:%M:%S",
                                                                             time.localtime(h.start))
    used = h.limit_used_pct
    if h.incomplete:
        return [first, f"  {start}  ran {format_span(h.elapsed_s)}",
                "  (slurmdbd's row of this run names another user than slurmctld's: its name, QOS and time limit "
                "are not shown; see docs/accounting.md)"]
    limit = "no time limit" if h.limit_s is None else (f"of a {format_span(h.limit_s)} limit ({used:.0f}% of it)")
    return [first, f"  {start}  ran {format_span(h.elapsed_s)} {limit}"]


def to_json(stats: JobStats) -> str:
    """``{"job", "user", "account", "partition", "source", "slurm", "devices": [record + "used_pct"],
    "suggestion", "notes", "notes_footer"}`` (``slurm``: :meth:`JobHeader.to_dict` or null; a record's memory
    series is its ``mem_series_mib`` and ``mem_series_width``; ``notes``: the efficiency notes, ``[]`` with none)."""
    s = stats.suggestion
    return json.dumps({
        "job": stats.job_id, "user": stats.user, "account": stats.account, "partition": stats.partition,
        "source": stats.source, "slurm": None if stats.header is None else stats.header.to_dict(),
        "devices": [{**d.record.to_dict(), "used_pct": None if d.used_pct is None else round(d.used_pct, 2)}
                    for d in stats.devices],
        "suggestion": None if s is None else {"request": s.request, "mem_mib": s.mib, "why": s.why},
        "notes": list(stats.notes), "notes_footer": stats.notes_footer,
    }, indent=1) + "\n"


# --- who may see a job ---------------------------------------------------------------------------------

def may_see(job_id: str, owner_uid: int | None, caller_uid: int, *, slurm_user_uid: Callable[[], int | None],
            admin_level: Callable[[], str]) -> None:
    """Let the job's user, root, SlurmUser and Slurm Operators/Administrators see a job; refuse anyone else.

    Args:
        owner_uid: the job's uid as Slurm recorded it (sacct ``UID``, or slurmctld's ``user_id``); None when
            Slurm does not know the job.
        caller_uid: the caller's real uid.
        slurm_user_uid: SlurmUser's uid (asked only when needed).
        admin_level: the caller's Slurm AdminLevel (``None``, ``Operator``, ``Administrator``; asked only
            when needed).

    Raises:
        NotYours: the caller may not see the job.
    """
    if caller_uid == 0 or (owner_uid is not None and owner_uid == caller_uid):
        return
    if caller_uid == slurm_user_uid():
        return
    if admin_level().strip().lower() in ("administrator", "operator"):
        return
    if owner_uid is None:
        raise NotYours(f"job {job_id} is not known to Slurm (sacct, scontrol): cannot tell whose job it is",
                       hint="check the job id; only Slurm administrators may read jobs Slurm no longer knows")
    raise NotYours(f"job {job_id} is another user's: jobstats shows your own jobs only",
                   hint="give one of your job ids (sacct -X -o JobID,JobName lists them); Slurm administrators "
                        "(AdminLevel Operator or Administrator) see every job")
