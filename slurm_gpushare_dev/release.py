"""Slurm releases the dev cluster and the tests run: the host's own, or another one in a root filesystem.

A Debian 12 host has Slurm 22.05. Debian's archive also has 24.11 (trixie) and 26.05 (sid), and they
run on this host from a root filesystem that ``debootstrap`` builds from the archive apt already uses
(:class:`ReleaseRoot`): built once and cached (``GPUSHARE_ROOTS_DIR``, default
``/var/cache/slurm-gpushare-dev/roots``), keyed by the release, the Debian suite, the mirror and the
package list. Every command of such a release runs inside its root (:meth:`ReleaseRoot.command`): in a
private mount namespace (``unshare --mount``, so nothing stays mounted on the host once its last
process ends) with ``/proc``, ``/sys`` (with the cgroup hierarchy, which slurmd 24.11 needs), ``/dev``,
``/tmp`` and the project's checkout bind-mounted at their own paths, and the root's own virtual
environment mounted over the checkout's ``.venv``. So the same paths, the same scripts
(``scripts/install-deps``, ``scripts/dev-cluster``, ``scripts/test``, ``scripts/demo``) and the same
tests serve every release: inside a root they simply find that release's Slurm and Python.

``python -m slurm_gpushare_dev.release run --slurm 26.05 -- CMD...`` runs one command so; ``scripts/test
--slurm R`` and ``scripts/demo --slurm R`` use it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

from slurm_gpushare.errors import ClusterError, GpushareError, SlurmError
from slurm_gpushare.slurm.release import Release

#: Supported releases -> the Debian suite whose ``slurm-wlm`` is that release (bookworm: the host).
SUITES = {"22.05": "bookworm", "24.11": "trixie", "26.05": "sid"}
#: What a root holds besides debootstrap's minbase: Slurm and its clients, MUNGE, Lua for job_submit.lua,
#: Python for the product, slurmdbd and MariaDB for the ``--dbd`` cluster, and the tools the tests use
#: (expect and bc: SchedMD's expect tests, ``scripts/peer-suite``).
ROOT_PACKAGES = ("slurm-wlm", "slurm-client", "slurmdbd", "munge", "lua-socket", "lua5.1", "python3",
                 "python3-venv", "procps", "mariadb-server", "ca-certificates", "passwd", "util-linux", "expect",
                 "bc")
DEFAULT_ROOTS_DIR = "/var/cache/slurm-gpushare-dev/roots"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: Set inside a root (to its release) by :meth:`ReleaseRoot.command`: a command that runs there must not
#: enter a root again.
IN_ROOT_ENV = "GPUSHARE_SLURM_RELEASE"
PROJECT = Path(__file__).resolve().parent.parent
#: Marker a finished root holds (a half-built one never has it): release, suite, packages, build time.
STAMP = "etc/slurm-gpushare-root.json"

def release_of(text: str) -> str:
    """The ``YY.MM`` release in a version line (``slurm-wlm 22.05.8``, ``slurm 24.11.5``): the product's
    :meth:`~slurm_gpushare.slurm.release.Release.parse`, as the string the dev cluster keys its roots by.

    Raises:
        ClusterError: no ``YY.MM`` version in ``text``.
    """
    try:
        return str(Release.parse(text))
    except SlurmError as e:
        raise ClusterError(e.message, hint=e.hint) from None


def host_release() -> str | None:
    """The release of the Slurm this process would run (``slurmctld -V``), or None when there is none."""
    exe = shutil.which("slurmctld") or shutil.which("sinfo")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-V"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    try:
        return release_of(out)
    except ClusterError:
        return None


def check_release(release: str) -> str:
    """``release`` when supported.

    Raises:
        ClusterError: naming the supported ones.
    """
    if release not in SUITES:
        raise ClusterError(f"Slurm {release} is not a release the dev cluster runs",
                           hint=f"use one of {', '.join(SUITES)}")
    return release


def needs_root(release: str | None) -> bool:
    """Whether ``release`` must run in a root: it is not the Slurm of this process (the host's, or the
    root this process already runs in).

    Raises:
        ClusterError: ``release`` is unsupported, or this process runs in another release's root.
    """
    if release is None:
        return False
    check_release(release)
    inside = os.environ.get(IN_ROOT_ENV)
    if inside:
        if inside != release:
            raise ClusterError(f"this command runs in the Slurm {inside} root; it cannot run Slurm {release}",
                               hint="run it from the host")
        return False
    return host_release() != release


def debian_mirror(sources: list[Path] | None = None) -> str:
    """The Debian mirror: ``GPUSHARE_DEBIAN_MIRROR``, else the first ``URIs:`` (deb822) or ``deb`` line of
    apt's ``sources`` (default: /etc/apt/sources.list and sources.list.d) that serves ``debian`` (not
    ``debian-security``), else deb.debian.org."""
    env = os.environ.get("GPUSHARE_DEBIAN_MIRROR")
    if env:
        return env
    if sources is None:
        d = Path("/etc/apt/sources.list.d")
        sources = [Path("/etc/apt/sources.list"), *sorted(d.glob("*.sources")), *sorted(d.glob("*.list"))]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split("#", 1)[0].split()
            if words[:1] == ["URIs:"]:
                uris = words[1:]
            elif words[:1] == ["deb"]:
                uris = [w for w in words[1:] if "://" in w][:1]
            else:
                continue
            for uri in uris:
                if uri.rstrip("/").endswith("/debian"):
                    return uri.rstrip("/")
    return DEFAULT_MIRROR


@dataclass
class ReleaseRoot:
    """The root filesystem that runs Slurm ``release`` (see the module docstring).

    Attributes:
        release: ``24.11`` or ``26.05`` (``22.05`` is bookworm's, a root only on another host).
        cache_dir: where roots are kept (``GPUSHARE_ROOTS_DIR``).
        mirror: the Debian mirror debootstrap fetches from.
    """

    release: str
    cache_dir: Path
    mirror: str

    @classmethod
    def for_release(cls, release: str) -> ReleaseRoot:
        """The root of ``release`` in the configured cache, from the configured mirror.

        Raises:
            ClusterError: unsupported release.
        """
        check_release(release)
        return cls(release, Path(os.environ.get("GPUSHARE_ROOTS_DIR") or DEFAULT_ROOTS_DIR), debian_mirror())

    @property
    def suite(self) -> str:
        """The Debian suite whose ``slurm-wlm`` is this release."""
        return SUITES[self.release]

    @property
    def key(self) -> str:
        """What the root is built from, as 12 hex digits: suite, mirror and package list."""
        what = json.dumps([self.suite, self.mirror, sorted(ROOT_PACKAGES)])
        return hashlib.sha256(what.encode()).hexdigest()[:12]

    @property
    def path(self) -> Path:
        """The root's directory: ``<cache>/<release>-<key>``."""
        return self.cache_dir / f"{self.release}-{self.key}"

    def built(self) -> dict | None:
        """The stamp of a finished build (release, suite, packages, seconds it took), or None."""
        try:
            return json.loads((self.path / STAMP).read_text())
        except (OSError, ValueError):
            return None

    def ensure(self, *, out=sys.stderr) -> Path:
        """Build the root unless a finished one is cached; returns its directory. Says what it builds and
        how long that took. A build that fails leaves no root behind (it is built aside, then renamed).

        Raises:
            ClusterError: not root, no debootstrap, debootstrap failed (its last lines quoted), or the
                root's Slurm is another release than asked.
        """
        if self.built():
            return self.path
        if os.geteuid() != 0:
            raise ClusterError(f"building the Slurm {self.release} root needs root", hint="run as root")
        if shutil.which("debootstrap") is None:
            raise ClusterError("debootstrap is not installed", hint="apt-get install debootstrap")
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        part = self.path.with_name(self.path.name + ".partial")
        if part.exists():
            _remove_tree(part)
        print(f"dev-cluster: building the Slurm {self.release} root (Debian {self.suite}, {self.mirror}) in "
              f"{self.path}: debootstrap, once, a few minutes ...", file=out, flush=True)
        started = time.monotonic()
        log = self.cache_dir / f"{self.path.name}.log"
        argv = ["debootstrap", "--variant=minbase", f"--include={','.join(ROOT_PACKAGES)}", self.suite,
                str(part), self.mirror]
        with open(log, "w") as f:
            proc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-8:])
            _remove_tree(part)
            raise ClusterError(f"debootstrap of Debian {self.suite} failed ({proc.returncode}); its log "
                               f"{log} ends:\n{tail}", hint="is the mirror reachable? (GPUSHARE_DEBIAN_MIRROR)")
        for name in ("etc/resolv.conf", "etc/hosts"):  # pip inside needs DNS; slurmctld resolves localhost
            try:
                shutil.copyfile(f"/{name}", part / name)
            except OSError:
                pass
        # the archive's suites behind a fixed mirror snapshot can carry an expired Valid-Until (sid did)
        (part / "etc/apt/apt.conf.d/99slurm-gpushare").write_text('Acquire::Check-Valid-Until "false";\n')
        version = subprocess.run(["chroot", str(part), "slurmctld", "-V"], capture_output=True, text=True).stdout
        got = release_of(version or "none")
        if got != self.release:
            _remove_tree(part)
            raise ClusterError(f"Debian {self.suite} has Slurm {got}, not {self.release}",
                               hint="the suite moved on: update SUITES in slurm_gpushare_dev/release.py")
        took = time.monotonic() - started
        (part / STAMP).write_text(json.dumps({"release": self.release, "slurm": version.strip(), "suite": self.suite,
                                              "mirror": self.mirror, "packages": sorted(ROOT_PACKAGES),
                                              "build_s": round(took, 1)}, indent=2) + "\n")
        os.rename(part, self.path)
        print(f"dev-cluster: Slurm {self.release} root built in {took:.0f} s ({version.strip()})", file=out,
              flush=True)
        return self.path

    def venv_dir(self, project: Path = PROJECT) -> Path:
        """The root's virtual environment for ``project`` (one per checkout), mounted over its ``.venv``."""
        digest = hashlib.sha256(str(project.resolve()).encode()).hexdigest()[:12]
        return self.path / "opt" / "slurm-gpushare" / f"venv-{digest}"

    def command(self, argv: list[str], *, cwd: str | os.PathLike | None = None, project: Path = PROJECT) -> list[str]:
        """The command line that runs ``argv`` in this root (see the module docstring); the environment
        passes through, plus ``GPUSHARE_SLURM_RELEASE``. ``cwd`` (default: this process's) must lie
        under ``/tmp`` or the checkout, the paths shared with the root."""
        project = project.resolve()
        venv = self.venv_dir(project)
        return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", _ENTER, "enter",
                str(self.path), str(project), str(venv), str(Path(cwd or os.getcwd()).absolute()), self.release,
                *argv]

    def run(self, argv: list[str], *, project: Path = PROJECT, out=sys.stderr) -> int:
        """Run ``argv`` in this root (building it and its venv first when needed); returns its exit status.

        Raises:
            ClusterError: as :meth:`ensure`, or the venv could not be made.
        """
        self.ensure(out=out)
        self.ensure_venv(project, out=out)
        return subprocess.run(self.command(argv, project=project)).returncode

    def ensure_venv(self, project: Path = PROJECT, *, out=sys.stderr) -> None:
        """Make the root's venv for ``project``: ``scripts/install-deps`` run inside the root (it installs
        the project with its test extras into ``.venv``, which is this venv there).

        Raises:
            ClusterError: install-deps failed inside the root.
        """
        venv = self.venv_dir(project)
        venv.mkdir(parents=True, exist_ok=True)
        (project / ".venv").mkdir(exist_ok=True)  # the mount point (the host's own venv, or an empty dir)
        stamp = venv / ".slurm-gpushare-pyproject.sha256"
        want = hashlib.sha256((project / "pyproject.toml").read_bytes()).hexdigest()
        try:
            if stamp.read_text().strip() == want:
                return
        except OSError:
            pass
        print(f"dev-cluster: installing the project into the Slurm {self.release} root's venv ...", file=out,
              flush=True)
        self._copy_host_trust()
        started = time.monotonic()
        proc = subprocess.run(self.command([str(project / "scripts" / "install-deps")], cwd=project,
                                           project=project), stdout=out, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            raise ClusterError(f"scripts/install-deps failed in the Slurm {self.release} root ({proc.returncode})")
        print(f"dev-cluster: venv ready in {time.monotonic() - started:.0f} s", file=out, flush=True)

    def _copy_host_trust(self) -> None:
        """Give the root what the host's pip trusts and uses: the CA bundle (a site's TLS proxy adds its CA
        there), ``/etc/pip.conf`` and DNS, so that pip inside reaches the same package index."""
        for name in ("etc/ssl/certs/ca-certificates.crt", "etc/pip.conf", "etc/resolv.conf"):
            src = Path("/") / name
            if src.is_file():
                (self.path / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, self.path / name)


#: Run inside ``unshare --mount``: $1 root, $2 checkout, $3 venv, $4 cwd, $5 release, then the command.
_ENTER = r"""
set -e
root=$1 project=$2 venv=$3 cwd=$4 release=$5
shift 5
mount --rbind /proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount --bind /tmp "$root/tmp"
mkdir -p "$root$project"
mount --bind "$project" "$root$project"
mkdir -p "$root$project/.venv"
mount --bind "$venv" "$root$project/.venv"
export GPUSHARE_SLURM_RELEASE="$release"
exec chroot "$root" /usr/bin/env --chdir="$cwd" "$@"
"""


def _remove_tree(path: Path) -> None:
    """Remove a root being built or discarded; a root with something still mounted in it is refused
    (``rm`` never crosses into a bind mount: ``--one-file-system``)."""
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def run_in_release(release: str | None, argv: list[str]) -> int | None:
    """Run ``argv`` in ``release``'s root when that release is not this process's Slurm; returns its
    exit status, or None when it should run here.

    Raises:
        ClusterError: unsupported release, or building the root failed.
    """
    if not needs_root(release):
        return None
    assert release is not None
    return ReleaseRoot.for_release(release).run(argv)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Slurm releases in root filesystems (see the module docstring)."""


@cli.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--slurm", "release", required=True, help=f"the release: {', '.join(SUITES)}")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def run_cmd(release: str, argv: tuple[str, ...]) -> None:
    """Run ARGV with Slurm RELEASE (in its root unless it is this host's)."""
    rc = run_in_release(release, list(argv))
    if rc is None:
        os.execvp(argv[0], list(argv))
    sys.exit(rc)


@cli.command("path")
@click.option("--slurm", "release", required=True)
def path_cmd(release: str) -> None:
    """Print the root directory of RELEASE (building it when missing)."""
    print(ReleaseRoot.for_release(release).ensure())


@cli.command("host")
def host_cmd() -> None:
    """Print the release of this host's Slurm."""
    print(host_release() or "none")


def main(argv: list[str] | None = None) -> int:
    """``python -m slurm_gpushare_dev.release run|path|host``; returns the exit status."""
    try:
        cli.main(args=argv, prog_name="release", standalone_mode=False)
    except click.ClickException as e:
        print(f"release: error: {e.format_message()}", file=sys.stderr)
        return 2
    except GpushareError as e:
        print(f"release: error: {e}", file=sys.stderr)
        return 5
    except SystemExit as e:
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
