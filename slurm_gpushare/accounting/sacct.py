"""The job's usage in Slurm's own accounting: one ``[gpushare:u1 ...]`` segment in the job's AdminComment,
written after the job ended from the job's accounting records, and the records read back from ``sacct`` alone.

The segment (pure text, :func:`final_segment`) holds, for one run of a job, what every record of that run
holds that ``sacct`` does not: per node the run's start and length and its exit, per GPU device what was
reserved and what was used. Tokens, separated by single spaces, in this order::

    [gpushare:u1 run=0 node=a100-01 t=1764547200+7200 exit=COMPLETED/0:0
                 gpu=0/a100/81920/mps/shard:10/10240/25/10240/4096/18.5/25.0/240 ...]

(one line in the field).

* ``run=R``: the run (the records' ``restart``: 0, 1 after one requeue);
* ``node=NAME`` opens a node's group; ``t=START+SECONDS`` (epoch seconds) and ``exit=STATE/CODE``
  belong to it; each ``gpu=`` is one record of that node, fields separated by ``/``: NVML index,
  model, GPU memory MiB, mode, share, memory asked MiB, SM asked %, memory granted MiB, memory peak MiB,
  SM mean %, SM peak %, samples. ``-`` is "no data" (or an empty text); numbers are written so that
  they read back to the same value (``repr`` of the float), so a report from ``sacct`` equals the
  report from the store.

What ``sacct`` itself says is taken from it (:data:`~slurm_gpushare.slurm.commands.SACCT_FIELDS`): the job
id (``JobIDRaw``), the array task (``JobID`` ``10_2``), user, account and partition.

The segment is written with ``sacctmgr`` into the job's row in slurmdbd (:func:`write_final_summary`,
run by EpilogSlurmctld): ``scontrol update`` refuses an ended job on every supported release. Only root,
SlurmUser and slurmdbd Operators may set AdminComment; users set Comment, which nothing here reads.

Other tools' text in AdminComment stays (:func:`merge_final`): Princeton jobstats' ``JS1:<base64 of a
gzip stream>``, which its reader expects at the very start of the field (``startswith('JS1:')``) and
decodes with everything after it (``base64.b64decode(data[4:])``, which skips characters outside the
alphabet; Python 3.11 stops at a complete padding, Python 3.13 reads on: measured). So the merged field
keeps ``JS1:`` first, and when its base64 ends without padding (a stream of 3k bytes), one NUL byte is
appended to the gzip stream before re-encoding: gzip readers skip NUL bytes after a member (Python's
``gzip``), the decoded JSON is the same, and where the decoder stops at the padding it stops before the
gpushare segments. Under Python 3.13 jobstats' reader fails on any text after its segment (it then asks
Prometheus again, as for a job without one).
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_gpushare.accounting.record import RERUN_STATES, RecordError, UsageRecord
from slurm_gpushare.errors import GpushareError, InputError, SlurmError
from slurm_gpushare.slurm.admincomment import FINAL, RUNNING, audit_text, without_audit
from slurm_gpushare.slurm.commands import local_release
from slurm_gpushare.slurm.release import SACCTMGR_KEEPS_CASE, Release

_JS1 = re.compile(r"^JS1:(\S*)")
#: Characters no value may hold: the separators, brackets, and quotes (``sacctmgr`` ends a value at a quote).
_BAD = frozenset(" /[]\n\t\r'\"\\")
_GPU_FIELDS = ("gpu_index", "gpu_model", "gpu_memory_mib", "mode", "share", "mem_asked_mib", "sm_asked_percent",
               "mem_granted_mib", "mem_peak_mib", "sm_mean_percent", "sm_peak_percent", "samples")
_INT, _NUM, _STR = "int", "num", "str"
_GPU_KINDS = {"gpu_index": _INT, "gpu_model": _STR, "gpu_memory_mib": _INT, "mode": _STR, "share": _STR,
              "mem_asked_mib": _INT, "sm_asked_percent": _INT, "mem_granted_mib": _INT, "mem_peak_mib": _INT,
              "sm_mean_percent": _NUM, "sm_peak_percent": _NUM, "samples": _INT}


class SegmentError(InputError):
    """An AdminComment usage segment that cannot be read (a newer version, a broken token)."""


def _put(value: object, what: str) -> str:
    if value is None or value == "":
        return "-"
    text = repr(value) if isinstance(value, float) else str(value)
    if any(c in _BAD for c in text):
        raise InputError(f"{what} {text!r} cannot be written into AdminComment (it holds a space, '/', a bracket "
                         "or a quote)")
    return text


def final_segment(records: Sequence[UsageRecord]) -> str:
    """The ``[gpushare:u1 ...]`` segment of one run of a job (see the module docstring), nodes and devices in
    the records' order (pure).

    Raises:
        InputError: no records, records of several jobs or runs, or a value holding a separator.
    """
    if not records:
        raise InputError("no records to summarize")
    if len({(r.job_id, r.restart) for r in records}) != 1:
        raise InputError("a usage segment is of one run of one job")
    tokens = [f"run={records[0].restart}"]
    nodes: dict[str, list[UsageRecord]] = {}
    for r in records:
        nodes.setdefault(r.node, []).append(r)
    for node, recs in nodes.items():
        first = recs[0]
        tokens += [f"node={_put(node, 'node name')}", f"t={first.start}+{first.end - first.start}",
                   f"exit={_put(first.exit_state, 'exit state')}/{_put(first.exit_code, 'exit code')}"]
        for r in recs:
            if (r.start, r.end, r.exit_state, r.exit_code) != (first.start, first.end, first.exit_state,
                                                               first.exit_code):
                raise InputError(f"records of job {r.job_id} on {node} differ in start, end or exit")
            tokens.append("gpu=" + "/".join(_put(getattr(r, f), f) for f in _GPU_FIELDS))
    return FINAL.format(tokens)


@dataclass(frozen=True)
class SacctJob:
    """One ``sacct`` row (one run of one job allocation), the fields of
    :data:`~slurm_gpushare.slurm.commands.SACCT_FIELDS` that the records take.

    Attributes:
        job_id: ``JobIDRaw`` (an array task's own id).
        array_job_id, array_task_id: from ``JobID`` ``<array>_<task>``; None outside arrays.
        user, account, partition, state: as slurmdbd stored them.
        admin_comment: the AdminComment column (root, SlurmUser and Operators write it; never Comment).
        start: the run's ``Start`` (epoch seconds; None: it never started).
        alloc_tres: the run's ``AllocTRES`` (``cpu=1,gres/gpu=1,...``; ``gres:gpu`` before 23.11).
    """

    job_id: str
    array_job_id: str | None
    array_task_id: int | None
    user: str
    account: str
    partition: str
    state: str
    admin_comment: str
    start: int | None = None
    alloc_tres: str = ""


def parse_sacct(text: str) -> list[SacctJob]:
    """Rows of :func:`~slurm_gpushare.slurm.commands.sacct_jobs` output (``-n -P``, its field order). A line
    with fewer fields is not a row (an empty output is no rows); AdminComment, the last field, keeps any
    ``|`` it holds.

    Raises:
        InputError: a row whose JobIDRaw is not a job id.
    """
    from slurm_gpushare.slurm.commands import SACCT_FIELDS

    rows = []
    n = len(SACCT_FIELDS)
    for line in text.splitlines():
        parts = line.split("|", n - 1)
        if len(parts) < n:
            continue
        f = dict(zip(SACCT_FIELDS, parts, strict=True))
        raw = f["JobIDRaw"].strip()
        if not raw.isdigit():
            raise InputError(f"sacct row with JobIDRaw {raw!r}: not a job id", hint="sacct -X -P -o JobIDRaw,...")
        array_job, _, task = f["JobID"].partition("_")
        array = (array_job, int(task)) if task.isdigit() else (None, None)
        start = f["Start"].strip()
        rows.append(SacctJob(raw, array[0], array[1], f["User"], f["Account"], f["Partition"], f["State"],
                             f["AdminComment"], int(start) if start.isdigit() and start != "0" else None,
                             f["AllocTRES"]))
    return rows


def latest_jobs(rows: Iterable[SacctJob]) -> list[SacctJob]:
    """Per job id, the rows of the most recent job of that id: what ``sacct -j`` shows without ``-D`` (sacct(1)
    ``--duplicates``: "returns the most recent job with that number"; slurmdbd orders a job id's rows by
    submit time), with that job's earlier runs kept, which ``-D`` also lists. A job id is used again once
    slurmctld's state is lost while slurmdbd keeps the old jobs. Going back from the newest row (by
    ``Start``), an older row is a run of the same job while its state is one Slurm runs a job again after
    (:data:`RERUN_STATES`) and its segment's ``run=`` (where both have one) is below the later run's; the
    first row that is neither ends the job. Rows keep their order."""
    rows = list(rows)
    by_id: dict[str, list[SacctJob]] = {}
    for r in rows:
        by_id.setdefault(r.job_id, []).append(r)
    keep: set[int] = set()
    for runs in by_id.values():
        newest_first = sorted(runs, key=lambda r: r.start or 0, reverse=True)
        keep.add(id(newest_first[0]))
        later = _run_of(newest_first[0])
        for r in newest_first[1:]:
            run = _run_of(r)
            rerun = (r.state.split() or [""])[0] in RERUN_STATES
            if not rerun or (run is not None and later is not None and run >= later):
                break
            keep.add(id(r))
            later = run if run is not None else later
    return [r for r in rows if id(r) in keep]


def _run_of(row: SacctJob) -> int | None:
    """The ``run=`` of the row's usage segment (None: no segment)."""
    m = FINAL.pattern.search(row.admin_comment or "")
    first = (m.group(2) or "").split(" ", 1)[0] if m else ""
    return int(first[len("run="):]) if first.startswith("run=") and first[len("run="):].isdigit() else None


def _get(text: str, kind: str, what: str):
    if text == "-":
        return "" if kind is _STR else None
    try:
        return int(text) if kind is _INT else float(text) if kind is _NUM else text
    except ValueError:
        raise SegmentError(f"usage segment field {what} is {text!r}, not a number") from None


def records_from_segment(job: SacctJob) -> list[UsageRecord]:
    """The records that the job's ``[gpushare:u1 ...]`` segment and its ``sacct`` row describe; empty when the
    AdminComment has no such segment.

    Raises:
        SegmentError: a segment of a newer version, or one that does not read as the grammar says.
    """
    m = FINAL.pattern.search(job.admin_comment or "")
    if not m:
        return []
    if int(m.group(1)) > FINAL.version:
        raise SegmentError(f"job {job.job_id}: AdminComment usage segment is version u{m.group(1)}; this "
                           f"slurm-gpushare reads u{FINAL.version}", hint="upgrade slurm-gpushare")
    run = None
    node = None
    start = end = None
    exit_state = exit_code = ""
    out: list[UsageRecord] = []
    for token in (m.group(2) or "").split():
        key, _, value = token.partition("=")
        if key == "run" and value.isdigit():
            run = int(value)
        elif key == "node" and value:
            node, start, end = value, None, None
        elif key == "t" and node is not None:
            a, _, d = value.partition("+")
            if not (a.isdigit() and d.isdigit()):
                raise SegmentError(f"job {job.job_id}: usage segment t={value!r}, not START+SECONDS")
            start, end = int(a), int(a) + int(d)
        elif key == "exit" and node is not None:
            s, _, c = value.partition("/")
            # upper: sacctmgr before 23.02 stored the field lowercased (SACCTMGR_KEEPS_CASE)
            exit_state, exit_code = _get(s, _STR, "exit").upper(), _get(c, _STR, "exit")
        elif key == "gpu" and node is not None and start is not None and run is not None:
            parts = value.split("/")
            if len(parts) != len(_GPU_FIELDS):
                raise SegmentError(f"job {job.job_id}: usage segment gpu={value!r} has {len(parts)} fields, "
                                   f"not {len(_GPU_FIELDS)}")
            fields = {name: _get(p, _GPU_KINDS[name], name) for name, p in zip(_GPU_FIELDS, parts, strict=True)}
            try:
                out.append(UsageRecord(
                    job_id=job.job_id, restart=run, user=job.user, account=job.account, partition=job.partition,
                    node=node, gpu_uuid=f"sacct:{node}:{fields['gpu_index']}:{len(out)}", start=start,
                    end=end if end is not None else start, exit_state=exit_state, exit_code=exit_code,
                    array_job_id=job.array_job_id, array_task_id=job.array_task_id, **fields))
            except (RecordError, TypeError) as e:
                raise SegmentError(f"job {job.job_id}: usage segment gpu={value!r}: {e}") from None
        else:
            raise SegmentError(f"job {job.job_id}: usage segment token {token!r} out of place",
                               hint="the grammar is run= then, per node, node= t= exit= gpu=...")
    return out


def records_from_sacct(jobs: Iterable[SacctJob]) -> list[UsageRecord]:
    """Every record the rows' segments describe (rows without a segment give none).

    Raises:
        SegmentError: see :func:`records_from_segment`.
    """
    return [r for job in jobs for r in records_from_segment(job)]


# --- merging into what AdminComment already holds ---------------------------------------------------------

def _padded_js1(payload: str) -> str:
    """jobstats' base64 payload, re-encoded with a NUL byte after its gzip stream when its base64 ends without
    padding (see the module docstring); any other payload unchanged."""
    if not payload or payload.endswith("=") or len(payload) % 4:
        return payload
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return payload
    if data[:2] != b"\x1f\x8b":  # not a gzip stream: not jobstats' format, leave it alone
        return payload
    return base64.b64encode(data + b"\x00").decode("ascii")


def merge_final(stored: str | None, live: str | None, segment: str) -> str:
    """The AdminComment to write: jobstats' ``JS1:`` first when there is one (padded, see the module
    docstring), then other tools' text as it was, then the gpushare request audit (from ``stored``, or from
    ``live`` when another tool replaced the whole field), then ``segment``. An earlier ``[gpushare:u...]``
    segment and the monitor's running ``[gpushare-usage:...]`` summaries are replaced by ``segment``.

    Args:
        stored: the job's AdminComment in slurmdbd (``sacct``), what other tools wrote after the job ended.
        live: the job's AdminComment in slurmctld (``scontrol show job``), or None when it is gone.
        segment: :func:`final_segment`'s text.

    Raises:
        InputError: the result would hold a quote or a backslash (sacctmgr ends a value at a quote).
    """
    text = (stored or "").strip()
    js1 = ""
    m = _JS1.match(text)
    if m:
        js1 = "JS1:" + _padded_js1(m.group(1))
        text = text[m.end():]
    audit = audit_text(text) or audit_text(live)
    rest = without_audit(RUNNING.strip(FINAL.strip(text)))
    parts = [p for p in (js1, rest, audit or "", segment) if p]
    out = " ".join(parts)
    if any(c in out for c in "'\"\\"):
        raise InputError("AdminComment holds a quote or a backslash, which sacctmgr cannot take whole",
                         hint="remove it from the other tool's text")
    return out


# --- the EpilogSlurmctld step ------------------------------------------------------------------------------

@dataclass(frozen=True)
class FinalJob:
    """The job EpilogSlurmctld runs for, from its environment (src/slurmctld/job_mgr.c builds it).

    Attributes:
        job_id: ``SLURM_JOB_ID``.
        restart: ``SLURM_JOB_RESTART_COUNT`` (the run).
        nodes: ``SLURM_JOB_NODELIST`` expanded.
        sacctmgr_id: ``<array>_<task>`` for the array task whose id is the array's own
            (``SLURM_ARRAY_JOB_ID == SLURM_JOB_ID``; ``jobid=<array>`` would name every task), else the id.
        user: ``SLURM_JOB_USER`` (every supported release), ``""`` unknown.
        start: ``SLURM_JOB_START_TIME`` (epoch s; 24.11 and later), 0 unknown.
    """

    job_id: str
    restart: int
    nodes: tuple[str, ...]
    sacctmgr_id: str
    user: str = ""
    start: int = 0

    @classmethod
    def from_env(cls, env: dict[str, str], job_id: str | None = None) -> FinalJob:
        """Read EpilogSlurmctld's environment (``job_id`` overrides ``SLURM_JOB_ID``).

        Raises:
            InputError: no job id.
        """
        from slurm_gpushare.slurm.hostlist import expand_hostlist

        jid = (job_id or env.get("SLURM_JOB_ID", "")).strip()
        if not jid.isdigit():
            raise InputError(f"job id {jid!r} is not a job id",
                             hint="EpilogSlurmctld sets SLURM_JOB_ID; give JOBID when running by hand")
        restart = env.get("SLURM_JOB_RESTART_COUNT", "0")
        array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
        sid = f"{array}_{task}" if array == jid and task.isdigit() else jid
        nodes = expand_hostlist(env.get("SLURM_JOB_NODELIST", "")) if env.get("SLURM_JOB_NODELIST") else ()
        start = env.get("SLURM_JOB_START_TIME", "")
        return cls(jid, int(restart) if restart.isdigit() else 0, nodes, sid, env.get("SLURM_JOB_USER", "").strip(),
                   int(start) if start.isdigit() else 0)

    def owns(self, r: UsageRecord) -> bool:
        """Whether ``r`` (of this job id and run) is this job's and not an earlier job's of the same id (a lost
        StateSaveLocation, MaxJobId wrapping): the same user, and not started before this job (a minute's slack:
        the Prolog's start is slurmctld's, or the Prolog's clock where slurmctld had none yet)."""
        return (not self.user or not r.user or r.user == self.user) and (not self.start or r.start >= self.start - 60)


def spooled_records(spools: Sequence[str | Path], job: FinalJob) -> list[UsageRecord]:
    """The records of ``job``'s run in the spool directories or files (the nodes' Epilogs wrote them; the
    controller reads them where they are mounted). Only the files of the job's nodes are read (all files
    when the node list is unknown); lines that are not records, or of other jobs, are skipped.
    """
    from slurm_gpushare.accounting.spool import SUFFIX, complete_size

    files: list[Path] = []
    for src in spools:
        p = Path(src)
        if p.is_dir():
            files += sorted(f for f in p.iterdir() if f.name.endswith(SUFFIX) and
                            (not job.nodes or f.name.split(".", 1)[0] in job.nodes or
                             any(f.name.startswith(f"{n}.") for n in job.nodes)))
        elif p.is_file():
            files.append(p)
    needle = f'"job_id":"{job.job_id}"'.encode()
    found: dict[tuple, UsageRecord] = {}
    for f in files:
        try:
            with open(f, "rb") as fh:
                data = fh.read(complete_size(f))
        except OSError:
            continue
        for line in data.splitlines():
            if needle not in line:
                continue
            try:
                r = UsageRecord.from_json(line)
            except RecordError:
                continue
            if r.job_id == job.job_id and r.restart == job.restart and r.step == "" and job.owns(r):
                # one record per device; where an Epilog ran twice for a run, the one that saw the run wins
                # (more samples, then the longer span), not the one that happened to be spooled first
                have = found.get(r.key)
                if have is None or r.saw_more(have):
                    found[r.key] = r
    # records of version 4 carry the run's submit time: of a job id Slurm gave again (to the same user, on a
    # release without SLURM_JOB_START_TIME) only the newest job's count; 0 is not known (a node of an earlier
    # release), never taken for older
    newest = max((r.submit for r in found.values()), default=0)
    kept = (r for r in found.values() if r.submit in (0, newest))
    return sorted(kept, key=lambda r: (job.nodes.index(r.node) if r.node in job.nodes else len(job.nodes),
                                       r.node, r.gpu_index, r.gpu_uuid))


def write_final_summary(job: FinalJob, spools: Sequence[str | Path], *, wait: float = 120.0,
                        poll: float = 1.0, sacct: Callable[[list[str]], str] | None = None,
                        show_job: Callable[[str], str] | None = None,
                        sacctmgr: Callable[[str, str], str] | None = None,
                        clock: Callable[[], float] = time.monotonic,
                        sleep: Callable[[float], None] = time.sleep, release: Release | None = None) -> str | None:
    """Put the run's final usage segment into the job's AdminComment in slurmdbd (EpilogSlurmctld's step).

    1. wait (up to ``wait`` seconds) until the spools hold records of the run from every node of the job
       (slurmctld starts EpilogSlurmctld as it sends the nodes their terminate requests, so the nodes'
       Epilogs run meanwhile: src/slurmctld/node_scheduler.c ``deallocate_nodes``); at the deadline, what
       is there is written, and nothing when there is nothing (a job without GPUs);
    2. wait (within the same deadline) until slurmdbd holds the run's end record: sacct shows a final state.
       slurmctld's own end record carries the AdminComment slurmctld holds and would replace one written
       before it arrived (as_mysql_job_complete);
    3. read what slurmdbd holds (sacct: other tools' text, jobstats' ``JS1:``) and what slurmctld holds
       (``scontrol show job``: the request audit, in case another tool replaced the whole field), merge
       (:func:`merge_final`) and write with ``sacctmgr``; then read it back. Before Slurm 23.02 sacctmgr
       stores the field lowercased (:data:`~slurm_gpushare.slurm.release.SACCTMGR_KEEPS_CASE`): the segment
       still reads back (its exit state is read case-blind; models, modes and shares are lowercase), while
       the request audit and other tools' text lose their capitals (jobstats' base64 among them, which
       jobstats' own sacctmgr write on such a release breaks the same way).

    Returns:
        The AdminComment as slurmdbd now holds it, or None when the run has no records.

    Raises:
        SlurmError: sacct or sacctmgr failed, slurmdbd had no end record of the run by the deadline, or the
            value read back is not the one written.
        InputError: a value that cannot be written (see :func:`merge_final`).
    """
    run = FinalRun(job, spools, wait=wait, sacct=sacct, show_job=show_job, sacctmgr=sacctmgr, clock=clock,
                   release=release)
    while not run.step():
        sleep(poll)
    return run.result


class FinalRun:
    """:func:`write_final_summary` for one run, as non-blocking steps, so that one process can carry many runs
    at once (the controller's queue worker, :mod:`slurm_gpushare.accounting.sacctqueue`), each with its own
    deadline. :meth:`step` does what can be done now and says whether the run is finished; ``result`` is then
    :func:`write_final_summary`'s return value.

    Args:
        job, spools, sacct, show_job, sacctmgr, release: as :func:`write_final_summary`.
        wait: seconds from now (``clock``) to the run's deadline, for the nodes' records and then slurmdbd's
            end record.
        clock: monotonic seconds.
    """

    def __init__(self, job: FinalJob, spools: Sequence[str | Path], *, wait: float = 120.0,
                 sacct: Callable[[list[str]], str] | None = None, show_job: Callable[[str], str] | None = None,
                 sacctmgr: Callable[[str, str], str] | None = None, clock: Callable[[], float] = time.monotonic,
                 release: Release | None = None) -> None:
        from slurm_gpushare.slurm import commands
        from slurm_gpushare.slurm.job import parse_job_json

        self.job, self.spools, self.wait, self.clock, self.release = job, spools, wait, clock, release
        self.sacct = sacct or (lambda args: commands.sacct_jobs(args))
        self.show_job = show_job or (lambda jid: parse_job_json(commands.job_record(jid), jid).admin_comment)
        self.sacctmgr = sacctmgr or commands.sacctmgr_admin_comment
        self.deadline = clock() + wait
        self.segment: str | None = None  # once every node's records are in (or the deadline passed)
        self.result: str | None = None

    @property
    def phase(self) -> str:
        """``records`` (waiting for the nodes' records) or ``dbd`` (waiting for slurmdbd's end record)."""
        return "records" if self.segment is None else "dbd"

    def stored_row(self, rows: Sequence[SacctJob] | None = None) -> SacctJob | None:
        """The run's row in slurmdbd: from ``rows`` (a sacct of several jobs at once) or a sacct of its own.

        ``-D`` lists every row of the id, in no order to rely on: the runs of a requeued job, and older jobs of
        the same id where slurmctld's state was lost while slurmdbd kept them. The run that just ended is the one
        whose ``Start`` is the job's ``SLURM_JOB_START_TIME`` (24.11 and later), else the newest by ``Start``
        (an older job of the id started before it; slurmdbd's ``modify job`` also writes the newest job of an
        id, as_mysql_modify_job: ``time_submit desc limit 1``). On 22.05 a rerun that has already started when
        the summary runs (after slurmctld's requeue delay, 120 s by default) would be taken for it: the summary
        then waits for its end."""
        if rows is None:
            rows = parse_sacct(self.sacct(["-j", self.job.job_id]))
        mine = [r for r in rows if r.job_id == self.job.job_id]
        if not mine:
            return None
        if self.job.start:
            exact = [r for r in mine if r.start == self.job.start]
            if exact:
                return exact[-1]
        return sorted(mine, key=lambda r: r.start or 0)[-1]

    def step(self, rows: Sequence[SacctJob] | None = None) -> bool:
        """Do what can be done now: look for the records; once they are in, look for slurmdbd's end record
        (in ``rows`` when given: parsed sacct rows holding this job's, else one ``sacct -j``); once it is
        there, merge, write and read back (see :func:`write_final_summary`). True when finished.

        Raises:
            SlurmError, InputError: as :func:`write_final_summary` (the end record missing at the deadline).
        """
        job = self.job
        if self.segment is None:
            records = spooled_records(self.spools, job)
            if {r.node for r in records} < set(job.nodes) and self.clock() < self.deadline:
                return False
            if not records:
                return True
            self.segment = final_segment(records)
            rows = None  # fetched before the records were in: maybe before the end record too
        row = self.stored_row(rows)
        if row is None or not _final_state(row.state):
            if self.clock() < self.deadline:
                return False
            raise SlurmError(f"slurmdbd has no end record of job {job.job_id} after {self.wait:.0f} s "
                             f"(sacct state {row.state if row else 'none'!r}): its usage segment was not written",
                             hint="is slurmdbd up? (sacctmgr show cluster)")
        try:
            live = self.show_job(job.job_id)
        except GpushareError:
            live = None
        text = merge_final(row.admin_comment, live, self.segment)
        try:
            # slurmdbd may not take the write at once although sacct shows the row ended (22.05, for the array
            # task whose id is the array's: "Request didn't affect anything", taken seconds later): tried again
            # each round until the deadline
            self.sacctmgr(job.sacctmgr_id, text)
            after = self.stored_row()
            keeps_case = (self.release or local_release()) >= SACCTMGR_KEEPS_CASE
            want = text if keeps_case else text.lower()
            if after is None or after.admin_comment.strip() != want:
                raise SlurmError(f"job {job.job_id}: sacct shows AdminComment "
                                 f"{after.admin_comment if after else None!r} after sacctmgr set {text!r}")
        except SlurmError:
            if self.clock() < self.deadline:
                return False
            raise
        self.result = want
        return True


def _final_state(state: str) -> bool:
    """Whether a sacct State is one a job ends in (``CANCELLED by 0`` is CANCELLED)."""
    return state.split(" ")[0] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
                                   "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REQUEUED")
