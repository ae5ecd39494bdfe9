"""MpsDaemon against the stand-in ``slurm_gpushare_dev/fake_mps/nvidia-cuda-mps-control`` (see its README.md).

Every test works in its own short directory under /tmp (a Unix socket path has at most 107 bytes) and
the fixture stops what the test started; leftover stand-in processes are found by PID through /proc
(command line and ``CUDA_MPS_PIPE_DIRECTORY``), never by name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from slurm_gpushare.errors import HardwareError, InputError
from slurm_gpushare.node.mps import (
    CONTROL_SOCKET,
    PID_FILE,
    MpsDaemon,
    MpsError,
    MpsSettings,
    Setting,
    StopResult,
    pinned_mem_value,
)
from slurm_gpushare.procinfo import pid_alive
from slurm_gpushare_dev.cluster import MPS_STANDIN
from tests.conftest import DEADLINE, wait_until

FAKE = MPS_STANDIN
#: A PATH every user can search, so that ``#!/usr/bin/env python3`` also works as an unprivileged user.
SYSTEM_PATH = "/usr/bin:/bin"
#: Waits for what a working daemon does (start, answer, quit, exit on a signal) are generous: they end when it
#: happened. A test of a timeout that expires (a hung or stubborn daemon) sets that timeout short itself.
SETTINGS = MpsSettings(control_binary=str(FAKE), start_timeout_s=DEADLINE, quit_timeout_s=DEADLINE,
                       kill_timeout_s=DEADLINE, command_timeout_s=DEADLINE)
GPU = "GPU-5f0d6a3e-9c1b-4b7e-8a51-2d3c4e5f6a7b"
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


# --- helpers ---------------------------------------------------------------------------------------


def running(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    return pid_alive(pid)


def stand_in_pids(base: Path) -> list[int]:
    """Running stand-in processes (daemon, server stand-in) whose pipe directory lies under ``base``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        argv, environ = proc.info["cmdline"] or [], proc.info["environ"] or {}
        if str(FAKE) in argv and environ.get("CUDA_MPS_PIPE_DIRECTORY", "").startswith(str(base)) \
                and running(proc.pid):
            found.append(proc.pid)
    return sorted(found)


def commands(daemon: MpsDaemon) -> list[dict]:
    path = daemon.log_dir / "commands.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def logged_pids(log_dir: Path) -> set[int]:
    """PIDs of the daemon and of its server stand-in, from control.log."""
    text = (log_dir / "control.log").read_text()
    return {int(p) for p in re.findall(r"Control +(\d+)\]", text)} | \
        {int(p) for p in re.findall(r"Starting new server (\d+)", text)}


class Env:
    """A short /tmp directory and the daemons of one test; stops them and checks nothing is left."""

    def __init__(self):
        self.base = Path(tempfile.mkdtemp(prefix="gsmps-", dir="/tmp"))
        self.base.chmod(0o755)  # a daemon of another user must reach its directories inside
        self.daemons: list[MpsDaemon] = []

    def daemon(self, name: str = "a", *, settings: MpsSettings = SETTINGS, mode: str | None = None,
               env: dict[str, str] | None = None, **kwargs) -> MpsDaemon:
        extra = {"PATH": SYSTEM_PATH, "GPUSHARE_FAKE_MPS_LIFETIME_S": "120", **(env or {})}
        if mode is not None:
            extra["GPUSHARE_FAKE_MPS_MODE"] = mode
        kwargs.setdefault("visible_devices", GPU)
        d = MpsDaemon(self.base / name / "pipe", self.base / name / "log", settings=settings, extra_env=extra,
                      **kwargs)
        self.daemons.append(d)
        return d

    def close(self) -> list[int]:
        for d in self.daemons:
            d.stop()
        left = stand_in_pids(self.base)
        for pid in left:  # last resort, by PID: only stand-ins of this test's directory
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.base, ignore_errors=True)
        return left


@pytest.fixture
def env():
    e = Env()
    yield e
    assert e.close() == [], "a test left stand-in processes running"


# --- start, commands, stop ---------------------------------------------------------------------------


def test_start_waits_until_the_daemon_answers(env):
    d = env.daemon()
    assert not d.alive() and d.pid() is None
    pid = d.start()
    assert d.pid() == pid and d.alive()
    assert (d.pipe_dir / PID_FILE).read_text().strip() == str(pid)
    assert (d.pipe_dir / CONTROL_SOCKET).exists()
    for path in (d.pipe_dir, d.log_dir):
        st = path.stat()
        assert (st.st_mode & 0o777, st.st_uid) == (0o700, os.geteuid())
    server = d.command("get_server_list")
    assert server.isdigit() and running(int(server)) and int(server) != pid
    received = commands(d)
    assert [c["command"] for c in received] == ["get_server_list", "get_server_list"]  # readiness check, then ours
    assert all(c["cuda_visible_devices"] == GPU and c["uid"] == os.geteuid() for c in received)
    assert "Starting control daemon" in (d.log_dir / "control.log").read_text()


def test_limits_are_set_and_read_back(env):
    d = env.daemon()
    d.start()
    d.set_pinned_mem_limit(0, 10240)
    d.set_pinned_mem_limit(1, 1536)
    d.set_active_thread_percentage(50)
    d.set_active_thread_percentage(12.5)
    d.set_client_priority(1)
    sent = [(c["command"], c["args"]) for c in commands(d) if c["command"].startswith("set_")]
    assert sent == [
        ("set_default_device_pinned_mem_limit", ["0", "10G"]),
        ("set_default_device_pinned_mem_limit", ["1", "1536M"]),
        ("set_default_active_thread_percentage", ["50"]),
        ("set_default_active_thread_percentage", ["12.5"]),
        ("set_default_client_priority", ["1"]),
    ]
    assert d.command("get_default_device_pinned_mem_limit 0") == "10G"
    assert d.command("get_default_device_pinned_mem_limit 1") == "1536M"
    assert d.command("get_default_active_thread_percentage") == "12.5"
    assert d.command("get_default_client_priority") == "1"


def test_start_applies_its_settings_in_the_first_answered_front_end_run(env):
    d = env.daemon()
    d.start([d.pinned_mem_limit(0, 10240), d.pinned_mem_limit(1, 1536), d.active_thread_percentage(25),
             d.client_priority(1, optional=True)])
    received = commands(d)
    # the readiness probe is the batch: every set, then every get, from one front-end process
    assert [c["command"] for c in received] == [
        "set_default_device_pinned_mem_limit", "set_default_device_pinned_mem_limit",
        "set_default_active_thread_percentage", "set_default_client_priority",
        "get_default_device_pinned_mem_limit", "get_default_device_pinned_mem_limit",
        "get_default_active_thread_percentage", "get_default_client_priority"]
    assert len({c["pid"] for c in received}) == 1
    assert d.command("get_default_device_pinned_mem_limit 1") == "1536M"
    assert d.command("get_default_active_thread_percentage") == "25.0"


def test_a_refused_setting_in_a_batch_is_retried_alone_and_named(env):
    d = env.daemon()
    d.start()
    bad = Setting("set_default_client_priority 7", "get_default_client_priority", lambda back: back == "7")
    with pytest.raises(MpsError, match="set_default_client_priority 7 was not applied: the daemon reports '0'"):
        d.configure([d.pinned_mem_limit(0, 2048), bad])
    # the good one took; the batch and then each setting alone ran
    assert d.command("get_default_device_pinned_mem_limit 0") == "2G"
    pids = [c["pid"] for c in commands(d) if c["command"] == "set_default_device_pinned_mem_limit"]
    assert len(pids) == 2 and pids[0] != pids[1]


def test_an_optional_setting_the_daemon_refuses_is_no_error(env):
    d = env.daemon()
    d.start([d.pinned_mem_limit(0, 4096),
             Setting("set_default_client_priority 7", "get_default_client_priority", lambda b: b == "7",
                     optional=True)])
    assert d.command("get_default_device_pinned_mem_limit 0") == "4G"
    assert d.command("get_default_client_priority") == "0"


def test_a_setting_that_does_not_take_fails_start_with_the_command(env):
    d = env.daemon()
    # a read-back that never shows the value (a daemon that ignores the command)
    with pytest.raises(MpsError, match="set_default_active_thread_percentage 50 was not applied: the daemon "
                                       "reports '50.0'"):
        d.start([Setting("set_default_active_thread_percentage 50", "get_default_active_thread_percentage",
                         lambda b: b == "60.0")])
    d.stop()


def test_a_running_servers_limit_is_set_and_read_back(env):
    d = env.daemon()
    d.start()
    (server,) = d.server_pids()
    d.set_server_pinned_mem_limit(server, 0, 30720)
    sent = [(c["command"], c["args"]) for c in commands(d) if c["command"] == "set_device_pinned_mem_limit"]
    assert sent == [("set_device_pinned_mem_limit", [str(server), "0", "30G"])]
    assert d.command(f"get_device_pinned_mem_limit {server} 0") == "30G"


def test_a_server_limit_the_daemon_does_not_apply_is_an_error(env):
    d = env.daemon()
    d.start()
    (server,) = d.server_pids()
    # the front end exits 0 on a rejected command: only the read-back tells
    with pytest.raises(MpsError, match=f"set_device_pinned_mem_limit {server + 1} 0 2G was not applied"):
        d.set_server_pinned_mem_limit(server + 1, 0, 2048)


@pytest.mark.parametrize("mib, value", [(10240, "10G"), (1536, "1536M"), (1024, "1G"), (1, "1M"),
                                         (1048576, "1024G"), (81559, "81559M")])
def test_pinned_mem_value_is_whole_g_or_m(mib, value):
    assert pinned_mem_value(mib) == value


@pytest.mark.parametrize("mib", [0, -1, 1.5, True, "10G"])
def test_pinned_mem_value_refuses_non_mib(mib):
    with pytest.raises(InputError):
        pinned_mem_value(mib)


def test_stop_quits_removes_the_directories_and_leaves_no_process(env):
    d = env.daemon()
    pid = d.start()
    server = int(d.command("get_server_list"))
    result = d.stop()
    assert result == StopResult(daemon_pid=pid, quit_ok=True, removed=(str(d.pipe_dir), str(d.log_dir)))
    assert result.clean
    assert not running(pid) and not running(server)
    assert not d.pipe_dir.exists() and not d.log_dir.exists()
    assert stand_in_pids(env.base) == []


def test_stop_can_keep_the_logs(env):
    d = env.daemon()
    d.start()
    result = d.stop(keep_logs=True)
    assert result.removed == (str(d.pipe_dir),)
    assert (d.log_dir / "control.log").exists()
    assert [c["command"] for c in commands(d)][-1] == "quit"


def test_stop_twice_is_harmless(env):
    d = env.daemon()
    d.start()
    assert d.stop().quit_ok
    again = d.stop()
    assert again == StopResult(daemon_pid=None, quit_ok=False)
    assert again.clean
    never_started = env.daemon("b")
    assert never_started.stop() == StopResult(daemon_pid=None, quit_ok=False)


def test_a_second_start_is_refused_while_running(env):
    d = env.daemon()
    pid = d.start()
    with pytest.raises(MpsError, match=f"already runs on this pipe directory \\(pid {pid}\\)"):
        env.daemon().start()
    assert d.pid() == pid


def test_client_env_points_tasks_at_the_daemon(env):
    d = env.daemon()
    assert d.client_env() == {"CUDA_MPS_PIPE_DIRECTORY": str(d.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(d.log_dir)}
    daemon_env = d.env()
    assert daemon_env["CUDA_VISIBLE_DEVICES"] == GPU and daemon_env["PATH"] == SYSTEM_PATH
    assert "SLURM_JOB_ID" not in daemon_env and "HOME" not in daemon_env


# --- misbehaving daemons -----------------------------------------------------------------------------


def test_crash_on_start_is_an_error_quoting_the_log(env):
    d = env.daemon(mode="crash-on-start")
    with pytest.raises(MpsError) as err:
        d.start()
    text = str(err.value)
    assert isinstance(err.value, HardwareError)
    assert str(FAKE) in text and str(d.pipe_dir) in text
    assert "exited while starting" in text
    assert "crash-on-start: exiting before creating the control socket" in text
    assert not d.pipe_dir.exists()
    assert (d.log_dir / "control.log").exists()  # kept for the administrator
    assert not any(running(p) for p in logged_pids(d.log_dir))


def test_slow_start_within_the_timeout_is_fine(env):
    d = env.daemon(mode="slow-start", env={"GPUSHARE_FAKE_MPS_SLOW_START_S": "1"})
    t0 = time.monotonic()
    pid = d.start()
    assert time.monotonic() - t0 >= 1.0
    assert d.command("get_server_list")
    assert d.stop().daemon_pid == pid


def test_slow_start_beyond_the_timeout_fails_and_leaves_nothing_running(env):
    mode_file = env.base / "mode"
    mode_file.write_text("slow-start\n")  # the mode file wins over GPUSHARE_FAKE_MPS_MODE
    d = env.daemon(settings=MpsSettings(control_binary=str(FAKE), start_timeout_s=0.8, quit_timeout_s=DEADLINE,
                                        kill_timeout_s=DEADLINE),
                   mode="normal", env={"GPUSHARE_FAKE_MPS_MODE_FILE": str(mode_file)})
    with pytest.raises(MpsError, match=r"not ready within 0.8 s \(pid \d+ runs but has no control socket yet\)"):
        d.start()
    pids = logged_pids(d.log_dir)
    assert len(pids) == 2  # the daemon and its server stand-in
    assert not any(running(p) for p in pids)
    assert stand_in_pids(env.base) == []
    assert not d.pipe_dir.exists()


def test_ignore_quit_escalates_to_sigkill_and_reports_it(env):
    # quit and SIGTERM are ignored: both waits expire (1 s, 5 s); the server stand-in has the 5 s to exit
    d = env.daemon(settings=MpsSettings(control_binary=str(FAKE), start_timeout_s=DEADLINE, quit_timeout_s=1.0,
                                        kill_timeout_s=5.0, command_timeout_s=DEADLINE), mode="ignore-quit")
    pid = d.start()
    server = int(d.command("get_server_list"))
    result = d.stop()
    assert not result.quit_ok
    assert result.killed == (pid,)  # it ignores SIGTERM too
    assert result.terminated == (server,)
    assert result.survivors == () and result.clean
    assert not running(pid) and not running(server)
    assert not d.pipe_dir.exists() and not d.log_dir.exists()


def test_a_hung_daemon_times_out_commands_and_is_stopped_by_signal(env):
    d = env.daemon(settings=MpsSettings(control_binary=str(FAKE), start_timeout_s=2.0, quit_timeout_s=0.5,
                                        kill_timeout_s=DEADLINE, command_timeout_s=0.5), mode="hang")
    for path in (d.pipe_dir, d.log_dir):
        path.mkdir(parents=True, mode=0o700)
    # started by hand: start() itself would fail its readiness check, which the next test covers
    subprocess.run([str(FAKE), "-d"], env=d.env(), check=True, timeout=DEADLINE)
    wait_until(lambda: (d.pipe_dir / CONTROL_SOCKET).exists(), "the control socket")
    pid = d.pid()
    assert pid is not None
    with pytest.raises(MpsError) as err:
        d.command("get_server_list")
    assert "command 'get_server_list' got no answer within 0.5 s" in str(err.value)
    assert err.value.source == f"MPS control daemon {d.pipe_dir}"
    result = d.stop()
    assert not result.quit_ok
    assert pid in result.terminated and result.killed == () and result.clean
    assert not running(pid)


def test_a_hung_daemon_fails_start(env):
    d = env.daemon(settings=MpsSettings(control_binary=str(FAKE), start_timeout_s=1.0, quit_timeout_s=0.5,
                                        kill_timeout_s=DEADLINE, command_timeout_s=0.5), mode="hang")
    with pytest.raises(MpsError, match="not ready within 1 s .*got no answer"):
        d.start()
    assert not any(running(p) for p in logged_pids(d.log_dir))


# --- stale state -------------------------------------------------------------------------------------


def test_stale_pid_file_naming_an_unrelated_process_is_never_signalled(env):
    d = env.daemon()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        d.pipe_dir.mkdir(parents=True)
        (d.pipe_dir / PID_FILE).write_text(str(sleeper.pid))
        assert d.pid() is None
        result = d.stop()
        assert result == StopResult(daemon_pid=None, quit_ok=False, removed=(str(d.pipe_dir),))
        time.sleep(0.1)
        assert sleeper.poll() is None and running(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_stale_pid_file_naming_another_pipe_directorys_daemon_is_never_signalled(env):
    other = env.daemon("b")
    other_pid = other.start()
    d = env.daemon("a")
    d.pipe_dir.mkdir(parents=True)
    (d.pipe_dir / PID_FILE).write_text(str(other_pid))  # the right binary, the right user, not ours
    assert d.pid() is None
    assert d.stop().daemon_pid is None
    assert other.alive() and other.command("get_server_list")


def test_start_replaces_a_crashed_daemons_leftovers(env):
    d = env.daemon()
    d.pipe_dir.mkdir(parents=True, mode=0o700)
    (d.pipe_dir / PID_FILE).write_text("999999999")
    (d.pipe_dir / CONTROL_SOCKET).write_text("")
    pid = d.start()
    assert (d.pipe_dir / PID_FILE).read_text() == str(pid)


# --- bad input and bad directories ---------------------------------------------------------------------


def test_bad_arguments_are_input_errors(env):
    with pytest.raises(InputError, match="not an absolute path"):
        MpsDaemon("relative/pipe", "/tmp/log", visible_devices=GPU)
    with pytest.raises(InputError, match=r"control socket path has 1\d\d bytes, Linux allows 107"):
        MpsDaemon("/tmp/" + "x" * 100, "/tmp/log", visible_devices=GPU)
    with pytest.raises(InputError, match="empty CUDA_VISIBLE_DEVICES"):
        env.daemon(visible_devices=" ").start()  # an object that only stops may have none
    with pytest.raises(InputError, match="extra_env may not set CUDA_VISIBLE_DEVICES"):
        env.daemon(env={"CUDA_VISIBLE_DEVICES": "0"})
    with pytest.raises(InputError, match="positive number of seconds"):
        MpsSettings(quit_timeout_s=0)
    d = env.daemon()
    for call in (lambda: d.command("quit\nget_server_list"), lambda: d.command("  "),
                 lambda: d.set_active_thread_percentage(0), lambda: d.set_active_thread_percentage(101),
                 lambda: d.set_pinned_mem_limit(-1, 1024), lambda: d.set_pinned_mem_limit(0, 0),
                 lambda: d.set_client_priority(2)):
        with pytest.raises(InputError):
            call()
    assert commands(d) == []


def test_unprivileged_caller_cannot_name_another_user():
    if os.geteuid() == 0:
        # only the effective ids change: the interpreter stays where root put it
        code = ("import os\n"
                "from slurm_gpushare.node.mps import MpsDaemon\n"
                "os.setegid(65534); os.seteuid(65534)\n"
                "try:\n    MpsDaemon('/tmp/p', '/tmp/l', visible_devices='0', uid=0)\n"
                "except Exception as e:\n    print(type(e).__name__, e)\n")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent.parent)
        assert "InputError" in proc.stdout and "only root can switch users" in proc.stdout, proc.stderr
    else:
        with pytest.raises(InputError, match="only root can switch users"):
            MpsDaemon("/tmp/p", "/tmp/l", visible_devices="0", uid=0)


def test_command_without_a_daemon_names_the_failure(env):
    d = env.daemon()
    d.pipe_dir.mkdir(parents=True)
    with pytest.raises(MpsError) as err:
        d.command("get_server_list")
    assert "command 'get_server_list' failed with exit status 1: Cannot find MPS control daemon process" \
        in str(err.value)
    assert str(FAKE) in str(err.value)


def test_a_flood_from_a_program_in_the_pipe_directory_is_cut_and_named(env):
    """The job's user owns the pipe directory: a program of theirs may listen on the control socket in place of
    the daemon and answer megabytes. Root (the monitor's read-back, the Epilog) reads at most 64 KiB of the front
    end's answer and fails the command, naming why; it kept all of it in memory."""
    import socket
    import threading

    d = env.daemon()
    d.pipe_dir.mkdir(parents=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(d.pipe_dir / "control"))
    listener.listen(4)
    sent = []

    def flood():
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            try:
                for _ in range(64):  # 4 MiB
                    conn.sendall(b"9" * 65536)
                    sent.append(65536)
            except OSError:
                pass

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    try:
        with pytest.raises(MpsError, match=r"command 'get_server_list' printed more than 65536 bytes on stdout: "
                                           r"not an answer of the MPS control daemon"):
            d.command("get_server_list")
    finally:
        listener.close()
        t.join(DEADLINE)


def test_missing_binary_is_an_error_and_leaves_only_the_logs(env):
    d = env.daemon(settings=MpsSettings(control_binary=str(env.base / "nvidia-cuda-mps-control")))
    with pytest.raises(MpsError, match="cannot run .*nvidia-cuda-mps-control -d'"):
        d.start()
    assert not d.pipe_dir.exists() and d.log_dir.is_dir()


def test_a_symlinked_pipe_directory_is_refused(env):
    d = env.daemon()
    target = env.base / "elsewhere"
    target.mkdir(mode=0o700)
    d.pipe_dir.parent.mkdir()
    d.pipe_dir.symlink_to(target)
    with pytest.raises(MpsError, match="is not a directory \\(a symbolic link is refused\\)"):
        d.start()
    assert target.is_dir()


# --- another user --------------------------------------------------------------------------------------


@as_root
def test_daemon_and_commands_run_as_the_given_user(env):
    d = env.daemon(uid=65534, gid=65534)
    pid = d.start()
    status = Path(f"/proc/{pid}/status").read_text()
    assert re.search(r"^Uid:\s+65534\s+65534", status, re.M) and re.search(r"^Gid:\s+65534\s+65534", status, re.M)
    assert re.search(r"^Groups:\s*$", status, re.M)  # root's supplementary groups are dropped
    for path in (d.pipe_dir, d.log_dir):
        st = path.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (65534, 65534, 0o700)
    d.set_pinned_mem_limit(0, 2048)
    assert {c["uid"] for c in commands(d)} == {65534}
    result = d.stop()
    assert result.quit_ok and result.clean and not running(pid)


@as_root
def test_root_stops_a_users_daemon_knowing_only_the_directories(env):
    d = env.daemon(uid=65534, gid=65534)
    pid = d.start()
    server = int(d.command("get_server_list"))
    epilog = MpsDaemon(d.pipe_dir, d.log_dir, settings=SETTINGS, visible_devices="")
    assert epilog.pid() == pid
    result = epilog.stop()
    assert (result.daemon_pid, result.quit_ok, result.clean) == (pid, True, True)
    assert not running(pid) and not running(server)
    assert not d.pipe_dir.exists() and not d.log_dir.exists()


@as_root
def test_an_existing_directory_of_another_user_is_refused(env):
    d = env.daemon(uid=65534, gid=65534)
    d.pipe_dir.mkdir(parents=True, mode=0o700)  # owned by root
    with pytest.raises(MpsError, match="is owned by uid 0, not by the daemon's uid 65534"):
        d.start()


# --- the stand-in itself -----------------------------------------------------------------------------


def test_stand_in_front_end_speaks_the_protocol(env):
    d = env.daemon()
    d.start()

    def front_end(text: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(FAKE)], input=text, env=d.env(), capture_output=True, text=True, timeout=DEADLINE)

    proc = front_end("get_default_device_pinned_mem_limit 0\nbogus 1\nset_default_device_pinned_mem_limit 0 10T\n"
                     "get_default_active_thread_percentage\n")
    assert proc.returncode == 0  # rejected commands are answered on stdout, exit status 0
    assert proc.stdout.splitlines() == ["0", "Invalid command: bogus 1",
                                        "Invalid command: set_default_device_pinned_mem_limit 0 10T", "100.0"]
    assert front_end("quit -t 5\n").returncode == 0
    wait_until(lambda: not d.alive(), "the daemon gone after quit")
    proc = front_end("get_server_list\n")
    assert proc.returncode == 1 and "Cannot find MPS control daemon process" in proc.stdout
    usage = subprocess.run([str(FAKE), "-x"], env=d.env(), capture_output=True, text=True, timeout=DEADLINE)
    assert usage.returncode == 2


def test_stand_in_runs_in_the_foreground(env):
    d = env.daemon()
    for path in (d.pipe_dir, d.log_dir):
        path.mkdir(parents=True, mode=0o700)
    proc = subprocess.Popen([str(FAKE), "-f"], env=d.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (d.pipe_dir / CONTROL_SOCKET).exists(), "the control socket")
        assert d.pid() == proc.pid
        assert d.command("quit") == ""
        assert proc.wait(timeout=DEADLINE) == 0
        assert not (d.pipe_dir / PID_FILE).exists() and not (d.pipe_dir / CONTROL_SOCKET).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
