"""Expected queue wait of a layout: a discrete-event replay of jobs onto its slots (docs/mig.md, "Queue wait").

The static objective (:mod:`slurm_gpushare.mig.plan`) judges a layout at the demand's mean concurrency; the
replay asks how long the demand's jobs would queue on it. It is the packing benchmark's trace model
(``slurm_gpushare_dev.packing``: each job has an arrival, a run time and a memory ask) replayed in
memory instead of on a dev cluster, so it can run inside ``mig plan``.

**The trace** (:class:`Trace`), one of

- from the accounting store (:func:`trace_from_store`): every record of the
  period is a job, its run time ``end - start``, its ask ``mem_asked_mib`` and ``sm_asked_percent``, or
  a whole GPU (mode ``gpu``, nothing asked). The store keeps no submit or eligible time, so a job
  arrives at its *start*: what it queued before it started is not seen, and the waits are lower
  bounds (``Trace.lower_bound``);
- from a demand file (:func:`poisson_trace`), which holds counts at once and no times: Poisson arrivals
  of every request kind at the rate that makes its count the mean number running at once (Little's
  law), run times exponential with mean ``mean_run_s`` (1 h), a fixed seed. Waits are then in hours
  of that model and scale with the real mean run time.

**The replay** (:func:`replay`). The layout's slots are its GPU instances and MIG-off GPUs
(:class:`~slurm_gpushare.mig.plan.Slot`). A job is bound, as the submit filter binds a ``gpushare``
request to one GRES type from the configured inventory (not from what is free), to a class of slots:
a memory request to the smallest MIG slot type that holds its memory and the compute slices its
``sm=`` asks (the plan's fit and rounding); a memory request no MIG slot holds to the MIG-off GPUs
whose memory holds it; a whole-GPU request to every MIG-off GPU. A job of an empty class never
starts (``Wait.never``). Jobs are taken in arrival order (ties in trace order); a job starts at
once on a free slot of its class (the smallest, then the lowest slot number), else it queues; a
slot that frees goes to the earliest queued job whose class holds it (FIFO, and first-fit backfill:
a later job starts on a slot no earlier queued job can use). A slot that frees at ``t`` serves a job
arriving at ``t``. Each record is one device, so a job of several devices replays as several jobs.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from slurm_gpushare.accounting.jobstats import format_span
from slurm_gpushare.accounting.store import Store
from slurm_gpushare.errors import InputError
from slurm_gpushare.mig.demand import Request, merge, records_in_period
from slurm_gpushare.mig.plan import Plan, Slot

#: Jobs of the Poisson replay of a demand file.
POISSON_JOBS = 10_000
#: Mean run time of the Poisson replay's jobs, seconds (waits scale with it).
MEAN_RUN_S = 3600.0
#: Seed of the Poisson replay.
SEED = 1


class Job(NamedTuple):
    """One job of a trace (a named tuple: a trace of 10,000 is built in milliseconds).

    Attributes:
        arrival_s: when it can start, seconds (epoch seconds from the store, trace seconds otherwise).
        run_s: how long it runs once started, seconds (>= 0).
        mem_mib: memory asked, MiB (0 for a whole GPU).
        sm_percent: compute asked, percent of a whole GPU, or None.
        whole: a whole GPU is asked.
    """

    arrival_s: float
    run_s: float
    mem_mib: int = 0
    sm_percent: int | None = None
    whole: bool = False


@dataclass(frozen=True)
class Trace:
    """Jobs to replay and where they came from.

    Attributes:
        jobs: the jobs, in trace order.
        source: ``store`` or ``poisson``.
        lower_bound: arrivals are start times (the store keeps no submit time): waits are lower bounds.
        note: what the trace is, for the summary's header line.
    """

    jobs: tuple[Job, ...]
    source: str
    lower_bound: bool
    note: str


class Started(NamedTuple):
    """One job's run in a replay.

    Attributes:
        job: index of the job in the trace.
        slot: index of the slot in the layout's slots.
        start_s, end_s: when it ran, seconds.
    """

    job: int
    slot: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Replay:
    """What a replay did.

    Attributes:
        started: every job that ran, in start order.
        never: indices of the jobs no slot of the layout holds.
    """

    started: tuple[Started, ...]
    never: tuple[int, ...]


@dataclass(frozen=True)
class Wait:
    """One layout's queue wait over a trace.

    Attributes:
        jobs: jobs that ran (the waits are theirs).
        never: jobs no slot holds.
        mean_s: mean wait, seconds (0 when no job ran).
        p95_s: 95th percentile wait, nearest rank (the ``ceil(0.95 n)``-th smallest), seconds.
        overloaded: request kinds (labels) asked more at once than their slots hold, Poisson replay only:
            their queue grows over the whole replay, and the wait with the replay's length.
    """

    jobs: int
    never: int
    mean_s: float
    p95_s: float
    overloaded: tuple[str, ...] = ()


@dataclass(frozen=True)
class Waits:
    """Today's and the plan's queue wait over one trace.

    Attributes:
        trace: the trace replayed.
        today, planned: the waits.
    """

    trace: Trace
    today: Wait
    planned: Wait


def slot_class(types: Sequence[Slot], mem_mib: int, sm_percent: int | None, whole: bool) -> tuple[Slot, ...]:
    """The slot types a request may start on (see the module docstring), smallest first.

    Args:
        types: the layout's distinct slots, sorted by (memory, slices).
    """
    if whole:
        return tuple(t for t in types if t.whole)
    mig = [t for t in types if not t.whole and t.mem_mib >= mem_mib and t.slices >= t.slices_for(sm_percent)]
    if mig:
        return (mig[0],)
    return tuple(t for t in types if t.whole and t.mem_mib >= mem_mib)


def _types(slots: Sequence[Slot]) -> list[Slot]:
    return sorted(set(slots), key=lambda s: (s.mem_mib, s.slices, s.whole))


def replay(slots: Sequence[Slot], jobs: Sequence[Job]) -> Replay:
    """Replay ``jobs`` on ``slots`` (see the module docstring): O(n log n) in the jobs, deterministic."""
    types = _types(slots)
    free: dict[Slot, list[int]] = {t: [] for t in types}
    for i, s in enumerate(slots):
        heapq.heappush(free[s], i)
    classes: dict[tuple[Slot, ...], deque[int]] = {}
    of_job: list[tuple[Slot, ...]] = []
    for j in jobs:
        c = slot_class(types, j.mem_mib, j.sm_percent, j.whole)
        of_job.append(c)
        if c:
            classes.setdefault(c, deque())
    holding: dict[Slot, list[deque[int]]] = {t: [q for c, q in classes.items() if t in c] for t in types}
    ends: list[tuple[float, int, int]] = []  # (end, slot, job)
    started: list[Started] = []
    never: list[int] = []
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival_s, i))

    def run(job: int, slot: int, at: float) -> None:
        end = at + jobs[job].run_s
        started.append(Started(job=job, slot=slot, start_s=at, end_s=end))
        heapq.heappush(ends, (end, slot, job))

    def release(upto: float) -> None:
        while ends and ends[0][0] <= upto:
            at, slot, _job = heapq.heappop(ends)
            waiting = [q for q in holding[slots[slot]] if q]
            if waiting:
                q = min(waiting, key=lambda q: (jobs[q[0]].arrival_s, q[0]))
                run(q.popleft(), slot, at)
            else:
                heapq.heappush(free[slots[slot]], slot)

    for i in order:
        release(jobs[i].arrival_s)
        c = of_job[i]
        if not c:
            never.append(i)
            continue
        t = next((t for t in c if free[t]), None)
        if t is not None:
            run(i, heapq.heappop(free[t]), jobs[i].arrival_s)
        else:
            classes[c].append(i)
    release(math.inf)
    return Replay(started=tuple(started), never=tuple(sorted(never)))


def wait_of(slots: Sequence[Slot], trace: Trace, demand: Sequence[Request] = ()) -> Wait:
    """The queue wait of ``trace`` on ``slots``; ``demand`` (Poisson traces) names the overloaded kinds."""
    r = replay(slots, trace.jobs)
    waits = sorted(s.start_s - trace.jobs[s.job].arrival_s for s in r.started)
    n = len(waits)
    mean = sum(waits) / n if n else 0.0
    p95 = waits[math.ceil(0.95 * n) - 1] if n else 0.0
    over = overloaded(slots, demand) if trace.source == "poisson" else ()
    return Wait(jobs=n, never=len(r.never), mean_s=mean, p95_s=p95, overloaded=over)


def overloaded(slots: Sequence[Slot], demand: Sequence[Request]) -> tuple[str, ...]:
    """Labels of the request kinds whose class of slots is asked more at once than it has slots.

    Requests bound to one MIG slot type are checked against that type's slots; requests bound to
    MIG-off GPUs together against all MIG-off GPUs (a necessary condition for a queue that stays finite).
    """
    types = _types(slots)
    count = {t: sum(1 for s in slots if s == t) for t in types}
    load: dict[Slot | None, float] = {}
    kinds: dict[Slot | None, list[str]] = {}
    for r in demand:
        c = slot_class(types, r.mem_mib, r.sm_percent, r.whole)
        if not c:
            continue
        key = None if c[0].whole else c[0]
        load[key] = load.get(key, 0.0) + r.weight
        kinds.setdefault(key, []).append(r.label())
    out: list[str] = []
    for key, asked in load.items():
        have = sum(n for t, n in count.items() if t.whole) if key is None else count[key]
        if asked >= have:
            out += kinds[key]
    return tuple(out)


def poisson_trace(demand: Sequence[Request], *, jobs: int = POISSON_JOBS, mean_run_s: float = MEAN_RUN_S,
                  seed: int = SEED) -> Trace:
    """A trace for a demand of counts at once: Poisson arrivals, exponential run times (module docstring).

    Each kind arrives at rate ``weight / mean_run_s`` (so its mean number running at once, with room
    for all, is its weight); the merged stream draws ``jobs`` arrivals with Python's ``random.Random(seed)``,
    the demand merged and sorted first (:func:`~slurm_gpushare.mig.demand.merge`: its order does not matter).

    Raises:
        InputError: an empty demand, or ``jobs`` or ``mean_run_s`` not positive.
    """
    total = sum(r.weight for r in demand)
    if not demand or total <= 0 or jobs <= 0 or not mean_run_s > 0:
        raise InputError(f"a Poisson trace needs a demand and positive jobs and mean run time (demand of "
                         f"{len(demand)} kinds, jobs={jobs}, mean_run_s={mean_run_s})",
                         hint="e.g. a demand file with 10G,6 and jobs=10000, mean_run_s=3600")
    demand = merge(list(demand))  # one order: the same demand in any order gives the same trace
    rng = random.Random(seed)
    rate = total / mean_run_s
    cumulative = []
    acc = 0.0
    for r in demand:
        acc += r.weight / total
        cumulative.append(acc)
    out = []
    t = 0.0
    for _ in range(jobs):
        t += rng.expovariate(rate)
        u = rng.random()
        r = demand[min(bisect.bisect_right(cumulative, u), len(demand) - 1)]
        out.append(Job(arrival_s=t, run_s=rng.expovariate(1 / mean_run_s), mem_mib=r.mem_mib,
                       sm_percent=r.sm_percent, whole=r.whole))
    note = (f"{jobs} Poisson arrivals at the demand's counts, run times exponential with mean "
            f"{mean_run_s / 3600:g} h, seed {seed} (a demand file has no times: waits scale with the real "
            "mean run time)")
    return Trace(jobs=tuple(out), source="poisson", lower_bound=False, note=note)


def trace_from_store(store: Store, *, partitions: tuple[str, ...] = (), since: int | None = None,
                     until: int | None = None, models: tuple[str, ...] = ()) -> Trace:
    """The jobs of the records that :func:`~slurm_gpushare.mig.demand.demand_from_store` reads and that
    *start* in the period: each arrives at its start (the store keeps no submit time, so the waits are
    lower bounds), runs ``end - start`` seconds, and asks what its record asked (a record without a
    memory ask and of another mode than ``gpu`` is left out, as in the demand).

    Raises:
        InputError: as :func:`~slurm_gpushare.mig.demand.demand_from_store`.
    """
    rows, lo, hi = records_in_period(store, partitions, since, until, models)
    jobs = []
    for mode, mem, sm, start, end in sorted(rows, key=lambda r: (r[3], r[4])):
        if not lo <= start < hi or (mem is None and mode != "gpu"):
            continue
        jobs.append(Job(arrival_s=float(start), run_s=float(end - start), mem_mib=int(mem or 0), sm_percent=sm,
                        whole=mem is None))
    note = (f"{len(jobs)} jobs of the store that started in the period, each arriving at its start (the store "
            "keeps no submit time: lower bounds, the queueing before a start is not seen)")
    return Trace(jobs=tuple(jobs), source="store", lower_bound=True, note=note)


def expected_waits(plan: Plan, trace: Trace) -> Waits:
    """Today's and the plan's queue wait of ``trace`` (the slots of every GPU of the plan)."""
    today = [s for p in plan.gpus for s in p.today.slots]
    planned = [s for p in plan.gpus for s in p.choice.slots]
    return Waits(trace=trace, today=wait_of(today, trace, plan.demand), planned=wait_of(planned, trace, plan.demand))


def format_wait(seconds: float) -> str:
    """``42 s``, ``12.5 min``, ``3.20 h``."""
    return format_span(seconds, hour_digits=2)
