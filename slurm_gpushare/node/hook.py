"""The Prolog's and Epilog's own entry point: ``slurm-gpushare hook prolog|epilog [--config FILE]`` without
the command-line framework.

slurmd starts the Prolog and the Epilog for every job on the node (slurm.conf(5) Prolog, Epilog); what
they cost is paid by every job, GPU or not. This module is what the ``slurm-gpushare`` console script and
``python -m slurm_gpushare`` run when the first argument is ``hook`` (:mod:`slurm_gpushare.__main__`):
it imports neither click nor the other commands, and it decides from slurmd's environment, before
anything else is imported, whether the job can need anything on this node:

* Prolog: a job with no GPU on this node (slurmd sets neither ``SLURM_JOB_GPUS`` nor
  ``CUDA_VISIBLE_DEVICES`` in the Prolog's environment: ``gres_common_prep_set_env`` in
  src/plugins/gres/common/gres_common.c at slurm-24-11-5-1 and slurm-26-05-3-1,
  ``gres_common_epilog_set_env`` at slurm-22-05-8-1) needs nothing: exit 0 without reading node.toml.
* Epilog: a job with no GPU on this node and no job directory needs nothing: exit 0 after reading
  node.toml for the run dir.

Everything else goes to :func:`slurm_gpushare.node.prolog.prolog` / :func:`slurm_gpushare.node.epilog.epilog`
with the same exit statuses and messages as the click command (:func:`run`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

#: The hooks this entry point runs.
HOOKS = ("prolog", "epilog")


def parse_args(argv: Sequence[str]) -> tuple[str, str | None] | None:
    """``[prolog|epilog, --config FILE]`` (also ``--config=FILE``) -> ``(hook, config path or None)``;
    None for anything else (``--help``, a typo), which the click command then answers."""
    if not argv or argv[0] not in HOOKS:
        return None
    config: str | None = None
    rest = list(argv[1:])
    while rest:
        arg = rest.pop(0)
        if arg == "--config" and rest:
            config = rest.pop(0)
        elif arg.startswith("--config="):
            config = arg.split("=", 1)[1]
        else:
            return None
    return argv[0], config


def has_gpus(env: Mapping[str, str]) -> bool:
    """Whether slurmd gave the job GPU devices on this node: ``SLURM_JOB_GPUS`` or ``CUDA_VISIBLE_DEVICES``
    in the Prolog's/Epilog's environment (a job holding ``gpu`` or ``shard`` GRES here gets both; measured
    on the dev cluster of 22.05, 24.11 and 26.05, docs/performance.md)."""
    return bool(env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES"))


def run(which: str, config_path: str | None, env: Mapping[str, str]) -> int:
    """Run hook ``which`` (``prolog`` or ``epilog``) for slurmd's environment ``env``; returns the exit status
    (non-zero drains the node), after writing any error as one line on stderr (slurmd's log)."""
    from slurm_gpushare.errors import GpushareError

    env = dict(env)
    job_id = env.get("SLURM_JOB_ID", "")
    if which == "prolog" and job_id and not has_gpus(env):
        return 0  # nothing on this node can be prepared for it: node.toml is not even read
    try:
        if which == "epilog" and job_id and not has_gpus(env):
            from slurm_gpushare.node.config import load_node_config

            node = _node_name(env)
            if not (load_node_config(config_path).run_dir_for(node) / "jobs" / job_id).exists():
                return 0  # nothing was prepared for it here, and it held no GPU to leave processes on
        ctx = _context(config_path, env)
    except GpushareError as e:
        if which == "epilog":  # still stop the job's MPS daemon (found by process)
            from slurm_gpushare.node.epilog import epilog_without_config
            return epilog_without_config(env, config_path, e)
        print(f"slurm-gpushare {which}: {e}", file=sys.stderr)
        config_drain(_node_name(env), f"gpushare {which}: node config: {e}")
        return 1
    from slurm_gpushare.node.context import NodeFault

    try:
        if which == "prolog":
            from slurm_gpushare.node.prolog import prolog
            return run_limited(ctx, which, env, prolog)
        from slurm_gpushare.node.epilog import epilog
        return run_limited(ctx, which, env, epilog)
    except NodeFault as e:
        print(f"slurm-gpushare {which}: node fault: {e}", file=sys.stderr)
        return 1
    except GpushareError as e:
        print(f"slurm-gpushare {which}: {e}", file=sys.stderr)
        return 1


#: Seconds a hook that ran out of time has to end its job (cancel) or drain the node.
_GRACE_S = 15.0


class HookTimeout(BaseException):
    """The hook's own time limit ran out (a BaseException: no ``except Exception`` inside the hook takes it)."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`HookTimeout` in the block once ``seconds`` have passed (SIGALRM, ``setitimer``; main thread
    only). The previous SIGALRM handler is restored on the way out."""
    import signal

    def expired(signum, frame):
        raise HookTimeout

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_limited(ctx, which: str, env: Mapping[str, str], hook) -> int:
    """``hook(ctx, env)`` within node.toml's ``hook_timeout`` seconds (SIGALRM, ``setitimer``; the limit is the
    hook's own, below slurmd's ``PrologEpilogTimeout``, which would kill the hook without a word and, for an
    Epilog, leave the node to Slurm). When it runs out: a Prolog fails its job (cancelled, the node kept:
    :func:`~slurm_gpushare.node.context.fail_job`) and exits 0; an Epilog drains the node with a reason naming
    the job and the limit and exits 1 (what it had not done yet, e.g. stopping the job's MPS daemon, is
    ``doctor --repair``'s); doing that has :data:`_GRACE_S` seconds of its own, after which the hook exits 1
    (slurmd then drains the node and requeues the job). Locks taken with ``with`` are released on the way out.
    Returns the exit status."""
    from slurm_gpushare.node.context import JobFault, fail_job, log_event

    limit = ctx.config.hook_timeout
    job_id = env.get("SLURM_JOB_ID", "")
    try:
        with time_limit(limit):
            return hook(ctx, dict(env))
    except HookTimeout:
        what = f"did not finish within {limit:g} s (node.toml hook_timeout)"
        try:
            with time_limit(min(limit, _GRACE_S)):  # ending it has a limit of its own
                if which == "prolog":
                    fail_job(ctx, job_id, JobFault(f"the Prolog {what}"), "prolog", tell=False)
                    return 0
                reason = f"gpushare epilog job {job_id}: {what}: run 'slurm-gpushare doctor --repair'"
                log_event(ctx, "epilog", reason)
                ctx.do_drain(reason)
                return 1
        except HookTimeout:  # slurmctld does not answer either: slurmd drains the node and requeues the job
            print(f"slurm-gpushare {which}: job {job_id}: {what}, and ending it did not finish in time either",
                  file=sys.stderr)
            return 1


def config_drain(node: str, reason: str) -> None:
    """Drain ``node`` with ``reason`` (at most 250 characters) before a hook exits non-zero on a node config it cannot
    use: slurmctld keeps the reason of a node already drained when slurmd's own "Prolog error"/"Epilog error" comes
    (``_drain_node`` in src/slurmctld/node_mgr.c at slurm-22-05-8-1, slurm-24-11-5-1, slurm-26-05-3-1), so the
    administrator reads what to fix in ``sinfo -R``, not only in slurmd's log. A failed ``scontrol`` leaves Slurm's
    own reason."""
    from slurm_gpushare.errors import GpushareError
    from slurm_gpushare.slurm import commands

    try:
        commands.drain_node(node, " ".join(reason.split())[:250])
    except GpushareError as e:
        print(f"slurm-gpushare: the drain reason was not set ({e}): Slurm's own stands", file=sys.stderr)


#: The file in a node's run dir that remembers the Slurm release of its clients (see :func:`_context`).
RELEASE_CACHE = "slurm-release"


def _context(config_path: str | None, env: Mapping[str, str]):
    """The hook's context: node.toml and the node's name (``SLURMD_NODENAME``, else this host's short name); the
    job record read with the Slurm release remembered in the run dir (``slurm-release``,
    :func:`~slurm_gpushare.slurm.commands.cached_local_release`).

    Raises:
        ConfigError: node.toml cannot be read or is not valid.
    """
    from slurm_gpushare.node.config import load_node_config
    from slurm_gpushare.node.context import HookContext
    from slurm_gpushare.slurm import commands

    config, node = load_node_config(config_path), _node_name(env)
    cache = config.run_dir_for(node) / RELEASE_CACHE

    def job_record(job_id: str) -> str:
        return commands.job_record(job_id, release=commands.cached_local_release(cache))

    return HookContext(config, node, job_record=job_record)


def _node_name(env: Mapping[str, str]) -> str:
    """``SLURMD_NODENAME``, else this host's short name (``uname -n``: what ``socket.gethostname`` returns,
    without importing socket)."""
    return env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]  # gethostname(2) is uname's nodename


def main(argv: Sequence[str] | None = None) -> int | None:
    """Run ``hook prolog|epilog [--config FILE]`` given as ``argv`` (without the ``hook`` word); None when
    ``argv`` is not of that form (the caller hands it to the click command)."""
    parsed = parse_args(list(sys.argv[2:] if argv is None else argv))
    if parsed is None:
        return None
    return run(parsed[0], parsed[1], os.environ)
