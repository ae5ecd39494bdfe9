"""The node's append-only spool: file per node and day, whole lines under concurrency, crash fragments."""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
from pathlib import Path

import pytest

from slurm_gpushare.accounting.record import UsageRecord
from slurm_gpushare.accounting.spool import Spool, SpoolError, append_lines, complete_size, spool_files
from slurm_gpushare.errors import InputError
from tests.accounting.test_record import record
from tests.conftest import DEADLINE, wait_until

DAY = 1_764_547_200  # 2025-12-01T00:00:00Z


def test_one_file_per_node_and_utc_day(tmp_path):
    now = [DAY + 3600.0]
    sp = Spool(tmp_path / "spool", node="a100-1", clock=lambda: now[0])
    assert sp.append([]) is None and not (tmp_path / "spool").exists()
    p1 = sp.append([record(job_id="1"), record(job_id="1", gpu_index=1, gpu_uuid="GPU-1")])
    now[0] = DAY + 86400 + 5
    p2 = sp.append([record(job_id="2")])
    assert p1.name == "a100-1.2025-12-01.jsonl" and p2.name == "a100-1.2025-12-02.jsonl"
    assert sp.files() == [p1, p2] == spool_files(tmp_path / "spool")
    assert [UsageRecord.from_json(ln).job_id for ln in p1.read_text().splitlines()] == ["1", "1"]
    assert oct(p1.stat().st_mode & 0o777) == "0o600"


def test_bad_node_names_and_missing_directories_are_refused(tmp_path):
    for name in ("", "../x", ".hidden", "a b"):
        with pytest.raises(InputError):
            Spool(tmp_path, node=name)
    with pytest.raises(InputError, match="does not exist"):
        spool_files(tmp_path / "nope")


def test_an_unwritable_spool_is_a_loud_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SpoolError) as e:
        Spool(blocker / "spool", node="n").append([record()])
    assert str(blocker / "spool") in str(e.value)


def _writer(directory: str, writer: int, jobs: int) -> None:
    sp = Spool(directory, node="n1", clock=lambda: DAY)
    for j in range(jobs):
        # one job on two GPUs: both lines in one write
        job = f"{writer}{j:05d}"
        sp.append([record(job_id=job, gpu_index=0, gpu_uuid="GPU-0", user="u" * 300),
                   record(job_id=job, gpu_index=1, gpu_uuid="GPU-1", user="u" * 300)])


def test_concurrent_epilogs_lose_no_line(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 150)) for w in range(1, 7)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    (f,) = spool_files(tmp_path)
    lines = f.read_bytes().split(b"\n")
    assert lines[-1] == b""
    keys = [UsageRecord.from_json(ln).key for ln in lines[:-1]]  # every line is whole
    assert len(keys) == len(set(keys)) == 6 * 150 * 2


def test_a_writer_that_died_mid_line_costs_only_its_own_line(tmp_path):
    sp = Spool(tmp_path, node="n1", clock=lambda: DAY)
    path = sp.append([record(job_id="1")])
    with open(path, "ab") as f:  # what a killed writer leaves: half a line, no newline
        f.write(record(job_id="2").to_json().encode()[:100])
    sp.append([record(job_id="3")])
    lines = path.read_text().split("\n")
    assert len(lines) == 4 and lines[-1] == ""
    assert UsageRecord.from_json(lines[0]).job_id == "1"
    assert UsageRecord.from_json(lines[2]).job_id == "3"  # intact, on its own line
    assert len(lines[1]) == 100


def _blocked_on(path: Path, pid: int) -> bool:
    """``pid`` waits for a lock on ``path``: a ``->`` line of /proc/locks (proc(5)) with its pid and the
    file's ``MAJOR:MINOR:INODE``."""
    inode = path.stat().st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        f = line.split()
        if len(f) > 6 and f[1] == "->" and f[5] == str(pid) and f[6].rsplit(":", 1)[-1] == str(inode):
            return True
    return False


def test_complete_size_waits_for_a_writer(tmp_path):
    path = tmp_path / "x.jsonl"
    append_lines(path, b'{"a":1}\n')
    assert complete_size(path) == 8
    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=lambda: q.put(complete_size(path)))
    p.start()
    # the reader is waiting for the lock now: /proc/locks shows its request blocked ("->") on the file
    wait_until(lambda: _blocked_on(path, p.pid), "the reader blocked on the writer's lock")
    os.write(fd, b'{"b":2}\n')  # the "writer" finishes its line, then lets go
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    assert q.get(timeout=DEADLINE) == 16
    p.join(DEADLINE)
    assert json.loads(path.read_text().splitlines()[1]) == {"b": 2}


def test_the_spool_is_private(tmp_path):
    """Spool lines name users and accounts: the directory is 0700 and its files 0600 (umask 022)."""
    old = os.umask(0o022)
    try:
        path = Spool(tmp_path / "spool" / "acct", node="n1", clock=lambda: DAY).append([record()])
    finally:
        os.umask(old)
    assert (path.parent.stat().st_mode & 0o777, path.stat().st_mode & 0o777) == (0o700, 0o600)
