"""Control of one NVIDIA MPS control daemon (``nvidia-cuda-mps-control``), for Prolog and Epilog.

Facts used here come from NVIDIA's Multi-Process Service documentation ("Appendix: Tools and
Interface Reference", "Legacy MPS v2 Interface", "Appendix: Environment Variables") and the
``nvidia-cuda-mps-control(1)`` man page:

- ``nvidia-cuda-mps-control -d`` starts the control daemon in the background (``-f``: foreground).
  It talks to its clients through ``CUDA_MPS_PIPE_DIRECTORY`` (default ``/tmp/nvidia-mps``; the
  ``control`` socket lives there) and logs to ``CUDA_MPS_LOG_DIRECTORY`` (default
  ``/var/log/nvidia-mps``; ``control.log``). It writes its PID to ``nvidia-cuda-mps-control.pid`` in
  the pipe directory. ``CUDA_VISIBLE_DEVICES`` set when the daemon starts selects, and renumbers,
  the GPUs its servers use.
- Running the binary without ``-d``/``-f`` is the front end: it reads commands from stdin, one per
  line, prints the daemon's answers on stdout, and exits non-zero only when the daemon cannot be
  reached or the connection breaks; a rejected command prints an error on stdout with exit status 0.
  That is why the setters here read their value back.
- The daemon runs one MPS server at a time, started for the UID of the first client (or by
  ``start_server -uid UID``). A client of another UID makes the daemon ask the running server to
  shut down once its clients are done and queues the newcomer: two users' jobs behind one daemon
  take turns, they never share the GPU at once. This is why slurm-gpushare starts one daemon per job
  (this class, ``uid`` = the job's user), each with its own pipe and log directories; whether two
  such daemons may drive one GPU is decided above this layer (compute mode ``EXCLUSIVE_PROCESS``
  lets only one server create a context on the GPU).

Nothing here prints; every error is an :class:`MpsError` that names the binary, the pipe directory
and, where one ran, the command.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import psutil

from slurm_gpushare import procinfo
from slurm_gpushare.atomicfile import printable, read_user_file
from slurm_gpushare.boundedrun import OutputTooLarge, run_bounded
from slurm_gpushare.errors import HardwareError, InputError
from slurm_gpushare.memsize import parse_mib

#: The daemon's PID file in the pipe directory (MPS documentation, "nvidia-cuda-mps-control").
PID_FILE = "nvidia-cuda-mps-control.pid"
#: The control socket in the pipe directory, which CUDA clients look for.
CONTROL_SOCKET = "control"
#: The daemon's log in the log directory ("MPS Logging Format": ``control.log``).
CONTROL_LOG = "control.log"
#: Longest Unix socket path Linux accepts (``sun_path`` is 108 bytes with the terminating NUL). A longer
#: pipe directory makes the real daemon fail to bind and report only that it cannot be found.
MAX_SOCKET_PATH_BYTES = 107
#: PATH given to the daemon when the caller's environment has none (slurmd's Prolog environment is bare).
DEFAULT_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
#: Variables the class sets itself; ``extra_env`` may not override them.
MPS_ENV = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "CUDA_VISIBLE_DEVICES")

_POLL_S = 0.05
#: The first pause of :meth:`MpsDaemon.start` (doubling up to ``_POLL_S``): the daemon is usually up in a few ms.
_FIRST_POLL_S = 0.002
_LOG_TAIL_LINES = 10
#: The most of ``control.log`` root reads for those lines (its end), bytes.
_LOG_TAIL_BYTES = 4096
#: The most characters of one quoted ``control.log`` line.
_LOG_LINE_CHARS = 300
#: The most bytes of a pid file root reads (a PID and a newline; more is no pid file of the daemon's).
_PID_FILE_BYTES = 32
#: The most bytes of one front-end run's stdout (and of its stderr) root reads: a few lines per command; the
#: answer comes from whatever listens in the job's pipe directory, which the job's user owns.
_ANSWER_BYTES = 64 * 1024


#: mount(2) flags of a job's MPS directory: no set-uid programs, no device files, nothing executed from it.
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
#: umount2(2) flags: detach now (a process may still hold a file there), never follow a symbolic link.
_MNT_DETACH, _UMOUNT_NOFOLLOW = 2, 8


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _mount_tmpfs(path: Path, size_mib: int, uid: int, gid: int) -> None:
    """Mount a tmpfs of ``size_mib`` MiB on the directory ``path`` (root made it, in a directory of root's),
    its root owned by ``uid``:``gid`` with mode 0700, nosuid, nodev, noexec (mount(2), as root).

    Raises:
        MpsError: mount(2) failed (not root, no CAP_SYS_ADMIN: node.toml ``mps_dir_size = "0"`` mounts nothing).
    """
    import ctypes

    options = f"size={size_mib}m,mode=0700,uid={uid},gid={gid}".encode()
    if _libc().mount(b"tmpfs", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, options) != 0:
        err = ctypes.get_errno()
        raise MpsError(f"cannot mount a {size_mib} MiB tmpfs on {path}: {os.strerror(err)}",
                       source=f"MPS directory {path}",
                       hint='the hooks run as root with CAP_SYS_ADMIN; or set mps_dir_size = "0" in node.toml '
                            "(the directories are then unbounded)")


def _mount_points_below(path: Path) -> list[str]:
    """Mount points at or below ``path``, deepest first (``/proc/self/mountinfo``: field 5, octal escapes)."""
    prefix = os.path.abspath(path)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    points = []
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            if point == prefix or point.startswith(prefix.rstrip("/") + "/"):
                points.append(point)
    return sorted(set(points), key=len, reverse=True)


def unmount_below(path: str | Path) -> list[str]:
    """Unmount (detached, no-follow) every mount at or below ``path``, deepest first; returns the mount points.

    Raises:
        OSError: a mount could not be detached (not root).
    """
    points = _mount_points_below(Path(path))
    for point in points:
        if _libc().umount2(os.fsencode(point), _MNT_DETACH | _UMOUNT_NOFOLLOW) != 0:
            import ctypes

            err = ctypes.get_errno()
            raise OSError(err, f"cannot unmount: {os.strerror(err)}", point)
    return points


def remove_tree(path: str | Path) -> None:
    """Remove the directory tree ``path`` after :func:`unmount_below`: a job's MPS directories are tmpfs
    mounts (:attr:`MpsSettings.dir_size_mib`), which ``rmtree`` alone would empty and leave mounted.

    Raises:
        OSError: a mount could not be detached, or the tree not removed.
    """
    unmount_below(path)
    shutil.rmtree(path)


class MpsError(HardwareError):
    """The MPS control daemon could not be started, answered a command wrongly, or could not be stopped.

    ``source`` names the daemon by its pipe directory (``MPS control daemon /run/gpushare/job42/pipe``);
    the message names the binary and the command.
    """


@dataclass(frozen=True)
class MpsSettings:
    """How to run the MPS control daemon (site configuration).

    Attributes:
        control_binary: ``nvidia-cuda-mps-control``, by name (looked up in PATH) or by path; tests use
            the stand-in ``slurm_gpushare_dev/fake_mps/nvidia-cuda-mps-control``.
        start_timeout_s: seconds :meth:`MpsDaemon.start` waits for the daemon to answer.
        quit_timeout_s: seconds :meth:`MpsDaemon.stop` waits after ``quit`` for the daemon to exit.
        kill_timeout_s: seconds to wait after SIGTERM, and again after SIGKILL.
        command_timeout_s: seconds one front-end command may take.
        dir_size_mib: the size of the tmpfs mounted on each of the pipe and log directories when the daemon
            starts (they are the daemon's user's, and the run dir is usually tmpfs, i.e. RAM: a job must not
            fill it); ``0`` mounts nothing (node.toml ``mps_dir_size``).

    Raises:
        InputError: a timeout that is not positive, an empty binary name, or a negative size.
    """

    control_binary: str = "nvidia-cuda-mps-control"
    start_timeout_s: float = 10.0
    quit_timeout_s: float = 10.0
    kill_timeout_s: float = 5.0
    command_timeout_s: float = 10.0
    dir_size_mib: int = 64

    def __post_init__(self) -> None:
        if not self.control_binary:
            raise InputError("MPS control binary: empty name", hint="nvidia-cuda-mps-control or a path to it")
        if isinstance(self.dir_size_mib, bool) or not isinstance(self.dir_size_mib, int) or self.dir_size_mib < 0:
            raise InputError(f"MPS settings: dir_size_mib = {self.dir_size_mib!r} is not a size in MiB",
                             hint="a whole number of MiB, 0 for no size limit")
        for name in ("start_timeout_s", "quit_timeout_s", "kill_timeout_s", "command_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise InputError(f"MPS settings: {name} = {value!r} is not a positive number of seconds")


@dataclass(frozen=True)
class StopResult:
    """What :meth:`MpsDaemon.stop` did.

    Attributes:
        daemon_pid: the daemon found running (verified, see :meth:`MpsDaemon.pid`), or None.
        quit_ok: ``quit`` was accepted and the daemon exited within ``quit_timeout_s``.
        terminated: PIDs that exited after SIGTERM.
        killed: PIDs that needed SIGKILL and exited.
        survivors: PIDs still there after SIGKILL and ``kill_timeout_s`` (a process stuck in the
            kernel, state ``D``): reported, never hidden; the GPU may still be in use.
        removed: directories removed.
        not_removed: ``"path: reason"`` for directories that could not be removed.
    """

    daemon_pid: int | None
    quit_ok: bool
    terminated: tuple[int, ...] = ()
    killed: tuple[int, ...] = ()
    survivors: tuple[int, ...] = ()
    removed: tuple[str, ...] = ()
    not_removed: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        """No process survived and every directory was removed."""
        return not self.survivors and not self.not_removed


@dataclass(frozen=True)
class Setting:
    """One daemon setting: the command that sets it, the one that reads it back, and what the read-back
    must show. Made by :meth:`MpsDaemon.pinned_mem_limit`, :meth:`MpsDaemon.server_pinned_mem_limit`,
    :meth:`MpsDaemon.active_thread_percentage` and :meth:`MpsDaemon.client_priority`; applied by
    :meth:`MpsDaemon.configure` (or :meth:`MpsDaemon.start`).

    Attributes:
        set_line: e.g. ``set_default_device_pinned_mem_limit 0 10G``.
        get_line: e.g. ``get_default_device_pinned_mem_limit 0``.
        accepts: whether one read-back line shows the value set.
        optional: a driver that refuses it is not an error (``set_default_client_priority``, CUDA 11.8+).
    """

    set_line: str
    get_line: str
    accepts: Callable[[str], bool]
    optional: bool = False

    def failure(self, back: str) -> str:
        """The message for a read-back that does not show the value."""
        return f"{self.set_line} was not applied: the daemon reports {back!r}"


def _batch(settings: Sequence[Setting]) -> str:
    """One front-end run's stdin for ``settings``: every set line, then every get line."""
    return "\n".join([s.set_line for s in settings] + [s.get_line for s in settings])


def pinned_mem_value(mib: int) -> str:
    """The VALUE of ``set_default_device_pinned_mem_limit``: ``<n>G`` when whole GiB, else ``<n>M``.

    The MPS documentation allows only an integer followed by ``G`` or ``M`` (no ``T``, no fractions).

    Raises:
        InputError: not a positive whole number of MiB.
    """
    if isinstance(mib, bool) or not isinstance(mib, int) or mib < 1:
        raise InputError(f"MPS pinned memory limit: {mib!r} is not a positive number of MiB")
    return f"{mib // 1024}G" if mib % 1024 == 0 else f"{mib}M"


# --- processes (psutil, see slurm_gpushare.procinfo) -------------------------------------------------


def _our_ancestry() -> tuple[set[int], set[int]]:
    """PIDs and session ids of this process and its ancestors: never signalled, whatever a pid file says."""
    pids, sids = {0, 1}, {0}
    me = psutil.Process()
    for p in (me, *me.parents()):
        if p.pid <= 1:
            break
        pids.add(p.pid)
        sid = procinfo.session_id(p)
        if sid is not None:
            sids.add(sid)
    return pids, sids


def _wait_gone(procs: Iterable[psutil.Process], deadline: float) -> list[psutil.Process]:
    """Wait until every process is gone or ``deadline`` (monotonic) passes; return those still running."""
    left = [p for p in procs if procinfo.running(p)]
    while left and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        left = [p for p in left if procinfo.running(p)]
    return left


# --- the daemon ------------------------------------------------------------------------------------


class MpsDaemon:
    """One MPS control daemon with its own pipe and log directories.

    The object holds no live state: a Prolog calls :meth:`start`, and an Epilog in another process
    builds an equal object and calls :meth:`stop`; everything is found again from the pid file and
    ``/proc``.

    The daemon and every front-end command run with a constructed environment, not the caller's:
    ``PATH`` (the caller's, or :data:`DEFAULT_PATH`), then ``extra_env``, then
    ``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY`` and ``CUDA_VISIBLE_DEVICES``. Nothing of a
    job's or of slurmd's environment leaks into the daemon.

    Identity: when the caller is root and ``uid`` is given, the directories are owned by
    ``uid:gid``, and the daemon and the front-end commands run as ``uid:gid`` with no supplementary
    groups (a per-user daemon: its server runs as the job's user, and commands come from the daemon's
    owner). Otherwise everything runs as the caller, and ``uid`` may only name the caller.

    Args:
        pipe_dir: absolute path of ``CUDA_MPS_PIPE_DIRECTORY``; ``pipe_dir/control`` must fit a Unix
            socket path (107 bytes). Its parent directories must be searchable by ``uid``.
        log_dir: absolute path of ``CUDA_MPS_LOG_DIRECTORY``.
        settings: the binary and the timeouts.
        visible_devices: ``CUDA_VISIBLE_DEVICES`` for the daemon: GPU UUIDs (``GPU-...``), as NVIDIA
            recommends, or indices. The daemon's servers renumber them from 0, which is the ``DEV``
            that :meth:`set_pinned_mem_limit` takes. May be empty for an object that only stops or
            inspects a daemon; :meth:`start` refuses it.
        uid: user to run the daemon as (see above); None: the caller. Root may leave it None to
            :meth:`stop` a daemon it does not know the user of (an Epilog): the daemon is then
            recognised by binary and pipe directory alone.
        gid: its group; None: the user's primary group.
        extra_env: more variables for the daemon and the front end (e.g. ``CUDA_MPS_*`` defaults);
            may not set the three above.

    Raises:
        InputError: relative paths, a pipe directory too long for the socket, a user or group that
            cannot be used, or ``extra_env`` overriding the MPS variables.
    """

    def __init__(self, pipe_dir: str | Path, log_dir: str | Path, *, settings: MpsSettings | None = None,
                 visible_devices: str, uid: int | None = None, gid: int | None = None,
                 extra_env: Mapping[str, str] | None = None):
        self.pipe_dir = Path(pipe_dir)
        self.log_dir = Path(log_dir)
        self.settings = settings if settings is not None else MpsSettings()
        self.visible_devices = visible_devices
        self._source = f"MPS control daemon {self.pipe_dir}"
        for what, path in (("pipe directory", self.pipe_dir), ("log directory", self.log_dir)):
            if not path.is_absolute():
                raise InputError(f"MPS {what} {str(path)!r} is not an absolute path",
                                 hint="the daemon runs in /; give /run/... or /tmp/...")
        socket_bytes = len(os.fsencode(self.pipe_dir / CONTROL_SOCKET))
        if socket_bytes > MAX_SOCKET_PATH_BYTES:
            raise InputError(f"MPS pipe directory {self.pipe_dir} is too long: its control socket path has "
                             f"{socket_bytes} bytes, Linux allows {MAX_SOCKET_PATH_BYTES}",
                             hint="use a shorter run directory")
        extra = dict(extra_env or {})
        clash = sorted(set(extra) & set(MPS_ENV))
        if clash:
            raise InputError(f"extra_env may not set {', '.join(clash)}", source=self._source,
                             hint="they come from pipe_dir, log_dir and visible_devices")
        self._extra_env = extra
        self._switch = uid is not None and os.geteuid() == 0
        if uid is not None and not self._switch and uid != os.geteuid():
            raise InputError(f"cannot run the MPS control daemon as uid {uid}: only root can switch users "
                             f"(this process runs as uid {os.geteuid()})", source=self._source)
        if self._switch and gid is None and uid is not None:
            try:
                gid = pwd.getpwuid(uid).pw_gid
            except KeyError:
                raise InputError(f"uid {uid} has no passwd entry, so no primary group", source=self._source,
                                 hint="pass gid (SLURM_JOB_GID)") from None
        self.uid: int = uid if self._switch and uid is not None else os.geteuid()
        self.gid: int = gid if self._switch and gid is not None else os.getegid()
        # root that was not told the user (an Epilog that knows only the pipe directory) accepts a
        # daemon of any user; see _is_our_daemon
        self._any_owner = uid is None and os.geteuid() == 0
        self._binary_name = Path(self.settings.control_binary).name

    # --- environment and identity -------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """The environment of the daemon and of every front-end command (see the class docstring)."""
        env = {"PATH": os.environ.get("PATH") or DEFAULT_PATH}
        env.update(self._extra_env)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.pipe_dir)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(self.log_dir)
        env["CUDA_VISIBLE_DEVICES"] = self.visible_devices
        return env

    def client_env(self) -> dict[str, str]:
        """What a job's tasks need to use this daemon: ``CUDA_MPS_PIPE_DIRECTORY`` and
        ``CUDA_MPS_LOG_DIRECTORY`` (MPS documentation, "Starting MPS client application": the same
        locations as the daemon's). ``CUDA_VISIBLE_DEVICES`` is not included: the daemon already
        selected and renumbered the GPUs, and repeating non-zero indices in the client is an error."""
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def _credentials(self) -> dict:
        if not self._switch:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    # --- the pid file and /proc ---------------------------------------------------------------------

    def _owner(self) -> int | None:
        """Whose files the daemon's directories hold: the daemon's user (any, for root that was not told it)."""
        return None if self._any_owner else self.uid

    def _pid_file_value(self) -> int | None:
        """The PID named in the pid file, read through the bounded reader (the job's user owns the pipe directory
        and may put a FIFO, a link or 5,000 digits there): None for anything but a small regular file of the
        daemon's user holding a PID."""
        try:
            text = read_user_file(self.pipe_dir / PID_FILE, max_bytes=_PID_FILE_BYTES, owner=self._owner())
        except OSError:
            return None
        value = text.strip()
        if not (value.isascii() and value.isdigit() and len(value) <= 10):
            return None
        return int(value) if int(value) > 1 else None

    def _is_our_daemon(self, pid: int) -> bool:
        """``pid`` is a live control daemon of this pipe directory, run by the daemon's user.

        The pid file lives in a directory the job's user owns, so its content is not trusted: the process
        must run the binary, have been started with this ``CUDA_MPS_PIPE_DIRECTORY``, and belong to the
        daemon's uid (any uid when root was not told it). Otherwise it is never signalled.
        """
        p = procinfo.process(pid)
        if p is None or not procinfo.running(p):
            return False
        try:
            argv = p.cmdline()
            uid = p.uids().real
            environ = p.environ()
        except psutil.Error:
            return False
        if not any(Path(a).name == self._binary_name for a in argv if a):
            return False
        if uid != self.uid and not self._any_owner:
            return False
        return environ.get("CUDA_MPS_PIPE_DIRECTORY") in (str(self.pipe_dir), f"{self.pipe_dir}/")

    def pid(self) -> int | None:
        """PID of the running daemon, from ``nvidia-cuda-mps-control.pid`` in the pipe directory.

        None when there is no pid file, or it names a process that is gone, is a zombie, does not run
        the control binary, belongs to another user, or serves another pipe directory.
        """
        pid = self._pid_file_value()
        return pid if pid is not None and self._is_our_daemon(pid) else None

    def alive(self) -> bool:
        """A daemon of this pipe directory is running (:meth:`pid` is not None)."""
        return self.pid() is not None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> tuple[str, ...]:
        """The last ``lines`` lines of ``control.log`` (empty when there is none), for the log and error messages:
        read through the bounded reader (its last :data:`_LOG_TAIL_BYTES`; a link, a FIFO or a file of another
        owner is not read), each line made printable and cut to :data:`_LOG_LINE_CHARS` characters."""
        try:
            data = read_user_file(self.log_dir / CONTROL_LOG, max_bytes=_LOG_TAIL_BYTES, owner=self._owner(),
                                  tail=True)
        except OSError:
            return ()
        return tuple(printable(line, limit=_LOG_LINE_CHARS)
                     for line in data.decode("utf-8", errors="replace").splitlines()[-lines:])

    def _tree(self, daemon: psutil.Process) -> dict[int, psutil.Process]:
        """The daemon, its descendants, and the other members of its session that run as its user.

        The session catches MPS servers and helpers the daemon started that were re-parented after a
        double fork. It is used only when it is not the session of this process or of an ancestor
        (the daemon is launched in a session of its own, so it never is unless something is wrong),
        and only for processes of the daemon's uid (a session a user built may hold setuid programs).
        """
        procs = list(psutil.process_iter(["ppid"]))
        never_pids, never_sids = _our_ancestry()
        members = {daemon.pid: daemon}
        frontier = [daemon.pid]
        while frontier:
            parent = frontier.pop()
            for p in procs:
                if p.info["ppid"] == parent and p.pid not in members:
                    members[p.pid] = p
                    frontier.append(p.pid)
        sid = procinfo.session_id(daemon)
        if sid is not None and sid not in never_sids:
            owner = procinfo.real_uid(daemon)
            members.update({p.pid: p for p in procs if p.pid not in members and procinfo.session_id(p) == sid
                            and procinfo.real_uid(p) == owner})
        return {pid: p for pid, p in members.items() if pid not in never_pids}

    # --- directories ----------------------------------------------------------------------------------

    def _make_dir(self, path: Path) -> None:
        """Make ``path`` the daemon's user's directory (mode 0700): with ``dir_size_mib``, a tmpfs of that size
        mounted there (its root owned by the user), unless one is mounted there already."""
        size = self.settings.dir_size_mib
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(path, 0o700)
            if size:
                _mount_tmpfs(path, size, self.uid, self.gid)
                return
            if self._switch:
                os.chown(path, self.uid, self.gid)
            os.chmod(path, 0o700)
            return
        if not stat.S_ISDIR(st.st_mode):
            raise MpsError(f"{path} exists and is not a directory (a symbolic link is refused)",
                           source=self._source, hint="remove it, or run slurm-gpushare doctor")
        if st.st_uid != self.uid:
            raise MpsError(f"{path} is owned by uid {st.st_uid}, not by the daemon's uid {self.uid}",
                           source=self._source, hint="remove it, or run slurm-gpushare doctor")
        if size and not os.path.ismount(path):
            _mount_tmpfs(path, size, self.uid, self.gid)  # over what is there: removed with it (remove_tree)
            return
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(path, 0o700)

    def _remove_dirs(self, keep_logs: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
        removed, not_removed = [], []
        dirs = [self.pipe_dir] if keep_logs else [self.pipe_dir, self.log_dir]
        for d in dirs:
            if not os.path.lexists(d):
                continue
            try:
                remove_tree(d)
            except OSError as e:
                not_removed.append(f"{d}: {e.strerror or e}")
            else:
                removed.append(str(d))
        return tuple(removed), tuple(not_removed)

    # --- front-end commands ---------------------------------------------------------------------------

    def _run_client(self, line: str, timeout: float) -> str:
        binary = self.settings.control_binary
        try:  # bounded: the answer comes from a pipe directory the job's user owns (boundedrun)
            proc = run_bounded([binary], input=line + "\n", env=self.env(), timeout=timeout,
                               max_bytes=_ANSWER_BYTES, **self._credentials())
        except subprocess.TimeoutExpired:
            raise MpsError(f"{binary}: command {line!r} got no answer within {timeout:g} s",
                           source=self._source, hint="the daemon hangs; stop it (Epilog) and see control.log") from None
        except OutputTooLarge as e:
            raise MpsError(f"{binary}: command {line!r} {e}: not an answer of the MPS control daemon",
                           source=self._source, hint="a program other than the daemon listens in its pipe "
                                                     "directory; stop it (Epilog)") from None
        except OSError as e:
            raise MpsError(f"cannot run {binary}: {e.strerror or e}", source=self._source,
                           hint="install the NVIDIA compute utilities or set the MPS control binary path") from None
        if proc.returncode != 0:
            said = " ".join((proc.stderr.strip() + " " + proc.stdout.strip()).split()) or "no output"
            raise MpsError(f"{binary}: command {line!r} failed with exit status {proc.returncode}: {said}",
                           source=self._source)
        return proc.stdout.strip()

    def command(self, line: str) -> str:
        """Send one command to the daemon through the front end and return its answer.

        Runs ``nvidia-cuda-mps-control`` (no ``-d``) with the command on stdin, the daemon's
        environment and identity, and ``command_timeout_s``. The commands are those of the MPS
        documentation ("Legacy MPS v2 Interface"; man page ``nvidia-cuda-mps-control(1)``), e.g.
        ``get_server_list``, ``start_server -uid UID``, ``shutdown_server PID [-f]``,
        ``get_client_list PID``, ``quit [-t SECONDS]``. A command the daemon rejects is answered with
        an error line and exit status 0, so the answer is returned as it is; the setters of this class
        check by reading back.

        Args:
            line: one command line, without a newline.

        Returns:
            The front end's stdout, stripped.

        Raises:
            InputError: ``line`` is empty or has more than one line.
            MpsError: the binary is missing, the daemon cannot be reached (the front end exits non-zero,
                e.g. "Cannot find MPS control daemon process"), or no answer came within the timeout.
        """
        if not line.strip() or any(c in line for c in "\n\r\0"):
            raise InputError(f"MPS command {line!r} is not one non-empty line", source=self._source)
        return self._run_client(line.strip(), self.settings.command_timeout_s)

    def configure(self, settings: Sequence[Setting]) -> None:
        """Apply settings with one front-end run: every ``set_...`` line, then every ``get_...`` line.

        The front end sends its stdin lines one by one, in order, and prints each answer (MPS documentation,
        "Tools and Interface Reference"); a ``set`` the daemon takes prints nothing, each ``get`` one line.
        When the answer is one line per setting and each shows its value, that is all; otherwise (a refused
        command printed an error line, a value did not take) the settings are applied again one at a time,
        for an error that names the command. Running the front end once instead of twice per setting is
        what keeps an MPS job's Prolog short.

        Raises:
            MpsError: the daemon cannot be reached, or a setting that is not ``optional`` was refused or
                reads back another value.
        """
        if settings:
            self._check(settings, self._run_client(_batch(settings), self.settings.command_timeout_s))

    def _check(self, settings: Sequence[Setting], answer: str) -> None:
        """Accept one batch's answer, or apply each setting alone (see :meth:`configure`)."""
        lines = answer.splitlines()
        if len(lines) == len(settings) and all(s.accepts(b) for s, b in zip(settings, lines, strict=True)):
            return
        for s in settings:
            self._run_client(s.set_line, self.settings.command_timeout_s)
            back = self._run_client(s.get_line, self.settings.command_timeout_s)
            if not s.accepts(back) and not s.optional:
                raise MpsError(s.failure(back), source=self._source)

    def read_back(self, settings: Sequence[Setting], *, timeout: float | None = None) -> list[str]:
        """Read ``settings`` back from the daemon with one front-end run (every ``get_...`` line) and say which
        no longer show the value the Prolog set (a job's processes may send commands to their own daemon: the
        node monitor checks, docs/mps.md section 2). A setting marked ``optional`` is not checked.

        Args:
            settings: what the daemon should hold (as :meth:`configure` applied them).
            timeout: seconds the front end may take (default ``command_timeout_s``).

        Returns:
            One line per setting that differs, ``"<get line> shows <value>, set <set line>"``; empty when all hold.

        Raises:
            MpsError: the daemon cannot be reached or gave no answer in time.
        """
        checked = [s for s in settings if not s.optional]
        if not checked:
            return []
        answer = self._run_client("\n".join(s.get_line for s in checked),
                                  self.settings.command_timeout_s if timeout is None else timeout)
        lines = answer.splitlines()
        lines += [""] * (len(checked) - len(lines))
        return [f"{s.get_line} shows {printable(back.strip(), limit=80) or 'nothing'!r}, set {s.set_line!r}"
                for s, back in zip(checked, lines, strict=False) if not s.accepts(back)]

    def pinned_mem_limit(self, device_index: int, mib: int) -> Setting:
        """The device memory each new MPS client may pin on one GPU, as a :class:`Setting`.

        ``set_default_device_pinned_mem_limit DEV VALUE`` (VALUE from :func:`pinned_mem_value`: ``10G``,
        ``10240M`` is sent as ``10G``, ``1536M`` as ``1536M``), read back with
        ``get_default_device_pinned_mem_limit DEV``. Per the MPS documentation the default applies to
        servers started afterwards (set it before the job's first CUDA client) and is lost on ``quit``;
        clients may lower it further with ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``. A read-back in whole
        ``G`` that equals the limit rounded down to GiB is accepted, as some drivers display it so.

        Args:
            device_index: ``DEV``, the GPU's ordinal among the daemon's ``CUDA_VISIBLE_DEVICES`` (0 first).
            mib: the limit in MiB.

        Raises:
            InputError: a negative device or a limit that is not a positive number of MiB.
        """
        return self._pinned(f"default_device_pinned_mem_limit {self._device(device_index)}", mib)

    def set_pinned_mem_limit(self, device_index: int, mib: int) -> None:
        """Apply :meth:`pinned_mem_limit` alone.

        Raises:
            InputError: as :meth:`pinned_mem_limit`.
            MpsError: the command failed or the daemon reports another limit.
        """
        self.configure([self.pinned_mem_limit(device_index, mib)])

    def server_pids(self, *, timeout: float | None = None) -> tuple[int, ...]:
        """PIDs of the daemon's running MPS servers (``get_server_list``: one PID per line; none before
        the first client or ``start_server``); ``timeout``: seconds the front end may take (default
        ``command_timeout_s``).

        Raises:
            MpsError: the daemon cannot be reached or gave no answer in time.
        """
        answer = self._run_client("get_server_list", self.settings.command_timeout_s if timeout is None else timeout)
        return tuple(int(w) for w in answer.split() if w.isdigit())

    def server_pinned_mem_limit(self, server_pid: int, device_index: int, mib: int) -> Setting:
        """The pinned-memory limit of a running MPS server, for the clients it creates afterwards.

        ``set_device_pinned_mem_limit PID DEV VALUE``, read back with ``get_device_pinned_mem_limit PID DEV``
        (MPS documentation, "Legacy MPS v2 Interface"). The default of :meth:`pinned_mem_limit` reaches only
        servers started after it; a shared daemon whose server already runs is raised with this one.
        Read-back and VALUE as there.

        Args:
            server_pid: a PID from :meth:`server_pids`.
            device_index: ``DEV``, as in :meth:`pinned_mem_limit`.
            mib: the limit in MiB.

        Raises:
            InputError: a negative device or a limit that is not a positive number of MiB.
        """
        return self._pinned(f"device_pinned_mem_limit {server_pid} {self._device(device_index)}", mib)

    def set_server_pinned_mem_limit(self, server_pid: int, device_index: int, mib: int) -> None:
        """Apply :meth:`server_pinned_mem_limit` alone.

        Raises:
            InputError: as :meth:`server_pinned_mem_limit`.
            MpsError: the command failed, the daemon has no such server, or it reports another limit.
        """
        self.configure([self.server_pinned_mem_limit(server_pid, device_index, mib)])

    def _device(self, device_index: int) -> int:
        if isinstance(device_index, bool) or not isinstance(device_index, int) or device_index < 0:
            raise InputError(f"MPS device {device_index!r} is not a device ordinal (0, 1, ...)", source=self._source)
        return device_index

    @staticmethod
    def _pinned(what: str, mib: int) -> Setting:
        """``set_<what> VALUE``; ``get_<what>`` must show ``mib`` (or it rounded down to whole GiB)."""
        value = pinned_mem_value(mib)

        def accepts(back: str) -> bool:
            try:
                shown = parse_mib(back, default_unit="M", what="pinned memory limit")
            except InputError:
                return False
            return shown == mib or (back.strip().upper().endswith("G") and mib >= 1024 and shown == mib // 1024 * 1024)

        return Setting(f"set_{what} {value}", f"get_{what}", accepts)

    def active_thread_percentage(self, pct: int | float) -> Setting:
        """The share of SMs each new MPS client may use, as a :class:`Setting`.

        ``set_default_active_thread_percentage P``, read back with ``get_default_active_thread_percentage``
        (MPS documentation: applies to servers started afterwards, lost on ``quit``, default 100; clients see
        it as ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` would set it).

        Args:
            pct: percent, more than 0 and at most 100.

        Raises:
            InputError: outside (0, 100].
        """
        if isinstance(pct, bool) or not isinstance(pct, (int, float)) or not 0 < pct <= 100:
            raise InputError(f"MPS active thread percentage {pct!r} is not in (0, 100]", source=self._source)
        text = str(int(pct)) if float(pct).is_integer() else f"{pct:g}"

        def accepts(back: str) -> bool:
            try:
                return abs(float(back) - float(pct)) < 0.01
            except ValueError:
                return False

        return Setting(f"set_default_active_thread_percentage {text}", "get_default_active_thread_percentage", accepts)

    def set_active_thread_percentage(self, pct: int | float) -> None:
        """Apply :meth:`active_thread_percentage` alone.

        Raises:
            InputError: outside (0, 100].
            MpsError: the command failed or the daemon reports another value.
        """
        self.configure([self.active_thread_percentage(pct)])

    def client_priority(self, priority: int, *, optional: bool = False) -> Setting:
        """The priority of new MPS clients, 0 (normal, the default) or 1 (below normal), as a :class:`Setting`.

        ``set_default_client_priority``, read back with ``get_default_client_priority`` (MPS documentation:
        a hint to the driver, not a guarantee; lost on ``quit``; CUDA 11.8+). A client may set its own with
        ``CUDA_MPS_CLIENT_PRIORITY``. ``optional``: a daemon that refuses it is not an error.

        Raises:
            InputError: not 0 or 1.
        """
        if priority not in (0, 1) or isinstance(priority, bool):
            raise InputError(f"MPS client priority {priority!r} is not 0 (normal) or 1 (below normal)",
                             source=self._source)
        return Setting(f"set_default_client_priority {priority}", "get_default_client_priority",
                       lambda back: back.split()[:1] == [str(priority)], optional=optional)

    def set_client_priority(self, priority: int) -> None:
        """Apply :meth:`client_priority` alone.

        Raises:
            InputError: not 0 or 1.
            MpsError: the command failed or the daemon reports another value.
        """
        self.configure([self.client_priority(priority)])

    # --- start and stop ---------------------------------------------------------------------------------

    def start(self, settings: Sequence[Setting] = ()) -> int:
        """Start the daemon, wait until it answers, and apply ``settings`` (see :meth:`configure`).

        Creates the pipe and log directories (mode 0700, owned by the daemon's user) when missing;
        existing ones must be real directories owned by that user. Removes a stale pid file and socket
        left by a crashed daemon, runs ``nvidia-cuda-mps-control -d`` in a session of its own, then
        waits (``start_timeout_s``) until the pid file names a live daemon (see :meth:`pid`) and answers
        (``get_server_list``, or the batch of ``settings``: the first answered run applies them, so a job
        daemon's start costs two runs of the binary). If that does not happen, whatever started is stopped
        (the log directory is kept for the administrator) and the error quotes the end of ``control.log``.

        Returns:
            The daemon's PID.

        Raises:
            InputError: no ``visible_devices``.
            MpsError: a daemon already runs on this pipe directory, a directory cannot be used, the
                binary is missing or failed, the daemon exited, or it did not answer in time; or a setting
                was not applied (the daemon is left running: the caller stops it).
        """
        binary = self.settings.control_binary
        if not self.visible_devices.strip():
            raise InputError("MPS control daemon: empty CUDA_VISIBLE_DEVICES", source=self._source,
                             hint="give the GPU UUIDs (GPU-...) the job was allocated")
        running = self.pid()
        if running is not None:
            raise MpsError(f"a control daemon already runs on this pipe directory (pid {running})",
                           source=self._source, hint="stop it first (Epilog, or slurm-gpushare doctor)")
        try:
            self._make_dir(self.pipe_dir)
            self._make_dir(self.log_dir)
            for name in (PID_FILE, CONTROL_SOCKET):
                (self.pipe_dir / name).unlink(missing_ok=True)
        except OSError as e:
            raise MpsError(f"cannot prepare the MPS directories: {e.strerror or e}", source=self._source) from None
        deadline = time.monotonic() + self.settings.start_timeout_s
        with tempfile.TemporaryFile(mode="w+") as out:
            # output to a file, not a pipe: a daemon that keeps its stdio open must not block us
            try:
                proc = subprocess.run([binary, "-d"], env=self.env(), stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT, cwd="/", start_new_session=True,
                                      timeout=self.settings.start_timeout_s, **self._credentials())
            except subprocess.TimeoutExpired:
                self._fail_start(f"'{binary} -d' did not return within {self.settings.start_timeout_s:g} s")
            except OSError as e:
                self._fail_start(f"cannot run '{binary} -d': {e.strerror or e}",
                                 hint="install the NVIDIA compute utilities or set the MPS control binary path")
            out.seek(0)
            said = " ".join(out.read().split())
        if proc.returncode != 0:
            self._fail_start(f"'{binary} -d' exited with status {proc.returncode}: {said or 'no output'}")
        last = "no pid file yet"
        probe = _batch(settings) or "get_server_list"
        pause = _FIRST_POLL_S
        while True:
            pid = self.pid()
            if pid is None:
                named = self._pid_file_value()
                gone = named is not None and not procinfo.pid_alive(named)
                if gone:
                    self._fail_start(f"the daemon (pid {named}) exited while starting")
                if named is not None:
                    last = f"the pid file names pid {named}, which is not a control daemon of this pipe directory"
            elif (self.pipe_dir / CONTROL_SOCKET).exists():
                remaining = deadline - time.monotonic()
                try:
                    answer = self._run_client(probe, max(0.1, min(self.settings.command_timeout_s, remaining)))
                except MpsError as e:
                    last = e.message
                else:
                    if settings:
                        self._check(settings, answer)
                    return pid
            else:
                last = f"pid {pid} runs but has no control socket yet"
            if time.monotonic() >= deadline:
                self._fail_start(f"not ready within {self.settings.start_timeout_s:g} s ({last})")
            time.sleep(pause)
            pause = min(pause * 2, _POLL_S)

    def _fail_start(self, reason: str, *, hint: str | None = None) -> NoReturn:
        """Stop whatever started, keep the logs, and raise the start error."""
        tail = self.log_tail()
        result = self.stop(keep_logs=True)
        message = f"{self.settings.control_binary} did not start: {reason}"
        if tail:
            message += f"; last lines of {self.log_dir / CONTROL_LOG}: {' | '.join(tail)}"
        else:
            message += f"; {self.log_dir / CONTROL_LOG} is empty or missing"
        if result.survivors:
            message += f"; processes that survived SIGKILL: {', '.join(map(str, result.survivors))}"
        raise MpsError(message, source=self._source, hint=hint or f"the log directory {self.log_dir} was kept")

    def stop(self, *, keep_logs: bool = False) -> StopResult:
        """Stop the daemon and everything it started, then remove its directories.

        Sends ``quit`` (the man page: the daemon shuts its servers down and exits; the front end waits)
        and waits ``quit_timeout_s`` for the daemon's PID to go. Then every process still left of the
        daemon's tree (the daemon, its descendants, the other members of its session, as found before
        ``quit``) gets SIGTERM, and after ``kill_timeout_s`` SIGKILL; what is still there after another
        ``kill_timeout_s`` is reported as a survivor. Processes are tracked by PID and start time, so a
        reused PID is never signalled. The pipe directory is removed, and the log directory unless
        ``keep_logs``.

        Idempotent: with no pid file, or one naming a process that is not this daemon (see
        :meth:`pid`), nothing is signalled and only the directories are removed.

        Returns:
            What happened; check :attr:`StopResult.clean`.
        """
        daemon_pid = self.pid()
        daemon = procinfo.process(daemon_pid) if daemon_pid is not None else None
        if daemon is None:
            orphans = self._orphans()
            if not orphans:
                removed, not_removed = self._remove_dirs(keep_logs)
                return StopResult(daemon_pid=None, quit_ok=False, removed=removed, not_removed=not_removed)
            tracked, quit_ok = orphans, False
        else:
            tracked = self._tree(daemon)
            quit_ok = self._quit(daemon, tracked)
        tracked.update(self._orphans())
        return self._kill(daemon_pid, quit_ok, tracked, keep_logs)

    def _orphans(self) -> dict[int, psutil.Process]:
        """MPS processes started for this pipe directory whose daemon is gone (an MPS server whose
        control daemon was SIGKILLed is re-parented and outlives it): found by ``CUDA_MPS_PIPE_DIRECTORY``
        in their environment (``/proc/<pid>/environ``; readable for root or the same user) and an MPS
        program (``nvidia-cuda-mps-*``, or the configured binary) on their command line, so that the
        job's own processes, which carry the same variable, are never touched."""
        want = str(self.pipe_dir)
        never_pids, _ = _our_ancestry()
        out: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter(["environ", "cmdline"]):
            env, argv = proc.info["environ"], proc.info["cmdline"]
            if proc.pid in never_pids or not env or env.get("CUDA_MPS_PIPE_DIRECTORY") != want or argv is None:
                continue
            if not procinfo.running(proc):
                continue
            # only MPS processes: the job's own tasks carry the same variable (the TaskProlog exports it)
            cmdline = "\0".join(argv)
            if "nvidia-cuda-mps" in cmdline or self._binary_name in cmdline:
                out[proc.pid] = proc
        return out

    def _quit(self, daemon: psutil.Process, tracked: dict[int, psutil.Process]) -> bool:
        deadline = time.monotonic() + self.settings.quit_timeout_s
        try:
            self._run_client("quit", self.settings.quit_timeout_s)
            quit_sent = True
        except MpsError:
            quit_sent = False  # no socket (still starting, or hung): go on with signals
        quit_ok = quit_sent and not _wait_gone([daemon], deadline)
        if procinfo.running(daemon):
            tracked.update(self._tree(daemon))
        return quit_ok

    def _kill(self, daemon_pid: int | None, quit_ok: bool, tracked: dict[int, psutil.Process],
              keep_logs: bool) -> StopResult:
        terminated, killed = [], []
        left = [p for p in tracked.values() if procinfo.running(p)]
        if left:
            sent = self._signal(left, signal.SIGTERM)
            left = _wait_gone(sent, time.monotonic() + self.settings.kill_timeout_s)
            terminated = sorted(p.pid for p in sent if p not in left)
        survivors: list[psutil.Process] = []
        if left:
            sent = self._signal(left, signal.SIGKILL)
            survivors = _wait_gone(left, time.monotonic() + self.settings.kill_timeout_s)
            killed = sorted(p.pid for p in sent if p not in survivors)
        removed, not_removed = self._remove_dirs(keep_logs)
        return StopResult(daemon_pid=daemon_pid, quit_ok=quit_ok, terminated=tuple(terminated), killed=tuple(killed),
                          survivors=tuple(sorted(p.pid for p in survivors)), removed=removed,
                          not_removed=not_removed)

    @staticmethod
    def _signal(procs: Iterable[psutil.Process], signum: int) -> list[psutil.Process]:
        """Signal each process that is still the same process; return those signalled or unsignallable."""
        sent = []
        for p in procs:
            if not procinfo.running(p):
                continue
            try:
                p.send_signal(signum)  # psutil refuses a PID that now names another process
            except psutil.NoSuchProcess:
                continue
            except psutil.AccessDenied:
                pass  # not ours to kill: it stays in the list and is reported if it survives
            sent.append(p)
        return sent
