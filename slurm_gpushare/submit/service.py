"""``slurm-gpushare filterd``: the decision service behind job_submit.lua and cli_filter.lua.

Runs on the controller as SlurmUser and listens on a unix socket
(:class:`~slurm_gpushare.submit.server.FramedServer`). It decides from a cluster snapshot held in memory
(:mod:`slurm_gpushare.submit.inventory`: machine descriptions from a directory joined with ``sinfo --json``),
refreshed in the background, on a change of the directory, and on SIGHUP, so that a request costs a dictionary
lookup and the pure policy, never a Slurm command. SIGHUP also reads the site policy again; the policy and the
inventory built for it are one :class:`~slurm_gpushare.submit.cache.Snapshot`, replaced whole
(:func:`~slurm_gpushare.submit.cache.reload`). It never imports NVML or node-side code (import-linter contract).

The wire protocol is :mod:`slurm_gpushare.submit.protocol`; the socket loop :mod:`slurm_gpushare.submit.server`;
the process :mod:`slurm_gpushare.submit.daemon`; the policy and inventory in memory :mod:`slurm_gpushare.submit.cache`.
"""

from __future__ import annotations

import json
import operator
import os
import threading
import time
from typing import Any

from slurm_gpushare.errors import InputError
from slurm_gpushare.slurm.admincomment import extract, format_segment, merge
from slurm_gpushare.slurm.gres import parse
from slurm_gpushare.submit.cache import InventoryCache, Snapshot
from slurm_gpushare.submit.log import Log, loggable
from slurm_gpushare.submit.policy import ESLURM_INVALID_GRES, decide, nodes_needed
from slurm_gpushare.submit.protocol import PROTOCOL
from slurm_gpushare.submit.request import mentions_share, unescape_knobs

#: ESLURM_ACCESS_DENIED ("Access/permission denied"; slurm/slurm_errno.h, 2002 at tags slurm-22-05-8-1,
#: slurm-24-11-5-1 and slurm-26-05-3-1): what slurmctld itself answers a user's update that sets AdminComment.
ERRNO_ACCESS_DENIED = 2002
CLI_MARK = "gpushare-request="
#: The job_desc TRES fields beside tres_per_node/tres_per_job that job_submit.lua sends (strings;
#: ``ntasks_per_tres`` comes as a number): what :func:`~slurm_gpushare.submit.policy.decide` refuses beside a share.
BESIDE_TRES = ("tres_per_task", "tres_per_socket", "mem_per_tres", "cpus_per_tres")


#: The longest request text (all GRES strings of one request together) whose decision is remembered: real requests
#: are a few dozen characters; a longer one is decided afresh each time, so a user's 64 KB strings never fill the
#: memo (they grew the service from 29 to 187 MB).
MEMO_KEY_CHARS = 1024


#: The job_desc counts a request carries. The shims send JSON numbers: job_submit.lua ``-1`` for a field Slurm left
#: nil, Slurm's own NO_VAL (``4294967294``) and INFINITE as they are, perhaps as floats (``4294967294.0``, a Lua
#: float's ``tostring``); cli_filter.lua ``-1`` for an option not given, or what srun gave it (22.05: ``-2`` for
#: --ntasks-per-node).
COUNT_FIELDS = ("min_nodes", "num_tasks", "ntasks_per_node")
#: The largest count a job_desc field holds (32 bits; NO_VAL and INFINITE are the top two).
_MAX_COUNT = 0xFFFFFFFF
#: Slurm's NO_VAL: ``het_job_offset`` of a job that is no component of a heterogeneous job.
_NO_VAL = 0xFFFFFFFE
#: The answer to a GPU share (gpushare, shard, mps) in a component of a heterogeneous job (``het_job_offset``
#: 0, 1, ...): every component's tasks read the leader's job directory on a node (``SLURM_JOB_ID`` is the
#: leader's id), so a component would get another's MPS settings or MIG devices.
HET_JOB_REFUSAL = ("gpushare: GPU shares (gpushare, shard, mps) are not available in heterogeneous jobs: the tasks "
                   "of one component would get another component's share settings. Submit the components as "
                   "separate jobs (e.g. the second with --dependency=after:<first job id>), or ask whole GPUs "
                   "with --gres=gpu:N")


def _count_problem(key: str, value: Any) -> str | None:
    """Why ``value`` is no job_desc count (missing, a negative whole number, 0, one up to 2^32-1 are), or None.

    A value too long to show (a 300-digit number) is cut to its first 30 characters and its length."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{key} {_brief(value)} is not a number"
    if isinstance(value, float) and not value.is_integer():
        return f"{key} {_brief(value)} is not a whole number"
    if not -_MAX_COUNT <= value <= _MAX_COUNT:
        return (f"{key} {_brief(value)} is out of range (a count up to {_MAX_COUNT}; a negative one, or Slurm's "
                "NO_VAL 4294967294, when not set)")
    return None


def _brief(value: Any) -> str:
    """``repr(value)``, or its first 30 characters and how long it is (digits of a whole number)."""
    text = repr(value)
    if len(text) <= 40:
        return text
    unit = "digits" if isinstance(value, int) and not isinstance(value, bool) else "characters"
    return f"{text[:30]}... ({len(text)} {unit})"


class FilterService:
    """The decision logic behind the socket (no sockets here: :meth:`handle_line` is the whole protocol).

    Args:
        cache: the policy and inventory decisions are made on (one :class:`Snapshot` per request).
        log: structured logger.
        modify_uids: the uids whose ``modify`` (``scontrol update``) may get a rewrite, which sets the
            job's AdminComment (its audit). slurmctld lets only root, SlurmUser and Slurm administrators
            (AdminLevel=Administrator) set AdminComment on an update, and checks it after the job_submit
            plugin ran, with the uid of the one who asked (``_update_job`` in src/slurmctld/job_mgr.c, at
            tags slurm-22-05-8-1, slurm-24-11-5-1 and slurm-26-05-3-1, via ``validate_super_user``), so
            the rewrite of anyone else's update is refused as a whole. Default: root and the service's
            own uid (it runs as SlurmUser). The service cannot see AdminLevel: an administrator who is
            neither updates as root or SlurmUser.
    """

    #: decisions remembered (the policy is pure: same inputs, same answer), at most this many
    MEMO_MAX = 4096

    def __init__(self, cache: InventoryCache, log: Log, modify_uids: frozenset[int] | None = None):
        self.cache = cache
        self.log = log
        self.modify_uids = modify_uids if modify_uids is not None else frozenset({0, os.geteuid()})
        #: request key -> [what the decision read (PoolIndex.token), the decision, its audit segment or None]
        self._memo: dict[tuple, list] = {}
        self._memo_lock = threading.Lock()
        self.decided = 0  # decisions made, not remembered (counted by the tests)

    def _decide(self, snap: Snapshot, tpn: str | None, tpj: str | None, parts: tuple[str, ...] | None,
                nodes: int = 1, beside: tuple = ()) -> list:
        """The remembered entry ``[token, decision, segment]`` for one request on ``snap``.

        A decision is remembered with what it read of the snapshot (the policy, the partition names and the
        pools of its partitions: :meth:`~slurm_gpushare.submit.policy.PoolIndex.token`) and holds on a later
        snapshot while those are the same objects: a refresh that changed nothing a decision read (the
        pools of other partitions, node states, a description rewritten with the same content) keeps it.
        """
        key = (tpn, tpj, parts, nodes, beside)
        remember = sum(len(v) for v in (tpn, tpj, *(str(b[1]) for b in beside)) if v) <= MEMO_KEY_CHARS
        pools = snap.pools
        token: tuple = pools.token(parts) if pools is not None else (snap,)
        entry = self._memo.get(key) if remember else None  # one dict read: no lock needed to look
        if entry is not None and len(entry[0]) == len(token) and all(map(operator.is_, entry[0], token)):
            return entry
        self.decided += 1
        d = decide(tpn, tpj, partitions=parts, inventory=snap.inventory, policy=snap.policy, nodes=nodes,
                   pools=pools, **dict(beside))
        if pools is not None:
            token = pools.token(parts)  # a pool of a partition list may have been built just now
        entry = [token, d, None]
        if not remember:
            return entry
        with self._memo_lock:
            if len(self._memo) >= self.MEMO_MAX:
                self._memo.clear()
            self._memo[key] = entry
        return entry

    def handle_line(self, line: bytes | str, peer_uid: int | None = None, logs: list | None = None) -> dict:
        """Answer one request line. Never raises: anything unexpected becomes a reject with a message.

        ``peer_uid`` (the connection's ``SO_PEERCRED`` uid: slurmctld's for job_submit.lua, the user's for
        cli_filter.lua) is logged beside the request's ``uid`` (the submitting or updating user, as
        slurmctld gave it to job_submit.lua). ``logs``: a list the ``decision`` log record is appended to,
        for the caller to write after it sent the answer (:meth:`Log.write`); None: written now.
        """
        t0 = time.perf_counter()
        req: Any = {}
        try:
            try:
                req = json.loads(line)
            except RecursionError:  # nested deeper than the parser goes: not a request either
                raise InputError("nested too deeply") from None
            if not isinstance(req, dict):
                req = {}
                raise InputError("request is not a JSON object")
            answer = self.handle(req)
        except (ValueError, InputError) as e:
            req, answer = {}, self._reject(f"gpushare: the filter service could not read the request ({e})")
        except Exception as e:  # noqa: BLE001 - a bug must not take the controller's submissions down
            self.log("internal_error", error=repr(e)[:2000], request={k: loggable(v) for k, v in req.items()})
            answer = self._reject("gpushare: internal error in the filter service; the administrator has "
                                  "the details in its log", errno=0)
        rec = {"ts": round(time.time(), 3), "event": "decision", "op": loggable(req.get("op")),
               "uid": loggable(req.get("uid")), "peer_uid": peer_uid, "job_id": loggable(req.get("job_id")),
               "request": loggable(req.get("tres_per_node")),
               "action": answer["action"], "tres_per_node": loggable(answer.get("tres_per_node")),
               "message": loggable(answer.get("message") or None), "us": round((time.perf_counter() - t0) * 1e6)}
        if logs is None:
            self.log.write([rec])
        else:
            logs.append(rec)
        return answer

    def handle(self, req: dict) -> dict:
        """Answer one decoded request (``op`` submit, modify or cli).

        What is decided is always the GRES Slurm will schedule (``tres_per_node``/``tres_per_job`` as
        job_submit.lua sees them), for ``nodes`` nodes. ``cli_request`` (the ``gpushare-request=`` word
        cli_filter.lua left in the user-writable comment) never changes a decision: it only names the
        request in the audit, and only when deciding it gives exactly the GRES that was decided.

        Raises:
            InputError: an unknown ``op`` or a field that is not a string.
        """
        op = req.get("op", "submit")
        if op not in ("submit", "modify", "move", "cli"):
            raise InputError(f"unknown op {op!r}")
        for key in ("tres_per_node", "tres_per_job", *BESIDE_TRES, "partition", "admin_comment", "cli_request"):
            if not isinstance(req.get(key) or "", str):
                raise InputError(f"{key} is not a string")
        for key in COUNT_FIELDS:
            problem = _count_problem(key, req.get(key))
            if problem is not None:
                raise InputError(problem)
        het = req.get("het_job_offset")
        if isinstance(het, (int, float)) and not isinstance(het, bool) and 0 <= het < _NO_VAL:
            return self._reject(HET_JOB_REFUSAL)
        snap = self.cache.state()
        tpn = req.get("tres_per_node") or ""
        tpj = req.get("tres_per_job") or ""
        if snap is None:
            return self._reject("gpushare: the filter service has no cluster inventory yet "
                                f"({self.cache.error or 'starting'}); try again in a minute")
        parts = tuple(p for p in (req.get("partition") or "").split(",") if p) or None
        nodes = nodes_needed(req.get("min_nodes"), req.get("num_tasks"), req.get("ntasks_per_node"))
        ntasks_per_tres = req.get("ntasks_per_tres")
        beside = tuple((k, req.get(k) or None) for k in BESIDE_TRES) + (
            (("ntasks_per_tres", ntasks_per_tres),) if isinstance(ntasks_per_tres, (int, float)) else ())
        if op == "move" and _granted_by_gpushare(tpn, req.get("admin_comment")):
            beside += (("granted_share", True),)
        entry = self._decide(snap, tpn or None, tpj or None, parts, nodes, beside)
        d = entry[1]
        if d.action == "pass":
            return {"v": PROTOCOL, "action": "pass"}
        if d.action == "reject":
            return self._reject(d.message, errno=d.errno or ESLURM_INVALID_GRES)
        new_tpn = d.tres_per_node or ""
        if op == "move":
            if _same_gres(new_tpn, tpn):
                return {"v": PROTOCOL, "action": "pass"}
            job = str(req.get("job_id") or "")
            return self._reject(
                f"gpushare: job {job or '?'}: this update changes what its GPU share "
                f"({','.join(it.body for it in parse(tpn))}) was decided for, and decided again it would be "
                f"{','.join(it.body for it in parse(new_tpn)) or 'refused'}; a share changes only with a new "
                f"submission: cancel the job (scancel {job or 'JOBID'}) and submit it again with the new options",
                errno=ESLURM_INVALID_GRES)
        answer = {"v": PROTOCOL, "action": "rewrite", "tres_per_node": new_tpn, "message": d.message or ""}
        if op == "cli":
            answer["gres"] = ",".join(it.body for it in parse(new_tpn))  # srun's --gres takes no prefix
            answer["mark"] = CLI_MARK + tpn.replace(" ", "")
            return answer
        if op == "modify" and req.get("uid") not in self.modify_uids:
            return self._reject(self._modify_refused(req, tpn), errno=ERRNO_ACCESS_DENIED)
        original = req.get("cli_request") or ""
        if op == "submit" and original and len(original) <= 256:
            via = self._decide(snap, original, tpj or None, parts, nodes)
            if via[1].action == "rewrite" and via[1].tres_per_node == new_tpn:
                if via[2] is None:
                    via[2] = format_segment({**via[1].audit_fields(), "via": "cli_filter"})
                answer["admin_comment"] = merge(req.get("admin_comment"), via[2])
                return answer
        if entry[2] is None:  # the segment of a remembered decision is made once
            entry[2] = format_segment(dict(d.audit_fields()))
        answer["admin_comment"] = merge(req.get("admin_comment"), entry[2])
        return answer

    @staticmethod
    def _modify_refused(req: dict, tpn: str) -> str:
        job = str(req.get("job_id") or "")
        gres = ",".join(it.body for it in parse(unescape_knobs(tpn) or ""))
        return (f"gpushare: job {job or '?'}: a GPU share can be set or changed on a pending job only by root or "
                f"SlurmUser (uid {req.get('uid')} asked): the share's audit lives in the job's AdminComment, which "
                "slurmctld lets no one else write; instead cancel the job (scancel "
                f"{job or 'JOBID'}) and submit it again with --gres={gres}")

    @staticmethod
    def _reject(message: str, errno: int = ESLURM_INVALID_GRES) -> dict:
        return {"v": PROTOCOL, "action": "reject", "message": message, "errno": errno}


def _granted_by_gpushare(tres_per_node: str, admin_comment: str | None) -> bool:
    """Whether what a job holds (``tres_per_node``) was granted for a ``gpushare`` request, by the audit in its
    AdminComment (which only slurmctld's job_submit plugin and administrators write): a share, MIG slice or
    whole GPUs whose audit names a grant, unless it says a direct ``shard:N``/``mps:N`` request
    (``kind=shard-direct``, ``mps-direct``). A share without an audit counts as granted (the options
    refused beside gpushare are refused); other GRES without one do not."""
    try:
        fields = extract(admin_comment)
    except InputError:
        return True  # a newer version's audit: written for a gpushare grant
    if fields is not None:
        return not fields.get("kind", "").endswith("-direct")
    return mentions_share(tres_per_node)


def _same_gres(a: str, b: str) -> bool:
    """Two TRES strings name the same GRES (prefixes and order aside: slurm_gpushare.slurm.gres)."""
    def key(text: str) -> list[str]:
        return sorted(it.body for it in parse(unescape_knobs(text) or ""))
    return key(a) == key(b)
