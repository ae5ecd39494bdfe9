"""``python -m slurm_gpushare ...`` is the ``slurm-gpushare`` command (its console script runs :func:`main`).

``hook prolog|epilog`` (slurmd runs them for every job) goes to :mod:`slurm_gpushare.node.hook`, which
imports no command-line framework; everything else to the click group :func:`slurm_gpushare.cli.main`.
"""

from __future__ import annotations

import sys


def main() -> None:
    """The ``slurm-gpushare`` command."""
    if sys.argv[1:2] == ["hook"]:
        from slurm_gpushare.node.hook import main as hook_main

        rc = hook_main(sys.argv[2:])
        if rc is not None:
            sys.exit(rc)
    from slurm_gpushare.cli import main as cli_main

    cli_main(prog_name="slurm-gpushare")


if __name__ == "__main__":
    main()
