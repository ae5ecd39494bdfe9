"""``slurm-gpushare filterd`` as a process: the sockets made, the cache, service and server started, the refresh
thread and signals (:func:`serve`)."""

from __future__ import annotations

import gc
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from slurm_gpushare.errors import InputError
from slurm_gpushare.slurm import commands
from slurm_gpushare.submit.cache import InventoryCache, PolicySource, reload
from slurm_gpushare.submit.log import Log
from slurm_gpushare.submit.server import FramedServer, Limits
from slurm_gpushare.submit.service import FilterService

#: How long the refresh thread may hold the interpreter lock while the socket thread waits for it
#: (seconds; ``sys.setswitchinterval``, CPython's default is 5 ms): a request that arrives during a refresh
#: waits at most about this long for it. A thread that runs alone is not interrupted, so it costs nothing
#: between refreshes.
SWITCH_INTERVAL_S = 0.0002


#: The peers' bounds when :func:`serve` is given none.
_DEFAULT_LIMITS = Limits()


def serve(socket_path: Path, machines_dir: Path, *, policy_path: Path | None = None, refresh_s: float = 30.0,
          socket_mode: int = 0o666, log_stream=None, slurm_source=None, ready=None,
          limits: Limits = _DEFAULT_LIMITS, stop: threading.Event | None = None,
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
