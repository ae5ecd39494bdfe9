"""``slurm-gpushare filterd``: the decision service behind job_submit.lua and cli_filter.lua.

Runs on the controller as SlurmUser, listens on a unix socket and speaks JSON lines: one request
object per line, one answer per line, on connections that stay open (slurmctld's Lua keeps one).
It decides from a cluster snapshot held in memory (:mod:`slurm_gpushare.submit.inventory`: machine
descriptions from a directory joined with ``sinfo --json``), refreshed in the background, on a
change of the directory, and on SIGHUP, so that a request costs a dictionary lookup and the pure
policy, never a Slurm command. It never imports NVML or node-side code (import-linter contract).

Request (all strings; missing = empty)::

    {"v": 1, "op": "submit" | "modify" | "cli", "tres_per_node": "gres:gpushare:mem=10G",
     "tres_per_job": "", "partition": "gpu", "comment": "", "admin_comment": "", "user": "alice",
     "job_id": ""}

Answer::

    {"v": 1, "action": "pass" | "rewrite" | "reject", "tres_per_node": "gres:gpu:h100_1g.10gb:1",
     "admin_comment": "... [gpushare:v1 ...]", "comment": "...", "message": "gpushare: ...",
     "errno": 2072}

``cli`` answers for cli_filter.lua (``srun --gres=gpushare:...`` without an allocation): the decided
GRES without prefixes, and a comment carrying ``gpushare-request=<original>`` so that job_submit
re-decides authoritatively and writes the audit (the comment is never trusted for anything else).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_gpushare.errors import GpushareError, InputError
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.slurm import commands
from slurm_gpushare.slurm.admincomment import format_segment, merge
from slurm_gpushare.slurm.gres import parse
from slurm_gpushare.slurm.nodegres import GresOptions, node_gres
from slurm_gpushare.submit.inventory import ClusterInventory, build_inventory
from slurm_gpushare.submit.policy import decide
from slurm_gpushare.submit.policyfile import SitePolicy, load_policy

PROTOCOL = 1
ERRNO_INVALID_GRES = 2072  # ESLURM_INVALID_GRES: "Invalid generic resource (gres) specification"
CLI_MARK = "gpushare-request="
MAX_LINE = 65536


class Log:
    """Structured log: one JSON object per line (``ts``, ``event`` and the event's fields)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.lock = threading.Lock()

    def __call__(self, event: str, **fields) -> None:
        """Write one JSON line: ``ts`` (epoch seconds), ``event`` and ``fields``."""
        rec = {"ts": round(time.time(), 3), "event": event, **fields}
        with self.lock:
            self.stream.write(json.dumps(rec, default=str) + "\n")
            self.stream.flush()


@dataclass
class Snapshot:
    """One built inventory and the machine directory's stamp then."""

    inventory: ClusterInventory
    machines_stamp: tuple


class InventoryCache:
    """Holds the current :class:`ClusterInventory`; rebuilds it when asked or when the directory changed.

    Args:
        machines_dir: directory of ``<node>.json`` machine descriptions.
        shard_unit_mib: GPU memory per shard (as given to the gres.conf generator).
        slurm_source: callable returning ``(sinfo --json text, scontrol -o show partition text)``.
        log: structured logger.
    """

    def __init__(self, machines_dir: Path, *, shard_unit_mib: int, slurm_source, log: Log):
        self.machines_dir = Path(machines_dir)
        self.shard_unit_mib = shard_unit_mib
        self.slurm_source = slurm_source
        self.log = log
        self.lock = threading.Lock()
        self.snapshot: Snapshot | None = None
        self.error: str | None = None

    def _stamp(self) -> tuple:
        try:
            return tuple(sorted((p.name, p.stat().st_mtime_ns) for p in self.machines_dir.glob("*.json")))
        except OSError:
            return ()

    def refresh(self, reason: str) -> None:
        """Rebuild the snapshot; on failure keep the previous one and remember the error."""
        stamp = self._stamp()
        machines: dict[str, Machine] = {}
        problems = []
        for p in sorted(self.machines_dir.glob("*.json")):
            try:
                machines[p.stem] = Machine.load(p)
            except GpushareError as e:
                problems.append(str(e))
        try:
            sinfo, parts = self.slurm_source()
            opts = GresOptions(shard_unit_mib=self.shard_unit_mib)
            inv = build_inventory(machines, sinfo, parts, shard_unit_mib=self.shard_unit_mib,
                                  expected_gres=lambda m, n: node_gres(m, n, opts).counts)
        except GpushareError as e:
            self.error = str(e)
            self.log("inventory_error", reason=reason, error=str(e))
            return
        if problems:
            inv = ClusterInventory(inv.nodes, inv.partitions, inv.default_partition,
                                   inv.problems + tuple(problems), inv.shard_unit_mib)
        with self.lock:
            self.snapshot = Snapshot(inv, stamp)
            self.error = None
        self.log("inventory", reason=reason, nodes=len(inv.nodes),
                 usable=sum(1 for n in inv.nodes.values() if n.usable), problems=list(inv.problems))

    def current(self) -> ClusterInventory | None:
        """The inventory requests are decided on now, or None before the first successful refresh."""
        with self.lock:
            return self.snapshot.inventory if self.snapshot else None

    def changed(self) -> bool:
        """Whether the machine descriptions changed on disk since the current snapshot (or there is none)."""
        snap = self.snapshot
        return snap is None or snap.machines_stamp != self._stamp()


class FilterService:
    """The decision logic behind the socket (no sockets here: :meth:`handle_line` is the whole protocol)."""

    #: decisions remembered per inventory snapshot (the policy is pure: same inputs, same answer)
    MEMO_MAX = 4096

    def __init__(self, cache: InventoryCache, policy: SitePolicy, log: Log):
        self.cache = cache
        self.policy = policy
        self.log = log
        self._memo: dict[tuple, object] = {}
        self._memo_inventory: ClusterInventory | None = None
        self._memo_lock = threading.Lock()

    def _decide(self, inv: ClusterInventory, tpn: str | None, tpj: str | None, parts: tuple[str, ...] | None):
        key = (tpn, tpj, parts)
        with self._memo_lock:
            if self._memo_inventory is not inv:
                self._memo.clear()
                self._memo_inventory = inv
            d = self._memo.get(key)
        if d is None:
            d = decide(tpn, tpj, partitions=parts, inventory=inv, policy=self.policy)
            with self._memo_lock:
                if self._memo_inventory is inv:
                    if len(self._memo) >= self.MEMO_MAX:
                        self._memo.clear()
                    self._memo[key] = d
        return d

    def handle_line(self, line: bytes | str) -> dict:
        """Answer one request line. Never raises: anything unexpected becomes a reject with a message."""
        t0 = time.perf_counter()
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise InputError("request is not a JSON object")
            answer = self.handle(req)
        except (ValueError, InputError) as e:
            req, answer = {}, self._reject(f"gpushare: the filter service could not read the request ({e})")
        except Exception as e:  # noqa: BLE001 - a bug must not take the controller's submissions down
            req = req if isinstance(req, dict) else {}
            self.log("internal_error", error=repr(e), request=req)
            answer = self._reject("gpushare: internal error in the filter service; the administrator has "
                                  "the details in its log", errno=0)
        self.log("decision", op=req.get("op"), user=req.get("user"), job_id=req.get("job_id"),
                 request=req.get("tres_per_node"), action=answer["action"],
                 tres_per_node=answer.get("tres_per_node"), message=answer.get("message") or None,
                 us=round((time.perf_counter() - t0) * 1e6))
        return answer

    def handle(self, req: dict) -> dict:
        """Answer one decoded request (``op`` submit, modify or cli).

        Raises:
            InputError: an unknown ``op``.
        """
        op = req.get("op", "submit")
        if op not in ("submit", "modify", "cli"):
            raise InputError(f"unknown op {op!r}")
        inv = self.cache.current()
        tpn = req.get("tres_per_node") or ""
        tpj = req.get("tres_per_job") or ""
        comment = req.get("comment") or ""
        original = _cli_request(comment)
        if original is not None and op == "submit":
            tpn_for_decision = original  # re-decide what the user asked srun for; never trust the rewrite
        else:
            tpn_for_decision = tpn
        if inv is None:
            return self._reject("gpushare: the filter service has no cluster inventory yet "
                                f"({self.cache.error or 'starting'}); try again in a minute")
        parts = tuple(p for p in (req.get("partition") or "").split(",") if p) or None
        d = self._decide(inv, tpn_for_decision or None, tpj or None, parts)
        if d.action == "pass":
            return {"v": PROTOCOL, "action": "pass"}
        if d.action == "reject":
            return self._reject(d.message, errno=d.errno or ERRNO_INVALID_GRES)
        new_tpn = d.tres_per_node
        answer = {"v": PROTOCOL, "action": "rewrite", "tres_per_node": new_tpn, "message": d.message or ""}
        fields = dict(d.audit_fields())
        if op == "cli":
            answer["gres"] = ",".join(it.body for it in parse(new_tpn))  # srun's --gres takes no prefix
            answer["comment"] = _with_cli_mark(comment, tpn)
            return answer
        if original is not None:
            fields["via"] = "cli_filter"
            answer["comment"] = _without_cli_mark(comment)
        answer["admin_comment"] = merge(req.get("admin_comment"), format_segment(fields))
        return answer

    @staticmethod
    def _reject(message: str, errno: int = ERRNO_INVALID_GRES) -> dict:
        return {"v": PROTOCOL, "action": "reject", "message": message, "errno": errno}


def _cli_request(comment: str) -> str | None:
    for word in comment.split():
        if word.startswith(CLI_MARK):
            return word[len(CLI_MARK):]
    return None


def _without_cli_mark(comment: str) -> str:
    return " ".join(w for w in comment.split() if not w.startswith(CLI_MARK))


def _with_cli_mark(comment: str, tpn: str) -> str:
    return " ".join([*(_without_cli_mark(comment).split()), CLI_MARK + tpn.replace(" ", "")])


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        service: FilterService = self.server.service  # type: ignore[attr-defined]
        while True:
            try:
                line = self.rfile.readline(MAX_LINE)
            except OSError:
                return
            if not line:
                return
            answer = service.handle_line(line)
            try:
                self.wfile.write((json.dumps(answer) + "\n").encode())
                self.wfile.flush()
            except OSError:
                return


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def serve(socket_path: Path, machines_dir: Path, *, policy_path: Path | None = None, refresh_s: float = 30.0,
          socket_mode: int = 0o666, log_stream=None, slurm_source=None, ready=None) -> int:
    """Run the service until SIGTERM/SIGINT. Returns the exit status.

    Args:
        socket_path: unix socket to listen on (replaced if a stale one is there).
        machines_dir: machine descriptions, one ``<node>.json`` per node.
        policy_path: site policy TOML (defaults when None).
        refresh_s: how often Slurm's view is refreshed (seconds); the directory is checked every second.
        socket_mode: permissions of the socket. cli_filter.lua runs as the submitting user, so the
            default lets every local user ask for a decision (read-only: the service changes nothing).
        slurm_source: callable returning (sinfo --json, scontrol -o show partition); default runs them.
        ready: optional threading.Event set when the socket listens (tests).
    """
    log = Log(log_stream)
    policy = load_policy(policy_path) if policy_path else SitePolicy()
    cache = InventoryCache(machines_dir, shard_unit_mib=policy.shard_unit_mib,
                           slurm_source=slurm_source or (lambda: (commands.sinfo_json(), commands.partitions_text())),
                           log=log)
    cache.refresh("start")
    service = FilterService(cache, policy, log)
    socket_path = Path(socket_path)
    _remove_stale_socket(socket_path)
    server = _Server(str(socket_path), _Handler)
    server.service = service  # type: ignore[attr-defined]
    os.chmod(socket_path, socket_mode)
    stop = threading.Event()
    reload_now = threading.Event()

    def on_term(signum, frame):
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        signal.signal(signal.SIGHUP, lambda s, f: reload_now.set())

    def refresher():
        last = time.monotonic()
        while not stop.is_set():
            stop.wait(1.0)
            if stop.is_set():
                break
            if reload_now.is_set():
                reload_now.clear()
                cache.refresh("SIGHUP")
                last = time.monotonic()
            elif cache.changed():
                cache.refresh("machines changed")
                last = time.monotonic()
            elif time.monotonic() - last >= refresh_s or cache.current() is None:
                cache.refresh("periodic")
                last = time.monotonic()

    threading.Thread(target=refresher, daemon=True, name="inventory-refresh").start()
    log("listening", socket=str(socket_path), machines=str(machines_dir), policy=str(policy_path or "defaults"))
    if ready is not None:
        ready.set()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        stop.set()
        server.server_close()
        try:
            socket_path.unlink()
        except OSError:
            pass
        log("stopped")
    return 0


def _remove_stale_socket(path: Path) -> None:
    """Remove a socket file no one listens on; refuse to start twice on a live one."""
    if not path.exists():
        return
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
    except OSError:
        path.unlink()
        return
    finally:
        s.close()
    raise InputError(f"another filter service is listening on {path}", hint="stop it first, or use --socket")
