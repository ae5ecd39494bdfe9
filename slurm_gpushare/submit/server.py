"""filterd's socket loop (:class:`FramedServer`): one thread, non-blocking sockets, framed requests
(:mod:`slurm_gpushare.submit.protocol`), peers bounded by uid (:class:`Limits`)."""

from __future__ import annotations

import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass

from slurm_gpushare.submit.log import DecisionLogBudget, Log
from slurm_gpushare.submit.protocol import MAGIC, MAX_HEADER, MAX_REQUEST, PROTOCOL, frame, peer_uid
from slurm_gpushare.submit.service import FilterService


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
