"""The pure half of ``benchmarks/packing``: job traces, the three ways to ask for them, the metrics.

A trace is a list of :class:`TraceJob`: when a job is submitted, how long it runs, the time limit it
asks for, how many GPUs and how much GPU memory it peaks at on each. :func:`generate_trace` draws one
with a fixed seed from published distributions (NERSC Perlmutter, see :data:`PEAK_CDF`);
:func:`read_trace_csv` reads a site's export (docs/performance.md lists the columns).

:func:`gres_request` is what each variant's user writes (``exclusive``: whole GPUs; ``fixed``: shards
of a GPU with ``Count=4``; ``gpushare``: ``gpushare:mem=<peak x headroom>``); :func:`reserved_mib`
reads back what Slurm granted. :func:`summarize` turns one replay (:class:`Run`: when each job was
released, started and ended, its grant and exit status) into the printed numbers; :func:`plot` draws
the variants side by side (matplotlib, imported only there). Nothing here talks to Slurm.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from slurm_gpushare.errors import InputError
from slurm_gpushare.memsize import parse_mib

VARIANTS = ("exclusive", "fixed", "gpushare")
#: shards per GPU of the fixed-fractions variant (the SoftMig / NVIDIA replicas style)
FIXED_SHARDS = 4
#: the site's default headroom over a job's peak for gpushare requests
HEADROOM = 1.2
#: a job's GPU memory peak as a fraction of the GPU's memory: cumulative shares, interpolated linearly
#: (NERSC Perlmutter, 80 GB A100 nodes: about half of GPU jobs use at most 25% of GPU memory, 55%
#: peak at or below 50%; the rest spread up to the whole GPU)
PEAK_CDF = ((0.01, 0.0), (0.25, 0.50), (0.50, 0.55), (1.00, 1.00))
#: jobs with more than one GPU, and how their GPU counts split
MULTI_GPU_SHARE = 0.15
MULTI_GPU_COUNTS = ((2, 0.5), (4, 0.35), (8, 0.15))
#: lognormal run time: median (trace seconds) and sigma; the longest job; limit = run time x factor
DURATION_MEDIAN_S = 20 * 60.0
DURATION_SIGMA = 1.0
DURATION_MAX_S = 3 * 3600.0
LIMIT_FACTOR = (1.5, 3.0)


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace (times in trace seconds).

    Attributes:
        id: the job's number in the trace.
        submit_s: when it is submitted, after the trace's start.
        duration_s: how long it runs.
        limit_s: the time limit it asks for (at least its run time).
        gpus: GPUs on one node.
        peak_mib: GPU memory it peaks at, per GPU.
        sm: SM utilization percent the fake GPU app shows.
    """

    id: int
    submit_s: float
    duration_s: float
    limit_s: float
    gpus: int
    peak_mib: int
    sm: float = 50.0


def _peak_fraction(u: float) -> float:
    """The inverse of :data:`PEAK_CDF` at ``u`` in [0, 1)."""
    for (f0, c0), (f1, c1) in zip(PEAK_CDF, PEAK_CDF[1:], strict=False):
        if u <= c1:
            return f0 + (f1 - f0) * (u - c0) / (c1 - c0)
    return PEAK_CDF[-1][0]


def generate_trace(n: int, *, seed: int = 1, gpu_mem_mib: int = 81920, total_gpus: int = 16,
                   load: float = 2.0) -> list[TraceJob]:
    """``n`` jobs drawn with ``seed`` (the same seed gives the same trace).

    Arrivals are Poisson at a rate that offers ``load`` times what ``total_gpus`` whole GPUs serve
    (load 2: the exclusive variant's queue grows while jobs arrive); a share
    (:data:`MULTI_GPU_SHARE`) has 2-8 GPUs; peaks follow :data:`PEAK_CDF`; run times are lognormal.

    Raises:
        InputError: ``n``, ``gpu_mem_mib``, ``total_gpus`` or ``load`` not positive.
    """
    import numpy as np

    if n <= 0 or gpu_mem_mib <= 0 or total_gpus <= 0 or not load > 0:
        raise InputError(f"trace: n={n}, gpu_mem_mib={gpu_mem_mib}, total_gpus={total_gpus}, load={load}: "
                         "each must be positive", hint="e.g. n=200, gpu_mem_mib=81920, total_gpus=16, load=2")
    rng = np.random.default_rng(seed)
    counts, weights = zip(*MULTI_GPU_COUNTS, strict=True)
    mean_gpus = 1 - MULTI_GPU_SHARE + MULTI_GPU_SHARE * sum(c * w for c, w in MULTI_GPU_COUNTS)
    mean_duration = DURATION_MEDIAN_S * math.exp(DURATION_SIGMA ** 2 / 2)
    gap = mean_duration * mean_gpus / (total_gpus * load)
    jobs, t = [], 0.0
    for i in range(n):
        multi = rng.random() < MULTI_GPU_SHARE
        gpus = int(rng.choice(counts, p=weights)) if multi else 1
        peak = max(256, int(_peak_fraction(float(rng.random())) * gpu_mem_mib))
        duration = float(min(DURATION_MAX_S, max(60.0, rng.lognormal(math.log(DURATION_MEDIAN_S), DURATION_SIGMA))))
        limit = duration * float(rng.uniform(*LIMIT_FACTOR))
        sm = float(np.round(rng.uniform(10, 95)))
        jobs.append(TraceJob(i, round(t, 1), round(duration, 1), round(limit, 1), gpus, peak, sm))
        t += float(rng.exponential(gap))
    return jobs


_ALIASES = {
    "submit": ("submit", "submit_s"), "elapsed": ("elapsed", "duration_s"), "timelimit": ("timelimit", "limit_s"),
    "gpus": ("gpus", "ngpus"), "peak": ("peakmem", "peak_mem", "peak_mib"), "tres": ("alloctres",),
    "usage": ("tresusageinmax",), "sm": ("sm", "smutil"), "id": ("jobid", "id"),
}


def _duration(text: str, what: str) -> float:
    """Seconds: ``90``, ``90.5``, ``MM:SS``, ``HH:MM:SS`` or ``D-HH:MM:SS`` (sacct's forms)."""
    t = text.strip()
    try:
        return float(t)
    except ValueError:
        pass
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)", t)
    if not m:
        raise InputError(f"{what} {text!r} is not a duration", hint="seconds, MM:SS, HH:MM:SS or D-HH:MM:SS")
    d, h, mi, s = m.groups()
    return int(d or 0) * 86400 + int(h or 0) * 3600 + int(mi) * 60 + float(s)


def _tres_value(tres: str, key: str) -> str | None:
    for item in tres.split(","):
        k, _, v = item.partition("=")
        if k.strip() == key:
            return v.strip()
    return None


def read_trace_csv(path: str | Path, *, gpu_mem_mib: int = 81920) -> list[TraceJob]:
    """A site's job export: one row per GPU job (docs/performance.md, "Reading a site's trace").

    Columns (case-insensitive, sacct's names where sacct has one): ``Submit`` (seconds, or an ISO
    time; the earliest is the trace's start), ``Elapsed`` (seconds or ``[D-]HH:MM:SS``), optional
    ``Timelimit`` (default twice Elapsed), ``GPUs`` or ``AllocTRES`` (``gres/gpu=N``), ``PeakMem``
    (per GPU: ``12G``, ``512M``, or MiB) or ``TRESUsageInMax`` (``gres/gpumem=``, all GPUs of the
    job), optional ``SM`` (percent) and ``JobID``. Rows without GPUs are skipped. Fields are separated
    by ``,`` or, when the header has one, by ``|`` (``sacct -P``).

    Raises:
        InputError: a missing column or a value that cannot be read (naming the row).
    """
    lines = Path(path).read_text().splitlines()
    rows = list(csv.DictReader(lines, delimiter="|" if lines and "|" in lines[0] else ","))
    if not rows:
        raise InputError(f"{path}: no rows", hint="a header line, then one line per job")
    header = {k.strip().lower(): k for k in rows[0]}

    def col(name: str) -> str | None:
        return next((header[a] for a in _ALIASES[name] if a in header), None)

    need = {"submit": col("submit"), "elapsed": col("elapsed")}
    if col("gpus") is None and col("tres") is None:
        need["GPUs or AllocTRES"] = None
    if col("peak") is None and col("usage") is None:
        need["PeakMem or TRESUsageInMax"] = None
    missing = [k for k, v in need.items() if v is None]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)} (has {', '.join(rows[0])})",
                         hint="Submit, Elapsed, GPUs, PeakMem (docs/performance.md lists all)")
    raw = []
    for n, row in enumerate(rows, start=2):
        where = f"{path} line {n}"
        try:
            gc, tc = col("gpus"), col("tres")
            if gc and row[gc].strip():
                gpus = int(row[gc])
            else:
                gpus = int(_tres_value(row[tc] or "", "gres/gpu") or 0) if tc else 0
            if gpus <= 0:
                continue
            pc, uc = col("peak"), col("usage")
            if pc and row[pc].strip():
                peak = parse_mib(row[pc], what="PeakMem")
            else:
                total = _tres_value(row[uc] or "", "gres/gpumem") if uc else None
                if total is None:
                    raise InputError("no PeakMem and no gres/gpumem in TRESUsageInMax")
                peak = parse_mib(total, what="gres/gpumem") // gpus
            elapsed = _duration(row[need["elapsed"]], "Elapsed")
            lc = col("timelimit")
            limit = _duration(row[lc], "Timelimit") if lc and row[lc].strip() else 2 * elapsed
            sub = row[need["submit"]].strip()
            try:
                submit = float(sub)
            except ValueError:
                submit = datetime.fromisoformat(sub).timestamp()
            sc = col("sm")
            sm = float(row[sc]) if sc and row[sc].strip() else 50.0
        except (InputError, ValueError) as e:
            raise InputError(f"{where}: {e}", hint="docs/performance.md lists the columns and forms") from None
        raw.append((submit, max(1.0, elapsed), max(limit, elapsed, 60.0), gpus, max(1, min(peak, gpu_mem_mib)), sm))
    if not raw:
        raise InputError(f"{path}: no job with GPUs", hint="GPUs > 0, or AllocTRES with gres/gpu=N")
    t0 = min(r[0] for r in raw)
    return [TraceJob(i, r[0] - t0, r[1], r[2], r[3], r[4], r[5]) for i, r in enumerate(sorted(raw))]


def gres_request(job: TraceJob, variant: str, gpu_mem_mib: int, *, headroom: float = HEADROOM) -> str:
    """The ``--gres`` a user of ``variant`` writes for ``job``.

    ``exclusive``: ``gpu:N``. ``fixed``: ``shard:K`` with K quarters of the GPU holding peak x
    headroom (at most :data:`FIXED_SHARDS`), whole GPUs for jobs on several GPUs (a shard job is one
    GPU). ``gpushare``: ``gpushare:mem=<peak x headroom>[:N]`` in MiB, at most the GPU's memory.
    """
    want = min(gpu_mem_mib, math.ceil(job.peak_mib * headroom))
    if variant == "exclusive" or (variant == "fixed" and job.gpus > 1):
        return f"gpu:{job.gpus}"
    if variant == "fixed":
        return f"shard:{min(FIXED_SHARDS, math.ceil(want * FIXED_SHARDS / gpu_mem_mib))}"
    if variant == "gpushare":
        return f"gpushare:mem={want}M" + (f":{job.gpus}" if job.gpus > 1 else "")
    raise InputError(f"unknown variant {variant!r}", hint=f"one of {', '.join(VARIANTS)}")


def reserved_mib(granted: str, gpu_mem_mib: int, shard_mib: int) -> int:
    """GPU memory a granted ``tres_per_node`` (``squeue %b``: ``gres:shard:10``, ``gres/gpu:a100:2``)
    holds for its job: whole GPUs at their memory, shards at ``shard_mib`` each; 0 for none."""
    total = 0
    for item in granted.split(","):
        parts = re.split(r"[:/]", item.strip())
        if parts and parts[0] == "gres":
            parts = parts[1:]
        if not parts or parts[0] not in ("gpu", "shard"):
            continue
        count = int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
        total += count * (gpu_mem_mib if parts[0] == "gpu" else shard_mib)
    return total


def least_grant_mib(job: TraceJob, variant: str, gpu_mem_mib: int, *, headroom: float = HEADROOM) -> int:
    """The least GPU memory (MiB, summed over the job's GPUs) that any grant of ``variant``'s request for
    ``job`` (:func:`gres_request`) holds: whole GPUs for ``gpu:N``, ``K`` quarters for ``shard:K``, the asked
    memory on each GPU for ``gpushare`` (the filter may grant more: whole GPUs, or shards rounded up)."""
    want = min(gpu_mem_mib, math.ceil(job.peak_mib * headroom))
    if variant == "exclusive" or (variant == "fixed" and job.gpus > 1):
        return job.gpus * gpu_mem_mib
    if variant == "fixed":
        return min(FIXED_SHARDS, math.ceil(want * FIXED_SHARDS / gpu_mem_mib)) * gpu_mem_mib // FIXED_SHARDS
    if variant == "gpushare":
        return want * job.gpus
    raise InputError(f"unknown variant {variant!r}", hint=f"one of {', '.join(VARIANTS)}")


def makespan_bound_s(trace: Sequence[TraceJob], variant: str, total_gpus: int, gpu_mem_mib: int) -> float:
    """A lower bound (trace seconds) on the makespan of any schedule of ``trace`` with ``variant``'s requests
    on ``total_gpus`` GPUs of ``gpu_mem_mib``, whatever the scheduler; the larger of:

    * the tail: no job ends before its submit time plus its run time;
    * the work from each submit time on: the jobs submitted at or after ``t`` hold at least
      :func:`least_grant_mib` x run time of GPU memory, which the cluster serves at most at its total memory
      per second, all of it after ``t``.

    Both are measured from the first submit (as :func:`summarize`'s makespan is from the first release).
    Nan for an empty trace.
    """
    if not trace:
        return math.nan
    t0 = min(j.submit_s for j in trace)
    tail = max(j.submit_s + j.duration_s for j in trace) - t0
    capacity = total_gpus * gpu_mem_mib
    work, best = 0.0, 0.0
    for j in sorted(trace, key=lambda j: j.submit_s, reverse=True):
        work += least_grant_mib(j, variant, gpu_mem_mib) * j.duration_s
        best = max(best, j.submit_s - t0 + work / capacity)
    return max(tail, best)


@dataclass(frozen=True)
class JobRecord:
    """One job of one replay (real seconds since the replay's start; None: it never did).

    Attributes:
        job: the trace's job.
        released: when it became eligible (its trace submit time, scaled).
        started, ended: when its script started and ended.
        reserved_mib: GPU memory its grant holds (:func:`reserved_mib`).
        exit_code: the fake GPU app's exit status (2: out of memory under its limit).
        where: the node and ``CUDA_VISIBLE_DEVICES`` its script saw (``"pk01 0,1"``; "" when it never ran).
    """

    job: TraceJob
    released: float
    started: float | None
    ended: float | None
    reserved_mib: int
    exit_code: int | None
    where: str = ""


@dataclass
class Run:
    """One replay of a trace on one variant.

    Attributes:
        variant: one of :data:`VARIANTS`.
        records: one per trace job.
        total_gpus, gpu_mem_mib: the cluster's GPUs and the memory of each.
        time_scale: trace seconds per real second.
    """

    variant: str
    records: list[JobRecord]
    total_gpus: int
    gpu_mem_mib: int
    time_scale: float = 60.0
    notes: list[str] = field(default_factory=list)


def pct(values: Sequence[float], p: float) -> float:
    """The ``p`` quantile (0-1) by linear interpolation between order statistics; nan when empty."""
    v = sorted(values)
    if not v:
        return math.nan
    k = (len(v) - 1) * p
    lo = math.floor(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def lost(r: JobRecord) -> str | None:
    """``oom`` (out of memory under its limit), ``failed`` (another exit status, or never ran), or None."""
    if r.exit_code == 2:
        return "oom"
    if r.exit_code != 0 or r.started is None or r.ended is None:
        return "failed"
    return None


def summarize(run: Run) -> dict[str, float]:
    """The printed numbers of one replay; times in trace units (real seconds x time scale).

    makespan_h: first release to last end; wait_mean_min, wait_p95_min: start minus release of the jobs
    that started; makespan_bound_h: the least makespan any scheduler could reach with this variant's
    requests (:func:`makespan_bound_s`); jobs_per_gpu_hour: finished jobs / (GPUs x makespan);
    packing: reserved GPU memory over the cluster's GPU memory, averaged over the makespan;
    reserved_gpu_h / used_gpu_h: GPU-hours the grants held / the jobs' peaks held (in whole-GPU units);
    lost_oom, lost_failed: counts.
    """
    s = run.time_scale
    recs = run.records
    t0 = min((r.released for r in recs), default=0.0)
    ends = [r.ended for r in recs if r.ended is not None]
    makespan = (max(ends) - t0) * s if ends else math.nan
    waits = [(r.started - r.released) * s for r in recs if r.started is not None]
    ran = [(r, r.ended - r.started) for r in recs if r.started is not None and r.ended is not None]
    reserved = sum(r.reserved_mib * t for r, t in ran) * s / run.gpu_mem_mib
    used = sum(min(r.job.peak_mib, run.gpu_mem_mib) * r.job.gpus * t for r, t in ran) * s / run.gpu_mem_mib
    done = sum(1 for r in recs if lost(r) is None)
    gpu_s = run.total_gpus * makespan
    return {
        "jobs": len(recs), "done": done,
        "makespan_h": makespan / 3600,
        "makespan_bound_h": makespan_bound_s([r.job for r in recs], run.variant, run.total_gpus,
                                             run.gpu_mem_mib) / 3600,
        "wait_mean_min": (sum(waits) / len(waits) / 60) if waits else math.nan,
        "wait_p95_min": pct(waits, 0.95) / 60,
        "jobs_per_gpu_hour": done / (gpu_s / 3600) if gpu_s > 0 else math.nan,
        "packing": reserved / gpu_s if gpu_s > 0 else math.nan,
        "reserved_gpu_h": reserved / 3600, "used_gpu_h": used / 3600,
        "lost_oom": sum(1 for r in recs if lost(r) == "oom"),
        "lost_failed": sum(1 for r in recs if lost(r) == "failed"),
    }


def timeline(run: Run, step: float | None = None) -> tuple[list[float], list[float], list[int]]:
    """(times in trace hours, reserved / total GPU memory, jobs waiting) sampled every ``step`` real
    seconds (default: 200 samples over the replay)."""
    recs = run.records
    t0 = min((r.released for r in recs), default=0.0)
    end = max([r.ended for r in recs if r.ended is not None] + [t0])
    step = step or max((end - t0) / 200, 1e-9)
    total = run.total_gpus * run.gpu_mem_mib
    ts, res, queue = [], [], []
    t = t0
    while t <= end + step / 2:
        ts.append((t - t0) * run.time_scale / 3600)
        res.append(sum(r.reserved_mib for r in recs if r.started is not None and r.started <= t
                       and (r.ended is None or r.ended > t)) / total)
        queue.append(sum(1 for r in recs if r.released <= t and (r.started is None or r.started > t)))
        t += step
    return ts, res, queue


def ratio_table(summaries: dict[str, dict[str, float]]) -> list[str]:
    """The printed table: each variant's numbers and, for every variant after the first, its ratio to
    the first (exclusive)."""
    rows = (("makespan (trace h)", "makespan_h"), ("  least possible (trace h)", "makespan_bound_h"),
            ("queue wait mean (min)", "wait_mean_min"),
            ("queue wait p95 (min)", "wait_p95_min"), ("jobs per GPU-hour", "jobs_per_gpu_hour"),
            ("reserved memory packing", "packing"), ("GPU-hours reserved", "reserved_gpu_h"),
            ("GPU-hours used (peak mem)", "used_gpu_h"), ("jobs lost: OOM", "lost_oom"),
            ("jobs lost: failed", "lost_failed"))
    names = list(summaries)
    base = summaries[names[0]]
    head = (f"{'':<27}" + "".join(f"{n:>12}" for n in names)
            + "".join(f"{n + '/' + names[0][:4]:>16}" for n in names[1:]))
    out = [head]
    for label, key in rows:
        vals = "".join(_fmt(summaries[n][key]) for n in names)
        ratios = ""
        for n in names[1:]:
            b, v = base[key], summaries[n][key]
            ratios += f"{v / b:>15.2f}x" if b and not math.isnan(b) and not math.isnan(v) else f"{'-':>16}"
        out.append(f"{label:<27}{vals}{ratios}")
    return out


def _fmt(v: float) -> str:
    if isinstance(v, int) or (not math.isnan(v) and v == int(v) and abs(v) >= 1):
        return f"{int(v):>12d}"
    return f"{v:>12.3g}" if not math.isnan(v) else f"{'-':>12}"


def plot(runs: Iterable[Run], path: str | Path, *, title: str = "") -> None:
    """Draw each run's reserved GPU memory (share of the cluster's) and queue length over time, one
    column per variant, into ``path`` (PNG; matplotlib's Agg backend, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(runs)
    fig, axes = plt.subplots(2, len(runs), figsize=(3.2 * len(runs), 4.2), sharex=True, sharey="row",
                             squeeze=False)
    for col, run in enumerate(runs):
        ts, res, queue = timeline(run)
        top, bottom = axes[0][col], axes[1][col]
        top.fill_between(ts, [100 * x for x in res], step="post", alpha=0.6)
        top.set_title(run.variant, fontsize=10)
        top.set_ylim(0, 105)
        bottom.step(ts, queue, where="post", color="tab:red")
        bottom.set_xlabel("trace hours")
        if col == 0:
            top.set_ylabel("GPU memory\nreserved (%)")
            bottom.set_ylabel("jobs waiting")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
