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
from slurm_gpushare.slurm.conf import expand_hostlist, split_outside

_FREE_TEXT = ("AdminComment=", "Comment=", "Command=", "Reason=")
_GRES_ITEM = re.compile(r"^(?P<name>[^:()]+)(?::(?P<type>[^:()]+))?:(?P<count>\d+)(?:\((?P<detail>[^)]*)\))?$")


@dataclass(frozen=True)
class GresAlloc:
    """One GRES item a job holds on one node: ``shard:10(IDX:0)`` -> name shard, count 10, indices (0,).

    Attributes:
        name, type: the GRES name and type (``""`` when untyped).
        count: how many (shards, GPUs).
        indices: slurmd device indices (``IDX:0,2-3``); empty when Slurm gave none (``IDX:N/A``).
    """

    name: str
    type: str
    count: int
    indices: tuple[int, ...] = ()


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
    gres: dict[str, tuple[GresAlloc, ...]] = field(default_factory=dict)
    account: str = ""
    start_time: int | None = None
    array_job_id: str | None = None
    array_task_id: int | None = None
    exit_code: str = ""  # ``ExitCode=`` (exit:signal), as slurmctld holds it

    @property
    def audit(self) -> dict[str, str] | None:
        """The gpushare AdminComment segment's fields, or None."""
        return extract(self.admin_comment)

    def gres_on(self, node: str) -> tuple[GresAlloc, ...]:
        """The GRES the job holds on ``node`` (empty when none)."""
        return self.gres.get(node, ())


def parse_indices(text: str) -> tuple[int, ...]:
    """``0,2-3`` -> ``(0, 2, 3)``; ``N/A`` -> ``()``.

    Raises:
        InputError: not a Slurm index list.
    """
    if text in ("", "N/A"):
        return ()
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise InputError(f"bad GRES index list {text!r}")
        out += range(int(lo), int(hi or lo) + 1)
    return tuple(out)


def parse_gres_detail(text: str) -> tuple[GresAlloc, ...]:
    """``gpu:a100:2(IDX:4-5),shard:10(IDX:0)`` -> GresAlloc items (commas inside parentheses kept).

    Raises:
        InputError: an item that is not ``name[:type]:count[(IDX:...)]``.
    """
    items = [i for i in split_outside(text.strip(), ",", "(", ")") if i]
    out = []
    for item in items:
        m = _GRES_ITEM.match(item.strip())
        if not m:
            raise InputError(f"cannot read the job's GRES detail item {item!r}", source="scontrol -d show job")
        detail = m.group("detail") or ""
        idx = parse_indices(detail[4:]) if detail.startswith("IDX:") else ()
        out.append(GresAlloc(m.group("name"), m.group("type") or "", int(m.group("count")), idx))
    return tuple(out)


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
    gres: dict[str, tuple[GresAlloc, ...]] = {}
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
