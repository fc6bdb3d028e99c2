"""A pending job changes partition, GPU type and count and node count in place, keeping its place in the queue.

`SlurmBackend.update_pending` (`scontrol update JobId=N Partition=P NumNodes=M ... Gres=gpu:TYPE:K`): the seam the
joint re-planning of waiting jobs (frenzy_slurm/has/replan.py) applies its changes through. Checked on the fake
and the simulator, and on the real local Slurm: the job keeps its id, submit time and priority, and runs with the
shape it was changed to.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from frenzy_slurm.render.shapes import SRUN_AS_GIVEN
from frenzy_slurm.sim.clusters import SimCluster, SimPartition
from frenzy_slurm.sim.slurm import SimSlurm
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm.backend import BatchJob, ComponentRequest
from frenzy_slurm.slurm.commands import update_pending_argv
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.slurm.run import SlurmCommandError, SlurmUnavailable
from frenzy_slurm.slurm.static import StaticBackend

from .helpers import LOCAL
from .slurm_fixture import occupy_gpus, sh, wait_for


def _req(partition: str, gpu_type: str | None, nodes: int, per_node: int, minutes: int = 60) -> ComponentRequest:
    return ComponentRequest(
        partition=partition, gpu_type=gpu_type, nodes=nodes, gpus_per_node=per_node, time_min=minutes
    )


def _job(*comps: ComponentRequest) -> BatchJob:
    return BatchJob(script=Path("x.sbatch"), workdir=Path("/tmp"), components=list(comps), name="j")


def test_the_scontrol_command_names_every_part_of_the_shape():
    assert update_pending_argv(41, "v100", 2, 8, "v100", 4) == [
        "scontrol",
        "update",
        "JobId=41",
        "Partition=v100",
        "NumNodes=2-2",
        "TasksPerNode=8",
        "NumTasks=16",
        "NumCPUs=64",
        "MinCPUsNode=32",
        "CPUsPerTask=4",
        "Gres=gpu:v100:8",
    ]
    assert update_pending_argv(7, "gpu", 1, 4, None, 1)[-1] == "Gres=gpu:4"  # a site without GPU types


def test_the_fake_changes_a_pending_job_and_keeps_its_id_and_submit_time():
    slurm = FakeSlurm(synthetic(LOCAL))
    blocker = slurm.submit(_job(_req("a100", "a100_40gb", 2, 4))).job_id
    jid = slurm.submit(_job(_req("a100", "a100_40gb", 1, 4))).job_id
    submitted = slurm.fake_jobs[jid].submitted
    assert slurm.fake_jobs[jid].state == "PENDING"
    # TasksPerNode is an operator's to change: a plain user's update naming it is refused, as slurmctld does
    with pytest.raises(SlurmCommandError, match="Access/permission denied"):
        slurm.update_pending(jid, _req("v100", "v100_32gb", 1, 8))
    assert not slurm.is_operator()
    slurm.operator = True
    assert slurm.is_operator()
    slurm.update_pending(jid, _req("v100", "v100_32gb", 1, 8))
    j = slurm.fake_jobs[jid]
    assert (j.job_id, j.submitted, j.state) == (jid, submitted, "RUNNING")  # the V100s were free: it started
    assert (j.components[0].partition, j.components[0].gpus_per_node, j.components[0].time_min) == ("v100", 8, 60)
    with pytest.raises(SlurmCommandError, match="no longer pending"):
        slurm.update_pending(blocker, _req("t4", "t4", 1, 4))  # a running job keeps its shape
    with pytest.raises(SlurmCommandError, match="partition"):
        slurm.update_pending(slurm.submit(_job(_req("a100", "a100_40gb", 2, 4))).job_id, _req("h100", None, 1, 1))


def test_a_plain_users_update_leaves_the_tasks_per_node_and_more_gpus_per_node_never_run():
    # measured on 22.05 as a plain user (docs/admin.md): without TasksPerNode a 1x4 job changed to 1x2 runs with 2
    # tasks; one changed to more GPUs per node than it was submitted with is taken but never runs (BadConstraints)
    assert "TasksPerNode=2" not in update_pending_argv(7, "gpu", 1, 2, None, 1, restate_tasks=False)
    slurm = FakeSlurm(synthetic(LOCAL))
    slurm.submit(_job(_req("a100", "a100_40gb", 2, 4)))  # every A100 busy
    small = slurm.submit(_job(_req("a100", "a100_40gb", 1, 2))).job_id
    slurm.update_pending(small, _req("v100", "v100_32gb", 1, 4), restate_tasks=False)
    assert slurm.fake_jobs[small].state == "PENDING"  # the V100s are free, but 4 tasks on a node of 2 never run
    shrunk = slurm.submit(_job(_req("a100", "a100_40gb", 1, 4))).job_id
    slurm.update_pending(shrunk, _req("v100", "v100_32gb", 1, 2), restate_tasks=False)
    assert slurm.fake_jobs[shrunk].state == "RUNNING"


def test_the_simulator_changes_a_pending_job_in_place():
    c = SimCluster(
        partitions=[
            SimPartition(name="a", gpu="A100-80GB", nodes=1, gpus_per_node=8),
            SimPartition(name="b", gpu="A100-80GB", nodes=1, gpus_per_node=8),
        ]
    )
    sim = SimSlurm(c, now=0.0, outcome=lambda j: (600.0, "COMPLETED"))
    sim.submit(_job(_req("a", "a100_80gb", 1, 8)))
    jid = sim.submit(_job(_req("a", "a100_80gb", 1, 8))).job_id
    assert sim.jobs_by_id[jid].state == "PENDING"
    sim.update_pending(jid, _req("b", "a100_80gb", 1, 4))
    j = sim.jobs_by_id[jid]
    assert (j.job_id, j.submit, j.state, j.components[0].gpus_per_node) == (jid, 0.0, "RUNNING", 4)


def test_a_saved_view_refuses_to_update():
    with pytest.raises(SlurmUnavailable, match="cannot update pending jobs"):
        StaticBackend(synthetic(LOCAL)).update_pending(1, _req("a100", None, 1, 1))


SCRIPT = """#!/bin/bash
#SBATCH --partition=a100
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gres=gpu:a100:4
#SBATCH --cpus-per-task=1
#SBATCH --time=5
echo "$SLURM_JOB_PARTITION $SLURM_JOB_NUM_NODES $SLURM_GPUS_ON_NODE $SLURM_CPUS_ON_NODE $SLURM_NTASKS" > {out}.tmp
srun {srun}--kill-on-bad-exit=1 printenv SLURM_PROCID > {out}.tasks
mv {out}.tmp {out}
"""


def _fields(jid: int) -> dict[str, str]:
    """squeue's id, submit time, priority, partition, node count and GRES per node of one job."""
    row = sh("squeue", "-h", "-j", str(jid), "-o", "%i|%V|%Q|%P|%D|%b|%T")
    return dict(zip(("id", "submit", "priority", "partition", "nodes", "gres", "state"), row.split("|"), strict=True))


def test_real_slurm_keeps_a_pending_jobs_place_when_its_shape_changes(clean_queue, tmp_path):
    """Two A100 nodes of four GPUs become one of two, with two CPUs a task: the job keeps its id, submit time and
    priority, and runs with the new shape. Slurm leaves SLURM_NTASKS as sbatch set it at submission (8 here): a
    script that accepts several shapes must read SLURM_JOB_NUM_NODES and SLURM_GPUS_ON_NODE instead, as the srun
    line of a job with shapes does."""
    from frenzy_slurm.slurm import open_backend

    occupy_gpus({})  # every GPU held: the job waits
    out = tmp_path / "ran.txt"
    script = tmp_path / "j.sbatch"
    script.write_text(SCRIPT.format(out=out, srun=SRUN_AS_GIVEN))
    jid = int(sh("sbatch", "--parsable", "-o", "/dev/null", "-D", str(tmp_path), str(script)).split(";")[0])
    before = wait_for(lambda: (f := _fields(jid))["state"] == "PENDING" and f, what="the job pending")
    smaller = ComponentRequest(partition="a100", gpu_type="a100", nodes=1, gpus_per_node=2, time_min=5, cpus_per_gpu=2)
    open_backend("cli").update_pending(jid, smaller)
    after = _fields(jid)
    assert (after["id"], after["submit"], after["priority"]) == (before["id"], before["submit"], before["priority"])
    assert (after["partition"], after["nodes"], after["state"]) == ("a100", "1", "PENDING")
    assert after["gres"].endswith("gpu:a100:2")
    sh("scancel", "-p", "a100", "-n", "wrap")  # the A100s free up: it runs with the shape it was given
    wait_for(
        lambda: out.exists() and out.read_text().strip(),
        timeout=90,
        what=f"the job to run: {sh('scontrol', 'show', 'job', str(jid), check=False)}",
    )
    assert out.read_text().split() == ["a100", "1", "2", "4", "8"]
    # srun as a job with shapes runs it (render/shapes.py): one task per GPU it got, not SLURM_NTASKS' eight
    assert sorted(Path(f"{out}.tasks").read_text().split()) == ["0", "1"]


def test_real_slurm_2205_cannot_change_a_pending_jobs_gpu_type(clean_queue, tmp_path):
    """Why shapes keep the GPU type (render/shapes.py): Slurm 22.05 merges a job's GRES update with the GRES it
    was submitted with, so an A100 job changed to the (free) T4s asks for both and is never runnable."""
    from frenzy_slurm.slurm import open_backend

    script = tmp_path / "j.sbatch"
    script.write_text(SCRIPT.format(out=tmp_path / "ran.txt", srun=SRUN_AS_GIVEN))
    jid = int(sh("sbatch", "--parsable", "--hold", "-o", "/dev/null", "-D", str(tmp_path), str(script)).split(";")[0])
    open_backend("cli").update_pending(jid, _req("t4", "t4", 1, 4))
    assert _fields(jid)["gres"].endswith("gpu:t4:4")  # what squeue shows is the new GRES only
    sh("scontrol", "release", str(jid))
    reason = wait_for(
        lambda: (r := sh("squeue", "-h", "-j", str(jid), "-o", "%r")) not in ("None", "JobHeldUser", "") and r,
        timeout=60,
        what="a scheduling pass over the job",
    )
    assert reason == "BadConstraints"
