"""What slurmctld says about a job, as plain data.

The node hooks read it with :func:`parse_job_json` from structured output (``squeue --json`` on 22.05,
:func:`slurm_gpushare.slurm.commands.job_record`), where a user-written field (JobName, Comment, WorkDir,
StdOut, ...) is a JSON string and cannot add or change another field; identity (uid, gid, user) comes from
slurmd's Prolog/Epilog environment (:func:`with_env_identity`). :func:`parse_show_job` reads the text of
``scontrol -d show job`` for tests and display only: that text embeds user fields verbatim, newlines
included, so a ``--comment`` can forge any line of it (issue #12). The parts used:

* ``UserId=alice(1000) GroupId=alice(1000)``, ``JobState=``, ``Partition=``, ``NodeList=``;
* ``TresPerNode=gres:shard:10`` (what the job holds after the job_submit rewrite);
* ``AdminComment=...`` with the gpushare segment (:mod:`slurm_gpushare.slurm.admincomment`);
* the detail lines of ``-d``: ``Nodes=a100-nvb CPU_IDs=0 Mem=100 GRES=shard:10(IDX:0)``: which
  devices of which node the job got (IDX = slurmd's device index on that node).
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
    start_time: int | None = None
    array_job_id: str | None = None
    array_task_id: int | None = None
    exit_code: str = ""  # ``ExitCode=`` (exit:signal), as slurmctld holds it

    @property
    def audit(self) -> dict[str, str] | None:
        """The gpushare AdminComment segment's fields, or None."""
        return extract(self.admin_comment)

    def gres_on(self, node: str) -> tuple[GresItem, ...]:
        """The GRES the job holds on ``node`` (empty when none)."""
        return self.gres.get(node, ())


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
                   partition=fields.get("Partition", ""), nodes=nodes,
                   tres_per_node=fields.get("TresPerNode", ""), admin_comment=fields.get("AdminComment", ""),
                   gres=gres, account="" if account == "(null)" else account,
                   start_time=_epoch(fields.get("StartTime", "")),
                   array_job_id=fields.get("ArrayJobId") or None, array_task_id=int(task) if task.isdigit() else None,
                   exit_code=fields.get("ExitCode", ""))


#: Account, partition and user names slurmctld accepts (admin-defined; lower case ASCII in practice).
_NAME = re.compile(r"[A-Za-z0-9_.@+-]{0,128}")
_STATE = re.compile(r"[A-Z_]{1,40}")


def _field(job: Mapping, key: str, kind: type, job_id: str):
    value = job.get(key)
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise InputError(f"job {job_id}: {key} is {value!r}, not an integer", source="squeue --json")
    if kind is str and not isinstance(value, str):
        raise InputError(f"job {job_id}: {key} is {value!r}, not a string", source="squeue --json")
    return value


def _name(job: Mapping, key: str, job_id: str) -> str:
    value = _field(job, key, str, job_id)
    if not _NAME.fullmatch(value):
        raise InputError(f"job {job_id}: {key} {value!r} is not a Slurm name", source="squeue --json")
    return value


def parse_job_json(text: str, job_id: str | int) -> JobInfo:
    """The record of ``job_id`` in ``squeue --json`` output (Slurm 22.05, openapi/v0.0.38: ``{"jobs": [...]}``).

    Fields read (all written by slurmctld, none by the job's user): ``job_id``, ``user_id``, ``group_id``,
    ``user_name``, ``account``, ``partition``, ``job_state``, ``nodes`` (host list), ``tres_per_node`` (the GRES
    after the job_submit rewrite), ``gres_detail`` (one ``shard:10(IDX:0)`` string per node of ``nodes``, in
    host-list order), ``admin_comment`` (SlurmUser and admins only), ``start_time`` (epoch s, 0 = not started),
    ``exit_code`` (wait status), ``array_job_id`` (0 = none), ``array_task_id``. Free-text fields are never read.

    Raises:
        InputError: not JSON, no record of ``job_id``, a field of the wrong type, a name with characters Slurm
            names do not have, or unreadable GRES detail: the record cannot be trusted (the job's fault, not
            the node's).
    """
    want = str(job_id)
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise InputError(f"squeue --json is not JSON: {e}", source="squeue --json") from None
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs, list):
        raise InputError("squeue --json has no job list", source="squeue --json")
    mine = [j for j in jobs if isinstance(j, dict) and str(j.get("job_id")) == want]
    if len(mine) != 1:
        raise InputError(f"squeue --json has {len(mine)} records of job {want}", source="squeue --json")
    job = mine[0]
    node_list = _field(job, "nodes", str, want)
    nodes = tuple(expand_hostlist(node_list)) if node_list else ()
    detail = job.get("gres_detail") or []
    if not isinstance(detail, list) or not all(isinstance(d, str) for d in detail) or len(detail) > len(nodes):
        raise InputError(f"job {want}: gres_detail {detail!r} does not match nodes {node_list!r}",
                         source="squeue --json")
    gres = {node: parse_gres_detail(d) for node, d in zip(nodes, detail, strict=False) if d}
    state = _field(job, "job_state", str, want)
    if not _STATE.fullmatch(state):
        raise InputError(f"job {want}: job_state {state!r}", source="squeue --json")
    tres = _field(job, "tres_per_node", str, want)
    if tres:
        parse(tres)  # Slurm's GRES grammar or InputError
    admin = _field(job, "admin_comment", str, want)
    start = _field(job, "start_time", int, want)
    array_id = _field(job, "array_job_id", int, want)
    task = job.get("array_task_id")
    if task is not None and (isinstance(task, bool) or not isinstance(task, int)):
        raise InputError(f"job {want}: array_task_id {task!r}", source="squeue --json")
    status = _field(job, "exit_code", int, want)
    return JobInfo(job_id=want, user=_name(job, "user_name", want), uid=_field(job, "user_id", int, want),
                   gid=_field(job, "group_id", int, want), state=state, partition=_name(job, "partition", want),
                   nodes=nodes, tres_per_node=tres, admin_comment=admin, gres=gres,
                   account=_name(job, "account", want), start_time=start or None,
                   array_job_id=str(array_id) if array_id else None, array_task_id=task,
                   exit_code=f"{(status >> 8) & 0xFF}:{status & 0x7F}")


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


def _epoch(text: str) -> int | None:
    """``2026-11-29T12:05:05`` (slurmctld's local time) -> epoch seconds; ``Unknown``/``None`` -> None."""
    try:
        return int(datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp())
    except ValueError:
        return None


def _name_id(text: str) -> tuple[str, int]:
    m = re.fullmatch(r"(.*)\((\d+)\)", text)
    return (m.group(1), int(m.group(2))) if m else (text, -1)
