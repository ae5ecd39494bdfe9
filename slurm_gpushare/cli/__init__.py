"""The ``slurm-gpushare`` command line: one click group, one module per command family.

Errors from the library arrive here as :class:`~slurm_gpushare.errors.GpushareError` and leave as one
line on stderr (``slurm-gpushare: error: ...``) and the error's exit code; no traceback.
"""

from __future__ import annotations

import sys

import click

from slurm_gpushare import __version__
from slurm_gpushare.errors import GpushareError


class GpushareGroup(click.Group):
    """A click group that turns library errors into one clear line and an exit code."""

    def invoke(self, ctx: click.Context):  # noqa: D102
        try:
            return super().invoke(ctx)
        except GpushareError as e:
            click.echo(f"slurm-gpushare: error: {e}", err=True)
            sys.exit(e.exit_code)


@click.group(cls=GpushareGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="slurm-gpushare")
def main() -> None:
    """Safe, topology-aware GPU sharing for Slurm.

    Administrators read the hardware (inventory, topology), generate gres.conf and the matching
    slurm.conf lines (gres-conf) and run the node hooks; see docs/cli.md.
    """


def _register() -> None:
    # Command modules import only what they need when they run, so `slurm-gpushare --help` stays fast.
    from slurm_gpushare.cli import commands  # noqa: F401


_register()
