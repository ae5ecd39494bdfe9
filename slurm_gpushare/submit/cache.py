"""What filterd decides from, held in memory: the site policy and the cluster inventory built for it (one
:class:`Snapshot`, replaced whole), the machine directory's stamps, and their reload on a change or SIGHUP."""

from __future__ import annotations

import gc
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from slurm_gpushare.errors import ConfigError, GpushareError
from slurm_gpushare.hardware.machine import Machine
from slurm_gpushare.slurm.nodegres import GresOptions, node_gres
from slurm_gpushare.submit.inventory import ClusterInventory, build_inventory
from slurm_gpushare.submit.log import Log
from slurm_gpushare.submit.policy import PoolIndex
from slurm_gpushare.submit.policyfile import SitePolicy, load_policy


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
