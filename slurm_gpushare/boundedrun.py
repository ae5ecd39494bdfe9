"""Run a program whose output root must not trust to be small: its stdout and stderr are read up to a bound, within
a deadline, and the program is killed when it passes either.

:func:`subprocess.run` with ``capture_output`` keeps all a program prints, and after a timeout it kills the
program but then waits, without a limit, for the pipes to close, which a child that inherited them can hold open.
The MPS front end (``nvidia-cuda-mps-control``) prints what the job's own daemon answers, and that daemon listens in
a pipe directory the job's user owns: a program of the user's may answer there instead, as much as it likes.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Bytes kept of each of stdout and stderr by default (a front-end answer is a few lines).
DEFAULT_MAX_BYTES = 64 * 1024


class OutputTooLarge(Exception):
    """The program printed more than the bound on stdout or stderr (it was killed)."""

    def __init__(self, stream: str, max_bytes: int):
        super().__init__(f"printed more than {max_bytes} bytes on {stream}")
        self.stream = stream
        self.max_bytes = max_bytes


@dataclass(frozen=True)
class Finished:
    """A program that exited: its status and what it printed (decoded as UTF-8, undecodable bytes replaced)."""

    returncode: int
    stdout: str
    stderr: str


def run_bounded(argv: Sequence[str], *, input: str = "", env: Mapping[str, str] | None = None, timeout: float,
                max_bytes: int = DEFAULT_MAX_BYTES, cwd: str = "/", **popen_kwargs: Any) -> Finished:
    """Run ``argv`` with ``input`` on its stdin and return its status and output, reading at most ``max_bytes``
    of each of stdout and stderr and waiting at most ``timeout`` seconds in all (for the input to be taken, the
    output and the exit). The program runs in a session and process group of its own; when the call fails, that
    group is killed (the program, and a child of it that kept the pipes). ``popen_kwargs`` go to
    :class:`subprocess.Popen` (``user``, ``group``, ``extra_groups``).

    Raises:
        subprocess.TimeoutExpired: the program had not taken its input, closed its output and exited within
            ``timeout`` (its process group is killed and it is reaped first).
        OutputTooLarge: it printed more than ``max_bytes`` on one stream (killed and reaped first).
        OSError: the program could not be started.
    """
    deadline = time.monotonic() + timeout
    proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
                            **popen_kwargs)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    pipes = (proc.stdin, proc.stdout, proc.stderr)
    streams = {proc.stdout.fileno(): ("stdout", bytearray()), proc.stderr.fileno(): ("stderr", bytearray())}
    pending = memoryview(input.encode())
    stdin_fd = proc.stdin.fileno()
    done = False
    try:
        with selectors.DefaultSelector() as sel:
            for fd in streams:
                sel.register(fd, selectors.EVENT_READ)
            if pending:
                os.set_blocking(stdin_fd, False)
                sel.register(stdin_fd, selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(list(argv), timeout)
                for key, _ in sel.select(left):
                    if key.fd == stdin_fd:
                        try:
                            pending = pending[os.write(stdin_fd, pending[:65536]):]
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:  # it stopped reading: what it printed still counts
                            pending = pending[:0]
                        if not pending:
                            sel.unregister(stdin_fd)
                            proc.stdin.close()
                        continue
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    name, buf = streams[key.fd]
                    buf += chunk
                    if len(buf) > max_bytes:
                        raise OutputTooLarge(name, max_bytes)
        returncode = proc.wait(max(0.0, deadline - time.monotonic()))
        done = True
    finally:
        if not done:  # not reaped yet, so its pid, the group's id, is still its own
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the program and what it started that kept the pipes
            except (ProcessLookupError, PermissionError):
                proc.kill()
            proc.wait()
        for pipe in pipes:
            try:
                pipe.close()
            except BrokenPipeError:  # stdin's unwritten bytes: the program is gone
                pass
    out, err = (bytes(buf).decode("utf-8", errors="replace") for _, buf in streams.values())
    return Finished(returncode, out, err)
