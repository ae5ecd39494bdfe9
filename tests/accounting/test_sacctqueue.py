"""The controller's queue of ended GPU runs and its one worker (slurm_gpushare.accounting.sacctqueue), with
sacct and sacctmgr injected: many runs carried at once, each with its own deadline, entries removed when done
or expired, one worker per queue, exit when idle."""

from __future__ import annotations

import fcntl
import os

from slurm_gpushare.accounting.sacct import final_segment
from slurm_gpushare.accounting.sacctqueue import LOCK_NAME, Worker, enqueue, entries, read_entry
from slurm_gpushare.accounting.spool import RUNS_DIR, Spool
from slurm_gpushare.errors import SlurmError
from slurm_gpushare.slurm.release import Release
from tests.accounting.test_record import record

AUDIT = "[gpushare:v1 req=gres:gpu:1 kind=whole]"


def _env(job: str, restart: int = 0, node: str = "n1", **kw) -> dict[str, str]:
    return {"SLURM_JOB_ID": job, "SLURM_JOB_RESTART_COUNT": str(restart), "SLURM_JOB_NODELIST": node, **kw}


class FakeDbd:
    """slurmdbd as sacct and sacctmgr see it: job id -> [state, AdminComment]."""

    def __init__(self):
        self.jobs: dict[str, list[str]] = {}
        self.sacct_calls: list[list[str]] = []
        self.writes: list[tuple[str, str]] = []

    def sacct(self, args):
        self.sacct_calls.append(args)
        assert args[0] == "-j"
        return "".join(f"{j}|{j}|alice|physics|gpu|{self.jobs[j][0]}|0:0|1000|4600|01:00:00|cpu=1|{self.jobs[j][1]}\n"
                       for j in args[1].split(",") if j in self.jobs)

    def sacctmgr(self, jid, text):
        self.writes.append((jid, text))
        self.jobs[jid.split("_")[0]][1] = text
        return ""


def _worker(tmp_path, dbd, t, **kw):
    def sleep(s):
        t[0] += s
    return Worker(tmp_path / "queue", [tmp_path / "spool"], sacct=dbd.sacct, show_job=lambda j: AUDIT,
                  sacctmgr=dbd.sacctmgr, release=Release(24, 11), clock=lambda: t[0], sleep=sleep,
                  log=kw.pop("log", None) or (lambda line: None), **kw)


def test_an_entry_holds_what_sacctmgr_needs_and_is_written_whole(tmp_path):
    path = enqueue(tmp_path / "q", _env("12", 2, "n[1-2]", SLURM_ARRAY_JOB_ID="12", SLURM_ARRAY_TASK_ID="4"))
    assert path.name == "12.2.run" and oct(os.stat(tmp_path / "q").st_mode & 0o777) == "0o700"
    job = read_entry(path)
    assert (job.job_id, job.restart, job.nodes, job.sacctmgr_id) == ("12", 2, ("n1", "n2"), "12_4")
    assert entries(tmp_path / "q") == [path]  # no temp file left, the lock and the log are not entries
    (tmp_path / "q" / LOCK_NAME).touch()
    (tmp_path / "q" / ".13.0.run.99").write_text("SLURM_JOB_ID=13\n")
    assert entries(tmp_path / "q") == [path] and entries(tmp_path / "nowhere") == []


def test_the_worker_carries_many_runs_at_once_each_with_its_own_deadline(tmp_path):
    dbd, t, logged = FakeDbd(), [0.0], []
    spool = Spool(tmp_path / "spool", node="n1", clock=lambda: 1000)
    recs = {j: record(job_id=j, node="n1", restart=0) for j in ("1", "2", "3")}
    for j in ("1", "2", "3"):
        enqueue(tmp_path / "queue", _env(j))
        dbd.jobs[j] = ["RUNNING", AUDIT]
    (tmp_path / "spool" / RUNS_DIR).mkdir(parents=True)
    (tmp_path / "spool" / RUNS_DIR / "1.0.n1").touch()  # a mark this worker may remove
    spool.append([recs["1"], recs["2"]])  # job 3's node never writes its record
    w = _worker(tmp_path, dbd, t, wait=10, log=logged.append)
    assert w.tick() == 3 and dbd.writes == []  # records of 1 and 2 in; no end records yet
    dbd.jobs["2"][0] = "COMPLETED"
    t[0] = 1
    assert w.tick() == 2 and dbd.writes == [("2", f"{AUDIT} {final_segment([recs['2']])}")]
    # one sacct for all runs waiting for their end records, not one per run
    assert ["-j", "1,2"] in dbd.sacct_calls
    dbd.jobs["1"][0] = "COMPLETED"
    t[0] = 2
    assert w.tick() == 1 and [j for j, _ in dbd.writes] == ["2", "1"] and w.written == ["2", "1"]
    assert not (tmp_path / "spool" / RUNS_DIR / "1.0.n1").exists()
    # job 3: no records by its deadline: nothing to write, its entry goes
    t[0] = 10
    assert w.tick() == 0 and entries(tmp_path / "queue") == [] and len(dbd.writes) == 2
    # a run whose end record never comes: logged at its deadline, its entry removed
    enqueue(tmp_path / "queue", _env("4"))
    dbd.jobs["4"] = ["RUNNING", ""]
    spool.append([record(job_id="4", node="n1", restart=0)])
    assert w.tick() == 1
    t[0] = 20
    assert w.tick() == 0 and entries(tmp_path / "queue") == []
    assert len(logged) == 1 and "job 4 run 0" in logged[0] and "no end record" in logged[0], logged


def test_a_failed_sacct_round_is_tried_again_not_a_lost_run(tmp_path):
    dbd, t = FakeDbd(), [0.0]
    enqueue(tmp_path / "queue", _env("5"))
    Spool(tmp_path / "spool", node="n1", clock=lambda: 1000).append([record(job_id="5", node="n1", restart=0)])
    dbd.jobs["5"] = ["RUNNING", ""]
    w = _worker(tmp_path, dbd, t, wait=10)
    assert w.tick() == 1
    real, dbd.sacct = dbd.sacct, lambda args: (_ for _ in ()).throw(SlurmError("slurmdbd down"))
    t[0] = 1
    assert w.tick() == 1
    dbd.sacct, dbd.jobs["5"][0] = real, "COMPLETED"
    t[0] = 2
    assert w.tick() == 0 and w.written == ["5"]


def test_one_worker_per_queue_and_it_exits_when_idle_taking_up_an_entry_queued_as_it_left(tmp_path):
    dbd, t = FakeDbd(), [0.0]
    (tmp_path / "queue").mkdir()
    fd = os.open(tmp_path / "queue" / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    enqueue(tmp_path / "queue", _env("6"))
    w = _worker(tmp_path, dbd, t, idle=5)
    assert w.run() == 0 and t[0] == 0 and entries(tmp_path / "queue")  # another worker holds the lock
    os.close(fd)
    dbd.jobs["6"] = ["COMPLETED", ""]
    Spool(tmp_path / "spool", node="n1", clock=lambda: 1000).append([record(job_id="6", node="n1", restart=0)])
    rounds = w._rounds

    def rounds_then_an_entry():  # queued after the last round, while its wrapper sees the lock still held
        rounds()
        if not w.written[1:]:
            enqueue(tmp_path / "queue", _env("7"))
            dbd.jobs["7"] = ["COMPLETED", ""]
            Spool(tmp_path / "spool", node="n1", clock=lambda: 1000).append(
                [record(job_id="7", node="n1", restart=0)])
    w._rounds = rounds_then_an_entry
    assert w.run() == 0
    assert w.written == ["6", "7"] and entries(tmp_path / "queue") == []
    assert t[0] == 10  # idle 5 s after each run, not longer


def test_a_node_prunes_its_own_old_marks_at_most_once_an_hour(tmp_path):
    from slurm_gpushare.accounting.spool import prune_marks

    runs = tmp_path / RUNS_DIR
    runs.mkdir()
    for name, age in (("1.0.n1", 2 * 86400), ("2.0.n1", 60), ("3.0.n2", 2 * 86400), ("4.0.n1", 2 * 86400)):
        (runs / name).touch()
        os.utime(runs / name, (100000 - age, 100000 - age))
    assert prune_marks(tmp_path, "n1", now=100000) == 2
    assert sorted(os.listdir(runs)) == [".pruned.n1", "2.0.n1", "3.0.n2"]  # another node's marks are its own
    (runs / "5.0.n1").touch()
    os.utime(runs / "5.0.n1", (0, 0))
    assert prune_marks(tmp_path, "n1", now=100000 + 1800) == 0  # within the hour: one stat, nothing else
    assert prune_marks(tmp_path, "n1", now=100000 + 3600) == 1
    assert prune_marks(tmp_path / "nowhere", "n1") == 0
