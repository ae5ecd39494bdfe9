"""What slurmctld says about a job, from ``scontrol -d show job ID`` (Slurm 22.05), as plain data.

The node hooks decide from this and from Slurm's own environment only: never from the job's
Comment or environment, which its user controls. The parts used:

* ``UserId=alice(1000) GroupId=alice(1000)``, ``JobState=``, ``Partition=``, ``NodeList=``;
* ``TresPerNode=gres:shard:10`` (what the job holds after the job_submit rewrite);
* ``AdminComment=...`` with the gpushare segment (:mod:`slurm_gpushare.slurm.admincomment`);
* the detail lines of ``-d``: ``Nodes=a100-nvb CPU_IDs=0 Mem=100 GRES=shard:10(IDX:0)``: which
  devices of which node the job got (IDX = slurmd's device index on that node).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
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


def _epoch(text: str) -> int | None:
    """``2026-11-29T12:05:05`` (slurmctld's local time) -> epoch seconds; ``Unknown``/``None`` -> None."""
    try:
        return int(datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp())
    except ValueError:
        return None


def _name_id(text: str) -> tuple[str, int]:
    m = re.fullmatch(r"(.*)\((\d+)\)", text)
    return (m.group(1), int(m.group(2))) if m else (text, -1)
