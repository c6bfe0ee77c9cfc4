"""A job that launches more GPU nodes than can run is refused before anything is created
(nvrx_eks/jobs/capacity.py): offline against the profile's gpu_nodes.max_size (render, validate,
submit --dry-run), and at submit against the deployed node group's maxSize and the capacity
reservation's size, read from moto (and, for the reservation moto lacks, tests/support/aws_gaps.py)."""

from __future__ import annotations

import boto3
import pytest
import yaml

from nvrx_eks.facts.job_kinds import JOBSET
from tests.support import cli_harness
from tests.support.aws_gaps import ServiceError, ServiceGaps, capacity_reservations_answer
from tests.support.cli_harness import add_fsx_volume, deploy_fake_environment, run_cli
from tests.support.profiles import profile_file

aws = cli_harness.aws
k8s_server = cli_harness.k8s_server

RESERVATION_ID = "cr-0123456789abcdef0"


def _refused(result, *needles: str) -> str:
    """The one error message (exit 2, no traceback, nothing rendered), whitespace-normalized."""
    assert result.code == 2, result.output
    assert "Traceback" not in result.output
    assert result.stdout == ""
    message = " ".join(result.stderr.split())
    assert message.startswith("error: "), message
    for needle in needles:
        assert needle in message, message
    return message


def _launched_pods(manifest: str) -> int:
    """GPU pods the rendered JobSet starts: one per node (parallelism of its worker replicated job;
    the coordinator's pod runs on a system node)."""
    [jobset] = [d for d in yaml.safe_load_all(manifest) if d["kind"] == JOBSET.kind]
    [replicated] = [rj for rj in jobset["spec"]["replicatedJobs"] if rj["name"] != "coordinator"]
    return replicated["replicas"] * replicated["template"]["spec"]["parallelism"]


# ----- offline: the profile's gpu_nodes.max_size -------------------------------------------


def test_render_beyond_the_profile_max_size_exits_2_naming_it_and_the_fix():
    message = _refused(
        run_cli("render", "--nodes", "16"),
        "the job launches 16 GPU nodes (--nodes 16)",
        "gpu_nodes.max_size: is 2 in profile p5",
        "raise gpu_nodes.max_size in the profile and run `nvrx-eks deploy`",
        "vCPU quota or capacity reservation",
        "or use --nodes <= 2",
    )
    assert "--spare-nodes" not in message


def test_max_size_decides_a_copy_of_p5_sized_for_16_nodes_renders_16(tmp_path):
    """The same profile, only gpu_nodes.max_size (and desired_size) changed: refused at 15, rendered at 16."""
    _refused(
        run_cli("render", "--config", str(profile_file(tmp_path / "15", gpu_nodes__max_size=15)), "--nodes", "16"),
        "gpu_nodes.max_size: is 15 in config",
        "or use --nodes <= 15",
    )
    config = profile_file(tmp_path, gpu_nodes__max_size=16, gpu_nodes__desired_size=16)
    result = run_cli("render", "--config", str(config), "--nodes", "16")
    assert result.code == 0, result.output
    assert _launched_pods(result.stdout) == 16


def test_spare_nodes_count_as_launched_nodes(tmp_path):
    _refused(
        run_cli("render", "--nodes", "2", "--spare-nodes", "1"),
        "the job launches 3 GPU nodes (--nodes 2 + --spare-nodes 1)",
        "gpu_nodes.max_size: is 2 in profile p5",
        "or use --nodes plus --spare-nodes <= 2",
    )
    config = profile_file(tmp_path, gpu_nodes__max_size=3, gpu_nodes__desired_size=3)
    result = run_cli("render", "--config", str(config), "--nodes", "2", "--spare-nodes", "1")
    assert result.code == 0, result.output
    assert _launched_pods(result.stdout) == 3


def test_default_node_count_plus_spares_is_checked_too():
    """No --nodes: the profile's desired_size (2), plus a spare."""
    _refused(run_cli("render", "--spare-nodes", "1"), "--nodes 2 + --spare-nodes 1", "gpu_nodes.max_size")


@pytest.mark.parametrize(
    "args",
    [
        ["validate", "--nodes", "3"],
        ["submit", "--dry-run", "--nodes", "3"],
        ["render", "--fabric-test", "--nodes", "3"],
        ["render", "--api", "pytorchjob", "--nodes", "3"],
    ],
    ids=["validate", "submit-dry-run", "fabric-test", "pytorchjob"],
)
def test_every_job_command_refuses_it(args):
    _refused(run_cli(*args), "gpu_nodes.max_size: is 2 in profile p5", "or use --nodes <= 2")


def test_a_config_file_is_named_as_the_source(tmp_path):
    config = profile_file(tmp_path, "g5-smoke", gpu_nodes__max_size=3, gpu_nodes__desired_size=3)
    _refused(
        run_cli("render", "--config", str(config), "--nodes", "4"),
        f"gpu_nodes.max_size: is 3 in config {config}",
        f"`nvrx-eks deploy -c {config}`",
    )


def test_a_capacity_block_profile_is_not_told_to_raise_desired_size():
    """The group is created empty in every profile; only max_size bounds what it can grow to."""
    message = _refused(
        run_cli("render", "--profile", "p5-capacity-block", "--nodes", "4"), "raise gpu_nodes.max_size in the profile"
    )
    assert "desired_size" not in message


# ----- live: submit against what is deployed ------------------------------------------------


@pytest.fixture
def gaps(aws, monkeypatch):
    """Sessions the CLI creates answer DescribeCapacityReservations (moto lacks it) from `reservations`."""
    real_session = boto3.Session
    reservations: list[dict] = []
    made: list[ServiceGaps] = []

    def make(*args, **kwargs):
        session = real_session(*args, **kwargs)
        gaps = ServiceGaps(session)
        gaps.answer("ec2", "DescribeCapacityReservations", capacity_reservations_answer(reservations))
        made.append(gaps)
        return session

    monkeypatch.setattr(boto3, "Session", make)
    return reservations, made


def _reservation(total: int) -> dict:
    return {
        "CapacityReservationId": RESERVATION_ID,
        "InstanceType": "p5.48xlarge",
        "AvailabilityZone": "us-east-1a",
        "State": "active",
        "TotalInstanceCount": total,
        "AvailableInstanceCount": total,
    }


def _posts(server) -> list:
    return [r for r in server.requests if r.method == "POST"]


def test_submit_refuses_more_than_the_deployed_node_group_holds(aws, k8s_server, tmp_path):
    """The profile was raised to 16, but the node group still has maxSize 2 (not deployed yet)."""
    config = profile_file(tmp_path, gpu_nodes__max_size=16, gpu_nodes__desired_size=16)
    deploy_fake_environment(k8s_server.url, config, gpu_max_size=2)
    add_fsx_volume(k8s_server)
    message = _refused(
        run_cli("submit", "--config", str(config), "--nodes", "16"),
        "gpu_nodes.max_size: the deployed node group nvrx-eks-gpu has scalingConfig.maxSize 2 (the profile says 16)",
        f"deploy the profile (`nvrx-eks deploy -c {config}`)",
        "aws eks update-nodegroup-config --cluster-name nvrx-eks --nodegroup-name nvrx-eks-gpu",
        "or use --nodes <= 2",
    )
    assert "is 16 in config" not in message  # the profile's own limit holds
    assert _posts(k8s_server) == []  # nothing created, not even a server-side dry run
    assert run_cli("submit", "--config", str(config), "--nodes", "2").code == 0


def test_submit_within_the_node_group_notes_pods_beyond_its_desired_size(aws, k8s_server, tmp_path):
    config = profile_file(tmp_path, gpu_nodes__max_size=4, gpu_nodes__desired_size=2)
    deploy_fake_environment(k8s_server.url, config)
    add_fsx_volume(k8s_server)
    result = run_cli("submit", "--config", str(config), "--nodes", "2", "--spare-nodes", "2")
    assert result.code == 0, result.output
    note = " ".join(result.stderr.split())
    assert "the job launches 4 nodes and the GPU node group nvrx-eks-gpu runs 2" in note
    assert f"pods wait in Pending until it is scaled up: `nvrx-eks capacity up --nodes 4 -c {config}`" in note


def test_submit_refuses_more_than_the_capacity_reservation_holds(gaps, k8s_server, tmp_path):
    reservations, made = gaps
    reservations.append(_reservation(total=2))
    config = profile_file(
        tmp_path,
        gpu_nodes__max_size=4,
        gpu_nodes__desired_size=4,
        gpu_nodes__capacity_reservation_id=RESERVATION_ID,
        gpu_nodes__placement_group=False,
    )
    deploy_fake_environment(k8s_server.url, config)
    add_fsx_volume(k8s_server)
    _refused(
        run_cli("submit", "--config", str(config), "--nodes", "2", "--spare-nodes", "1"),
        f"gpu_nodes.capacity_reservation_id: capacity reservation {RESERVATION_ID} holds 2 instances "
        "(TotalInstanceCount)",
        "set gpu_nodes.capacity_reservation_id to a larger reservation or Capacity Block",
        "or use --nodes plus --spare-nodes <= 2",
    )
    assert any(g.called("DescribeCapacityReservations") == [{"CapacityReservationIds": [RESERVATION_ID]}] for g in made)
    assert _posts(k8s_server) == []
    assert run_cli("submit", "--config", str(config), "--nodes", "2").code == 0


def test_submit_refuses_when_the_reservation_no_longer_exists(gaps, k8s_server, tmp_path):
    config = profile_file(tmp_path, gpu_nodes__capacity_reservation_id=RESERVATION_ID, gpu_nodes__placement_group=False)
    deploy_fake_environment(k8s_server.url, config)
    add_fsx_volume(k8s_server)
    message = _refused(
        run_cli("submit", "--config", str(config), "--nodes", "1"),
        f"gpu_nodes.capacity_reservation_id: capacity reservation {RESERVATION_ID} does not exist in us-east-1",
        "set gpu_nodes.capacity_reservation_id to a larger reservation or Capacity Block and run `nvrx-eks deploy",
    )
    assert "<= 0" not in message


def test_submit_without_permission_to_read_the_node_group_goes_on_with_a_note(aws, k8s_server, monkeypatch):
    """Submitting needs only the cluster's access entry; a missing IAM read skips that check."""
    deploy_fake_environment(k8s_server.url)
    add_fsx_volume(k8s_server)
    real_session = boto3.Session

    def denied(_params):
        raise ServiceError("AccessDeniedException", "not authorized to perform eks:DescribeNodegroup")

    def make(*args, **kwargs):
        session = real_session(*args, **kwargs)
        ServiceGaps(session).answer("eks", "DescribeNodegroup", denied)
        return session

    monkeypatch.setattr(boto3, "Session", make)
    result = run_cli("submit", "--nodes", "2")
    assert result.code == 0, result.output
    assert "not checked: the node group's maxSize (eks:DescribeNodegroup denied)" in " ".join(result.stderr.split())


def test_submit_when_the_node_group_is_gone_asks_for_a_deploy(aws, k8s_server):
    deploy_fake_environment(k8s_server.url)
    add_fsx_volume(k8s_server)
    boto3.client("eks", region_name=cli_harness.REGION).delete_nodegroup(
        clusterName="nvrx-eks", nodegroupName="nvrx-eks-gpu"
    )
    _refused(
        run_cli("submit", "--nodes", "2"),
        "the GPU node group nvrx-eks-gpu of cluster nvrx-eks (stack output GpuNodegroupName) does not exist",
        "`nvrx-eks deploy`",
    )
