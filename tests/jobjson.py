"""Test fixtures: a job written as ``scontrol -d show job`` text, turned into the ``squeue --json`` record the
node hooks read (:func:`slurm_gpushare.slurm.job.parse_job_json`)."""

from __future__ import annotations

import json

from slurm_gpushare.slurm.hostlist import compress_hostlist
from slurm_gpushare.slurm.job import JobInfo, parse_show_job


def job_dict(info: JobInfo) -> dict:
    """The ``squeue --json`` job entry (openapi/v0.0.38 keys) of ``info``."""
    exit_status, _, signal = (info.exit_code or "0:0").partition(":")
    nodes = list(info.nodes) or list(info.gres)
    return {"job_id": int(info.job_id), "user_id": info.uid, "group_id": info.gid, "user_name": info.user,
            "account": info.account, "partition": info.partition, "job_state": info.state or "RUNNING",
            "nodes": compress_hostlist(nodes) if nodes else "", "tres_per_node": info.tres_per_node,
            "gres_detail": [",".join(it.text for it in info.gres.get(n, ())) for n in nodes],
            "admin_comment": info.admin_comment, "start_time": info.start_time or 0,
            "exit_code": (int(exit_status or 0) << 8) | int(signal or 0),
            "array_job_id": int(info.array_job_id or 0), "array_task_id": info.array_task_id,
            "comment": "", "name": ""}


def as_job_json(show_text: str, job_id: str | None = None) -> str:
    """``squeue --json`` text holding the job of ``show_text`` (``scontrol -d show job`` output)."""
    info = parse_show_job(show_text, job_id)
    return json.dumps({"jobs": [job_dict(info)]})
