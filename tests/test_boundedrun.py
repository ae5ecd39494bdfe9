"""run_bounded: a program's output is read up to a bound, within a deadline, and the program never outlives it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from slurm_gpushare.boundedrun import OutputTooLarge, run_bounded
from slurm_gpushare.procinfo import pid_alive
from tests.conftest import wait_until

PY = sys.executable


def test_input_reaches_the_program_and_its_answer_and_status_come_back():
    done = run_bounded([PY, "-c", "import sys; d = sys.stdin.read(); print(d.upper()); "
                        "print('e', file=sys.stderr); sys.exit(3)"], input="get_server_list\n", timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "GET_SERVER_LIST\n\n", "e\n")


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_flood_on_either_stream_is_cut_at_the_bound_and_the_program_killed(tmp_path, stream):
    pid_file = tmp_path / "pid"
    code = (f"import os, sys; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
            f"[sys.{stream}.write('x' * 65536) for _ in iter(int, 1)]")
    with pytest.raises(OutputTooLarge, match=f"more than 1000 bytes on {stream}"):
        run_bounded([PY, "-c", code], timeout=30, max_bytes=1000)
    assert not pid_alive(int(pid_file.read_text()))


def test_a_program_that_does_not_answer_is_killed_at_the_deadline(tmp_path):
    pid_file = tmp_path / "pid"
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_bounded([PY, "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
                     "time.sleep(60)"], timeout=1.5)
    assert time.monotonic() - start < 30
    assert not pid_alive(int(pid_file.read_text()))


def test_a_child_that_keeps_the_output_open_does_not_hold_the_caller_past_the_deadline(tmp_path):
    """subprocess.run waits for the pipes to close after its timeout's kill, without a limit: a grandchild that
    inherited them held it for as long as the grandchild lived."""
    child = tmp_path / "child"
    code = (f"import os, subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(30)']); open({str(child)!r}, 'w').write(str(p.pid)); print('ok', flush=True)")
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_bounded([PY, "-c", code], timeout=2)
    assert time.monotonic() - start < 15
    subprocess.run(["kill", child.read_text()], check=False)


def test_input_larger_than_a_pipe_is_fed_while_the_output_is_read():
    """The input is written as the program takes it, beside reading its output: a program that prints 200 KB before
    it reads 300 KB of input finishes (a blocking write of the input first deadlocked with it)."""
    done = run_bounded(["sh", "-c", "head -c 200000 /dev/zero; wc -c"], input="y" * 300000, timeout=30,
                       max_bytes=10**6)
    assert done.returncode == 0 and len(done.stdout) == 200000 + len("300000\n")


def test_a_grandchild_that_keeps_the_pipes_is_killed_with_the_program(tmp_path):
    """The program runs in a process group of its own; on a timeout the group goes, so a child that kept the pipes
    does not outlive the call."""
    pid_file = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        run_bounded(["sh", "-c", f"(sleep 37 & echo $! > {pid_file}; wait) & sleep 60"], timeout=1.5)
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), "the grandchild's pid")
    wait_until(lambda: not pid_alive(int(pid_file.read_text())), "the grandchild gone")
