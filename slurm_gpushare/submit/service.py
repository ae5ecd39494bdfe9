"""``slurm-gpushare filterd``: the decision service behind job_submit.lua and cli_filter.lua.

Runs on the controller as SlurmUser and listens on a unix socket (:class:`FramedServer`). It decides
from a cluster snapshot held in memory (:mod:`slurm_gpushare.submit.inventory`: machine descriptions
from a directory joined with ``sinfo --json``), refreshed in the background, on a change of the
directory, and on SIGHUP, so that a request costs a dictionary lookup and the pure policy, never a
Slurm command. SIGHUP also reads the site policy again; the policy and the inventory built for it are
one :class:`Snapshot`, replaced whole (:func:`reload`). It never imports NVML or node-side code
(import-linter contract).

Protocol 2: every message, both ways, is a header line ``GPS2 <id> <length>`` (``id`` decimal, at
most 20 digits, chosen by the client; ``length`` in bytes) and then exactly ``length`` bytes of one
JSON object. An answer carries the ``id`` of its request in its header and in its JSON, and the client
uses no answer whose id is not the one it sent. A request body over :data:`MAX_REQUEST` bytes is read
past and refused as one request; a malformed header is answered once (id ``0``) and the connection
closed. Request (strings and numbers; missing = empty)::

    {"v": 2, "op": "submit" | "modify" | "move" | "cli", "tres_per_node": "gres:gpushare:mem=10G",
     "tres_per_job": "", "tres_per_task": "", "tres_per_socket": "", "mem_per_tres": "",
     "cpus_per_tres": "", "ntasks_per_tres": 65534, "partition": "gpu", "admin_comment": "",
     "min_nodes": 2, "num_tasks": 8, "ntasks_per_node": 4, "cli_request": "", "uid": 1000, "job_id": "",
     "het_job_offset": -1}

``het_job_offset`` (job_desc's; -1 or NO_VAL: no heterogeneous job) refuses a share in a component
(:data:`HET_JOB_REFUSAL`).

The counts (``min_nodes``, ``num_tasks``, ``ntasks_per_node``) are JSON numbers: whole, 0 to 4294967295 (Slurm's
NO_VAL and INFINITE, the top two, mean not set, as do a negative one down to -4294967295, 0 and a missing one:
22.05's srun gives cli_filter.lua -2 for an unset --ntasks-per-node); anything else is refused.

Answer::

    {"v": 2, "id": "17", "action": "pass" | "rewrite" | "reject", "tres_per_node": "gres:gpu:h100_1g.10gb:1",
     "admin_comment": "... [gpushare:v1 ...]", "message": "gpushare: ...", "errno": 2072}

No user-writable field is ever sent or trusted: ``cli`` answers cli_filter.lua (``srun
--gres=gpushare:...`` without an allocation) with the decided GRES without prefixes and a ``mark``
(``gpushare-request=<original>``) that cli_filter appends to the job comment; job_submit.lua sends
only that word back as ``cli_request``, and the service still decides the GRES it sees (a direct
``shard:N`` is policed as such); the mark only names the original request in the audit when deciding
it gives exactly that GRES, so a forged mark gains nothing. ``move`` is job_submit.lua's question when
an update leaves the GRES of a job that holds a GPU share alone but changes what its share was decided
for (partition, node count, per-task/socket/job TRES): the job's current GRES is decided again with the
new fields; the answer is ``pass`` when that gives the same GRES, else ``reject`` (the share would have
to change, which only a new submission may do). ``move`` also carries the job's ``admin_comment``: where
its audit shows a gpushare grant (also a MIG slice or whole GPUs: job_submit.lua asks about those jobs
too) or, without an audit, the job holds a share, the options refused beside gpushare at submit (GPUs
per task or socket, per-GPU counts) are refused beside it too.
"""

from __future__ import annotations

import gc
import json
import operator
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from slurm_gpushare.errors import ConfigError, GpushareError, InputError
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.slurm import commands
from slurm_gpushare.slurm.admincomment import extract, format_segment, merge
from slurm_gpushare.slurm.gres import parse
from slurm_gpushare.slurm.nodegres import GresOptions, node_gres
from slurm_gpushare.submit.inventory import ClusterInventory, build_inventory
from slurm_gpushare.submit.policy import ESLURM_INVALID_GRES, PoolIndex, decide, nodes_needed
from slurm_gpushare.submit.policyfile import SitePolicy, load_policy
from slurm_gpushare.submit.request import mentions_share, unescape_knobs

PROTOCOL = 2
#: First word of every message header (``GPS2 <id> <length>``).
MAGIC = "GPS2"
#: ESLURM_ACCESS_DENIED ("Access/permission denied"; slurm/slurm_errno.h, 2002 at tags slurm-22-05-8-1,
#: slurm-24-11-5-1 and slurm-26-05-3-1): what slurmctld itself answers a user's update that sets AdminComment.
ERRNO_ACCESS_DENIED = 2002
CLI_MARK = "gpushare-request="
#: The job_desc TRES fields beside tres_per_node/tres_per_job that job_submit.lua sends (strings;
#: ``ntasks_per_tres`` comes as a number): what :func:`~slurm_gpushare.submit.policy.decide` refuses beside a share.
BESIDE_TRES = ("tres_per_task", "tres_per_socket", "mem_per_tres", "cpus_per_tres")
#: Longest request body the service decides (bytes); job_submit.lua sends only short fields.
MAX_REQUEST = 65536
#: Longest message header line (bytes, without the newline).
MAX_HEADER = 64
#: How long the refresh thread may hold the interpreter lock while the socket thread waits for it
#: (seconds; ``sys.setswitchinterval``, CPython's default is 5 ms): a request that arrives during a refresh
#: waits at most about this long for it. A thread that runs alone is not interrupted, so it costs nothing
#: between refreshes.
SWITCH_INTERVAL_S = 0.0002


class Log:
    """Structured log: one JSON object per line (``ts``, ``event`` and the event's fields)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.lock = threading.Lock()

    def __call__(self, event: str, **fields) -> None:
        """Write one JSON line: ``ts`` (epoch seconds), ``event`` and ``fields``."""
        self.write([{"ts": round(time.time(), 3), "event": event, **fields}])

    def write(self, records: list[dict]) -> None:
        """Write records made before (each with its ``ts`` and ``event``), one JSON line each, and flush once."""
        if not records:
            return
        text = "".join(_line(rec) for rec in records)
        with self.lock:
            self.stream.write(text)
            self.stream.flush()


def _line(rec: dict) -> str:
    """One record as a JSON line; a record that cannot be encoded (a value nested too deeply) is written as its
    event and the reason, never raised into the service."""
    try:
        return json.dumps(rec, default=str) + "\n"
    except (ValueError, TypeError, RecursionError) as e:
        return json.dumps({"ts": rec.get("ts"), "event": str(rec.get("event"))[:100],
                           "error": f"record not written: {type(e).__name__}"}) + "\n"


@dataclass(frozen=True)
class Snapshot:
    """What requests are decided on: one site policy, the inventory built for it, and the machine
    directory's stamp then. Replaced whole (one attribute store), so a request sees one policy with the
    inventory built for that policy, never a new policy with an old inventory or part of a policy."""

    inventory: ClusterInventory
    machines_stamp: dict  # <node>.json file name -> FileStamp, when the inventory was built
    policy: SitePolicy
    #: the pools of ``inventory`` under ``policy``, built with the snapshot (None: built on first use)
    pools: PoolIndex | None = None


def load_inventory(machines_dir: Path, sinfo: str, partitions: str, *, shard_unit_mib: int) -> ClusterInventory:
    """The cluster inventory from a directory of ``<node>.json`` machine descriptions and Slurm's view.

    Args:
        machines_dir: machine descriptions, one ``<node>.json`` per node (a file that does not load
            is one of the inventory's ``problems``).
        sinfo: ``sinfo --json`` text; partitions: ``scontrol -o show partition`` text.
        shard_unit_mib: GPU memory per shard (the site policy's ``shard_unit``), with which each
            node's expected GRES are computed.

    Raises:
        GpushareError: Slurm's text cannot be read (see :func:`~slurm_gpushare.submit.inventory.build_inventory`).
    """
    return MachineFiles(machines_dir).inventory(sinfo, partitions, shard_unit_mib=shard_unit_mib)


#: What tells a machine description changed on disk: size, modification time (ns), inode, change time (ns).
FileStamp = tuple[int, int, int, int]


class MachineFiles:
    """The machine descriptions of a directory, read again only where a file changed.

    A file is parsed again (:meth:`Machine.load`) only when its size, modification time, inode or
    change time differ from the last read (a file replaced whole by a rename gets a new inode; one
    written in place a new change time); the others keep their :class:`Machine` object, so that
    :func:`~slurm_gpushare.submit.inventory.build_inventory` reuses their nodes (``previous``).

    Args:
        machines_dir: directory of ``<node>.json`` machine descriptions.
    """

    def __init__(self, machines_dir: Path):
        self.dir = Path(machines_dir)
        self._read: dict[str, tuple[FileStamp, Machine | None, str | None]] = {}
        self.previous: ClusterInventory | None = None
        self.parsed = 0  # files parsed so far (counted by the tests)

    def stamps(self) -> dict[str, FileStamp]:
        """``<node>.json`` file name -> its :data:`FileStamp`, now (a file gone meanwhile is left out)."""
        out: dict[str, FileStamp] = {}
        try:
            entries = list(os.scandir(self.dir))
        except OSError:
            return out
        for e in entries:
            if not e.name.endswith(".json"):
                continue
            try:
                st = e.stat()
            except OSError:
                continue
            out[e.name] = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
        return out

    def machines(self, stamps: dict[str, FileStamp] | None = None) -> tuple[dict[str, Machine], list[str]]:
        """Node name -> description, and one problem line per file that does not load (sorted by file)."""
        stamps = self.stamps() if stamps is None else stamps
        read: dict[str, tuple[FileStamp, Machine | None, str | None]] = {}
        machines: dict[str, Machine] = {}
        problems = []
        for fname in sorted(stamps):
            was = self._read.get(fname)
            if was is not None and was[0] == stamps[fname]:
                entry = was
            else:
                self.parsed += 1
                try:
                    entry = (stamps[fname], Machine.load(self.dir / fname), None)
                except GpushareError as e:
                    entry = (stamps[fname], None, str(e))
            read[fname] = entry
            if entry[1] is not None:
                machines[fname[:-len(".json")]] = entry[1]
            else:
                problems.append(entry[2] or "")
        self._read = read
        return machines, problems

    def inventory(self, sinfo: str, partitions: str, *, shard_unit_mib: int,
                  stamps: dict[str, FileStamp] | None = None) -> ClusterInventory:
        """The inventory from the descriptions now and Slurm's text, built from the one before where
        nothing changed (see :func:`load_inventory` for the arguments and errors)."""
        machines, problems = self.machines(stamps)
        opts = GresOptions(shard_unit_mib=shard_unit_mib)
        inv = build_inventory(machines, sinfo, partitions, shard_unit_mib=shard_unit_mib,
                              expected_gres=lambda m, n: node_gres(m, n, opts).counts, previous=self.previous)
        before, self.previous = self.previous, inv
        if before is not None and before.sources is not inv.sources:
            # only the next build reads ``sources``: emptied entry by entry, the old one's 10,000 sinfo entries
            # are small frees between bytecodes, not one 8-11 ms cascade when the old snapshot goes (requests
            # never read it)
            while before.sources:
                before.sources.popitem()
        if problems:
            inv = replace(inv, problems=inv.problems + tuple(problems))
        return inv


class InventoryCache:
    """Holds the current :class:`Snapshot` (policy, inventory and its pools); rebuilds it when asked or
    when the directory changed.

    A refresh builds the new snapshot beside the one in force, in the thread that calls :meth:`refresh`
    (the service's refresh thread), reading again only the descriptions and ``sinfo`` entries that
    changed (:class:`MachineFiles`) and building again only the pools whose nodes changed
    (:class:`~slurm_gpushare.submit.policy.PoolIndex`), then puts it in force with one attribute
    store. Requests read :attr:`snapshot` and take no lock: a slow refresh never delays them.
    ``lock`` only keeps two refreshes from building at once.

    Args:
        machines_dir: directory of ``<node>.json`` machine descriptions.
        slurm_source: callable returning ``(sinfo --json text, scontrol -o show partition text)``.
        log: structured logger.
        policy: the site policy decided with until :meth:`refresh` is given another (default: the
            built-in defaults). Its ``shard_unit`` is the GPU memory per shard the inventory is built with.
        freeze_gc: no garbage collection while a refresh builds, and after it every object alive moved
            to the collector's permanent generation (``gc.freeze``): a collection then walks only what
            was made since. At 10,000 nodes a full collection over the snapshot held the interpreter lock,
            and so the requests, for up to 0.7 s, and one over the freshly parsed ``sinfo`` text for 40-50 ms
            (benchmarks/filterd_scale). The objects of an old snapshot are still freed when the last
            reference goes (reference counting); only cyclic garbage made during or before a refresh is
            never collected (the inventory and the requests make none). ``serve`` sets it.
    """

    def __init__(self, machines_dir: Path, *, slurm_source, log: Log, policy: SitePolicy | None = None,
                 freeze_gc: bool = False):
        self.machines_dir = Path(machines_dir)
        self.slurm_source = slurm_source
        self.log = log
        self.lock = threading.Lock()
        self.snapshot: Snapshot | None = None
        self.error: str | None = None
        self._initial = policy or SitePolicy()
        #: a policy read by a reload whose inventory could not be built yet: the next refresh that
        #: builds one puts both in force together
        self.pending: SitePolicy | None = None
        self.files = MachineFiles(self.machines_dir)
        self.freeze_gc = freeze_gc

    @property
    def policy(self) -> SitePolicy:
        """The policy in force (the current snapshot's), or the one the first snapshot will have."""
        snap = self.snapshot
        return snap.policy if snap else self._initial

    @property
    def shard_unit_mib(self) -> int:
        """GPU memory per shard of the policy the next refresh builds with (MiB)."""
        return (self.pending or self.policy).shard_unit_mib

    def refresh(self, reason: str, policy: SitePolicy | None = None) -> bool:
        """Rebuild the snapshot; on failure keep the previous one and remember the error.

        Args:
            reason: logged with the outcome (``start``, ``SIGHUP``, ``periodic`` ...).
            policy: a new site policy: the inventory is built for it (its ``shard_unit``) and both
                replace the snapshot at once. When the inventory cannot be built, the old snapshot stays
                in force and the new policy waits (``pending``) for the next refresh that succeeds.
                None: the pending policy, else the one in force.

        Returns:
            Whether a new snapshot is in force.
        """
        gc_was = gc.isenabled()
        if self.freeze_gc:
            gc.disable()
        try:
            return self._refresh(reason, policy)
        finally:
            if self.freeze_gc:
                gc.freeze()
                if gc_was:
                    gc.enable()

    def _refresh(self, reason: str, policy: SitePolicy | None) -> bool:
        with self.lock:
            old = self.policy
            target = policy or self.pending or old
            stamps = self.files.stamps()
            try:
                sinfo, parts = self.slurm_source()
                inv = self.files.inventory(sinfo, parts, shard_unit_mib=target.shard_unit_mib, stamps=stamps)
            except GpushareError as e:
                self.error = str(e)
                if target is not old:
                    self.pending = target
                self.log("inventory_error", reason=reason, error=str(e),
                         **({"policy_waiting": target.source} if target is not old else {}))
                return False
            before = self.snapshot
            pools = PoolIndex(inv, target, before.pools if before is not None else None)
            self.snapshot = Snapshot(inv, stamps, target, pools)  # in force: one store
            self.error = None
            self.pending = None
            del before
        self.log("inventory", reason=reason, nodes=len(inv.nodes), policy=target.source,
                 usable=sum(1 for n in inv.nodes.values() if n.usable), problems=list(inv.problems))
        if target is not old:
            self.log("policy", reason=reason, policy=target.source, previous=old.source,
                     message=f"site policy {target.source} in force (was {old.source})")
        return True

    def state(self) -> Snapshot | None:
        """The snapshot requests are decided on now, or None before the first successful refresh."""
        return self.snapshot

    def current(self) -> ClusterInventory | None:
        """The inventory requests are decided on now, or None before the first successful refresh."""
        snap = self.snapshot
        return snap.inventory if snap else None

    def changed(self) -> bool:
        """Whether the machine descriptions changed on disk since the current snapshot (or there is none)."""
        snap = self.snapshot
        return snap is None or snap.machines_stamp != self.files.stamps()


@dataclass(frozen=True)
class PolicySource:
    """Where the filter service reads its site policy, at start and on every reload (SIGHUP).

    Attributes:
        path: the policy file given with ``--policy``: it must exist and be valid.
        default: the file read when no ``path`` is given and it exists (``/etc/slurm/gpushare/gpushare.toml``
            for ``filterd``); otherwise the built-in defaults. The lookup is made again on each reload.
    """

    path: Path | None = None
    default: Path | None = None

    def where(self) -> Path | None:
        """The file the lookup finds now, or None for the built-in defaults."""
        if self.path is not None:
            return Path(self.path)
        if self.default is not None and Path(self.default).exists():
            return Path(self.default)
        return None

    def load(self, in_force: str | None = None) -> SitePolicy:
        """The policy the lookup finds now.

        Args:
            in_force: where the policy in force came from (:attr:`SitePolicy.source`), on a reload. Without
                ``path``, a lookup that finds no file while the policy in force came from one is refused:
                a deleted default file (or one a configuration tool has not put back yet) would put the
                built-in defaults in force silently. A service that runs on the built-in defaults stays on them.

        Raises:
            ConfigError: the file cannot be read or is not a valid policy (the message names the file), or
                the file of the policy in force is gone.
        """
        where = self.where()
        if where is None and in_force is not None and in_force != SitePolicy().source:
            raise ConfigError(f"the policy file {in_force} is gone (no {self.default})",
                              hint="put it back and reload; to decide with the built-in defaults, write a file "
                                   "with only 'version = 1' there, or restart the service without one")
        return load_policy(where) if where is not None else SitePolicy()


def reload(cache: InventoryCache, source: PolicySource, log: Log, reason: str = "SIGHUP") -> bool:
    """Read the site policy again and rebuild the inventory for it; put both in force at once.

    A policy file that cannot be read or is not valid changes nothing: the policy in force stays (the
    inventory is still refreshed for it) and one ``policy_rejected`` log line names the file, the
    error and the hint. So does a lookup without ``--policy`` that finds no file where the policy in
    force came from one (:meth:`PolicySource.load`).

    Returns:
        Whether the policy the lookup found is now in force.
    """
    kept = cache.policy.source
    try:
        policy = source.load(in_force=kept)
    except GpushareError as e:
        where = source.where() or (None if kept == SitePolicy().source else kept)
        waiting = cache.pending
        cache.refresh(reason)  # a policy that waited for an inventory comes in with this one
        kept = cache.policy.source
        if waiting is None:
            in_force, still = "unchanged", f"still deciding with {kept}"
        elif cache.pending is None:
            in_force = "the version read at an earlier reload"
            still = f"deciding with {kept}, the version of it read at an earlier reload (it waited for an inventory)"
        else:
            in_force = "unchanged"
            still = (f"still deciding with {kept}; the version of {waiting.source} read at an earlier reload "
                     "waits for an inventory")
        log("policy_rejected", reason=reason, file=str(where or "built-in defaults"), error=e.message, hint=e.hint,
            kept=kept, in_force=in_force, message=f"site policy {where} not loaded: {e.message}"
                                                  + (f" ({e.hint})" if e.hint else "") + f"; {still}")
        return False
    return cache.refresh(reason, policy=policy)


def _scalar(value: Any) -> Any:
    """``value`` for a log record when it is a string, number, bool or None; else the first 200 characters of
    its type name and length (a request's field may be any JSON: nested arbitrarily deep, it would fail the
    record's encoding)."""
    if isinstance(value, str) and len(value) > LOGGED_CHARS:
        return f"{value[:LOGGED_CHARS]}...(+{len(value) - LOGGED_CHARS} characters)"
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return f"<{type(value).__name__} of {len(value) if hasattr(value, '__len__') else '?'}>"[:200]


#: The most characters of one string a log record keeps of a request (a user may send 64 KB fields).
LOGGED_CHARS = 300
#: The longest request text (all GRES strings of one request together) whose decision is remembered: real requests
#: are a few dozen characters; a longer one is decided afresh each time, so a user's 64 KB strings never fill the
#: memo (they grew the service from 29 to 187 MB).
MEMO_KEY_CHARS = 1024


class DecisionLogBudget:
    """How many ``decision`` lines one peer uid of the public socket may write per window; what is over is counted
    and said in one ``decisions_not_logged`` line per window (a user's flood of requests wrote 286 MiB to the log
    in 10 s). slurmctld's and root's requests are always logged: they are the audit of real submissions.

    Args:
        per_uid: decision lines per uid and window.
        window_s: the window, seconds (monotonic clock).
    """

    def __init__(self, per_uid: int, window_s: float):
        self.per_uid = per_uid
        self.window_s = window_s
        self._start: float | None = None
        self._logged: dict[int, int] = {}
        self._dropped: dict[int, int] = {}

    def allow(self, uid: int, *, now: float) -> bool:
        """Whether ``uid``'s next decision line is written (at ``now``); counts it either way."""
        if self._start is None or now - self._start >= self.window_s:
            self._start, self._logged = now, {}
        n = self._logged.get(uid, 0) + 1
        self._logged[uid] = n
        if n <= self.per_uid:
            return True
        self._dropped[uid] = self._dropped.get(uid, 0) + 1
        return False

    def summary(self, *, now: float) -> dict[str, int] | None:
        """The lines left out per uid (as strings, for JSON) once the window is over, then forgotten; None before
        that or when nothing was left out."""
        if not self._dropped or self._start is None or now - self._start < self.window_s:
            return None
        out, self._dropped = {str(k): v for k, v in sorted(self._dropped.items())}, {}
        return out


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
            self.log("internal_error", error=repr(e)[:2000], request={k: _scalar(v) for k, v in req.items()})
            answer = self._reject("gpushare: internal error in the filter service; the administrator has "
                                  "the details in its log", errno=0)
        rec = {"ts": round(time.time(), 3), "event": "decision", "op": _scalar(req.get("op")),
               "uid": _scalar(req.get("uid")), "peer_uid": peer_uid, "job_id": _scalar(req.get("job_id")),
               "request": _scalar(req.get("tres_per_node")),
               "action": answer["action"], "tres_per_node": _scalar(answer.get("tres_per_node")),
               "message": _scalar(answer.get("message") or None), "us": round((time.perf_counter() - t0) * 1e6)}
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


@dataclass(frozen=True)
class Limits:
    """How much of the service one peer may hold (see :class:`FramedServer`).

    Attributes:
        per_uid: connections one ordinary user (any uid but the service's own and root) may hold.
        users: connections all ordinary users together may hold.
        privileged: connections the service's own uid (SlurmUser: slurmctld's job_submit.lua) and
            root may hold; counted apart, so that no flood of users can refuse slurmctld.
        idle_s: an ordinary user's connection with no request for this long is closed (seconds).
        privileged_idle_s: the same for privileged connections (slurmctld keeps one open).
        frame_s: a request must arrive whole within this long of its first byte (seconds).
        max_request: longest request body (bytes); a longer one is read past and refused as one request.
        max_discard: longest body that is read past (bytes); beyond it the connection is closed
            after the refusal.
        max_pending: answer bytes a peer may leave unread before its connection is closed.
        log_per_uid: ``decision`` log lines one ordinary user's requests may write per ``log_window_s`` seconds
            (:class:`DecisionLogBudget`); the rest are counted in one line per window.
        log_window_s: that window, seconds.
    """

    per_uid: int = 8
    users: int = 256
    privileged: int = 64
    idle_s: float = 10.0
    privileged_idle_s: float = 3600.0
    frame_s: float = 2.0
    max_request: int = MAX_REQUEST
    max_discard: int = 16 * MAX_REQUEST
    max_pending: int = 1 << 20
    log_per_uid: int = 50
    log_window_s: float = 10.0


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a unix socket (``SO_PEERCRED``: pid, uid, gid as ``3i``).

    Returns -1 where the kernel gives no credentials.
    """
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return -1
    return struct.unpack("3i", creds)[1]


def frame(request_id: str, payload: dict) -> bytes:
    """One protocol message: ``GPS2 <id> <length>`` and a newline, then ``length`` bytes of JSON (with ``id`` in it)."""
    body = json.dumps({**payload, "id": request_id}).encode()
    return f"{MAGIC} {request_id} {len(body)}\n".encode() + body


class _Conn:
    """One client connection's state in :class:`FramedServer`."""

    def __init__(self, sock: socket.socket, uid: int, privileged: bool, now: float):
        self.sock = sock
        self.uid = uid
        self.privileged = privileged
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.last = now  # last complete request (or the connect)
        self.frame_start: float | None = None  # first byte of an incomplete request
        self.request_id = ""  # of the body being read or discarded
        self.need = -1  # body bytes still to read (-1: reading a header)
        self.discard = False  # the body is over-long: read past it, then refuse
        self.close_after = False


#: Connections accepted on the public socket per turn of the loop (see :meth:`FramedServer._accept`).
ACCEPT_BATCH = 32


class _Listener:
    """One listening socket of :class:`FramedServer` and whether it is the controller's (private) one."""

    def __init__(self, sock: socket.socket, controller: bool):
        self.sock = sock
        self.controller = controller


class FramedServer:
    """The filter service's socket loop: one thread, non-blocking sockets, framed requests, bounded peers.

    Every message is framed (a line ``GPS2 <id> <length>`` and ``length`` bytes of JSON) and every answer
    carries the id of its request, so an answer can never be taken for another request's. Decisions
    take microseconds (memoised, no I/O), so the one loop thread is the whole worker pool: no thread or
    buffer grows with the number of connections. A peer's connections are bounded by its uid (from
    ``SO_PEERCRED``) with :class:`Limits`; the service's own uid and root are counted apart and served
    first.

    slurmctld has a socket of its own (``controller_sock``): users cannot fill its listen backlog, and a
    peer on it whose uid is not privileged is closed at once, whatever the file's mode. Each turn of
    the loop serves the controller's connections and accepts first, then the users' connections, then
    at most :data:`ACCEPT_BATCH` connections of the public socket, so a flood of the public socket
    delays slurmctld by at most one bounded turn (measured: benchmarks/submit_overhead --hostile).

    Args:
        sock: the public listening unix socket (cli_filter.lua, as the user).
        service: answers one request.
        log: structured logger.
        limits: connection bounds.
        privileged_uids: uids served as slurmctld (default: the service's own and root).
        controller_sock: the private listening unix socket of job_submit.lua (slurmctld), or None.
    """

    def __init__(self, sock: socket.socket, service: FilterService, log: Log, limits: Limits = Limits(),
                 privileged_uids: frozenset[int] | None = None, controller_sock: socket.socket | None = None):
        self.sock = sock
        self.controller_sock = controller_sock
        self.service = service
        self.log = log
        self.limits = limits
        self.privileged_uids = privileged_uids if privileged_uids is not None else frozenset({os.geteuid(), 0})
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, _Conn] = {}
        self.per_uid: dict[int, int] = {}
        self.refused: dict[int, int] = {}  # uid -> connections refused since the last log line
        self.last_refusal_log = 0.0
        self.stop = threading.Event()
        #: decision log records of answers not yet sent: written after the answers go out (:meth:`_read`)
        self.pending_logs: list[dict] = []
        self.log_budget = DecisionLogBudget(limits.log_per_uid, limits.log_window_s)
        self.listeners = [_Listener(sock, False)] + ([_Listener(controller_sock, True)] if controller_sock else [])
        for lst in self.listeners:
            lst.sock.setblocking(False)
            self.sel.register(lst.sock, selectors.EVENT_READ, lst)

    # --- counts ---
    def _users(self) -> int:
        return sum(1 for c in self.conns.values() if not c.privileged)

    def _privileged(self) -> int:
        return sum(1 for c in self.conns.values() if c.privileged)

    def _accept(self, lst: _Listener, now: float) -> None:
        # A small batch per loop turn on the public socket: under a flood of connects the loop returns to
        # the open connections (slurmctld's first) after ~0.5 ms, where 1,024 accepts and closes took
        # 15-20 ms, as long as the shim's whole timeout (measured: benchmarks/submit_overhead --hostile).
        # The controller's socket only takes privileged peers, themselves bounded by Limits.privileged.
        for _ in range(self.limits.privileged + 1 if lst.controller else ACCEPT_BATCH):
            try:
                s, _addr = lst.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and the like: shed this one, keep serving
                self.log("accept_error", error=str(e))
                return
            uid = peer_uid(s)
            privileged = uid in self.privileged_uids
            lim = self.limits
            if lst.controller and not privileged:  # the file's mode is not the only guard
                s.close()
                self.refused[uid] = self.refused.get(uid, 0) + 1
                self.log("controller_socket_refused", uid=uid)
                continue
            if privileged:
                ok = self._privileged() < lim.privileged
            else:
                ok = self.per_uid.get(uid, 0) < lim.per_uid and self._users() < lim.users
            if not ok:
                s.close()
                self.refused[uid] = self.refused.get(uid, 0) + 1
                continue
            s.setblocking(False)
            c = _Conn(s, uid, privileged, now)
            self.conns[s.fileno()] = c
            if not privileged:
                self.per_uid[uid] = self.per_uid.get(uid, 0) + 1
            self.sel.register(s, selectors.EVENT_READ, c)

    def _close(self, c: _Conn) -> None:
        fd = c.sock.fileno()
        if self.conns.pop(fd, None) is None:
            return
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()
        if not c.privileged:
            n = self.per_uid.get(c.uid, 1) - 1
            if n > 0:
                self.per_uid[c.uid] = n
            else:
                self.per_uid.pop(c.uid, None)

    def _answer(self, c: _Conn, payload: dict, now: float) -> None:
        c.outbuf += frame(c.request_id, payload)
        c.last = now
        c.frame_start = None

    def _protocol_error(self, c: _Conn, why: str, now: float) -> None:
        self.log("protocol_error", uid=c.uid, error=why)
        c.request_id = "0"
        self._answer(c, FilterService._reject(f"gpushare: the filter service could not read the request ({why})"),
                     now)
        c.close_after = True

    def _consume(self, c: _Conn, now: float) -> None:
        """Answer every complete request in ``c.inbuf``."""
        lim = self.limits
        while not c.close_after:
            if c.need < 0:
                nl = c.inbuf.find(b"\n", 0, MAX_HEADER + 1)
                if nl < 0:
                    if len(c.inbuf) > MAX_HEADER:
                        self._protocol_error(c, "no message header", now)
                    return
                head = bytes(c.inbuf[:nl]).split(b" ")
                del c.inbuf[:nl + 1]
                if (len(head) != 3 or head[0] != MAGIC.encode() or not head[1].isdigit() or not head[2].isdigit()
                        or len(head[1]) > 20):
                    self._protocol_error(c, f"not a {MAGIC} message header (protocol {PROTOCOL})", now)
                    return
                c.request_id = head[1].decode()
                c.need = int(head[2])
                c.discard = c.need > lim.max_request
            if c.discard:
                take = min(c.need, len(c.inbuf))
                del c.inbuf[:take]
                c.need -= take
                if c.need > 0:
                    return
            elif len(c.inbuf) < c.need:
                return
            body = b"" if c.discard else bytes(c.inbuf[:c.need])
            if not c.discard:
                del c.inbuf[:c.need]
            c.need = -1
            if c.discard:
                c.discard = False
                self.log("request_too_long", uid=c.uid, id=c.request_id, limit=lim.max_request)
                self._answer(c, FilterService._reject(
                    f"gpushare: the request is longer than the filter service reads ({lim.max_request} bytes); "
                    "shorten the job's fields (name, comment, GRES)"), now)
                continue
            logged = len(self.pending_logs)
            answer = self.service.handle_line(body, peer_uid=c.uid, logs=self.pending_logs)
            if not c.privileged and len(self.pending_logs) > logged and not self.log_budget.allow(c.uid, now=now):
                del self.pending_logs[logged:]
            self._answer(c, answer, now)

    def _read(self, c: _Conn, now: float) -> None:
        try:
            data = c.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(c)
            return
        if c.frame_start is None:
            c.frame_start = now
        if c.discard:
            if c.need > self.limits.max_discard:  # not worth reading past: refuse and hang up
                c.discard = False
                c.need = -1
                self._answer(c, FilterService._reject("gpushare: the request is far too long"), now)
                c.close_after = True
            else:
                c.inbuf += data
        else:
            c.inbuf += data
        self._consume(c, now)
        if not c.inbuf and c.need < 0:
            c.frame_start = None
        self._write(c)
        if self.pending_logs:  # the answers are sent (or queued): now the log lines
            logs, self.pending_logs = self.pending_logs, []
            self.log.write(logs)

    def _write(self, c: _Conn) -> None:
        if c.outbuf:
            try:
                sent = c.sock.send(c.outbuf)
                del c.outbuf[:sent]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._close(c)
                return
        if c.close_after and not c.outbuf:
            self._close(c)
            return
        if len(c.outbuf) > self.limits.max_pending:
            self._close(c)
            return
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if c.outbuf else 0)
        try:
            self.sel.modify(c.sock, want, c)
        except (KeyError, ValueError):
            pass

    def _sweep(self, now: float) -> None:
        lim = self.limits
        for c in list(self.conns.values()):
            idle = lim.privileged_idle_s if c.privileged else lim.idle_s
            if (c.frame_start is not None and now - c.frame_start > lim.frame_s) or (
                    c.frame_start is None and now - c.last > idle):
                self._close(c)
        dropped = self.log_budget.summary(now=now)
        if dropped:
            self.log("decisions_not_logged", by_uid=dropped, window_s=lim.log_window_s, per_uid=lim.log_per_uid)
        if self.refused and now - self.last_refusal_log >= 10.0:
            self.log("connections_refused", by_uid={str(k): v for k, v in self.refused.items()},
                     limits={"per_uid": lim.per_uid, "users": lim.users})
            self.refused.clear()
            self.last_refusal_log = now

    def serve_forever(self, poll_interval: float = 0.2) -> None:
        """Serve until :attr:`stop` is set."""
        last_sweep = time.monotonic()
        while not self.stop.is_set():
            events = self.sel.select(poll_interval)
            now = time.monotonic()
            # slurmctld's connections and accepts first, then users' connections, new users' connections last
            ready = sorted((key.data for key, _m in events if isinstance(key.data, _Conn)),
                           key=lambda c: not c.privileged)
            listening = [key.data for key, _m in events if isinstance(key.data, _Listener)]
            for c in ready:
                if c.privileged and c.sock.fileno() in self.conns:
                    self._read_guarded(c, now)
            for lst in listening:
                if lst.controller:
                    self._accept(lst, now)
            for c in ready:
                if not c.privileged and c.sock.fileno() in self.conns:
                    self._read_guarded(c, now)
            for lst in listening:
                if not lst.controller:
                    self._accept(lst, now)
            if now - last_sweep >= 0.5:
                self._sweep(now)
                last_sweep = now

    def _read_guarded(self, c: _Conn, now: float) -> None:
        """:meth:`_read`, where a bug met on one connection closes that connection (logged), never the loop: the
        service goes on answering slurmctld and every other client."""
        try:
            self._read(c, now)
        except Exception as e:  # noqa: BLE001 - one peer's bytes must not stop everyone's submissions
            self.service.log("internal_error", error=repr(e)[:2000], peer_uid=c.uid)
            if c.sock.fileno() in self.conns:
                self._close(c)

    def close(self) -> None:
        """Close every connection and the selector (not the listening sockets)."""
        for c in list(self.conns.values()):
            self._close(c)
        self.sel.close()


def serve(socket_path: Path, machines_dir: Path, *, policy_path: Path | None = None, refresh_s: float = 30.0,
          socket_mode: int = 0o666, log_stream=None, slurm_source=None, ready=None,
          limits: Limits = Limits(), stop: threading.Event | None = None,
          controller_socket_path: Path | None = None, default_policy_path: Path | None = None,
          reload_event: threading.Event | None = None) -> int:
    """Run the service until SIGTERM/SIGINT. Returns the exit status.

    Args:
        socket_path: the public unix socket (cli_filter.lua, as the user; replaced if a stale one is there).
        machines_dir: machine descriptions, one ``<node>.json`` per node.
        policy_path: site policy TOML; it must exist. None: ``default_policy_path`` when that exists,
            else the built-in defaults (:class:`PolicySource`; the lookup is made again on each reload).
        refresh_s: how often Slurm's view is refreshed (seconds); the directory is checked every second.
        socket_mode: permissions of the socket. cli_filter.lua runs as the submitting user, so the
            default lets every local user ask for a decision (read-only: the service changes nothing).
        slurm_source: callable returning (sinfo --json, scontrol -o show partition); default runs them.
        ready: optional threading.Event set when the socket listens (tests).
        limits: connection bounds per peer uid and in total (:class:`Limits`).
        stop: optional event that stops the service when set (tests; SIGTERM does it otherwise).
        controller_socket_path: the private unix socket of job_submit.lua (slurmctld), mode 0600 and
            owned by the service's user; only the service's own uid and root are served on it
            (``SO_PEERCRED``), so that users flooding the public socket cannot refuse or delay slurmctld.
            None: no private socket (job_submit.lua then uses the public one).
        default_policy_path: the policy file read when ``policy_path`` is None and it exists.
        reload_event: optional event that asks for a reload when set, as SIGHUP does (tests).

    SIGHUP reloads the site policy and the inventory together (:func:`reload`): a policy file that is
    not valid keeps the policy in force and is logged (``policy_rejected``). While it runs, the
    interpreter's thread switch interval is :data:`SWITCH_INTERVAL_S` and the inventory is refreshed
    with ``freeze_gc`` (:class:`InventoryCache`); both are put back when it returns.

    Raises:
        InputError: another filter service listens on one of the sockets.
        ConfigError: the policy file at start cannot be read or is not valid.
    """
    log = Log(log_stream)
    switch_was = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        return _serve(socket_path, machines_dir, log, policy_path=policy_path, refresh_s=refresh_s,
                      socket_mode=socket_mode, slurm_source=slurm_source, ready=ready, limits=limits, stop=stop,
                      controller_socket_path=controller_socket_path, default_policy_path=default_policy_path,
                      reload_event=reload_event)
    finally:  # as it was (tests run the service in a thread of theirs)
        sys.setswitchinterval(switch_was)
        gc.unfreeze()


def _serve(socket_path: Path, machines_dir: Path, log: Log, *, policy_path, refresh_s, socket_mode, slurm_source,
           ready, limits, stop, controller_socket_path, default_policy_path, reload_event) -> int:
    source = PolicySource(Path(policy_path) if policy_path else None,
                          Path(default_policy_path) if default_policy_path else None)
    policy = source.load()
    cache = InventoryCache(machines_dir, policy=policy, freeze_gc=True,
                           slurm_source=slurm_source or (lambda: (commands.sinfo_json(), commands.partitions_text())),
                           log=log)
    cache.refresh("start")
    service = FilterService(cache, log)
    socket_path = Path(socket_path)
    listener = _listen(socket_path, socket_mode)
    controller = None
    if controller_socket_path is not None:
        controller_socket_path = Path(controller_socket_path)
        try:
            controller = _listen(controller_socket_path, 0o600)
        except BaseException:
            listener.close()
            socket_path.unlink(missing_ok=True)
            raise
    server = FramedServer(listener, service, log, limits, controller_sock=controller)
    if stop is not None:
        server.stop = stop
    stop = server.stop
    reload_now = reload_event if reload_event is not None else threading.Event()

    def on_term(signum, frame):
        stop.set()

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
            try:
                if reload_now.is_set():
                    reload_now.clear()
                    reload(cache, source, log)
                    last = time.monotonic()
                elif cache.changed():
                    cache.refresh("machines changed")
                    last = time.monotonic()
                elif time.monotonic() - last >= refresh_s or cache.current() is None:
                    cache.refresh("periodic")
                    last = time.monotonic()
            except Exception as e:  # noqa: BLE001 - the thread must outlive any one refresh: logged, then on
                log("refresh_failed", error=f"{type(e).__name__}: {str(e)[:300]}")
                last = time.monotonic()

    threading.Thread(target=refresher, daemon=True, name="inventory-refresh").start()
    log("listening", socket=str(socket_path), controller_socket=str(controller_socket_path or ""),
        machines=str(machines_dir), policy=policy.source)
    if ready is not None:
        ready.set()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        stop.set()
        server.close()
        for lsock, path in ((listener, socket_path), (controller, controller_socket_path)):
            if lsock is None or path is None:
                continue
            lsock.close()
            try:
                path.unlink()
            except OSError:
                pass
        log("stopped")
    return 0


def _listen(path: Path, mode: int) -> socket.socket:
    """A unix socket listening at ``path`` with permissions ``mode`` (a stale socket file is replaced).

    It listens only after the chmod (a connect before ``listen`` is refused), so no peer gets in under
    the umask's permissions.
    """
    _remove_stale_socket(path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(str(path))
        os.chmod(path, mode)
    except BaseException:
        s.close()
        raise
    s.listen(socket.SOMAXCONN)
    return s


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
