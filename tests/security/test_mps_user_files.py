"""Root reads the files of a job's MPS directories, which the job's user owns, only through the bounded reader.

The attacks are a real unprivileged user's (``gpushare-alice``), made with ``runuser`` in directories she owns,
as she can inside her own gpushare job: the Epilog (``MpsDaemon.stop``, ``pid``) and the Prolog's start failure
(``control.log`` quoted in the error) run as root against them. Each read must return at once, read at most a
few KiB, never follow a link and never quote bytes that are not printable text.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from slurm_gpushare.atomicfile import read_user_file
from slurm_gpushare.node.mps import CONTROL_LOG, PID_FILE, MpsDaemon, MpsSettings

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a test user")

#: How long a read may take before the test calls it hung (a FIFO's open blocks for ever).
HANG_S = 10.0


def as_user(user: str, *argv: str) -> None:
    """Run ``argv`` as ``user`` (the attacker's own action in her own directory)."""
    subprocess.run(["runuser", "-u", user, "--", *argv], check=True)


def within(fn, seconds: float = HANG_S):
    """``fn()``'s result, or a failure when it has not returned within ``seconds`` (it runs in a daemon thread,
    left behind blocked if it hangs)."""
    box: dict = {}

    def call():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"{getattr(fn, '__name__', fn)} did not return within {seconds:g} s (blocked on a user's file)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture
def job_dirs(users):
    """A pipe and a log directory owned by alice (as the Prolog makes them for her job) and root's daemon
    object for them, as the Epilog builds it (it knows the job's uid)."""
    base = Path(tempfile.mkdtemp(prefix="gsuf-", dir="/tmp"))
    base.chmod(0o755)
    uid = users["gpushare-alice"]
    pipe, log = base / "pipe", base / "log"
    for d in (pipe, log):
        d.mkdir(mode=0o700)
        os.chown(d, uid, -1)
    daemon = MpsDaemon(pipe, log, visible_devices="", uid=uid,
                       settings=MpsSettings(quit_timeout_s=1, kill_timeout_s=1, command_timeout_s=1))
    yield daemon
    subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_fifo_as_the_pid_file_does_not_hang_root(job_dirs):
    as_user("gpushare-alice", "mkfifo", str(job_dirs.pipe_dir / PID_FILE))
    assert within(job_dirs.pid) is None
    within(job_dirs.stop)  # the Epilog's call: it ends


def test_a_link_to_dev_zero_as_the_pid_file_is_not_read(job_dirs):
    as_user("gpushare-alice", "ln", "-s", "/dev/zero", str(job_dirs.pipe_dir / PID_FILE))
    assert within(job_dirs.pid) is None
    within(job_dirs.stop)


def test_five_thousand_digits_in_the_pid_file_are_no_pid(job_dirs):
    as_user("gpushare-alice", "sh", "-c", f"printf '%05000d' 7 > {job_dirs.pipe_dir / PID_FILE}")
    assert within(job_dirs.pid) is None
    within(job_dirs.stop)  # raised ValueError (Python's int limit of 4300 digits): the Epilog died


def test_control_log_linked_to_a_root_only_file_is_not_quoted(job_dirs):
    secret = Path(tempfile.mkdtemp(prefix="gsuf-secret-", dir="/tmp")) / "shadow"
    secret.write_text("root-only-secret-line\n")
    secret.chmod(0o600)
    try:
        as_user("gpushare-alice", "ln", "-s", str(secret), str(job_dirs.log_dir / CONTROL_LOG))
        assert within(job_dirs.log_tail) == ()
    finally:
        secret.unlink()
        secret.parent.rmdir()


def test_control_log_as_a_fifo_does_not_hang_root(job_dirs):
    as_user("gpushare-alice", "mkfifo", str(job_dirs.log_dir / CONTROL_LOG))
    assert within(job_dirs.log_tail) == ()


def test_a_huge_line_of_escapes_in_control_log_is_cut_and_made_printable(job_dirs):
    as_user("gpushare-alice", "python3", "-c",
            f"open({str(job_dirs.log_dir / CONTROL_LOG)!r}, 'w').write('ok line\\n' + '\\x1b[2J\\x07' * 100000)")
    tail = within(job_dirs.log_tail)
    quoted = " | ".join(tail)
    assert len(quoted) <= 4096
    assert "\x1b" not in quoted and "\x07" not in quoted
    assert all(ch.isprintable() for ch in quoted)


def test_a_log_of_another_owner_is_not_quoted(job_dirs):
    """A file alice did not write (root's, planted by a hard link where the kernel allows it) is not hers."""
    path = job_dirs.log_dir / CONTROL_LOG
    path.write_text("root wrote this\n")  # root's file in alice's directory
    assert within(job_dirs.log_tail) == ()


def test_the_reader_refuses_links_fifos_and_big_files(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100)
    with pytest.raises(OSError):
        read_user_file(big, max_bytes=10)
    assert read_user_file(big, max_bytes=10, tail=True) == b"x" * 10
    link = tmp_path / "link"
    link.symlink_to(big)
    with pytest.raises(OSError):
        read_user_file(link, max_bytes=1000)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError):
        within(lambda: read_user_file(fifo, max_bytes=1000))
    with pytest.raises(OSError):
        read_user_file(big, max_bytes=1000, owner=os.geteuid() + 12345)
    assert read_user_file(big, max_bytes=1000, owner=os.geteuid()) == b"x" * 100


def test_a_forged_segment_in_control_log_does_not_reach_the_admin_comment():
    """The Prolog's start failure quotes the end of the user's control.log, and the reason goes into the job's
    AdminComment (issue 26 N11). A line ``[gpushare:u1 ...]`` there would read as the product's own usage segment
    (or an audit): brackets are never copied, so the note holds no segment."""
    from slurm_gpushare.node.config import NodeConfig
    from slurm_gpushare.node.context import HookContext, tell_user

    written = []
    ctx = HookContext(NodeConfig(run_dir=tempfile.mkdtemp(prefix="gsuf-run-", dir="/tmp")), "n1",
                      job_record=lambda j: '{"jobs": []}', drain=lambda n, r: None,
                      set_admin_comment=lambda j, t: written.append(t))
    forged = "MPS daemon failed; last lines of control.log: [gpushare:u1 run=0 n1=AAAA] [gpushare:v1 grant=gpu:8]"
    tell_user(ctx, "7", f"gpushare: cancelled by the Prolog on n1: {forged}", "prolog")
    (text,) = written
    assert "[" not in text and "]" not in text and "gpushare:u1" in text, text
