"""`nvrx-eks capacity up|down` against moto's EKS and the loopback Kubernetes API: the GPU node
group is scaled through UpdateNodegroupConfig and waited for until its nodes are Ready; a
shortfall ends with the node group's health issues, one line each with what to do; a Capacity
Block is scaled up only once active; `down` refuses while a job runs.

moto 5.2.5 has no DescribeUpdate and never reports node group health: DescribeUpdate is answered
through tests/support/aws_gaps.py (checked against botocore's output shape), and health issues and
status are written into moto's DescribeNodegroup answer by an after-call hook, as EKS would report
them; DescribeCapacityReservations is a gap too.
"""

from __future__ import annotations

import datetime

import boto3
import pytest
from rich.console import Console

from nvrx_eks.deploy.deployment import load_deployment
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.names import NODEGROUP_LABEL_KEY
from nvrx_eks.jobs.render import render_job
from nvrx_eks.jobs.spec import build_jobspec
from nvrx_eks.ops.gpu_capacity import capacity_down, capacity_up
from tests.support import cli_harness, k8s_api_server
from tests.support.aws_gaps import ServiceGaps, capacity_reservations_answer
from tests.support.cli_harness import REGION, deploy_fake_environment, run_cli

aws = cli_harness.aws
k8s_server = cli_harness.k8s_server

#: What EC2 says when it has no p5 to give (the message EKS relays: eksctl-io/eksctl#4732).
NO_CAPACITY = (
    "AsgInstanceLaunchFailures",
    "Could not launch On-Demand Instances. InsufficientInstanceCapacity - We currently do not have sufficient "
    "p5.48xlarge capacity in the Availability Zone you requested (us-east-1a). Launching EC2 instance failed.",
)
NOW = datetime.datetime(2026, 12, 10, 9, 0, tzinfo=datetime.UTC)
BLOCK_ID = "cr-0123456789abcdef0"


class Fleet:
    """EKS and the Auto Scaling group behind the GPU node group. DescribeUpdate answers InProgress,
    then Successful; each DescribeNodegroup poll after a scaling brings one node of the group more
    (Ready) into the cluster, or takes one away, until the desired size. With `issues`, no instance
    launches: the group reports them and turns DEGRADED."""

    def __init__(self, session: boto3.Session, server, issues: tuple[tuple[str, str], ...] = ()):
        self.server, self.issues, self.polls, self.scalings = server, issues, 0, []
        ServiceGaps(session).answer("eks", "DescribeUpdate", self._update)
        session.events.register("after-call.eks.DescribeNodegroup", self._poll)
        session.events.register("before-parameter-build.eks.UpdateNodegroupConfig", self._scaled)

    def _scaled(self, params, **_):
        self.scalings.append(dict(params["scalingConfig"]))

    def _update(self, params: dict) -> dict:
        self.polls += 1
        status = "InProgress" if self.polls == 1 else "Successful"
        return {"update": {"id": params["updateId"], "status": status, "type": "ConfigUpdate", "errors": []}}

    def nodes(self, group: str) -> list[str]:
        return [
            n["metadata"]["name"]
            for n in self.server.list("v1", "nodes")
            if n["metadata"]["labels"].get(NODEGROUP_LABEL_KEY) == group
        ]

    def _poll(self, parsed, **_):
        group = parsed["nodegroup"]
        if not self.scalings:
            return
        if self.issues:
            group["status"] = "DEGRADED"
            group["health"] = {
                "issues": [{"code": c, "message": m, "resourceIds": ["eks-gpu-asg"]} for c, m in self.issues]
            }
            return
        name, desired = group["nodegroupName"], group["scalingConfig"]["desiredSize"]
        present = self.nodes(name)
        if len(present) < desired:
            self.server.add(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": f"ip-10-0-0-{len(present) + 10}", "labels": {NODEGROUP_LABEL_KEY: name}},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
                }
            )
        elif len(present) > desired:
            self.server.objects.pop(("v1", "nodes", "", present[-1]))


@pytest.fixture
def cluster(aws, k8s_server, monkeypatch):
    monkeypatch.setitem(k8s_api_server.RESOURCES["v1"], "nodes", ("Node", False))
    return k8s_server


def _session() -> boto3.Session:
    return boto3.Session(region_name=REGION)


def _deployed(server, profile: str = "p5", desired: int = 0) -> str:
    deploy_fake_environment(server.url, profile)
    config = load_deployment(profile).config
    boto3.client("eks", region_name=REGION).update_nodegroup_config(
        clusterName=config.cluster_name,
        nodegroupName=f"{config.name}-gpu",
        scalingConfig={"minSize": 0, "maxSize": config.gpu_nodes.max_size, "desiredSize": desired},
    )
    return f"{config.name}-gpu"


def test_up_scales_the_group_and_waits_until_its_nodes_are_ready(cluster):
    """(deploy N1, first-contact 2) The group deploys at 0 and `capacity up` brings the nodes."""
    group = _deployed(cluster)
    session = _session()
    fleet = Fleet(session, cluster)
    console = Console(width=200, record=True)
    result = capacity_up(load_deployment(), None, console, session=session, poll_s=0)
    assert fleet.scalings == [{"minSize": 0, "maxSize": 2, "desiredSize": 2}]  # desired_size of the p5 profile
    assert result.desired_size == 2 and len(fleet.nodes(group)) == 2
    out = console.export_text()
    assert "scaling nvrx-eks-gpu (p5.48xlarge, us-east-1a) from 0 to 2 nodes" in out
    assert "  nvrx-eks-gpu ACTIVE, 1 of 2 nodes Ready" in out  # progress while they come
    assert "2 of 2 nodes Ready in nvrx-eks-gpu" in out
    assert "billed ~$110.08/h while they run" in out


def test_up_when_the_group_asks_for_the_nodes_already_only_waits(cluster):
    """A second `capacity up` sends no update that changes nothing; it waits for the nodes."""
    group = _deployed(cluster, desired=2)
    session = _session()
    fleet = Fleet(session, cluster)
    fleet.scalings.append({"desiredSize": 2})  # as if scaled before: nodes come on each poll
    console = Console(width=200, record=True)
    capacity_up(load_deployment(), 2, console, session=session, poll_s=0)
    assert fleet.scalings == [{"desiredSize": 2}] and fleet.polls == 0  # no update, none described
    assert len(fleet.nodes(group)) == 2
    assert "nvrx-eks-gpu is set to 2 nodes already" in console.export_text()


def test_a_capacity_shortfall_names_the_health_issue_and_what_to_do(cluster):
    _deployed(cluster)
    session = _session()
    Fleet(session, cluster, issues=(NO_CAPACITY,))
    console = Console(width=400, record=True)
    with pytest.raises(ConfigError) as error:
        capacity_up(load_deployment(), 2, console, session=session, poll_s=0)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("node group nvrx-eks-gpu is DEGRADED; 1 health issue(s) above, each with what to do")
    out = console.export_text()
    issue = [line for line in out.splitlines() if line.strip().startswith("AsgInstanceLaunchFailures: Could not")]
    assert len(issue) == 1
    assert issue[0].endswith(
        "-> AWS has no free p5.48xlarge in us-east-1a now: run `nvrx-eks capacity up` again later, hold capacity "
        "with a Capacity Block or an On-Demand Capacity Reservation (gpu_nodes.capacity_reservation_id), or deploy "
        "to another AZ (gpu_availability_zone)"
    )


def test_up_beyond_the_groups_maximum_is_refused_before_anything_changes(cluster):
    _deployed(cluster)
    session = _session()
    fleet = Fleet(session, cluster)
    with pytest.raises(ConfigError, match=r"^--nodes 3: node group nvrx-eks-gpu holds at most 2 \(maxSize\); raise"):
        capacity_up(load_deployment(), 3, Console(), session=session, poll_s=0)
    assert fleet.scalings == []


def _block(session: boto3.Session, **fields) -> None:
    block = {
        "CapacityReservationId": BLOCK_ID,
        "InstanceType": "p5.48xlarge",
        "AvailabilityZone": "us-east-1a",
        "State": "scheduled",
        "TotalInstanceCount": 0,
        "AvailableInstanceCount": 0,
        "StartDate": datetime.datetime(2026, 12, 12, 11, 30, tzinfo=datetime.UTC),
        "EndDate": datetime.datetime(2026, 12, 19, 11, 30, tzinfo=datetime.UTC),
        "Tags": [{"Key": "aws:ec2capacityreservation:incrementalRequestedQuantity", "Value": "2"}],
        **fields,
    }
    ServiceGaps(session).answer("ec2", "DescribeCapacityReservations", capacity_reservations_answer([block]))


def test_up_refuses_a_capacity_block_before_it_starts_naming_the_start(cluster):
    _deployed(cluster, "p5-capacity-block")
    session = _session()
    fleet = Fleet(session, cluster)
    _block(session)
    with pytest.raises(ConfigError) as error:
        capacity_up(load_deployment("p5-capacity-block"), None, Console(), session=session, clock=lambda: NOW)
    assert str(error.value) == (
        f"Capacity Block {BLOCK_ID} is scheduled: it starts 2026-12-12 11:30 UTC (in 2 d 2 h), and no node can "
        "launch into it before; run `nvrx-eks capacity up` then"
    )
    assert fleet.scalings == []


def test_up_on_an_active_capacity_block_brings_the_blocks_nodes_and_says_how_to_update(cluster):
    group = _deployed(cluster, "p5-capacity-block")
    session = _session()
    fleet = Fleet(session, cluster)
    _block(session, State="active", TotalInstanceCount=2, AvailableInstanceCount=2)
    console = Console(width=300, record=True)
    capacity_up(load_deployment("p5-capacity-block"), None, console, session=session, poll_s=0, clock=lambda: NOW)
    assert fleet.scalings == [{"minSize": 0, "maxSize": 2, "desiredSize": 2}] and len(fleet.nodes(group)) == 2
    out = " ".join(console.export_text().split())
    assert "the block ends 2026-12-19 11:30 UTC; EC2 begins terminating its instances 30 minutes before" in out
    assert "only at 0 nodes: run `nvrx-eks capacity down` before such a deploy" in out


def test_down_warns_how_much_of_the_block_it_leaves_unused(cluster):
    group = _deployed(cluster, "p5-capacity-block", desired=2)
    session = _session()
    fleet = Fleet(session, cluster)
    for _node in range(2):  # the block's two nodes, up
        fleet._poll({"nodegroup": {"nodegroupName": group, "scalingConfig": {"desiredSize": 2}}})
    _block(session, State="active", TotalInstanceCount=2, AvailableInstanceCount=0)
    console = Console(width=300, record=True)
    capacity_down(load_deployment("p5-capacity-block"), console, session=session, poll_s=0, clock=lambda: NOW)
    assert fleet.scalings == [{"minSize": 0, "maxSize": 2, "desiredSize": 0}] and fleet.nodes(group) == []
    out = " ".join(console.export_text().split())
    assert (
        f"Capacity Block {BLOCK_ID} runs until 2026-12-19 11:30 UTC: this stops its nodes 9 d 2 h before EC2 would"
    ) in out
    assert "nvrx-eks-cb-gpu has no nodes" in out


def test_down_refuses_while_a_job_runs_unless_forced(cluster):
    """A running job would lose its nodes: its pods wait in Pending."""
    group = _deployed(cluster, desired=2)
    for document in render_job(build_jobspec(load_deployment().config, nodes=2, name="train")).documents:
        cluster.add(document)
    result = run_cli("capacity", "down")
    assert result.code == 2
    assert " ".join(result.stderr.split()).startswith(
        "error: JobSet train still running in training: scaling the GPU nodes to 0 takes its nodes away"
    )
    assert "`nvrx-eks delete train`), or pass --force" in " ".join(result.stderr.split())
    assert (
        boto3.client("eks", region_name=REGION).describe_nodegroup(clusterName="nvrx-eks", nodegroupName=group)[
            "nodegroup"
        ]["scalingConfig"]["desiredSize"]
        == 2
    )

    session = _session()
    Fleet(session, cluster)
    capacity_down(load_deployment(), Console(), force=True, session=session, poll_s=0)
    assert (
        boto3.client("eks", region_name=REGION).describe_nodegroup(clusterName="nvrx-eks", nodegroupName=group)[
            "nodegroup"
        ]["scalingConfig"]["desiredSize"]
        == 0
    )


def test_the_cli_refuses_capacity_for_a_cluster_it_did_not_create(tmp_path):
    from tests.support.profiles import profile_file

    config = profile_file(
        tmp_path,
        cluster={"context": "other", "namespace": "ml", "pvc": "data", "image": "registry.example.com/t:1"},
    )
    result = run_cli("capacity", "up", "--config", str(config))
    assert result.code == 2 and "capacity scales the GPU node group this project deploys" in result.stderr
