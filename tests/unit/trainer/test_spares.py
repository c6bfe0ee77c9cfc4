"""Hot spare nodes: the NVRx rank assignment, faults that follow the active rank, the launcher and
Kubernetes policy that keeps survivors running (workloads/spares.py)."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from infra.config import resolve_config
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.jobs.render import render_job
from nvrx_eks.jobs.spec import build_jobspec
from nvrx_eks.jobs.validate import Expectations, validate_documents
from tests.support.manifest_cases import GOLDEN_IMAGE
from workloads.faults import FaultInjector, parse_fault_spec

P5 = Expectations("1.35", "training", "fsx-lustre", "p5.48xlarge")
JOB_SPEC = "spec.replicatedJobs[0].template.spec"


def _assign(assignment, rank: int, world: int, terminated: set[int], previous=None):
    from nvidia_resiliency_ext.inprocess.rank_assignment import RankAssignmentCtx
    from nvidia_resiliency_ext.inprocess.state import State

    state = previous or State(rank=rank, world_size=world)
    return assignment(RankAssignmentCtx(state, None, terminated)).state


def test_spare_nodes_wait_outside_the_active_world_and_one_replaces_a_lost_node():
    from nvidia_resiliency_ext.inprocess.state import Mode

    from workloads.spares import rank_assignment

    assignment = rank_assignment(world_size=3, spare_nodes=1, nproc_per_node=1)
    start = [_assign(assignment, r, 3, set()) for r in range(3)]
    assert [(s.mode, s.active_rank, s.active_world_size) for s in start] == [
        (Mode.ACTIVE, 0, 2),
        (Mode.ACTIVE, 1, 2),
        (Mode.INACTIVE, None, 2),
    ]
    # Rank 1 is lost: the spare (rank 2) becomes active rank 1, the active world stays 2.
    after = [_assign(assignment, s.rank, 3, {1}, previous=s) for s in (start[0], start[2])]
    assert [(s.mode, s.active_rank, s.active_world_size) for s in after] == [(Mode.ACTIVE, 0, 2), (Mode.ACTIVE, 1, 2)]


def test_without_spares_left_the_active_world_shrinks_below_the_retry_minimum():
    from workloads.spares import active_world_size, rank_assignment

    assignment = rank_assignment(world_size=3, spare_nodes=1, nproc_per_node=1)
    state = _assign(assignment, 0, 3, set())
    state = _assign(assignment, 0, 3, {1}, previous=state)  # the spare is used
    state = _assign(assignment, 0, 2, {1}, previous=state)  # one more node lost
    # The RetryController's minimum (workloads.inprocess) is the active world of 2: this restart
    # is refused and the fault goes to the next layer.
    assert state.active_world_size == 1 < active_world_size(3, 1, 1)


@pytest.mark.parametrize("lost", [set(), {1}, {0}, {3}, {1, 2}, {0, 4}])
@pytest.mark.parametrize("nproc", [1, 2])
def test_node_roles_state_the_rank_assignment_nvrx_makes(lost, nproc):
    """workloads.spares.node_roles (what `nvrx-eks status` reports) against NVRx's own rank
    assignment for 5 launched nodes, 2 of them spares: every rank of a lost node terminated."""
    from nvidia_resiliency_ext.inprocess.state import Mode

    from workloads.spares import node_roles, rank_assignment

    nodes, spares = 5, 2
    world = nodes * nproc
    assignment = rank_assignment(world_size=world, spare_nodes=spares, nproc_per_node=nproc)
    terminated = {node * nproc + local for node in lost for local in range(nproc)}
    active_ranks = {}
    for rank in sorted(set(range(world)) - terminated):
        state = _assign(assignment, rank, world, set())
        if terminated:
            state = _assign(assignment, rank, world, terminated, previous=state)
        if state.mode == Mode.ACTIVE:
            active_ranks[rank] = state.active_rank
    roles = node_roles(launched_nodes=nodes, spare_nodes=spares, lost=lost, nproc_per_node=nproc)
    expected = {
        node: ("lost", None)
        if node in lost
        else ("active", active_ranks[node * nproc])
        if node * nproc in active_ranks
        else ("spare", None)
        for node in range(nodes)
    }
    assert {r.node: (r.role, r.first_rank) for r in roles} == expected
    for r in roles:  # a node's ranks stay together and in order
        if r.role == "active":
            assert [active_ranks[r.node * nproc + i] for i in range(nproc)] == list(
                range(r.first_rank, r.first_rank + nproc)
            )


def test_a_rank_lost_alone_takes_its_whole_node_out_of_the_next_assignment():
    """Rank 3 of node 1 (2 ranks per node) is killed while rank 2 still joins the restart: rank 2 is
    discarded with it, and the spare node's ranks take ranks 2-3, not rank 2 alone (seen otherwise:
    the next process group waited for the departing rank 2, restart after restart)."""
    from nvidia_resiliency_ext.inprocess.rank_assignment import RankDiscarded
    from nvidia_resiliency_ext.inprocess.state import Mode

    from workloads.spares import rank_assignment

    assignment = rank_assignment(world_size=6, spare_nodes=1, nproc_per_node=2)
    start = {r: _assign(assignment, r, 6, set()) for r in range(6)}
    with pytest.raises(RankDiscarded):
        _assign(assignment, 2, 6, {3}, previous=start[2])
    after = {r: _assign(assignment, r, 6, {3}, previous=start[r]) for r in (0, 1, 4, 5)}
    assert {r: (s.mode, s.active_rank) for r, s in after.items()} == {
        0: (Mode.ACTIVE, 0),
        1: (Mode.ACTIVE, 1),
        4: (Mode.ACTIVE, 2),
        5: (Mode.ACTIVE, 3),
    }


def test_faults_follow_the_active_rank_and_node_loss_fires_on_the_first_rank_of_the_node(tmp_path):
    faults = parse_fault_spec("sigkill@14:1,exception@29:0,node-loss@15:1")
    spare = FaultInjector(faults, 4, tmp_path, lambda *a, **k: None, nproc_per_node=2)
    assert spare.mine == []  # a spare (initial rank 4) targets nothing while it waits
    spare.retarget(2)  # it took node 1's first rank
    assert [f.label for f in spare.mine] == ["node-loss@15:1"]
    spare.retarget(1)
    assert [f.label for f in spare.mine] == ["sigkill@14:1"]


def test_local_spare_nodes_come_beyond_at_least_one_active_node_and_faults_name_active_ones(tmp_path):
    from nvrx_eks.local.runner import LocalRun, run_local

    run = LocalRun(nproc=1, steps=4, faults="", run_dir=tmp_path / "r", preset="tiny", checkpoint_interval=2,
                   backend="nvrx")  # fmt: skip
    with pytest.raises(ConfigError, match=r"--nodes: must be at least 1 \(the active nodes; --spare-nodes are"):
        run_local(replace(run, nodes=0, spare_nodes=2))
    with pytest.raises(ConfigError, match="--spare-nodes -1: give 0 or more"):
        run_local(replace(run, nodes=2, spare_nodes=-1))
    # One active node and its spare: node 1 is the spare, which no fault may name.
    with pytest.raises(ConfigError, match="node-loss@3:1 targets node 1; .* use an active node below 1"):
        run_local(replace(run, faults="node-loss@3:1", nodes=1, spare_nodes=1))
    assert not (tmp_path / "r").exists()


def _spare_documents() -> list[dict]:
    spec = build_jobspec(resolve_config(), nodes=2, name="train", image=GOLDEN_IMAGE, spare_nodes=1)
    return copy.deepcopy(render_job(spec).documents)


def _job_spec(docs) -> dict:
    return docs[1]["spec"]["replicatedJobs"][0]["template"]["spec"]


def test_spare_jobset_launches_every_node_with_an_active_world_of_n():
    docs = _spare_documents()
    assert validate_documents(docs, P5).errors == []
    job = _job_spec(docs)
    assert job["parallelism"] == job["completions"] == 3
    assert docs[1]["metadata"]["annotations"]["nvrx-eks.io/world-size"] == "16"
    script = job["template"]["spec"]["containers"][0]["args"][2]
    assert "--nnodes 3 " in script and "--max-restarts 0 " in script


@pytest.mark.parametrize(
    "mutate, field",
    [
        # Any pod failure fails the Job and the JobSet recreates the surviving pods.
        (
            lambda j: (j.pop("backoffLimitPerIndex"), j.pop("maxFailedIndexes"), j.__setitem__("backoffLimit", 0)),
            f"{JOB_SPEC}.backoffLimitPerIndex",
        ),
        # A failed index retried: the replacement's launcher would restart every node.
        (lambda j: j.__setitem__("backoffLimitPerIndex", 1), f"{JOB_SPEC}.backoffLimitPerIndex"),
        # More failures tolerated than there are spares: the active world would be short.
        (lambda j: j.__setitem__("maxFailedIndexes", 2), f"{JOB_SPEC}.maxFailedIndexes"),
        # Without the success rule, a finished job with a lost node counts as failed.
        (lambda j: j.pop("successPolicy"), f"{JOB_SPEC}.successPolicy"),
    ],
    ids=["one-failure-fails-the-job", "failed-index-retried", "too-many-failures", "no-success-rule"],
)
def test_a_pod_failure_while_spares_remain_must_not_recreate_the_survivors(mutate, field):
    docs = _spare_documents()
    mutate(_job_spec(docs))
    found = [f.path for f in validate_documents(docs, P5).errors if f.layer == "project"]
    assert field in found, found


def test_spare_nodes_are_for_the_training_jobset_only():
    from nvrx_eks.deploy.deployment import load_deployment
    from nvrx_eks.jobs.commands import JobOptions, build_spec

    with pytest.raises(ConfigError, match="--spare-nodes"):
        build_spec(load_deployment(None, None), JobOptions(nodes=2, api="pytorchjob", spare_nodes=1), None)
