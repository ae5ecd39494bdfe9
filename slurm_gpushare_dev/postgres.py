"""A private PostgreSQL server for the tests and benchmarks: Debian's ``postgresql`` package (``initdb`` and
``postgres`` from ``/usr/lib/postgresql/<version>/bin``), a cluster of its own in a directory, listening only on a
unix socket in that directory (no TCP port: sessions of other users or other tests never meet it), started
directly (no systemd, no ``pg_ctlcluster``) and stopped by the PID in its ``postmaster.pid``.

PostgreSQL refuses to run as root: run as root, the server runs as the ``postgres`` account the Debian package
creates (or ``--as-user``), and the directory is given to it. Connections use ``trust`` authentication on that
socket, as the database user ``postgres``.

    python -m slurm_gpushare_dev.postgres up --dir /tmp/pg      # prints the URL of database "gpushare"
    python -m slurm_gpushare_dev.postgres down --dir /tmp/pg
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

#: The database the server is started with (``up`` creates it).
DATABASE = "gpushare"
#: The port number in the socket's name (``.s.PGSQL.<port>``); nothing listens on TCP.
DEFAULT_PORT = 5432


class PostgresError(RuntimeError):
    """PostgreSQL is not installed, would not start, or would not stop."""


def bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` holding ``initdb`` and ``postgres``, else None."""
    root = Path("/usr/lib/postgresql")
    found = sorted((p for p in root.glob("*/bin") if (p / "initdb").is_file() and (p / "postgres").is_file()),
                   key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    return found[-1] if found else None


class PostgresServer:
    """A PostgreSQL cluster in ``directory`` (``data/``, ``server.log``; the socket in ``directory``).

    Args:
        directory: its home (created).
        port: the number in the socket's name.
        user: the account the server runs as when this process is root (default ``postgres``).
        durable: ``fsync`` on (the default of a real server); off makes a test session's many small
            databases cheap.
    """

    def __init__(self, directory: str | Path, *, port: int = DEFAULT_PORT, user: str = "postgres",
                 durable: bool = True):
        self.dir = Path(directory).absolute()
        self.data = self.dir / "data"
        self.port = port
        self.durable = durable
        self.run_as = user if os.geteuid() == 0 else None

    # --- where it is -------------------------------------------------------------------------------

    def url(self, database: str = DATABASE) -> str:
        """libpq's URL of a database of this server (over its socket, as user ``postgres``)."""
        return f"postgresql://postgres@/{database}?host={self.dir}&port={self.port}"

    def pid(self) -> int | None:
        """The postmaster's PID from ``data/postmaster.pid`` when that process is this cluster's postgres."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        if not argv or Path(os.fsdecode(argv[0])).name != "postgres" or os.fsencode(str(self.data)) not in argv:
            return None
        return pid

    # --- start and stop ----------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> str:
        """Initialise the cluster when it has none, start the server unless it runs, create :data:`DATABASE`;
        its URL.

        Raises:
            PostgresError: not installed, no account to run it as, or it did not come up (the log's end).
        """
        bins = bin_dir()
        if bins is None:
            raise PostgresError("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): "
                                "apt-get install postgresql (scripts/install-deps installs it)")
        uid = gid = None
        if self.run_as is not None:
            try:
                entry = pwd.getpwnam(self.run_as)
            except KeyError:
                raise PostgresError(f"PostgreSQL refuses to run as root and there is no account {self.run_as!r} "
                                    "(Debian's postgresql package creates 'postgres')") from None
            uid, gid = entry.pw_uid, entry.pw_gid
        self.dir.mkdir(parents=True, exist_ok=True)
        if uid is not None:
            os.chown(self.dir, uid, gid or 0)
        os.chmod(self.dir, 0o700)
        kw: dict = {"user": uid, "group": gid, "extra_groups": []} if uid is not None else {}
        if not (self.data / "PG_VERSION").exists():
            shutil.rmtree(self.data, ignore_errors=True)
            proc = subprocess.run([str(bins / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                                   "-E", "UTF8", "--locale=C", "--no-sync"], cwd=self.dir,
                                  capture_output=True, text=True, **kw)
            if proc.returncode != 0:
                raise PostgresError(f"initdb failed: {(proc.stderr or proc.stdout).strip()[-2000:]}")
        if self.pid() is None:
            log = open(self.dir / "server.log", "ab")  # noqa: SIM115 (the server keeps it)
            try:
                settings = ["-c", "listen_addresses=", "-c", f"unix_socket_directories={self.dir}",
                            "-c", "max_connections=50", "-c", "shared_buffers=128MB"]
                if not self.durable:
                    settings += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
                subprocess.Popen([str(bins / "postgres"), "-D", str(self.data), "-p", str(self.port), *settings],
                                 cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 start_new_session=True, **kw)
            finally:
                log.close()
        deadline = time.monotonic() + timeout
        while not self._ready(bins):
            if time.monotonic() > deadline:
                tail = (self.dir / "server.log").read_text(errors="replace")[-2000:]
                raise PostgresError(f"PostgreSQL did not accept connections within {timeout:g} s: {tail}")
            time.sleep(0.1)
        self.create_database(DATABASE)
        return self.url()

    def _ready(self, bins: Path) -> bool:
        proc = subprocess.run([str(bins / "pg_isready"), "-q", "-h", str(self.dir), "-p", str(self.port)],
                              capture_output=True)
        return proc.returncode == 0 and self.pid() is not None

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL with ``psql`` as user ``postgres``; its output.

        Raises:
            PostgresError: psql failed (its message).
        """
        bins = bin_dir()
        psql = str(bins / "psql") if bins and (bins / "psql").exists() else "psql"
        proc = subprocess.run([psql, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", str(self.dir),
                               "-p", str(self.port), "-U", "postgres", "-d", database, "-c", sql],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise PostgresError(f"psql: {proc.stderr.strip()}")
        return proc.stdout

    def create_database(self, name: str, *, fresh: bool = False) -> str:
        """Create database ``name`` (``fresh``: dropped first when it exists); its URL."""
        if fresh:
            self.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if fresh or not self.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'").strip():
            self.psql(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.url(name)

    def stop(self, timeout: float = 60.0) -> bool:
        """Stop the server by its PID (SIGINT: PostgreSQL's fast shutdown; SIGKILL after ``timeout``); whether one
        was running."""
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + timeout
        while self.pid() == pid and Path(f"/proc/{pid}").exists():
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.1)
        return True


def main(argv: list[str] | None = None) -> int:
    """``up`` (print the URL) or ``down`` a private server."""
    ap = argparse.ArgumentParser(prog="python -m slurm_gpushare_dev.postgres", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["up", "down"])
    ap.add_argument("--dir", required=True, help="the cluster's directory")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help="the number in the socket's name")
    ap.add_argument("--no-fsync", action="store_true", help="fsync off (tests; not durable)")
    a = ap.parse_args(argv)
    server = PostgresServer(a.dir, port=a.port, durable=not a.no_fsync)
    try:
        if a.action == "up":
            print(server.start())
        else:
            print("stopped" if server.stop() else "not running")
    except PostgresError as e:
        print(f"postgres: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
