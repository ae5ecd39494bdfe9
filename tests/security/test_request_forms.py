"""Every request form beside ``--gres=gpushare`` reaches the policy or is refused saying what works (issue #15
item 8), on the real dev cluster, submitted by an unprivileged user.

The options and the job_desc fields they fill (src/common/slurm_opt.c, ``slurm_opt_create_job_desc``, at tags
slurm-22-05-8-1, slurm-24-11-5-1 and slurm-26-05-3-1): ``--gpus-per-task`` -> ``tres_per_task``,
``--gpus-per-socket`` -> ``tres_per_socket``, ``--mem-per-gpu`` -> ``mem_per_tres``, ``--cpus-per-gpu`` ->
``cpus_per_tres``, ``--ntasks-per-gpu`` -> ``ntasks_per_tres``; ``--tres-per-task`` exists from 23.11 on. A form
a release's sbatch has no option for, or refuses itself before submitting, is skipped on that release with
the reason (the job is refused either way).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import bare
from tests.security.conftest import USERS
from tests.security.test_submit_path import sbatch, tres

pytestmark = pytest.mark.slurm

GPUSHARE = "--gres=gpushare:mem=10G"
#: (the options, whether they go beside --gres=gpushare, what the refusal must say)
FORMS = {
    # 22.05's sbatch writes --gpus-per-task=1 as gres:gpu:1, 24.11's and 26.05's as gres/gpu=1 (measured)
    "gpus-per-task": (["--gpus-per-task=1"], True, "GPUs per task ('gpu"),
    "tres-per-task-gpu": (["--tres-per-task=gres/gpu:1"], True, "GPUs per task ('gpu:1', from --gpus-per-task or "
                          "--tres-per-task) do not combine with --gres=gpushare"),
    "tres-per-task-gpushare": (["--tres-per-task=gres/gpushare:mem=10G"], False,
                               "GPU shares per task or per socket are not supported"),
    "tres-per-task-gpushare-escaped": (["--tres-per-task=gres/gpushare:mem%3D10G+mode%3Dmps"], False,
                                       "GPU shares per task or per socket are not supported"),
    # the count after '=' (as the 23.11+ clients write --gpus-per-task and -c there) passed unpoliced
    "tres-per-task-shard-equals": (["--tres-per-task=gres/shard=4"], False,
                                   "GPU shares per task or per socket are not supported"),
    "gpus-per-socket": (["--gpus-per-socket=1", "--sockets-per-node=1"], True,
                        "GPUs per socket ('gpu:1', from --gpus-per-socket) do not combine with --gres=gpushare"),
    "mem-per-gpu": (["--mem-per-gpu=4G"], True, "--mem-per-gpu (4096M) does not combine with --gres=gpushare"),
    "cpus-per-gpu": (["--cpus-per-gpu=2"], True, "--cpus-per-gpu (2 CPUs) does not combine with --gres=gpushare"),
    "ntasks-per-gpu": (["--ntasks-per-gpu=2"], True, "--ntasks-per-gpu (2) does not combine with --gres=gpushare"),
}
#: what each refusal tells the user to write instead
WORKS = ("--ntasks-per-node", "--ntasks-per-socket", "--mem", "--cpus-per-task")


@pytest.mark.parametrize("form", list(FORMS))
def test_each_form_beside_gpushare_is_refused_saying_what_works(slurm, users, form):
    options, beside, message = FORMS[form]
    alice = USERS[0]
    proc = sbatch(slurm.cluster, alice, "-p", "gpu", "-n", "2", *options, *([GPUSHARE] if beside else []))
    if proc.returncode == 0:
        slurm.submitted.append(proc.stdout.strip().split(";")[0])
    assert proc.returncode != 0, f"{' '.join(options)} was accepted: {proc.stdout}"
    option = options[0].split("=")[0]
    if "unrecognized option" in proc.stderr:  # not every option is in sbatch --help (22.05's --ntasks-per-gpu)
        pytest.skip(f"this Slurm's sbatch has no {option} (22.05 has no --tres-per-task): the form cannot be written")
    if "gpushare:" not in proc.stderr and "Batch job submission failed" not in proc.stderr:
        pytest.skip(f"this Slurm's sbatch refuses {' '.join(options)} beside {GPUSHARE} itself, before submitting: "
                    f"{proc.stderr.strip()}")
    assert "sbatch: error: gpushare: " in proc.stderr and message in proc.stderr, proc.stderr
    assert any(w in proc.stderr for w in WORKS), proc.stderr
    assert "Invalid generic resource (gres) specification" in proc.stderr, proc.stderr


def test_the_same_share_with_tasks_per_node_is_decided(slurm, users):
    """What the refusals say works: the share per node, with the tasks given per node."""
    alice = USERS[0]
    ok = sbatch(slurm.cluster, alice, "-p", "gpu", "-n", "2", "--ntasks-per-node=2", "--cpus-per-task=1", GPUSHARE)
    assert tres(slurm, ok) == "gpu:h100_1g.10gb:1"
    # GPUs per task without a share are Slurm's own business: never refused by the filter
    plain = sbatch(slurm.cluster, alice, "-p", "gpu", "-n", "2", "--gpus-per-task=1")
    assert plain.returncode == 0 and "gpushare" not in plain.stderr, plain.stderr
    slurm.submitted.append(plain.stdout.strip().split(";")[0])


def test_a_share_job_moved_to_a_partition_that_allows_no_share_is_refused(slurm, users):
    """Found by a hostile-user pass: alice's pending job, granted shard:10 in partition gpu on the RTX 4090
    node, moved with ``scontrol update partition=pcie`` into a partition whose policy allows whole GPUs only,
    ran there with its shards (job_submit.lua asked the service only about updates of the GRES). The move is
    now refused with the policy's message and the job stays where it was."""
    from tests.security.test_submit_path import as_user
    from tests.test_policy_reload_slurm import _hup_and_wait

    c = slurm.cluster
    policy = c.policy_file
    original = policy.read_text()
    alice = USERS[0]
    try:
        policy.write_text('version = 1\n[partitions.pcie]\nmodes = ["gpu"]\n')
        _hup_and_wait(c, "policy")
        proc = sbatch(c, alice, "-p", "gpu", "--nodelist=rtx4090-pcie", "--gres=gpushare:mem=10G+sm=25")
        assert tres(slurm, proc) == "shard:10"
        job_id = proc.stdout.strip().split(";")[0]
        moved = as_user(c, alice, ["scontrol", "update", f"jobid={job_id}", "partition=pcie"])
        assert moved.returncode != 0, moved.stdout + moved.stderr
        fields = slurm.show_job(job_id)
        assert fields["Partition"] == "gpu" and bare(fields["TresPerNode"]) == "shard:10", fields
        # a move the policy allows is not refused by the filter (into nomig, where shares are allowed; Slurm
        # itself may still refuse it: 22.05 answers this one "Resource temporarily unavailable")
        other = sbatch(c, alice, "-p", "gpu", "--nodelist=rtx4090-pcie", "--gres=gpushare:mem=10G+sm=25")
        assert tres(slurm, other) == "shard:10"
        other_id = other.stdout.strip().split(";")[0]
        as_user(c, alice, ["scontrol", "update", f"jobid={other_id}", "partition=nomig"])
        decisions = [json.loads(line) for line in (c.root / "log" / "filterd.log").read_text(errors="replace")
                     .splitlines() if f'"{other_id}"' in line]
        assert [(d["op"], d["action"]) for d in decisions if d.get("event") == "decision"] == [("move", "pass")], \
            decisions
    finally:
        policy.write_text(original)
        _hup_and_wait(c, "policy")


#: ``scontrol update`` forms that add GPUs per task or per socket, or counts per GPU, to a pending job (the
#: job_desc fields --gpus-per-task/--tres-per-task, --gpus-per-socket, --mem-per-gpu and --cpus-per-gpu fill
#: at submit), and what the filter's refusal says (slurmctld answers the user "Invalid generic resource")
UPDATE_FORMS = {
    "tres-per-task-slash": ("TresPerTask=gres/gpu:1", "GPUs per task ('gpu:1'"),
    "tres-per-task-colon": ("TresPerTask=gres:gpu:1", "GPUs per task ('gpu:1'"),
    "tres-per-socket": ("TresPerSocket=gres:gpu:1", "GPUs per socket ('gpu:1'"),
    "mem-per-tres": ("MemPerTres=gres:gpu:4096", "--mem-per-gpu (4096M)"),
    "cpus-per-tres": ("CpusPerTres=gres:gpu:2", "--cpus-per-gpu (2 CPUs)"),
}


#: the grants an update is tried on: shard:10 (MPS, on the RTX 4090 node) and a MIG slice (the H100's)
GRANTS = {"shard": (["--nodelist=rtx4090-pcie", "--gres=gpushare:mem=10G+sm=25"], "shard:10"),
          "mig": ([GPUSHARE], "gpu:h100_1g.10gb:1")}


@pytest.mark.parametrize("grant", list(GRANTS))
@pytest.mark.parametrize("form", list(UPDATE_FORMS))
def test_gpus_per_task_added_to_a_pending_share_job_by_an_update_are_refused(slurm, users, form, grant):
    """Found by a reviewer (issue #15): alice's pending job, granted shard:10 for --gres=gpushare, updated with
    ``scontrol update jobid=N TresPerTask=gres/gpu:1`` kept its shards and got a whole GPU per task on top: the
    update left the share alone, and deciding the held shard:10 again with the new field passed (the forms
    beside gpushare were only refused beside a gpushare request). The same form is refused at submit; so is
    the update now (the filter's "move" decision, on the audit in the job's AdminComment), and the job keeps
    what it had. MemPerTres and CpusPerTres are decided too (22.05's slurmctld also refuses them itself). A job
    granted a MIG slice (GRES that are no share by name) was not even asked about."""
    from tests.security.test_submit_path import as_user

    update, message = UPDATE_FORMS[form]
    c = slurm.cluster
    alice = USERS[0]
    options, granted = GRANTS[grant]
    proc = sbatch(c, alice, "-p", "gpu", *options)
    assert tres(slurm, proc) == granted
    job_id = proc.stdout.strip().split(";")[0]
    field = update.split("=")[0]
    before = slurm.show_job(job_id).get(field)
    moved = as_user(c, alice, ["scontrol", "update", f"jobid={job_id}", update])
    fields = slurm.show_job(job_id)
    assert moved.returncode != 0, f"{update} was accepted: {fields}"
    assert fields.get(field) == before and bare(fields["TresPerNode"]) == granted, fields
    decisions = [json.loads(line) for line in (c.root / "log" / "filterd.log").read_text(errors="replace")
                 .splitlines() if f'"{job_id}"' in line]
    refused = [d for d in decisions if d.get("event") == "decision" and d["op"] == "move"]
    assert [d["action"] for d in refused] == ["reject"], decisions
    assert message in refused[0]["message"] and "combine with --gres=gpushare" in refused[0]["message"], refused[0]


def test_a_node_count_raised_by_an_update_of_a_mig_slice_job_is_refused(slurm, users):
    """Found by a reviewer: ``scontrol update jobid=N NumNodes=2`` of alice's pending job, granted a MIG slice
    that one node of the partition has, was accepted, and the job then waited forever (BadConstraints). The
    filter's move decision now checks the grant on the new node count; the job keeps NumNodes=1."""
    from tests.security.test_submit_path import as_user

    c = slurm.cluster
    alice = USERS[0]
    options, granted = GRANTS["mig"]
    proc = sbatch(c, alice, "-p", "gpu", *options)
    assert tres(slurm, proc) == granted
    job_id = proc.stdout.strip().split(";")[0]
    moved = as_user(c, alice, ["scontrol", "update", f"jobid={job_id}", "NumNodes=2"])
    fields = slurm.show_job(job_id)
    assert moved.returncode != 0, f"NumNodes=2 was accepted: {fields}"
    assert fields["NumNodes"].split("-")[0] == "1" and bare(fields["TresPerNode"]) == granted, fields
    decisions = [json.loads(line) for line in (c.root / "log" / "filterd.log").read_text(errors="replace")
                 .splitlines() if f'"{job_id}"' in line]
    refused = [d for d in decisions if d.get("event") == "decision" and d["op"] == "move"]
    assert [d["action"] for d in refused] == ["reject"], decisions
    assert "2 nodes asked for, but only 1 node(s)" in refused[0]["message"], refused[0]
