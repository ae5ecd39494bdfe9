"""The Slurm commands (slurm_gpushare.slurm.commands): argv, and how a failing command is read."""

from __future__ import annotations

import pytest

from slurm_gpushare.errors import SlurmError
from slurm_gpushare.node.membership import parse_listpids
from slurm_gpushare.slurm import commands

LISTPIDS = ("PID      JOBID    STEPID   LOCALID GLOBALID\n"
            "1002     201      0        1       1       \n")


def test_a_node_without_job_steps_is_not_an_error(monkeypatch):
    # found on the dev cluster with slurmdbd: scontrol listpids exits 1 saying "No job steps exist on this
    # node." when no job runs there (or a job's Prolog still runs); that is an empty list, not a failure
    def run(argv, **kw):
        assert argv[:4] == ["scontrol", "listpids", "*", "a100"]
        raise SlurmError("scontrol listpids * a100 exited 1: No job steps exist on this node.")
    monkeypatch.setattr(commands, "run", run)
    assert parse_listpids(commands.listpids("a100")) == {}

    def broken(argv, **kw):
        raise SlurmError("scontrol listpids * a100 exited 1: Unable to contact slurmstepd")
    monkeypatch.setattr(commands, "run", broken)
    with pytest.raises(SlurmError, match="slurmstepd"):
        commands.listpids("a100")


def test_a_step_that_ends_while_listpids_asks_is_retried_not_counted(monkeypatch):
    # found under load: "StepId=16.batch does not exist on this node." when a step ends during the call
    calls = []

    def run(argv, **kw):
        calls.append(argv)
        if len(calls) == 1:
            raise SlurmError("scontrol listpids * a100 exited 1: StepId=16.batch does not exist on this node.")
        return LISTPIDS
    monkeypatch.setattr(commands, "run", run)
    assert parse_listpids(commands.listpids("a100"))[1002] == "201" and len(calls) == 2


def test_update_commands_name_the_job_and_the_node(monkeypatch):
    calls = []
    monkeypatch.setattr(commands, "run", lambda argv, **kw: calls.append((argv, kw)) or "")
    commands.update_admin_comment("17", "gpushare:mem=10G")
    commands.drain_node("a100", "gpushare: MPS stuck")
    assert calls == [(["scontrol", "update", "jobid=17", "AdminComment=gpushare:mem=10G"], {"timeout": 10.0}),
                     (["scontrol", "update", "nodename=a100", "state=drain", "reason=gpushare: MPS stuck"], {})]


@pytest.mark.parametrize("release, argv", [
    ("22.05", ["squeue", "--json"]),  # no scontrol --json before 23.02; squeue --json ignores -j
    ("24.11", ["scontrol", "-d", "show", "job", "42", "--json"]),
    ("26.05", ["scontrol", "-d", "show", "job", "42", "--json"]),
])
def test_the_job_record_comes_from_the_structured_command_of_the_release(monkeypatch, release, argv):
    from slurm_gpushare.slurm.release import Release

    calls = []
    monkeypatch.setattr(commands, "run", lambda a, **kw: calls.append(a) or "{}")
    commands.job_record("42", release=Release.parse(release))
    monkeypatch.setattr(commands, "local_release", lambda: Release.parse(release))
    commands.job_record("42")
    assert calls == [argv, argv]
