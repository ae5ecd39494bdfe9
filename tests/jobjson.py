"""Test fixtures: a job written as ``scontrol -d show job`` text, turned into the structured record the node hooks
read (:func:`slurm_gpushare.slurm.job.parse_job_json`), in the shape of a Slurm release: by default the release
this session runs on (``scripts/test --slurm R``; the host's own otherwise), so that the hook unit tests read
each release's shape. The shapes follow the real outputs kept under ``tests/data/slurm/<release>/``.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

from slurm_gpushare.errors import SlurmError
from slurm_gpushare.slurm.commands import local_release
from slurm_gpushare.slurm.gres import GresItem, parse
from slurm_gpushare.slurm.hostlist import compress_hostlist
from slurm_gpushare.slurm.job import JobInfo, parse_show_job
from slurm_gpushare.slurm.release import DATA_PARSER, OLDEST, TRES_SLASH, Release

#: From this release on a shared GRES detail is per-device counts (``shard:10(10/80,0/80)``), not ``IDX:``:
#: slurm-23-11-2-1 (Release has no micro; every supported release from 23.11 on has it).
SHARED_DETAIL = TRES_SLASH
#: The data_parser version each supported release writes (measured).
_PARSER = {Release(24, 11): "v0.0.42", Release(26, 5): "v0.0.45"}


def session_release() -> Release:
    """The release this test session runs on: ``GPUSHARE_SLURM_RELEASE`` (set in a release's root), else the
    host's clients (``sinfo -V``), else the oldest supported."""
    name = os.environ.get("GPUSHARE_SLURM_RELEASE")
    if name:
        return Release.parse(name)
    try:
        return local_release()
    except SlurmError:
        return OLDEST


def _number(value: int | None) -> dict:
    return {"set": value is not None, "infinite": False, "number": value or 0}


def _shared_detail(item: GresItem, per_gpu: int = 80) -> str:
    """``shard:10(IDX:0)`` -> ``shard:10(10/80)`` (23.11.2+): the count on each listed device, 0 on the others."""
    idx = item.indices
    if not idx:
        return item.text
    share = [0] * (max(idx) + 1)
    for n, i in enumerate(idx):
        share[i] = item.amount // len(idx) + (1 if n < item.amount % len(idx) else 0)
    body = ",".join(f"{s}/{max(per_gpu, s)}" for s in share)
    return GresItem(item.name, item.type, item.count, body, item.prefix).text


def job_dict(info: JobInfo, release: Release | None = None) -> dict:
    """The ``jobs[]`` entry of ``info`` as ``release`` writes it (default: :func:`session_release`)."""
    release = release or session_release()
    exit_status, _, signal = (info.exit_code or "0:0").partition(":")
    code, sig = int(exit_status or 0), int(signal or 0)
    nodes = list(info.nodes) or list(info.gres)
    tres = info.tres_per_node
    detail = [",".join(it.text for it in info.gres.get(n, ())) for n in nodes]
    if release >= TRES_SLASH and tres:
        tres = ",".join(("gres/" + it.text[len(it.prefix):]) if it.prefix else it.text for it in parse(tres))
    if release >= SHARED_DETAIL:
        detail = [",".join(_shared_detail(it) if it.name in ("shard", "mps") else it.text
                           for it in info.gres.get(n, ())) for n in nodes]
    job = {"job_id": int(info.job_id), "user_id": info.uid, "group_id": info.gid, "user_name": info.user,
           "account": info.account, "partition": info.partition, "qos": info.qos,
           "nodes": compress_hostlist(nodes) if nodes else "",
           "tres_per_node": tres, "gres_detail": detail, "admin_comment": info.admin_comment,
           "comment": "", "name": ""}
    if info.cores:
        job["job_resources"] = _job_resources(info, release)
    if info.tasks is not None:
        job["tasks"] = info.tasks if release < DATA_PARSER else _number(info.tasks)
        job["tasks_per_node"] = (info.tasks_per_node or 0) if release < DATA_PARSER else _number(info.tasks_per_node)
    if release < DATA_PARSER:
        return {**job, "job_state": info.state or "RUNNING", "start_time": info.start_time or 0,
                "submit_time": info.submit_time or 0, "restart_cnt": info.restarts or 0,
                "exit_code": (code << 8) | sig, "array_job_id": int(info.array_job_id or 0),
                "array_task_id": info.array_task_id}
    return {**job, "job_state": [info.state or "RUNNING"], "start_time": _number(info.start_time),
            "submit_time": _number(info.submit_time), "restart_cnt": info.restarts or 0,
            "exit_code": {"status": ["SIGNALED" if sig else "SUCCESS" if code == 0 else "ERROR"],
                          "return_code": {"set": not sig, "infinite": False, "number": code},
                          "signal": {"id": _number(sig or None), "name": ""}},
            "array_job_id": _number(int(info.array_job_id or 0)), "array_task_id": _number(info.array_task_id)}


def _job_resources(info: JobInfo, release: Release, cores_per_socket: int = 32) -> dict:
    """``job_resources`` of ``info.cores`` as the real records show it (tests/data/slurm/*/squeue-cores.json,
    show-job-cores.json): 22.05 only the allocated cores, by socket; later every core of the node's sockets
    with its status."""
    if release < DATA_PARSER:
        nodes = []
        for node, pairs in info.cores.items():
            sockets: dict[str, dict] = {}
            for s, c in pairs:
                sockets.setdefault(str(s), {"cores": {}})["cores"][str(c)] = "allocated"
            nodes.append({"sockets": sockets, "nodename": node, "cpus_used": 0, "memory_used": 0,
                          "memory_allocated": 100})
        return {"nodes": ",".join(info.cores), "allocated_hosts": len(nodes), "allocated_nodes": nodes}
    allocation = []
    for i, (node, pairs) in enumerate(info.cores.items()):
        used = set(pairs)
        sockets = [{"index": s, "cores": [{"index": c, "status": ["ALLOCATED"] if (s, c) in used else ["UNALLOCATED"]}
                                          for c in range(cores_per_socket)]}
                   for s in range(max(s for s, _ in pairs) + 1)]
        allocation.append({"index": i, "name": node, "cpus": {"count": len(pairs), "used": 0}, "sockets": sockets})
    return {"select_type": ["CORE"], "nodes": {"count": len(allocation), "list": ",".join(info.cores),
                                               "whole": False, "allocation": allocation}}


def meta(release: Release) -> dict:
    """The ``meta`` block of a ``--json`` output of ``release`` (22.05: ``meta.Slurm`` with numbers; later:
    ``meta.slurm`` with strings)."""
    if release < DATA_PARSER:
        return {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
                "Slurm": {"version": {"major": release.major, "micro": 0, "minor": release.minor},
                          "release": f"{release}.0"}}
    return {"plugin": {"type": "", "name": "", "data_parser": f"data_parser/{_PARSER.get(release, 'v0.0.45')}",
                       "accounting_storage": ""},
            "slurm": {"version": {"major": f"{release.major:02d}", "micro": "0", "minor": f"{release.minor:02d}"},
                      "release": f"{release}.0", "cluster": "test"}}


def as_job_json(show_text: str, job_id: str | None = None, release: Release | None = None, **fields) -> str:
    """The structured record (``squeue --json`` on 22.05, ``scontrol -d show job --json`` later) holding the job
    of ``show_text`` (``scontrol -d show job`` output), as ``release`` writes it (default: this session's);
    ``fields`` replace :class:`JobInfo` fields the text does not carry (``cores``, ``tasks``)."""
    release = release or session_release()
    info = replace(parse_show_job(show_text, job_id), **fields)
    return json.dumps({"jobs": [job_dict(info, release)], "meta": meta(release), "errors": [], "warnings": []})
