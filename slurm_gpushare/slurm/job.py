"""What slurmctld says about a job, as plain data.

The node hooks read it with :func:`parse_job_json` from structured output (``squeue --json`` on 22.05,
``scontrol show job ID --json`` from 23.02 on: :func:`slurm_gpushare.slurm.commands.job_record`), where a
user-written field (JobName, Comment, WorkDir, StdOut, ...) is a JSON string and cannot add or change another
field; identity (uid, gid, user) comes from
slurmd's Prolog/Epilog environment (:func:`with_env_identity`). :func:`parse_show_job` reads the text of
``scontrol -d show job`` for tests and display only: that text embeds user fields verbatim, newlines
included, so a ``--comment`` can forge any line of it (issue #12). The parts used:

* ``UserId=alice(1000) GroupId=alice(1000)``, ``JobState=``, ``Partition=``, ``NodeList=``;
* ``TresPerNode=gres:shard:10`` (22.05; ``gres/shard:10`` from 23.11: what the job holds after the
  job_submit rewrite);
* ``AdminComment=...`` with the gpushare segment (:mod:`slurm_gpushare.slurm.admincomment`);
* the detail lines of ``-d``: ``Nodes=a100-nvb CPU_IDs=0 Mem=100 GRES=shard:10(IDX:0)``: which
  devices of which node the job got (IDX = slurmd's device index on that node; shards from 23.11.2:
  ``GRES=shard:10(10/80,0/80)``, the job's count on each device).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from slurm_gpushare.errors import InputError
from slurm_gpushare.slurm.admincomment import extract
from slurm_gpushare.slurm.gres import GresItem, parse
from slurm_gpushare.slurm.hostlist import expand_hostlist
from slurm_gpushare.slurm.release import DATA_PARSER, SCONTROL_JSON, Release, missing, of_meta

_FREE_TEXT = ("AdminComment=", "Comment=", "Command=", "Reason=")


@dataclass(frozen=True)
class JobInfo:
    """The fields of one job the hooks use (see module docstring)."""

    job_id: str
    user: str = ""
    uid: int = -1
    gid: int = -1
    state: str = ""
    partition: str = ""
    nodes: tuple[str, ...] = ()
    tres_per_node: str = ""
    admin_comment: str = ""
    gres: dict[str, tuple[GresItem, ...]] = field(default_factory=dict)
    account: str = ""
    qos: str = ""  # the job's QOS as slurmctld holds it ("" where Slurm keeps none: no slurmdbd)
    start_time: int | None = None
    #: ``SubmitTime=`` / ``submit_time`` (epoch s): slurmctld sets it anew when it requeues the job, and
    #: slurmdbd keys the job's row by id and submit time; None when not known
    submit_time: int | None = None
    #: ``Restarts=`` / ``restart_cnt``: how often slurmctld has restarted (requeued) the job; None not known
    restarts: int | None = None
    array_job_id: str | None = None
    array_task_id: int | None = None
    exit_code: str = ""  # ``ExitCode=`` (exit:signal), as slurmctld holds it
    #: node -> the job's cores there as ``(socket, core in socket)`` pairs (``job_resources``); a node
    #: that is not a key: not known (a record without detail, or a pending job)
    cores: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    tasks: int | None = None  # ``NumTasks=``: the job's tasks in all
    tasks_per_node: int | None = None  # ``--ntasks-per-node``, None when not asked

    @property
    def audit(self) -> dict[str, str] | None:
        """The gpushare AdminComment segment's fields, or None."""
        return extract(self.admin_comment)

    def gres_on(self, node: str) -> tuple[GresItem, ...]:
        """The GRES the job holds on ``node`` (empty when none)."""
        return self.gres.get(node, ())

    def core_ids_on(self, node: str, cores_per_socket: int) -> tuple[int, ...] | None:
        """The job's Slurm core ids on ``node`` (gres.conf ``Cores=`` numbering: ``socket *
        cores_per_socket + core``, the order of slurmctld's core bitmap), ascending; None when the
        record does not say, or names a core beyond ``cores_per_socket`` (a node layout other than
        the one given: then nothing is known)."""
        pairs = self.cores.get(node)
        if pairs is None or cores_per_socket < 1 or any(c >= cores_per_socket for _, c in pairs):
            return None
        return tuple(sorted(s * cores_per_socket + c for s, c in pairs))

    def tasks_on(self, node: str) -> int | None:
        """The job's tasks on ``node`` when the record fixes them: ``--ntasks-per-node``, or every task
        of a one-node job; None otherwise (slurmctld's record does not keep a per-node task count)."""
        if node not in self.nodes:
            return None
        if self.tasks_per_node:
            return self.tasks_per_node
        if len(self.nodes) == 1 and self.tasks:
            return self.tasks
        return None


def parse_gres_detail(text: str) -> tuple[GresItem, ...]:
    """The GRES a job holds on a node (``GRES=`` of ``scontrol -d show job``) or a node has in use
    (``GresUsed=`` of ``scontrol -d show node``): ``gpu:a100:2(IDX:4-5),shard:10(IDX:0)`` -> items,
    each with its count and its device indices (``GresItem.indices``; none for ``IDX:N/A``).

    Raises:
        InputError: an item that is not ``name[:type]:count[(IDX:...)]`` (the count is required here).
    """
    try:
        items = parse(text.strip())
        for it in items:
            if it.count is None:
                raise InputError(f"GRES item {it.text!r} has no count")
            it.indices  # noqa: B018 (an unreadable IDX: list fails here, not later in the Prolog)
    except InputError as e:
        raise InputError(f"cannot read the job's GRES detail {text!r}: {e.message}",
                         source="scontrol -d show job") from None
    return items


def used_devices(text: str, names: tuple[str, ...] = ("gpu", "shard")) -> set[int]:
    """slurmd device indices in use on a node, from ``GresUsed=`` of ``scontrol -d show node``, counting the
    GRES ``names``.

    ``gpu`` items give ``IDX:`` lists of node-wide indices. Shared GRES give ``IDX:`` on 22.05 and, from
    23.11.2, per-device ``allocated/available`` counts in one item per type, the types in device order
    (``shard:h100:10(0/79,10/79),shard:h100_4g.40gb:0(0/0,0/0)``: ``_node_gres_used`` in
    src/interfaces/gres.c at slurm-24-11-5-1, measured on 24.11.5 and 26.05.5): a device's index is its
    position after the devices of the earlier items of that name (here: 1). From 26.05 a device allocated
    whole shows ``-/79`` in the shard item (in use: it is in the ``gpu`` item's ``IDX:`` too).

    Raises:
        InputError: unreadable ``GresUsed=`` text.
    """
    used: set[int] = set()
    offset: dict[str, int] = {}
    for it in parse_gres_detail(text) if text else ():
        if it.name not in names:
            continue
        if it.shares:
            base = offset.get(it.name, 0)
            used.update(base + i for i, (alloc, _avail) in enumerate(it.shares) if alloc is None or alloc)
            offset[it.name] = base + len(it.shares)
        else:
            used.update(it.indices)
    return used


def _records(text: str) -> list[list[str]]:
    """The records of ``scontrol show job`` output, each a list of lines from its ``JobId=`` line."""
    out: list[list[str]] = []
    for line in text.splitlines():
        if line.strip().startswith("JobId="):
            out.append([])
        if out:
            out[-1].append(line)
    return out


def parse_show_job(text: str, job_id: str | int | None = None) -> JobInfo:
    """Parse the multi-line output of ``scontrol -d show job ID``.

    For an array's own job id Slurm prints every task of the array, one record each (``JobId=49
    ArrayTaskId=1``, ``JobId=50 ArrayTaskId=0``, ...): only the record whose ``JobId`` is ``job_id``
    is read (default: the first record).

    Raises:
        InputError: no ``JobId=`` (no such job), no record of ``job_id``, or unreadable GRES detail.
    """
    records = _records(text)
    if job_id is not None and records:
        want = str(job_id)
        mine = [r for r in records if r[0].strip().split()[0] == f"JobId={want}"]
        if not mine:
            raise InputError(f"scontrol printed no record of job {want}", source="scontrol -d show job")
        records = mine
    lines = records[0] if records else text.splitlines()
    fields: dict[str, str] = {}
    gres: dict[str, tuple[GresItem, ...]] = {}
    for line in lines:
        s = line.strip()
        if not s:
            continue
        if s.startswith(_FREE_TEXT):
            k, _, v = s.partition("=")
            fields[k] = v
            continue
        if s.startswith("Nodes=") and " GRES=" in f" {s}":
            parts = dict(kv.split("=", 1) for kv in s.split() if "=" in kv)
            allocs = parse_gres_detail(parts.get("GRES", ""))
            for node in expand_hostlist(parts["Nodes"]):
                gres[node] = allocs
            continue
        for kv in s.split():
            if "=" in kv:
                k, _, v = kv.partition("=")
                fields.setdefault(k, v)
    if "JobId" not in fields:
        raise InputError("scontrol printed no job", source="scontrol -d show job")
    user, uid = _name_id(fields.get("UserId", ""))
    _group, gid = _name_id(fields.get("GroupId", ""))
    node_list = fields.get("NodeList", "")
    nodes = tuple(expand_hostlist(node_list)) if node_list not in ("", "(null)") else ()
    account = fields.get("Account", "")
    task = fields.get("ArrayTaskId", "")
    return JobInfo(job_id=fields["JobId"], user=user, uid=uid, gid=gid, state=fields.get("JobState", ""),
                   partition=fields.get("Partition", ""), qos=fields.get("QOS", ""), nodes=nodes,
                   tres_per_node=fields.get("TresPerNode", ""), admin_comment=fields.get("AdminComment", ""),
                   gres=gres, account="" if account == "(null)" else account,
                   start_time=_epoch(fields.get("StartTime", "")),
                   submit_time=_epoch(fields.get("SubmitTime", "")),
                   restarts=int(fields["Restarts"]) if fields.get("Restarts", "").isdigit() else None,
                   array_job_id=fields.get("ArrayJobId") or None, array_task_id=int(task) if task.isdigit() else None,
                   exit_code=fields.get("ExitCode", ""))


#: Account, partition and user names slurmctld accepts (admin-defined; lower case ASCII in practice).
_NAME = re.compile(r"[A-Za-z0-9_.@+-]{0,128}")
_STATE = re.compile(r"[A-Z_]{1,40}")


class _Reader:
    """Typed access to one job entry of a ``--json`` document written by ``release``: a field that is not
    there is :func:`~slurm_gpushare.slurm.release.missing` (naming the release and the field), one of the
    wrong type an :class:`InputError`."""

    def __init__(self, job: Mapping, job_id: str, release: Release, source: str):
        self.job, self.job_id, self.release, self.source = job, job_id, release, source

    def raw(self, key: str):
        if key not in self.job:
            raise missing(self.release, self.source, f"jobs[].{key}")
        return self.job[key]

    def bad(self, key: str, value, what: str) -> InputError:
        return InputError(f"job {self.job_id}: {key} is {value!r}, not {what}", source=self.source)

    def integer(self, key: str) -> int:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.bad(key, value, "an integer")
        return value

    def string(self, key: str) -> str:
        value = self.raw(key)
        if not isinstance(value, str):
            raise self.bad(key, value, "a string")
        return value

    def name(self, key: str) -> str:
        value = self.string(key)
        if not _NAME.fullmatch(value):
            raise InputError(f"job {self.job_id}: {key} {value!r} is not a Slurm name", source=self.source)
        return value

    def number(self, key: str, value=None) -> int | None:
        """A data_parser number, ``{"set": true, "infinite": false, "number": 7}`` -> 7; unset or infinite
        -> None (a plain integer is read as itself)."""
        value = self.raw(key) if value is None else value
        if isinstance(value, Mapping):
            flags = (value.get("set"), value.get("infinite"), value.get("number"))
            if not all(isinstance(v, bool) for v in flags[:2]) or isinstance(flags[2], bool) or \
                    not isinstance(flags[2], int):
                raise self.bad(key, value, 'a {"set", "infinite", "number"} object')
            return flags[2] if flags[0] and not flags[1] else None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.bad(key, value, "a number")
        return value


def _job_list(text: str, source: str | None) -> tuple[list, Release, str]:
    """The ``jobs`` list of Slurm's ``--json`` job record, the release that wrote it and the command's name.

    Raises:
        InputError: not JSON. SlurmError: no ``meta`` version, or no ``jobs`` list.
    """
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise InputError(f"{source or 'the job record'} is not JSON: {e}", source=source) from None
    release = of_meta(doc, source or "the job record")
    source = source or ("squeue --json" if release < SCONTROL_JSON else "scontrol show job --json")
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        raise missing(release, source, "jobs")
    return jobs, release, source


def parse_job_json(text: str, job_id: str | int, *, source: str | None = None) -> JobInfo:
    """The record of ``job_id`` in the ``--json`` job list of Slurm (:func:`~slurm_gpushare.slurm.commands.job_record`:
    ``squeue --json`` on 22.05, ``scontrol show job ID --json`` from 23.02 on), in the shape of the release that
    wrote it (its ``meta`` block, :func:`~slurm_gpushare.slurm.release.of_meta`).

    Fields read (all written by slurmctld, none by the job's user): ``job_id``, ``user_id``, ``group_id``,
    ``user_name``, ``account``, ``partition``, ``qos`` (where the shape has it), ``job_state``, ``nodes`` (host
    list), ``tres_per_node`` (the GRES after the job_submit rewrite), ``gres_detail`` (one ``shard:10(IDX:0)``
    string per node of ``nodes``, in host-list order), ``admin_comment`` (SlurmUser and admins only), ``start_time``
    (epoch s), ``exit_code``, ``array_job_id``, ``array_task_id``, ``tasks``, ``tasks_per_node`` and, for a running
    job read with detail, ``job_resources`` (the cores it holds on each node: :func:`_job_cores`). Free-text fields
    are never read. The shapes:

    * 22.05 (openapi/v0.0.38, ``meta.Slurm.version``): plain numbers (``start_time`` 0 and ``array_job_id``
      0 = none), ``job_state`` a string, ``exit_code`` the wait status (``(code << 8) | signal``).
    * 23.02 and later (data_parser; v0.0.42 on 24.11, v0.0.45 on 26.05, measured): ``start_time``,
      ``array_job_id`` and ``array_task_id`` are ``{"set", "infinite", "number"}`` objects, ``job_state`` a
      list (the base state, then flags: ``["CANCELLED", "COMPLETING"]``), ``exit_code`` an object
      (``return_code`` and ``signal.id`` numbers); TRES written ``gres/shard:10`` (23.11+), shared GRES detail
      ``shard:10(10/80,0/80)`` (23.11.2+, :attr:`~slurm_gpushare.slurm.gres.GresItem.shares`).

    A release newer than :data:`~slurm_gpushare.slurm.release.NEWEST` is read in the newest shape.

    Args:
        source: the command that printed ``text``, for messages (default: the one of its release).

    Raises:
        InputError: not JSON, no record of ``job_id``, a field of the wrong type, a name with characters Slurm
            names do not have, or unreadable GRES detail: the record cannot be trusted (the job's fault, not
            the node's).
        SlurmError: no ``meta`` version, or a field the release's shape should have is not there
            (:func:`~slurm_gpushare.slurm.release.missing`: names the release and the field).
    """
    want = str(job_id)
    jobs, release, source = _job_list(text, source)
    mine = [j for j in jobs if isinstance(j, dict) and str(j.get("job_id")) == want]
    if len(mine) != 1:
        raise InputError(f"{source} has {len(mine)} records of job {want}", source=source)
    r = _Reader(mine[0], want, release, source)
    node_list = r.string("nodes")
    nodes = tuple(expand_hostlist(node_list)) if node_list else ()
    detail = r.raw("gres_detail") or []
    if not isinstance(detail, list) or not all(isinstance(d, str) for d in detail) or len(detail) > len(nodes):
        raise InputError(f"job {want}: gres_detail {detail!r} does not match nodes {node_list!r}", source=source)
    gres = {node: parse_gres_detail(d) for node, d in zip(nodes, detail, strict=False) if d}
    tres = r.string("tres_per_node")
    if tres:
        parse(tres)  # Slurm's GRES grammar or InputError
    start: int | None
    array_id: int | None
    task: int | None
    if release < DATA_PARSER:
        state = r.string("job_state")
        start, array_id = r.integer("start_time") or None, r.integer("array_job_id") or None
        task = r.job.get("array_task_id")
        if task is not None and (isinstance(task, bool) or not isinstance(task, int)):
            raise r.bad("array_task_id", task, "an integer")
        status = r.integer("exit_code")
        exit_code = f"{(status >> 8) & 0xFF}:{status & 0x7F}"
    else:
        states = r.raw("job_state")
        states = [states] if isinstance(states, str) else states
        if not isinstance(states, list) or not states or not all(isinstance(x, str) for x in states):
            raise r.bad("job_state", states, "a list of states")
        state = states[0]
        start, array_id, task = r.number("start_time") or None, r.number("array_job_id") or None, \
            r.number("array_task_id")
        code = r.raw("exit_code")
        if not isinstance(code, Mapping):
            raise r.bad("exit_code", code, "an object")
        if "return_code" not in code or not isinstance(code.get("signal"), Mapping) or "id" not in code["signal"]:
            raise missing(release, source, "jobs[].exit_code.return_code/signal.id")
        rc, sig = r.number("exit_code", code["return_code"]), r.number("exit_code", code["signal"]["id"])
        exit_code = f"{rc or 0}:{sig or 0}"
    if not _STATE.fullmatch(state):
        raise InputError(f"job {want}: job_state {state!r}", source=source)
    submit = ((r.integer("submit_time") if release < DATA_PARSER else r.number("submit_time")) or None
              if "submit_time" in r.job else None)
    restarts = r.number("restart_cnt") if "restart_cnt" in r.job else None
    # 22.05 writes null for an unset count (NO_VAL/INFINITE: data_set_null, openapi/v0.0.38 jobs.c)
    tasks, per_node = (r.number("tasks") if r.job.get("tasks") is not None else None,
                       r.number("tasks_per_node") if r.job.get("tasks_per_node") is not None else None)
    return JobInfo(job_id=want, user=r.name("user_name"), uid=r.integer("user_id"), gid=r.integer("group_id"),
                   state=state, partition=r.name("partition"), nodes=nodes, tres_per_node=tres,
                   admin_comment=r.string("admin_comment"), gres=gres, account=r.name("account"),
                   qos=r.name("qos") if "qos" in r.job else "", start_time=start,
                   submit_time=submit, restarts=restarts, array_job_id=str(array_id) if array_id else None,
                   array_task_id=task, exit_code=exit_code,
                   cores=_job_cores(r), tasks=tasks or None, tasks_per_node=per_node or None)


def array_task_job_id(text: str, array_id: str, task: int, *, source: str | None = None) -> str | None:
    """The job id of task ``task`` of job array ``array_id`` (``10_2`` as squeue and sacct name it) in Slurm's
    ``--json`` job list (:func:`~slurm_gpushare.slurm.commands.job_record`), read from ``array_job_id`` and
    ``array_task_id`` in the shape of the release that wrote it; None when the list has no such task.

    Raises:
        InputError: not JSON, or a field of the wrong type.
        SlurmError: no ``meta`` version, or no ``jobs`` list.
    """
    jobs, release, source = _job_list(text, source)
    for j in jobs:
        if not isinstance(j, dict):
            continue
        r = _Reader(j, str(j.get("job_id")), release, source)
        a: int | None
        if release < DATA_PARSER:
            a, t = r.integer("array_job_id"), j.get("array_task_id")
        else:
            a, t = r.number("array_job_id"), r.number("array_task_id")
        if a and str(a) == str(array_id) and t == task and not isinstance(t, bool):
            return str(j.get("job_id"))
    return None


def _job_cores(r: _Reader) -> dict[str, tuple[tuple[int, int], ...]]:
    """The ``job_resources`` of a running job read with detail, node -> ``(socket, core)`` pairs.

    * 22.05 (openapi/v0.0.38, ``_dump_node_res`` in src/plugins/openapi/v0.0.38/jobs.c at slurm-22-05-8-1):
      ``allocated_nodes[]``: ``{"nodename", "sockets": {"1": {"cores": {"0": "allocated", ...}}}}``, only
      the allocated cores (``allocated`` or ``allocated_and_in_use``); ``squeue --json`` loads with
      ``SHOW_DETAIL`` (``_op_handler_jobs``, same file).
    * 23.02 and later (data_parser ``JOB_RES_NODES``, src/plugins/data_parser/v0.0.42/parsers.c at
      slurm-24-11-5-1): ``nodes.allocation[]``: ``{"name", "sockets": [{"index", "cores": [{"index",
      "status": ["ALLOCATED", ...]}]}]}``, every core of the node; only ``scontrol -d show job --json``
      has it (``SHOW_DETAIL``: src/scontrol/info_job.c).

    Missing or empty ``job_resources`` (a pending job, a record without detail): ``{}``.

    Raises:
        InputError: a ``job_resources`` of the wrong shape.
    """
    res = r.job.get("job_resources")
    if not res:
        return {}
    bad = r.bad("job_resources", "...", "the job's allocated cores per node")
    out: dict[str, tuple[tuple[int, int], ...]] = {}
    try:
        if r.release < DATA_PARSER:
            for n in res.get("allocated_nodes") or ():
                pairs = [(int(s), int(c)) for s, sock in (n.get("sockets") or {}).items()
                         for c, status in (sock.get("cores") or {}).items() if str(status).startswith("allocated")]
                out[str(n["nodename"])] = tuple(sorted(pairs))
        else:
            nodes = res.get("nodes") or {}
            for n in (nodes.get("allocation") or ()) if isinstance(nodes, Mapping) else ():
                pairs = [(int(sock["index"]), int(core["index"])) for sock in n.get("sockets") or ()
                         for core in sock.get("cores") or () if "ALLOCATED" in (core.get("status") or ())]
                out[str(n["name"])] = tuple(sorted(pairs))
    except (AttributeError, KeyError, TypeError, ValueError):
        raise bad from None
    if any(s < 0 or c < 0 for pairs in out.values() for s, c in pairs):
        raise bad
    return out


def with_env_identity(info: JobInfo, env: Mapping[str, str]) -> JobInfo:
    """``info`` with the job's owner from slurmd's Prolog/Epilog environment (``SLURM_JOB_UID``,
    ``SLURM_JOB_GID``, ``SLURM_JOB_USER``; slurm.conf(5) Prolog and Epilog): the identity a hook acts as
    never comes from slurmctld's text. Variables that are absent leave the record's values.

    Raises:
        InputError: ``SLURM_JOB_UID``/``SLURM_JOB_GID`` not a number.
    """
    uid, gid = env.get("SLURM_JOB_UID", ""), env.get("SLURM_JOB_GID", "")
    for key, value in (("SLURM_JOB_UID", uid), ("SLURM_JOB_GID", gid)):
        if value and not value.isdigit():
            raise InputError(f"{key}={value!r} is not a number", source="slurmd environment")
    return replace(info, uid=int(uid) if uid else info.uid, gid=int(gid) if gid else info.gid,
                   user=env.get("SLURM_JOB_USER") or info.user)


def job_from_env(job_id: str, env: Mapping[str, str]) -> JobInfo:
    """What slurmd's Prolog/Epilog environment tells of a job, for when slurmctld cannot be asked: the
    owner (``SLURM_JOB_UID``, ``SLURM_JOB_GID``, ``SLURM_JOB_USER``), ``SLURM_JOB_PARTITION``,
    ``SLURM_JOB_ACCOUNT`` and ``SLURM_JOB_QOS`` where the release sets them (26.05's Prolog has the QOS, 22.05's
    not), and the node (``SLURMD_NODENAME``); no GRES detail, no
    AdminComment, no exit code (slurm.conf(5) Prolog and Epilog: the variables slurmd sets). The values
    are slurmd's, never a user's.

    Raises:
        InputError: ``SLURM_JOB_UID``/``SLURM_JOB_GID`` not a number.
    """
    node = env.get("SLURMD_NODENAME", "")
    return with_env_identity(JobInfo(job_id, partition=env.get("SLURM_JOB_PARTITION", ""),
                                     account=env.get("SLURM_JOB_ACCOUNT", ""), qos=env.get("SLURM_JOB_QOS", ""),
                                     nodes=(node,) if node else ()), env)


def _epoch(text: str) -> int | None:
    """``2026-11-29T12:05:05`` (slurmctld's local time) -> epoch seconds; ``Unknown``/``None`` -> None."""
    try:
        return int(datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp())
    except ValueError:
        return None


def _name_id(text: str) -> tuple[str, int]:
    m = re.fullmatch(r"(.*)\((\d+)\)", text)
    return (m.group(1), int(m.group(2))) if m else (text, -1)
