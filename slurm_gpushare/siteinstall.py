"""``slurm-gpushare install``: put the site files of one host's role in place, with this installation's paths.

The package ships what a site installs in ``slurm_gpushare/data/site/`` (package data, so a wheel has
it): the Lua shims, the Prolog/Epilog/TaskProlog wrappers, the systemd units and the example configs.
The wrappers and units are templates: ``@NAME@`` placeholders (:data:`PLACEHOLDERS`) are filled with the
command of *this* installation (:func:`this_installation`: the ``slurm-gpushare`` console script that is
running, or the venv's one next to ``sys.executable``, else ``sys.executable -m slurm_gpushare``) and the
directories of a :class:`Layout`. The Lua client's socket settings, the TaskProlog's ``RUN_DIR`` and the
example node config's ``run_dir`` are set to the layout's run directory.

What each role gets (:data:`ROLE_FILES`):

- ``controller``: ``job_submit.lua``, ``gpushare_client.lua`` and ``cli_filter.lua`` next to slurm.conf
  (slurmctld loads ``job_submit.lua`` from slurm.conf's directory, src/plugins/job_submit/lua; in
  configless mode it also sends ``cli_filter.lua`` to the clients), the filter service's unit,
  ``gpushare.toml.example`` and ``epilog_slurmctld.sh`` (EpilogSlurmctld: the usage segment into
  AdminComment, docs/accounting.md);
- ``node``: ``prolog.sh``, ``epilog.sh``, ``taskprolog.sh`` in the config directory, the monitor's unit
  and ``node.toml.example``;
- ``login``: ``cli_filter.lua`` and ``gpushare_client.lua`` next to slurm.conf (srun/sbatch/salloc load
  ``cli_filter.lua`` from there; 22.05's srun path also needs the client file);
- every role: the man pages of the ``slurm-gpushare`` commands (``slurm_gpushare/data/man/``, generated from the
  commands' help) in ``PREFIX/usr/local/share/man/man1`` (the FHS place for software a site installs locally).

A file is never replaced behind an administrator's back: :func:`install` writes a file that is missing,
leaves one that already holds what it would write, and replaces one that differs only when the manifest
of the last install (:data:`MANIFEST`, in the config directory) shows it unchanged since that install
wrote it (an upgrade); a file edited since (or never written by this command) is refused unless
``force``. Nothing is written when anything is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from slurm_gpushare.atomicfile import write_all_atomic, write_atomic
from slurm_gpushare.errors import ConfigError, InputError

ROLES = ("controller", "node", "login")
DEFAULT_RUN_DIR = "/run/slurm-gpushare"
#: The run directory the shipped files name (replaced by the layout's).
SHIPPED_RUN_DIR = "/run/slurm-gpushare"
#: filterd's socket directory below the run directory (the filterd unit's RuntimeDirectory=).
SOCKET_SUBDIR = "filterd"
#: The manifest of what the last install wrote (path -> sha256), in the layout's config directory.
MANIFEST = "install-manifest.json"
#: The placeholders a template may hold; an unknown ``@NAME@`` left in a template is an error.
PLACEHOLDERS = ("SLURM_GPUSHARE", "PYTHON", "CONFIG_DIR", "SLURM_CONF_DIR", "RUN_DIR", "SOCKET_DIR",
                "RUNTIME_DIRECTORY")
_PLACEHOLDER = re.compile(r"@([A-Z][A-Z_]*)@")
#: Characters a path written into the files may hold: Slurm splits its values on whitespace, systemd and
#: sh would expand ``%``, ``$`` and quotes, Lua strings end at a quote. ``{node}`` only in a node's run dir.
_PATH_CHARS = re.compile(r"[A-Za-z0-9._+/-]+")


@dataclass(frozen=True)
class _Spec:
    source: str  # name in slurm_gpushare/data/site/
    where: str  # "slurm_conf_dir", "config_dir" or "systemd_dir"
    mode: int
    render: str  # "template", "lua_client", "taskprolog", "node_example" or "copy"


_SPECS = {
    "job_submit.lua": _Spec("job_submit.lua", "slurm_conf_dir", 0o644, "copy"),
    "gpushare_client.lua": _Spec("gpushare_client.lua", "slurm_conf_dir", 0o644, "lua_client"),
    "cli_filter.lua": _Spec("cli_filter.lua", "slurm_conf_dir", 0o644, "copy"),
    "slurm-gpushare-filterd.service": _Spec("slurm-gpushare-filterd.service", "systemd_dir", 0o644, "template"),
    "gpushare.toml.example": _Spec("gpushare.toml.example", "config_dir", 0o644, "copy"),
    "epilog_slurmctld.sh": _Spec("epilog_slurmctld.sh", "config_dir", 0o755, "template"),
    "prolog.sh": _Spec("prolog.sh", "config_dir", 0o755, "template"),
    "epilog.sh": _Spec("epilog.sh", "config_dir", 0o755, "template"),
    "taskprolog.sh": _Spec("taskprolog.sh", "config_dir", 0o755, "taskprolog"),
    "slurm-gpushare-monitor.service": _Spec("slurm-gpushare-monitor.service", "systemd_dir", 0o644, "template"),
    "node.toml.example": _Spec("node.toml.example", "config_dir", 0o644, "node_example"),
}

#: The files that name the filter service's sockets (below the run directory: no ``{node}`` there).
_SOCKET_FILES = ("gpushare_client.lua", "slurm-gpushare-filterd.service")

#: The source prefix of the man pages, which every role installs.
_MAN_SOURCE = "slurm_gpushare/data/man/"

#: Role -> the shipped files it installs (and the man pages, every role).
ROLE_FILES: dict[str, tuple[str, ...]] = {
    "controller": ("job_submit.lua", "gpushare_client.lua", "cli_filter.lua", "slurm-gpushare-filterd.service",
                   "gpushare.toml.example", "epilog_slurmctld.sh"),
    "node": ("prolog.sh", "epilog.sh", "taskprolog.sh", "slurm-gpushare-monitor.service", "node.toml.example"),
    "login": ("cli_filter.lua", "gpushare_client.lua"),
}


def man_data() -> Traversable:
    """The man pages shipped with the package (``slurm_gpushare/data/man/``, a :mod:`importlib.resources`
    traversable)."""
    return resources.files("slurm_gpushare") / "data" / "man"


def man_page_names() -> list[str]:
    """The shipped man pages' file names (``slurm-gpushare.1``, ``slurm-gpushare-gres-conf.1``...), sorted."""
    return sorted(p.name for p in man_data().iterdir() if p.name.endswith(".1"))


def site_data() -> Traversable:
    """The directory of the shipped site files (an ``importlib.resources`` traversable)."""
    return resources.files("slurm_gpushare") / "data" / "site"


def this_installation(argv0: str | None = None, executable: str | None = None) -> tuple[str, ...]:
    """The command that runs this installation's ``slurm-gpushare``, as argv words.

    The console script that is running (``argv0`` is named ``slurm-gpushare``: a pip install's script,
    in a venv or in ``/usr/local/bin``), else the one a venv's pip put next to ``executable``, else
    ``executable -m slurm_gpushare``. Paths are made absolute but symlinks are kept: a venv's
    ``bin/python`` is a link to the base interpreter, which does not see the venv's packages. A script
    run through a link (install.md's ``/usr/local/sbin/slurm-gpushare``) is named by what it links
    to, the venv's own script where it is that one: the files keep running this installation when the
    link is removed or pointed at another.

    Args:
        argv0: the program name (default ``sys.argv[0]``).
        executable: the interpreter (default ``sys.executable``).
    """
    argv0 = sys.argv[0] if argv0 is None else argv0
    executable = executable or sys.executable
    script = os.path.join(os.path.dirname(os.path.abspath(executable)), "slurm-gpushare")
    venv_script = os.path.isfile(script) and os.access(script, os.X_OK)
    if argv0 and os.path.basename(argv0) == "slurm-gpushare" and os.path.isfile(argv0):
        if not os.path.islink(argv0):
            return (os.path.abspath(argv0),)
        if venv_script and os.path.samefile(argv0, script):
            return (script,)
        return (os.path.realpath(argv0),)
    if venv_script:
        return (script,)
    return (os.path.abspath(executable), "-m", "slurm_gpushare")


def _unsafe_path(option: str, value: str) -> InputError:
    return InputError(f"{option} {value!r} holds characters that slurm.conf, sh and systemd would split or expand",
                      hint="use a path of letters, digits and ._+-/ only")


@dataclass(frozen=True)
class Layout:
    """Where the files go and what they name.

    Attributes:
        slurm_conf_dir: slurm.conf's directory (the Lua files go there).
        config_dir: the product's configuration directory (wrappers, example configs, machines/).
        systemd_dir: where the units go.
        man_dir: where the man pages go (section 1); None: none are installed.
        run_dir: the hooks' run directory (node; may hold ``{node}``, the Slurm node name); the filter service's
            sockets are in its ``filterd`` subdirectory (:attr:`socket_dir`; controller, login), the unit's
            ``RuntimeDirectory=``, which systemd removes whenever filterd stops or restarts: on a host with both
            roles the running jobs' state in the run directory stays.
        command: argv words that run this installation's ``slurm-gpushare`` (:func:`this_installation`).
        python: this installation's interpreter (``sys.executable``, symlinks kept: a venv's ``bin/python``),
            for templates that run a module of the package with ``@PYTHON@ -m ...``.
    """

    slurm_conf_dir: Path
    config_dir: Path
    systemd_dir: Path
    run_dir: str = DEFAULT_RUN_DIR
    command: tuple[str, ...] = ()
    python: str = ""
    man_dir: Path | None = None

    @property
    def socket_dir(self) -> str:
        """filterd's socket directory: ``<run_dir>/filterd``."""
        return f"{self.run_dir}/{SOCKET_SUBDIR}"

    @classmethod
    def under(cls, prefix: str | Path, *, slurm_conf_dir: str | Path | None = None,
              config_dir: str | Path | None = None, run_dir: str = DEFAULT_RUN_DIR,
              command: Sequence[str] | None = None) -> Layout:
        """The layout below ``prefix``: ``PREFIX/etc/slurm`` (slurm.conf's directory),
        ``PREFIX/etc/slurm/gpushare`` (config) and ``PREFIX/etc/systemd/system``; ``prefix`` ``/`` is a
        site's real layout. Relative paths are made absolute.

        Raises:
            InputError: a path holding characters the files cannot carry (whitespace, quotes, ``$``, ``%``...),
                or an empty ``prefix``.
        """
        if not str(prefix).strip():
            raise InputError("--prefix is empty (an unset variable?): it would install below the working directory",
                             hint="give the root of the layout: / on a real host, a scratch directory to try")
        base = Path(os.path.abspath(prefix))
        if not _PATH_CHARS.fullmatch(str(base)):
            raise _unsafe_path("--prefix", str(base))
        sc = Path(os.path.abspath(slurm_conf_dir)) if slurm_conf_dir else base / "etc" / "slurm"
        cd = Path(os.path.abspath(config_dir)) if config_dir else base / "etc" / "slurm" / "gpushare"
        layout = cls(slurm_conf_dir=sc, config_dir=cd, systemd_dir=base / "etc" / "systemd" / "system",
                     man_dir=base / "usr" / "local" / "share" / "man" / "man1", run_dir=run_dir,
                     command=tuple(command) if command else this_installation(),
                     python=os.path.abspath(sys.executable))
        layout.check()
        return layout

    def check(self) -> None:
        """Refuse paths the written files cannot carry.

        Raises:
            InputError: naming the option and the offending path.
        """
        named = [("--slurm-conf-dir", str(self.slurm_conf_dir)), ("--config-dir", str(self.config_dir)),
                 ("--prefix", str(self.systemd_dir)), ("this installation's command", " ".join(self.command)),
                 ("this installation's python", self.python or "/")]
        for option, value in named:
            for word in value.split(" ") if option.startswith("this installation's c") else [value]:
                if not _PATH_CHARS.fullmatch(word):
                    raise _unsafe_path(option, value)
        run = self.run_dir.replace("{node}", "")
        if not self.run_dir.startswith("/") or not _PATH_CHARS.fullmatch(run):
            raise InputError(f"--run-dir {self.run_dir!r} is not an absolute path of letters, digits, ._+-/ "
                             "(and {node})", hint=f"e.g. {DEFAULT_RUN_DIR}")

    def directory(self, where: str) -> Path:
        """The directory named by a spec's ``where``."""
        return {"slurm_conf_dir": self.slurm_conf_dir, "config_dir": self.config_dir,
                "systemd_dir": self.systemd_dir}[where]

    @property
    def manifest(self) -> Path:
        """The manifest of what the last install wrote (:data:`MANIFEST`)."""
        return self.config_dir / MANIFEST


@dataclass(frozen=True)
class SiteFile:
    """One file an install writes.

    Attributes:
        path: where it goes.
        text: its content.
        mode: its permission bits (0o755 for the hook wrappers, else 0o644).
        source: the shipped file it comes from (``slurm_gpushare/data/site/<name>``).
        roles: the roles it belongs to.
    """

    path: Path
    text: str
    mode: int
    source: str
    roles: tuple[str, ...]

    @property
    def digest(self) -> str:
        """sha256 of :attr:`text` (hex)."""
        return hashlib.sha256(self.text.encode()).hexdigest()


def set_lua_setting(text: str, key: str, value: str, *, source: str = "gpushare_client.lua") -> str:
    """``text`` with the first ``key = ...,`` line of gpushare_client.lua's settings table set to ``value``
    (a Lua expression: ``'"/run/x.sock"'``, ``"0.5"``).

    Raises:
        ConfigError: the text has no such setting.
    """
    out, done = [], False
    for line in text.splitlines(keepends=True):
        if not done and line.lstrip().startswith(f"{key} = "):
            indent = line[: len(line) - len(line.lstrip())]
            line = f"{indent}{key} = {value},\n"
            done = True
        out.append(line)
    if not done:
        raise ConfigError(f"{source} has no '{key} =' setting",
                          hint="use the gpushare_client.lua of this package (slurm_gpushare/data/site/)")
    return "".join(out)


def _replace_line(text: str, old: str, new: str, source: str) -> str:
    if old not in text:
        raise ConfigError(f"{source} has no line {old!r} to set", hint="reinstall the package: a shipped file "
                          "was changed")
    return text.replace(old, new, 1)


def render(name: str, layout: Layout) -> str:
    """The text of shipped file ``name`` for ``layout``.

    Raises:
        ConfigError: a template holds a placeholder this version does not fill, or a shipped file lost the
            line that is set.
        InputError: a controller/login file asked for a run directory with ``{node}``.
    """
    spec = _SPECS[name]
    text = (site_data() / spec.source).read_text()
    source = f"slurm_gpushare/data/site/{spec.source}"
    if name in _SOCKET_FILES and "{node}" in layout.run_dir:
        raise InputError(f"--run-dir {layout.run_dir} holds {{node}}, which only the node role's files take "
                         f"({name} names the filter service's sockets)",
                         hint="install the node role with its own --run-dir")
    if spec.render == "lua_client":
        text = set_lua_setting(text, "socket", f'"{layout.socket_dir}/filterd.sock"', source=source)
        text = set_lua_setting(text, "controller_socket", f'"{layout.socket_dir}/controller.sock"', source=source)
    elif spec.render == "taskprolog":
        text = _replace_line(text, f'RUN_DIR="{SHIPPED_RUN_DIR}"', f'RUN_DIR="{layout.run_dir}"', source)
    elif spec.render == "node_example":
        text = _replace_line(text, f'run_dir = "{SHIPPED_RUN_DIR}"', f'run_dir = "{layout.run_dir}"', source)
    elif spec.render == "template":
        rel = layout.run_dir.removeprefix("/run/")
        values = {
            "SLURM_GPUSHARE": " ".join(shlex.quote(w) for w in layout.command),
            "PYTHON": layout.python or sys.executable,
            "CONFIG_DIR": str(layout.config_dir),
            "SLURM_CONF_DIR": str(layout.slurm_conf_dir),
            "RUN_DIR": layout.run_dir,
            "SOCKET_DIR": layout.socket_dir,
            # systemd makes (and owns to User=) a RuntimeDirectory= below /run only, and removes the innermost
            # directory when the unit stops or restarts (systemd.exec(5)): filterd's own, never the node's run dir
            "RUNTIME_DIRECTORY": (f"RuntimeDirectory={rel}/{SOCKET_SUBDIR}" if rel != layout.run_dir and rel
                                  else f"# {layout.socket_dir} is not below /run: create it, owned by User=, first"),
        }

        def fill(m: re.Match) -> str:
            if m.group(1) not in values:
                raise ConfigError(f"{source} holds the placeholder @{m.group(1)}@, which this version does not fill",
                                  hint=f"placeholders: {', '.join('@' + p + '@' for p in PLACEHOLDERS)}")
            return values[m.group(1)]

        text = _PLACEHOLDER.sub(fill, text)
    return text


def plan(roles: Iterable[str], layout: Layout) -> list[SiteFile]:
    """The files ``roles`` install with ``layout``, each once, in the order of :data:`ROLE_FILES`.

    Raises:
        InputError: an unknown role (naming the known ones), or a run directory a role cannot use.
        ConfigError: a shipped file that does not render (see :func:`render`).
    """
    roles = list(dict.fromkeys(roles))
    unknown = [r for r in roles if r not in ROLES]
    if unknown or not roles:
        raise InputError(f"unknown role {', '.join(unknown) or '(none given)'}",
                         hint=f"--role is one of {', '.join(ROLES)} (repeat it for a host with several)")
    owners: dict[str, list[str]] = {}
    for role in roles:
        for name in ROLE_FILES[role]:
            owners.setdefault(name, []).append(role)
    files = []
    for name, who in owners.items():
        spec = _SPECS[name]
        files.append(SiteFile(path=layout.directory(spec.where) / name, text=render(name, layout), mode=spec.mode,
                              source=f"slurm_gpushare/data/site/{spec.source}", roles=tuple(who)))
    if layout.man_dir is not None:  # every role's: the commands are the same on every host
        for name in man_page_names():
            files.append(SiteFile(path=layout.man_dir / name, text=(man_data() / name).read_text(), mode=0o644,
                                  source=f"slurm_gpushare/data/man/{name}", roles=tuple(roles)))
    return files


def slurm_conf_lines(roles: Iterable[str], layout: Layout) -> list[str]:
    """The slurm.conf lines the installed files need, with a comment on each (slurm.conf must be the same
    on every host, so add them once for the whole cluster).

    Sources: slurm.conf(5) (``JobSubmitPlugins``, ``CliFilterPlugins``, ``Prolog``, ``Epilog``,
    ``TaskProlog``, ``PrologFlags=Alloc``: the Prolog runs when the job is allocated, so it has prepared
    the MPS daemon before the first task, also for salloc).
    """
    roles = set(roles)
    lines = []
    if roles & {"controller", "login"}:
        if "controller" in roles:
            lines.append(f"JobSubmitPlugins=lua             # {layout.slurm_conf_dir}/job_submit.lua")
            lines.append(f"EpilogSlurmctld={layout.config_dir}/epilog_slurmctld.sh  # usage segment into AdminComment "
                         "(needs slurmdbd; docs/accounting.md)")
        lines.append(f"CliFilterPlugins=cli_filter/lua  # {layout.slurm_conf_dir}/cli_filter.lua")
    if "node" in roles:
        lines += [f"Prolog={layout.config_dir}/prolog.sh",
                  f"Epilog={layout.config_dir}/epilog.sh",
                  f"TaskProlog={layout.config_dir}/taskprolog.sh",
                  "PrologFlags=Alloc                # add Alloc to the flags you already have"]
    lines.append("GresTypes=gpu,shard,gpushare     # and the Gres= lines: slurm-gpushare gres-conf writes them")
    return lines


@dataclass(frozen=True)
class Outcome:
    """What :func:`install` did (or, with ``dry_run``, would do) with one file.

    ``state``: ``"new"`` (missing), ``"unchanged"`` (already holds it, with its mode), ``"mode"`` (holds it, with
    other permission bits: a Prolog that lost its x bit; the mode is set again), ``"upgrade"`` (differs, but is what
    the last install wrote), ``"replace"`` (differs, replaced with ``force``) or ``"refused"`` (differs and
    was not written by the last install: edited, or someone else's).
    """

    file: SiteFile
    state: str


def _read_manifest(path: Path) -> dict[str, str]:
    return _read_manifest_data(path)[0]


def _read_manifest_data(path: Path) -> tuple[dict[str, str], set[str] | None]:
    """The manifest's files (path -> sha256) and the roles installed (None: a manifest of a version that did not
    record them)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError):
        return {}, None  # an unreadable manifest only means: nothing counts as written by the last install
    files = data.get("files") if isinstance(data, dict) else None
    roles = data.get("roles") if isinstance(data, dict) else None
    return ({str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else {},
            {str(r) for r in roles if r in ROLES} if isinstance(roles, list) else None)


def _write_manifest(layout: Layout, files: dict[str, str], roles: set[str]) -> None:
    write_atomic(layout.manifest, json.dumps({"files": dict(sorted(files.items())), "roles": sorted(roles)},
                                             indent=2) + "\n", mode=0o644)


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


_NO_WRITE_HINT = "run it as root for --prefix /, or give a --prefix you can write"


def check_writable(paths: Iterable[Path]) -> None:
    """Refuse, before anything is written, what would stop the install writing ``paths``: a directory where a
    file goes, something not a directory where a directory goes (or must be made), a directory this user
    cannot write (the nearest that exists: the install makes the ones below it). A dry run checks the same.

    Raises:
        InputError: naming the path and what to do.
    """
    seen: set[Path] = set()
    for path in paths:
        if path.is_dir():
            raise InputError(f"{path} is a directory, where the install writes a file",
                             hint="move it away: the install never replaces a directory, not even with --force")
        for d in (path.parent, *path.parent.parents):
            if d in seen:
                break
            seen.add(d)
            if not os.path.lexists(d):
                continue
            if not d.is_dir():
                raise InputError(f"{d} is not a directory, where the install needs one (for {path})",
                                 hint="move it away, or give the install another --prefix (or --slurm-conf-dir, "
                                      "--config-dir)")
            if not os.access(d, os.W_OK | os.X_OK):
                raise InputError(f"cannot write {d}: permission denied", hint=_NO_WRITE_HINT)
            break


def assess(files: Sequence[SiteFile], layout: Layout, *, force: bool = False) -> list[Outcome]:
    """What :func:`install` would do with each file (see :class:`Outcome`), reading only.

    Raises:
        InputError: something in the way of a file or its directory, or a directory this user cannot write
            (:func:`check_writable`).
    """
    check_writable([*(f.path for f in files), layout.manifest])
    manifest = _read_manifest(layout.manifest)
    out = []
    for f in files:
        have = _digest(f.path)
        if have is None:
            state = "new"
        elif have == f.digest:
            state = "unchanged" if _mode(f.path) == f.mode else "mode"
        elif manifest.get(str(f.path)) == have:
            state = "upgrade"
        else:
            state = "replace" if force else "refused"
        out.append(Outcome(f, state))
    return out


#: The mode of every directory ``install`` makes or writes into: root-run scripts live there (no other writer),
#: and login users' clients read cli_filter.lua from there.
DIR_MODE = 0o755


def _refuse_foreign_writable(d: Path) -> None:
    """Refuse a directory the files would go into that is writable by group or others and owned by another user
    (anyone who may write there could replace a root-run script); one of this user's is repaired by
    :func:`make_dir`.

    Raises:
        InputError: naming the directory, its mode and owner.
    """
    try:
        st = d.lstat()
    except FileNotFoundError:
        return
    if st.st_mode & 0o022 and st.st_uid != os.geteuid():
        raise InputError(f"{d} is writable by others and owned by uid {st.st_uid} (mode {oct(st.st_mode & 0o7777)}): "
                         "whoever may write there could replace the root-run Prolog and Epilog; nothing was written",
                         hint=f"chown root {d} && chmod 755 {d}, or install elsewhere (--prefix)")


def make_dir(d: Path) -> None:
    """Create ``d`` and its missing parents with mode :data:`DIR_MODE` whatever the umask, and take group and
    others' write permission from ``d`` when it is there already.

    Raises:
        OSError: a directory cannot be made or changed.
    """
    missing = []
    p = d
    while not p.exists():
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        p.mkdir(mode=DIR_MODE)
        os.chmod(p, DIR_MODE)  # mkdir's mode is masked by the umask
    mode = d.stat().st_mode & 0o7777
    if mode & 0o022:
        os.chmod(d, mode & ~0o022)


def install(files: Sequence[SiteFile], layout: Layout, *, force: bool = False, dry_run: bool = False) -> list[Outcome]:
    """Write ``files`` (atomically each, :mod:`slurm_gpushare.atomicfile`) and the manifest.

    Returns:
        One :class:`Outcome` per file; with ``dry_run`` nothing is written.

    Raises:
        ConfigError: some files differ from what this install writes and were not written by the last
            install (edited since, or someone else's) and ``force`` is not given: the message names each;
            nothing is written.
        InputError: something in the way of a file or its directory, or a directory this user cannot
            write, found before anything is written (:func:`check_writable`; a dry run says the same), or a
            file that could not be written after all (naming it).
    """
    outcomes = assess(files, layout, force=force)
    refused = [o.file.path for o in outcomes if o.state == "refused"]
    if refused and not dry_run:
        raise ConfigError(
            f"{len(refused)} file(s) differ from what this install writes and were changed since the last "
            f"install wrote them (or never written by it): {', '.join(map(str, refused))}",
            hint="see how with --dry-run --diff and merge your changes after the install, or "
                 "pass --force to replace them (their content is lost: copy them first); nothing was written")
    if dry_run:
        return outcomes
    writes = [o.file for o in outcomes if o.state != "unchanged"]
    dirs = sorted({f.path.parent for f in files} | {layout.manifest.parent})
    for d in dirs:
        _refuse_foreign_writable(d)
    try:
        for d in dirs:
            make_dir(d)
        # one write for every file (each with its mode): none is replaced unless all could be written
        write_all_atomic({f.path: f.text for f in writes}, mode={f.path: f.mode for f in writes})
        manifest, installed = _read_manifest_data(layout.manifest)
        manifest.update({str(f.path): f.digest for f in files})
        _write_manifest(layout, manifest, (installed or set()) | {r for f in files for r in f.roles})
    except OSError as e:
        raise InputError(f"cannot write {e.filename or layout.config_dir}: {e.strerror or e}",
                         hint=_NO_WRITE_HINT) from None
    return outcomes


# --- uninstall ----------------------------------------------------------------------------------------------

#: The slurm.conf settings that name each site file (slurm.conf(5)): while one of them is in force, the file must
#: stay (slurmctld or slurmd would fail to load it, or drain the node running a Prolog that is gone). A
#: ``*.lua`` file is named by its plugin (``JobSubmitPlugins=lua``, ``CliFilterPlugins=cli_filter/lua``), the
#: scripts by their path.
_NAMED_BY = {"job_submit.lua": ("JobSubmitPlugins", "lua"), "cli_filter.lua": ("CliFilterPlugins", "cli_filter/lua"),
             "epilog_slurmctld.sh": ("EpilogSlurmctld", None), "prolog.sh": ("Prolog", None),
             "epilog.sh": ("Epilog", None), "taskprolog.sh": ("TaskProlog", None)}


@dataclass(frozen=True)
class Removal:
    """What :func:`uninstall` did (or would do) with one file of the roles.

    ``state``: ``"remove"`` (as the last install wrote it: removed), ``"changed"`` (changed since the last install
    wrote it, or not written by it: left), ``"gone"`` (not there), ``"shared"`` (also a file of a role this host
    keeps: left).
    """

    path: Path
    state: str


def _installed_roles(manifest: dict[str, str], recorded: set[str] | None, layout: Layout) -> set[str]:
    """The roles the manifest records as installed; for a manifest that does not record them, those one of whose
    own files (not shared with another role) it lists."""
    if recorded is not None:
        return recorded
    listed = set(manifest)
    out = set()
    for role, names in ROLE_FILES.items():
        own = [n for n in names if sum(n in other for other in ROLE_FILES.values()) == 1]
        if any(str(layout.directory(_SPECS[n].where) / n) in listed for n in own):
            out.add(role)
    return out


def uninstall_plan(roles: Iterable[str], layout: Layout) -> list[Removal]:
    """What :func:`uninstall` would do with each file of ``roles`` (reading only): a file is removed only as the
    last install wrote it (the manifest's digest), and only when no role this host keeps also installs it.

    Raises:
        InputError: an unknown role (see :func:`plan`).
    """
    roles = set(roles)
    files = plan(roles, layout)
    manifest, recorded = _read_manifest_data(layout.manifest)
    kept = _installed_roles(manifest, recorded, layout) - roles
    out = []
    for f in files:
        have = _digest(f.path)
        if have is None:
            state = "gone"
        elif any(f.path.name in ROLE_FILES[r] for r in kept) or (kept and f.source.startswith(_MAN_SOURCE)):
            state = "shared"
        elif manifest.get(str(f.path)) == have:
            state = "remove"
        else:
            state = "changed"
        out.append(Removal(f.path, state))
    return out


def lines_in_force(removals: Sequence[Removal], settings: Sequence[tuple[str, int, str, str]]) -> list[str]:
    """The slurm.conf settings (``file:line: Key=Value``, from :func:`slurm_gpushare.slurm.conf.slurm_conf_settings`)
    that name a file ``removals`` would remove: they must go from slurm.conf (and slurmctld and slurmd be told)
    before the files do."""
    out = []
    for r in removals:
        if r.state != "remove" or r.path.name not in _NAMED_BY:
            continue
        key, plugin = _NAMED_BY[r.path.name]
        for src, number, k, v in settings:
            if k.lower() != key.lower():
                continue
            items = [x.strip() for x in v.split(",")]
            if (plugin in items) if plugin else (str(r.path) in items):
                out.append(f"{src}:{number}: {k}={v}")
    return list(dict.fromkeys(out))


def job_dirs(layout: Layout) -> list[Path]:
    """The job directories in the node run directory (``{node}`` read as any node): jobs whose Prolog ran here
    and whose Epilog has not ended yet."""
    pattern = layout.run_dir.replace("{node}", "*").lstrip("/")
    return sorted(p for d in Path("/").glob(pattern) for p in (d / "jobs").glob("*") if p.is_dir())


def uninstall(roles: Iterable[str], removals: Sequence[Removal], layout: Layout, *, dry_run: bool = False) -> None:
    """Remove the files ``removals`` mark ``remove``, take them and ``roles`` out of the manifest (removed when it
    lists nothing else). Directories stay (they may hold the site's own files: node.toml, machines/, policies).

    Raises:
        InputError: a file that could not be removed (naming it); the manifest then still lists it.
    """
    if dry_run:
        return
    manifest, recorded = _read_manifest_data(layout.manifest)
    left_roles = _installed_roles(manifest, recorded, layout) - set(roles)
    try:
        for r in removals:
            if r.state == "remove":
                r.path.unlink(missing_ok=True)
                manifest.pop(str(r.path), None)
            elif r.state == "gone":
                manifest.pop(str(r.path), None)
        if manifest:
            _write_manifest(layout, manifest, left_roles)
        else:
            layout.manifest.unlink(missing_ok=True)
    except OSError as e:
        raise InputError(f"cannot remove {e.filename or layout.config_dir}: {e.strerror or e}",
                         hint=_NO_WRITE_HINT) from None
