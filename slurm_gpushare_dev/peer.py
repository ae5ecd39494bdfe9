"""SchedMD's own GPU tests against the dev cluster, without the product's slurm.conf lines and with them.

``scripts/peer-suite [--slurm R]`` (``python -m slurm_gpushare_dev.peer``) takes Slurm's regression test
suite from the release's Debian source package, configures its expect tests for a dev cluster and runs
the GPU-related ones there twice: on plain Slurm (the product's slurm.conf lines switched off,
:meth:`~slurm_gpushare_dev.cluster.DevCluster.set_product`) and with the product (the same gres.conf,
nodes and daemons). It prints one row per test and exits 1 when a test passes on plain Slurm and fails
with the product.

- **The suite** (:class:`TestSuite`): ``apt-get source --download-only slurm-wlm`` with a ``deb-src``
  entry for the release's Debian suite (:data:`slurm_gpushare_dev.release.SUITES`) and apt state of its
  own (``Dir::Etc::SourceParts``, ``Dir::State::Lists``, ``Dir::Cache`` under the cache directory: the
  system's apt lists are left alone) fetches the upstream tarball, which carries ``testsuite/``; only that
  folder is unpacked, once per release, into ``GPUSHARE_TESTSUITE_DIR`` (default
  ``/var/cache/slurm-gpushare-dev/testsuite``). Nothing of it enters this repository.
- **The selection** (:func:`select_tests`): the expect tests ``testN.M`` whose text names ``gpu`` or
  ``gres`` (any case), plus :data:`ALWAYS` (the tests named in the issue that asked for this).
- **A run** (:func:`run_test`): each test in a copy of ``testsuite/`` under the cluster's directory (the
  tests write their scratch files beside themselves), with ``SLURM_TESTSUITE_CONF`` (``SlurmInstallDir=/usr``,
  ``SlurmConfigDir=<cluster>/etc``) and ``SLURM_LOCAL_GLOBALS_FILE`` (``set slurm_dir /usr``), under a
  per-test timeout; the suite's exit codes are 0 pass, 1 fail, 255 (-1) skip (``testsuite/expect/globals``:
  ``pass``/``fail``/``skip``); the reason is the test's own ``Warning`` (skip) or first ``Fatal``/``Error``
  line (fail).
- **The comparison** (:func:`compare`): every test runs plain first; one that skips there (the cluster
  lacks what it needs: its message says what) or fails there (it cannot pass plain and fail with the
  product) is not run again. The others run with the product; a test whose result differs runs once more
  each way, and counts only when it differs the same way again. Each run starts on a quiet cluster
  (:func:`wait_quiet`), both ways.
- **MIG devices** (:attr:`Outcome.mig_named`): on a real MIG node Slurm names a MIG device by its UUID in
  ``CUDA_VISIBLE_DEVICES`` (``AutoDetect=nvml`` gives the device a ``UniqueId``, which ``common_gres_set_env``
  in src/plugins/gres/common/gres_common.c prints instead of the index); the dev cluster's static gres.conf
  cannot give one, so plain Slurm prints the index there and the product the UUID. A test that failed with
  the product while printing a MIG UUID runs once more with the product and the MIG nodes out of every partition
  (:func:`partitions_without`); it is explained when it passes there, a regression otherwise.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from slurm_gpushare.errors import ClusterError, GpushareError
from slurm_gpushare_dev.release import SUITES, ReleaseRoot, check_release, host_release, needs_root, release_of

DEFAULT_CACHE_DIR = "/var/cache/slurm-gpushare-dev/testsuite"
#: Tests run whatever the grep says: the GPU tests the issue names (test39.* are matched by the grep).
ALWAYS = ("test1.12", "test1.62", "test3.18", "test38.18", "test38.19")
#: Text that marks a test as exercising GRES.
SELECT_RE = re.compile(r"gpu|gres", re.IGNORECASE)
TEST_NAME_RE = re.compile(r"^test(\d+)\.(\d+)$")
#: One line of the suite's log: ``[2026-12-05 13:09:24.348] Error   message (caller@file:line,...)``, maybe
#: after a terminal's escape sequence.
#: A ``CUDA_VISIBLE_DEVICES`` value (``NAME=value`` or a test's ``NAME:value``) naming a MIG device by UUID.
MIG_NAMED_RE = re.compile(r"CUDA_VISIBLE_DEVICES[:=][^\s]*\bMIG-")
#: The most seconds :func:`wait_quiet` waits before a run.
QUIET_LIMIT = 30.0
LOG_LINE_RE = re.compile(r"\[\d{4}-\d\d-\d\d [0-9:.]+\] (Fatal|Error|Warning)\s+(.*?)(?: \([^()]*@[^()]*\))?\s*$")
DEFAULT_TIMEOUT = 240.0
#: Results, as the table prints them.
PASS, FAIL, SKIP, TIMEOUT, ERROR = "pass", "FAIL", "skip", "timeout", "error"


@dataclass
class Outcome:
    """One run of one test.

    Attributes:
        result: :data:`PASS`, :data:`FAIL`, :data:`SKIP`, :data:`TIMEOUT` or :data:`ERROR` (another
            exit status: expect itself failed).
        seconds: wall time of the run.
        reason: the test's own skip or failure message ('' when it passed).
        mig_named: the output showed a ``CUDA_VISIBLE_DEVICES`` naming a MIG device by its UUID.
    """

    result: str
    seconds: float
    reason: str = ""
    mig_named: bool = False

    @property
    def failed(self) -> bool:
        """A failure, a timeout or an error (a skip is none of them)."""
        return self.result in (FAIL, TIMEOUT, ERROR)


@dataclass
class Row:
    """One test's runs: plain Slurm's and the product's, in order (a rerun adds a second to each).

    Attributes:
        test: ``testN.M``.
        plain: the runs without the product's lines.
        product: the runs with them (none when the plain run skipped or failed).
        without_mig: the run with the product and the MIG nodes out of the partitions (a product failure that showed MIG
            UUIDs, see the module docstring), else None.
    """

    test: str
    plain: list[Outcome] = field(default_factory=list)
    product: list[Outcome] = field(default_factory=list)
    without_mig: Outcome | None = None

    @property
    def differs(self) -> bool:
        """The first runs of both ways gave different results."""
        return bool(self.plain and self.product) and self.plain[0].result != self.product[0].result

    @property
    def mig_explained(self) -> bool:
        """Failed with the product printing MIG UUIDs and passed without the MIG nodes."""
        return self.without_mig is not None and self.without_mig.result == PASS

    @property
    def regression(self) -> bool:
        """Passed on plain Slurm and failed with the product, in every run of each way (the rerun too),
        unless :attr:`mig_explained`."""
        return (bool(self.plain and self.product) and all(o.result == PASS for o in self.plain)
                and all(o.failed for o in self.product) and not self.mig_explained)


def order_key(name: str) -> tuple[int, int]:
    """Sort key of ``testN.M``: (N, M) as numbers (test1.12 after test1.9).

    Raises:
        ValueError: not a test name.
    """
    m = TEST_NAME_RE.match(name)
    if m is None:
        raise ValueError(f"not an expect test name: {name!r}")
    return int(m.group(1)), int(m.group(2))


def select_tests(expect_dir: Path, only: list[str] | None = None) -> list[str]:
    """The GPU-related tests of ``expect_dir`` (``testsuite/expect``), in numeric order: every ``testN.M``
    file whose text matches :data:`SELECT_RE`, and those of :data:`ALWAYS` that exist. ``only``: keep
    just these names (a name that is no test of the directory raises).

    Raises:
        ClusterError: a name of ``only`` is not a test of ``expect_dir``.
    """
    chosen = set()
    for path in expect_dir.iterdir():
        if not TEST_NAME_RE.match(path.name) or not path.is_file():
            continue
        if path.name in ALWAYS or SELECT_RE.search(path.read_text(errors="replace")):
            chosen.add(path.name)
    if only:
        missing = [t for t in only if not (expect_dir / t).is_file() or not TEST_NAME_RE.match(t)]
        if missing:
            raise ClusterError(f"no such expect test: {', '.join(missing)}", hint=f"see {expect_dir}")
        chosen = set(only)
    return sorted(chosen, key=order_key)


def parse_outcome(returncode: int, output: str, seconds: float, *, timed_out: bool = False) -> Outcome:
    """The outcome of one run from expect's exit status and output (``testsuite/expect/globals``: ``pass``
    exits 0, ``fail`` 1, ``skip`` -1, i.e. 255). The reason: for a skip the last ``Warning`` line's message,
    for a failure the first ``Fatal`` line's, else the first ``Error`` line's, without the call chain in
    parentheses; a timeout says after how long."""
    mig_named = MIG_NAMED_RE.search(output) is not None
    if timed_out:
        return Outcome(TIMEOUT, seconds, f"no result within {seconds:.0f} s", mig_named)
    lines: dict[str, list[str]] = {"Fatal": [], "Error": [], "Warning": []}
    for line in output.splitlines():
        m = LOG_LINE_RE.search(line)
        if m:
            lines[m.group(1)].append(m.group(2))
    if returncode == 0:
        return Outcome(PASS, seconds, "", mig_named)
    if returncode == 255:
        return Outcome(SKIP, seconds, (lines["Warning"] or ["(no message)"])[-1], mig_named)
    reason = (lines["Fatal"] or lines["Error"] or ["(no message)"])[0]
    if returncode == 1:
        return Outcome(FAIL, seconds, reason, mig_named)
    tail = " | ".join(output.strip().splitlines()[-2:])
    return Outcome(ERROR, seconds, f"exit {returncode}: {reason if reason != '(no message)' else tail}", mig_named)


def compare(tests: list[str], run, set_product, *, without_mig=None, out=None) -> list[Row]:
    """Run ``tests`` both ways: ``run(test)`` -> :class:`Outcome` on the cluster as it is,
    ``set_product(bool)`` switches the product's lines. Plain first (a test that skips or fails there is
    done), then the product; ``without_mig(test)`` -> :class:`Outcome` (the product on, the MIG nodes out
    of the partitions) for a test that passed plain and failed with the product printing MIG UUIDs; a test whose
    results differ otherwise runs again with the product, then plain, so the product is switched twice at
    most. ``out``: a stream that gets one line per run. Leaves the product switched off."""
    rows = {t: Row(t) for t in tests}

    def one(test: str, way: str, how=run) -> Outcome:
        o = how(test)
        if out is not None:
            print(f"peer-suite: {way:7} {test:10} {o.result:7} {o.seconds:6.1f} s  {o.reason}"[:200], file=out,
                  flush=True)
        return o

    set_product(False)
    for t in tests:
        rows[t].plain.append(one(t, "plain"))
    runnable = [t for t in tests if rows[t].plain[0].result == PASS]
    if runnable:
        set_product(True)
        for t in runnable:
            rows[t].product.append(one(t, "product"))
        if without_mig is not None:
            for t in runnable:
                if rows[t].product[0].failed and rows[t].product[0].mig_named:
                    rows[t].without_mig = one(t, "no-MIG", without_mig)
        again = [t for t in runnable if rows[t].differs and not rows[t].mig_explained]
        for t in again:
            rows[t].product.append(one(t, "product"))
        set_product(False)
        for t in again:
            rows[t].plain.append(one(t, "plain"))
    return [rows[t] for t in tests]


def format_table(rows: list[Row], title: str = "") -> str:
    """A Markdown table: test, plain result(s), product result(s), seconds (plain + product, first runs),
    note (skip reason, failure reason, rerun, REGRESSION); then a count line."""
    lines = [title] if title else []
    lines += ["| test | plain | product | s | note |", "|---|---|---|---|---|"]
    for r in rows:
        plain = ", ".join(o.result for o in r.plain)
        product = ", ".join(o.result for o in r.product) or "-"
        secs = sum(o.seconds for o in r.plain[:1] + r.product[:1])
        notes = []
        if r.regression:
            notes.append("**passes plain, fails with the product**")
        elif r.mig_explained:
            notes.append("MIG devices named by UUID (as Slurm names them with AutoDetect=nvml); passes with the "
                         "product with the MIG nodes out of the partitions")
        elif r.plain and r.plain[0].result in (FAIL, TIMEOUT, ERROR):
            notes.append("fails on plain Slurm, not run with the product")
        elif r.differs:
            notes.append("differed once, not again" if len(r.product) > 1 else "differs")
        if len(r.product) > 1 and r.regression:
            notes.append("again on rerun")
        reasons = [o.reason for o in r.plain + r.product if o.reason]
        if reasons:
            notes.append(reasons[0].replace("|", "/")[:140])
        lines.append(f"| {r.test} | {plain} | {product} | {secs:.0f} | {'; '.join(notes)} |")
    ran = [r for r in rows if r.product]
    skipped = sum(1 for r in rows if r.plain and r.plain[0].result == SKIP)
    lines.append("")
    lines.append(f"{len(rows)} tests, {skipped} skipped on the dev cluster, {len(rows) - skipped - len(ran)} failed "
                 f"on plain Slurm, {len(ran)} run both ways; "
                 f"{sum(1 for r in rows if r.differs)} differed; "
                 f"{sum(1 for r in rows if r.regression)} pass plain and fail with the product")
    return "\n".join(lines)


@dataclass
class TestSuite:
    """Slurm's ``testsuite/`` of one release, from its Debian source package (see the module docstring).

    Attributes:
        release: ``22.05``, ``24.11`` or ``26.05``.
        cache_dir: where the suites are kept (``GPUSHARE_TESTSUITE_DIR``).
        mirror: the Debian mirror apt fetches the source from.
    """

    __test__ = False  # not a pytest class

    release: str
    cache_dir: Path
    mirror: str

    @classmethod
    def for_release(cls, release: str) -> TestSuite:
        """The suite of ``release`` in the configured cache, from the mirror the roots use.

        Raises:
            ClusterError: unsupported release.
        """
        check_release(release)
        root = ReleaseRoot.for_release(release)
        return cls(release, Path(os.environ.get("GPUSHARE_TESTSUITE_DIR") or DEFAULT_CACHE_DIR), root.mirror)

    @property
    def path(self) -> Path:
        """The unpacked ``testsuite/`` folder: ``<cache>/<release>/testsuite``."""
        return self.cache_dir / self.release / "testsuite"

    def ensure(self, *, out=sys.stderr) -> Path:
        """Fetch and unpack the suite unless cached; returns :attr:`path`. A fetch that fails leaves no
        suite behind (it is unpacked aside, then renamed).

        Raises:
            ClusterError: not root, apt-get failed (its last lines quoted), no upstream tarball, or the
                tarball is another release than asked.
        """
        if (self.path / "expect" / "globals").is_file():
            return self.path
        if os.geteuid() != 0:
            raise ClusterError(f"fetching Slurm {self.release}'s test suite needs root", hint="run as root")
        base = self.cache_dir / self.release
        apt = base / "apt"
        for d in ("sources", "lists/partial", "cache/archives/partial", "download"):
            (apt / d).mkdir(parents=True, exist_ok=True)
        (apt / "sources" / "slurm-src.sources").write_text(
            f"Types: deb-src\nURIs: {self.mirror}\nSuites: {SUITES[self.release]}\nComponents: main\n"
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
        opts = ["-o", "Dir::Etc::SourceList=/dev/null", "-o", f"Dir::Etc::SourceParts={apt / 'sources'}",
                "-o", f"Dir::State::Lists={apt / 'lists'}", "-o", f"Dir::Cache={apt / 'cache'}",
                "-o", "APT::Sandbox::User=root", "-o", "Acquire::Check-Valid-Until=false", "-q"]
        print(f"peer-suite: fetching Slurm {self.release}'s source (Debian {SUITES[self.release]}, {self.mirror}) "
              f"into {base} ...", file=out, flush=True)
        started = time.monotonic()
        for argv, cwd in ((["apt-get", *opts, "update"], base),
                          (["apt-get", *opts, "source", "--download-only", "slurm-wlm"], apt / "download")):
            proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
            tarballs = sorted((apt / "download").glob("slurm-wlm_*.orig.tar.*"))
            # only the upstream tarball matters: a mirror that lacks the .dsc or the Debian diff of a
            # point release (trixie's 24.11.5-4+deb13u1 here) still serves it
            if proc.returncode != 0 and not (argv[-1] == "slurm-wlm" and tarballs):
                tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
                raise ClusterError(f"{' '.join(argv[:1] + argv[-3:])} failed ({proc.returncode}):\n{tail}",
                                   hint="is the source package on the mirror? (GPUSHARE_DEBIAN_MIRROR)")
        if not tarballs:
            raise ClusterError(f"apt-get source fetched no upstream tarball into {apt / 'download'}")
        tarball = tarballs[-1]
        got = release_of(tarball.name.split("_", 1)[1])
        if got != self.release:
            raise ClusterError(f"Debian {SUITES[self.release]}'s slurm-wlm is Slurm {got}, not {self.release}",
                               hint="the suite moved on: update SUITES in slurm_gpushare_dev/release.py")
        part = Path(tempfile.mkdtemp(prefix="unpack.", dir=base))
        try:
            proc = subprocess.run(["tar", "-xf", str(tarball), "-C", str(part), "--wildcards", "*/testsuite/*"],
                                  capture_output=True, text=True)
            found = sorted(part.glob("*/testsuite/expect/globals"))
            if proc.returncode != 0 or not found:
                raise ClusterError(f"{tarball.name} has no testsuite/expect ({proc.stderr.strip()[-300:]})")
            if self.path.exists():
                shutil.rmtree(self.path)
            os.rename(found[0].parent.parent, self.path)
        finally:
            shutil.rmtree(part, ignore_errors=True)
        print(f"peer-suite: {tarball.name}'s testsuite/ unpacked in {time.monotonic() - started:.0f} s", file=out,
              flush=True)
        return self.path


def prepare_workdir(suite: Path, workdir: Path, slurm_conf_dir: Path) -> Path:
    """A fresh copy of ``suite`` (``testsuite/``) in ``workdir``, configured for the cluster whose
    slurm.conf lies in ``slurm_conf_dir``: ``testsuite.conf`` and ``expect/globals.local``. Returns the
    copy's ``expect`` folder."""
    dest = workdir / "testsuite"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(suite, dest, symlinks=True)
    (dest / "testsuite.conf").write_text(f"SlurmInstallDir=/usr\nSlurmConfigDir={slurm_conf_dir}\n")
    (dest / "expect" / "globals.local").write_text("set slurm_dir /usr\n")
    return dest / "expect"


def run_test(expect_dir: Path, test: str, env: dict[str, str], *, timeout: float = DEFAULT_TIMEOUT,
             log_dir: Path | None = None) -> Outcome:
    """Run one expect test in ``expect_dir`` with ``env`` (``SLURM_CONF`` and the suite's variables)
    within ``timeout`` seconds (then SIGTERM to its process group, SIGKILL 10 s later); its output goes
    to ``log_dir/<test>.<n>.log`` when given."""
    started = time.monotonic()
    proc = subprocess.Popen(["expect", f"./{test}"], cwd=expect_dir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=timeout)
    except BaseException as e:  # a timeout, or this run stopped (Ctrl-C, SIGTERM): the test's group goes too
        if not isinstance(e, subprocess.TimeoutExpired):
            _signal_group(proc.pid, 9)
            raise
        timed_out = True
        _signal_group(proc.pid, 15)
        try:
            output, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, 9)
            output, _ = proc.communicate()
    seconds = time.monotonic() - started
    text = output.decode(errors="replace")
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        n = 1
        while (log_dir / f"{test}.{n}.log").exists():
            n += 1
        (log_dir / f"{test}.{n}.log").write_text(text)
    return parse_outcome(proc.returncode, text, seconds, timed_out=timed_out)


def wait_quiet(query, *, limit: float = QUIET_LIMIT, poll: float = 0.1) -> bool:
    """Wait until no job is completing (``squeue -h -t CG``) and no node is COMPLETING (``sinfo -h -N -o %T``),
    at most ``limit`` seconds; ``query(argv)`` -> the command's stdout. Both ways of the comparison wait, so a
    test that takes the first idle node right after the previous test's last job does not read that job's
    Epilog (the product's Epilog of a GPU job takes longer than none: benchmarks/plain_jobs measures it).
    Returns whether it got quiet (a run starts all the same)."""
    deadline = time.monotonic() + limit
    while True:
        if not query(["squeue", "-h", "-t", "CG", "-o", "%i"]).strip() and \
                "completing" not in query(["sinfo", "-h", "-N", "-o", "%T"]).lower():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


@contextlib.contextmanager
def partitions_without(nodes: list[str], env: dict[str, str], *, scontrol=None):
    """Take ``nodes`` out of every partition for the ``with`` block and put them back after, as they were
    (``scontrol show partition -o`` read first; ``scontrol update partitionname=P nodes=...``). Not a drain:
    from 24.11 on the suite's ``_test_init`` resumes every idle node of the default partition before each test
    (testsuite/expect/globals, "Ensure that idle nodes are not drained/down"). A partition left with no node
    is set ``state=inactive`` instead. ``scontrol(argv)`` -> :class:`subprocess.CompletedProcess` (default:
    the ``scontrol`` on PATH with ``env``).

    Raises:
        ClusterError: scontrol failed (its message), so that a run meant without those nodes never runs
            with them.
    """
    def default(argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(["scontrol", *argv], env=env, capture_output=True, text=True)

    call = scontrol or default

    def check(argv: list[str]) -> str:
        done = call(argv)
        if done.returncode != 0:
            raise ClusterError(f"scontrol {' '.join(argv)} failed: {(done.stderr or done.stdout).strip()}",
                               hint="see the cluster's log/slurmctld.log")
        return done.stdout

    drop = set(nodes)
    restore: list[list[str]] = []
    try:
        for line in check(["show", "partition", "-o"]).splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            name, listed = fields.get("PartitionName"), fields.get("Nodes", "(null)")
            if not name or listed == "(null)":
                continue
            members = check(["show", "hostnames", listed]).split()
            rest = [n for n in members if n not in drop]
            if rest == members:
                continue
            if rest:
                check(["update", f"partitionname={name}", f"nodes={','.join(rest)}"])
                restore.append(["update", f"partitionname={name}", f"nodes={listed}"])
            else:
                check(["update", f"partitionname={name}", "state=inactive"])
                restore.append(["update", f"partitionname={name}", f"state={fields.get('State', 'UP').lower()}"])
        yield
    finally:
        for argv in restore:
            check(argv)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


DEFAULT_DIR = "/tmp/slurm-gpushare-peer"
DEFAULT_PORT_BASE = 21817
#: Port offset of each release's cluster, so that the runs of several releases can share a host.
RELEASE_PORT_OFFSET = {"24.11": 1000, "26.05": 2000}


def default_dir(release: str) -> Path:
    """The cluster directory of ``release``'s run: ``GPUSHARE_PEER_DIR``, else /tmp/slurm-gpushare-peer-<release>."""
    return Path(os.environ.get("GPUSHARE_PEER_DIR") or f"{DEFAULT_DIR}-{release}")


def default_port(release: str) -> int:
    """The cluster's port base: ``GPUSHARE_PEER_PORT``, else 21817 (+1000 for 24.11, +2000 for 26.05)."""
    env = os.environ.get("GPUSHARE_PEER_PORT")
    return int(env) if env else DEFAULT_PORT_BASE + RELEASE_PORT_OFFSET.get(release, 0)


def revive(cluster, *, out=sys.stderr) -> list[str]:
    """Start again the cluster's daemons that are gone (a Slurm daemon can abort inside Slurm: CI saw 22.05's
    slurmd die of a heap corruption during a test, with a core in ``log/``) and say which; returns them. The
    test that ran then shows what it saw; the next ones find every node in service."""
    dead = [d for d in cluster.daemons() if not cluster.alive(d)]
    if dead:
        print(f"peer-suite: {', '.join(dead)} was not running (died during the last test: see the cluster's log/, "
              "a core file there); started again", file=out, flush=True)
        cluster.up(out=out)
    return dead


def run_here(release: str, directory: Path, port: int, expect_dir: Path, tests: list[str], *,
             timeout: float, keep: bool, out=sys.stderr) -> list[Row]:
    """Bring the cluster up (product lines off), compare ``tests`` both ways (:func:`compare`) and take the
    cluster down again unless ``keep``; returns the rows. Runs where ``release``'s Slurm is this process's.

    Raises:
        ClusterError: the cluster did not come up or could not be switched.
    """
    from slurm_gpushare_dev.cluster import DevCluster

    # task/cgroup with ConstrainDevices=yes, as sites run GPUs: test39.8 and test39.16 skip without it
    cluster = DevCluster.default(directory, port, cgroup=True)
    cluster.product = False  # up as plain Slurm: compare() starts there
    env = dict(os.environ, SLURM_CONF=str(cluster.slurm_conf),
               SLURM_TESTSUITE_CONF=str(expect_dir.parent / "testsuite.conf"),
               SLURM_LOCAL_GLOBALS_FILE=str(expect_dir / "globals.local"))
    log_dir = directory / "peer-suite" / "logs"
    shutil.rmtree(log_dir, ignore_errors=True)

    def query(argv: list[str]) -> str:
        return subprocess.run(argv, env=env, capture_output=True, text=True).stdout

    mig_nodes = sorted(n for n, m in cluster.nodes.items() if any(g.mig_enabled for g in m.gpus))

    def run(test: str) -> Outcome:
        revive(cluster, out=out)
        if not wait_quiet(query):
            print(f"peer-suite: the cluster was still completing jobs after {QUIET_LIMIT:.0f} s; {test} starts all "
                  "the same", file=out, flush=True)
        o = run_test(expect_dir, test, env, timeout=timeout, log_dir=log_dir)
        if o.result == TIMEOUT:  # what it left queued would hold the nodes of the tests after it
            ids = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout.split()
            if ids:
                subprocess.run(["scancel", *ids], env=env, capture_output=True)
        return o

    def without_mig(test: str) -> Outcome:
        with partitions_without(mig_nodes, env):
            return run(test)

    def switch(enabled: bool) -> None:
        if cluster.product == enabled:
            return
        revive(cluster, out=out)
        started = time.monotonic()
        cluster.set_product(enabled)
        print(f"peer-suite: product lines {'on' if enabled else 'off'} in {time.monotonic() - started:.1f} s",
              file=out, flush=True)

    print(f"peer-suite: Slurm {release}, cluster {directory} (port base {port}), {len(tests)} tests, "
          f"{timeout:.0f} s each at most; logs in {log_dir}", file=out, flush=True)
    cluster.up(out=out)
    try:
        return compare(tests, run, switch, without_mig=without_mig if mig_nodes else None, out=out)
    finally:
        if not keep:
            cluster.down(out=out)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--slurm", "release", default=None, help=f"the release: {', '.join(SUITES)} (default: the host's)")
@click.option("--dir", "directory", type=click.Path(path_type=Path), default=None,
              help="the cluster's directory (default /tmp/slurm-gpushare-peer-<release>; env GPUSHARE_PEER_DIR)")
@click.option("--port-base", "port", type=int, default=None,
              help="its port base (default 21817, +1000 for 24.11, +2000 for 26.05; env GPUSHARE_PEER_PORT)")
@click.option("--test", "only", multiple=True, help="run only this test (testN.M; repeatable)")
@click.option("--timeout", type=float, default=DEFAULT_TIMEOUT, show_default=True, help="seconds per test run")
@click.option("--keep", is_flag=True, help="leave the cluster running afterwards")
@click.option("--list", "list_only", is_flag=True, help="print the selected tests and exit (fetches the suite)")
@click.option("--expect-dir", type=click.Path(path_type=Path), default=None, hidden=True)
def cli(release: str | None, directory: Path | None, port: int | None, only: tuple[str, ...], timeout: float,
        keep: bool, list_only: bool, expect_dir: Path | None) -> None:
    """Run SchedMD's GPU tests on plain Slurm and with the product; exit 1 when one passes plain and fails
    with the product (see the module docstring)."""
    # CI's timeout sends SIGTERM: end as Ctrl-C does, so that the cluster is taken down (run_here)
    signal.signal(signal.SIGTERM, _terminated)
    release = release or host_release()
    if release is None:
        raise ClusterError("no Slurm on this host", hint="scripts/install-deps")
    check_release(release)
    directory = (directory or default_dir(release)).absolute()
    port = port or default_port(release)
    if expect_dir is None:  # on the host: fetch the suite, copy it beside the cluster (a root sees /tmp)
        suite = TestSuite.for_release(release).ensure()
        tests = select_tests(suite / "expect", list(only))
        if list_only:
            print("\n".join(tests))
            return
        directory.mkdir(parents=True, exist_ok=True)
        expect_dir = prepare_workdir(suite, directory / "peer-suite", directory / "etc")
        if needs_root(release):
            argv = [".venv/bin/python", "-m", "slurm_gpushare_dev.peer", "--slurm", release, "--dir",
                    str(directory), "--port-base", str(port), "--timeout", str(timeout),
                    "--expect-dir", str(expect_dir), *(a for t in only for a in ("--test", t)),
                    *(["--keep"] if keep else [])]
            sys.exit(ReleaseRoot.for_release(release).run(argv))
    tests = select_tests(expect_dir, list(only))
    started = time.monotonic()
    rows = run_here(release, directory, port, expect_dir, tests, timeout=timeout, keep=keep)
    took = time.monotonic() - started
    print(format_table(rows, f"SchedMD's GPU tests, Slurm {release} (plain Slurm / with the product):"))
    print(f"\npeer-suite: Slurm {release}: {took:.0f} s")
    if any(r.regression for r in rows):
        sys.exit(1)


def _terminated(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """``python -m slurm_gpushare_dev.peer [options]``; returns the exit status: 0 no test passes plain and
    fails with the product, 1 some do, 2 usage, 5 the suite or the cluster failed."""
    try:
        cli.main(args=argv, prog_name="peer-suite", standalone_mode=False)
    except click.ClickException as e:
        print(f"peer-suite: error: {e.format_message()}", file=sys.stderr)
        return 2
    except GpushareError as e:
        print(f"peer-suite: error: {e}", file=sys.stderr)
        return 5
    except SystemExit as e:
        return int(e.code or 0)
    except KeyboardInterrupt:
        print("peer-suite: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
