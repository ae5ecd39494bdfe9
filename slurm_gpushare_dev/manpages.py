r"""The man pages of ``slurm-gpushare``, generated from its click commands by click-man: one page per command
and command group (``slurm-gpushare.1``, ``slurm-gpushare-gres-conf.1``, ``slurm-gpushare-accounting-ingest.1``),
section 1. They are package data (``slurm_gpushare/data/man/``, so a wheel carries them and ``slurm-gpushare
install`` puts them in place) written by ``scripts/make-man``; ``tests/test_manpages.py`` fails when a
command's help changed and the pages were not written again.

click-man lays a page out (``.TH``, NAME, SYNOPSIS, DESCRIPTION, OPTIONS, COMMANDS) but copies the help
text into it as it is; roff reads a line that starts with ``.`` or ``'`` as a request and a backslash as an
escape. The help text is escaped here before click-man sees it, and a paragraph click keeps unwrapped
(``\b``, click's "do not rewrap" marker) is set unfilled (``.nf``/``.fi``).
"""

from __future__ import annotations

from inspect import cleandoc
from pathlib import Path

import click

#: Where the pages live in the source tree (package data of ``slurm_gpushare``).
MAN_DIR = Path(__file__).resolve().parent.parent / "slurm_gpushare" / "data" / "man"


def escape(text: str) -> str:
    r"""Help text as roff body text: backslashes as ``\e``, a line that would start a request guarded with
    ``\&``, a ``\b`` paragraph unfilled, blank lines left for click-man to turn into ``.PP``."""
    out: list[str] = []
    unfilled = False
    for line in text.split("\n"):
        if line.strip() == "\b":
            unfilled = True
            out.append(".nf")
            continue
        if not line.strip():
            if unfilled:
                out.append(".fi")
                unfilled = False
            out.append("")
            continue
        line = line.replace("\\", "\\e")
        if line.startswith((".", "'")):
            line = "\\&" + line
        out.append(line)
    if unfilled:
        out.append(".fi")
    return "\n".join(out)


def _page(ctx: click.Context, version: str) -> str:
    from click_man.man import ManPage  # type: ignore[import-untyped]

    command = ctx.command
    page = ManPage(ctx.command_path)
    page.version = f"slurm-gpushare {version}"
    page.date = version  # reproducible: the page changes with the version, not with the day it was written
    page.short_help = escape(command.get_short_help_str(limit=120))
    page.description = escape(cleandoc(command.help or ""))
    page.synopsis = " ".join(command.collect_usage_pieces(ctx))
    page.options = []
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            record = param.get_help_record(ctx)
            if record:
                page.options.append((record[0], escape(record[1])))
    commands = getattr(command, "commands", None)
    if commands:
        page.commands = [(name, escape(sub.get_short_help_str(limit=120))) for name, sub in commands.items()
                         if not sub.hidden]
    return str(page)


def man_pages(cli: click.Command | None = None, name: str = "slurm-gpushare",
              version: str | None = None) -> dict[str, str]:
    """Every page of ``cli`` (default: the ``slurm-gpushare`` group) and its subcommands: file name -> roff
    text, in command order. Needs click-man (a test extra)."""
    from slurm_gpushare import __version__
    from slurm_gpushare.cli import main

    pages: dict[str, str] = {}

    def walk(command: click.Command, info_name: str, parent: click.Context | None) -> None:
        ctx = click.Context(command, info_name=info_name, parent=parent)
        pages[ctx.command_path.replace(" ", "-") + ".1"] = _page(ctx, version or __version__)
        for sub_name, sub in getattr(command, "commands", {}).items():
            if not sub.hidden:
                walk(sub, sub_name, ctx)

    walk(cli or main, name, None)
    return pages


def write_man_pages(target: Path = MAN_DIR) -> list[Path]:
    """Write :func:`man_pages` into ``target`` and remove pages of commands that are gone; returns the paths
    written."""
    target.mkdir(parents=True, exist_ok=True)
    pages = man_pages()
    for old in target.glob("*.1"):
        if old.name not in pages:
            old.unlink()
    written = []
    for file_name, text in pages.items():
        path = target / file_name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written
