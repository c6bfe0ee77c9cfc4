"""What a first `cdk deploy` depends on and leaves behind, on the synthesized templates: the
cluster stack launches no GPU instance (the GPU node group is created empty, in every profile),
the log groups that would otherwise grow unbounded exist with a retention before anything writes
to them, and the system nodes, where the job's coordinator runs, keep pods away from IMDS.

One synthesis per profile per session (tests/conftest.py), shared with the other infra tests."""

from __future__ import annotations

import json

import pytest
from aws_cdk import aws_logs as logs

from infra.config import PROFILES_DIR
from infra.stacks.storage import CONTROL_PLANE_LOG_RETENTION
from nvrx_eks.facts import training_metrics
from nvrx_eks.facts.names import RUNS_COPY_PREFIX
from tests.support.cluster_template import (
    gpu_launch_template_id,
    gpu_nodegroup,
    gpu_nodegroup_resource,
    launch_template_data,
    system_nodegroup,
)
from tests.support.profiles import config_with

pytestmark = [pytest.mark.synth, pytest.mark.xdist_group("synth")]

PROFILES = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))
#: Resource types that launch EC2 instances by themselves.
LAUNCHING_TYPES = {
    "AWS::EC2::Instance",
    "AWS::AutoScaling::AutoScalingGroup",
    "AWS::EC2::EC2Fleet",
    "AWS::EC2::SpotFleet",
}


def _depends_on(resource: dict) -> list[str]:
    depends = resource.get("DependsOn", [])
    return [depends] if isinstance(depends, str) else depends


@pytest.mark.parametrize("profile", PROFILES)
def test_the_stacks_create_the_cluster_with_no_gpu_instance_to_launch(synth, profile):
    """A p5 shortfall (or any GPU shortfall) can no longer roll the cluster stack back: the only
    thing that can launch a GPU instance is the GPU node group, and it is created at 0 with a
    minimum of 0; `nvrx-eks capacity up` scales it afterwards, outside CloudFormation."""
    synthesized = synth(profile)
    nodes = synthesized.config.gpu_nodes
    assert gpu_nodegroup(synthesized)["ScalingConfig"] == {"MinSize": 0, "DesiredSize": 0, "MaxSize": nodes.max_size}
    lt_id = gpu_launch_template_id(synthesized)
    for role, template in synthesized.templates.items():
        for logical_id, resource in template["Resources"].items():
            assert resource["Type"] not in LAUNCHING_TYPES, (role, logical_id)
            if nodes.instance_type in json.dumps(resource):
                assert (role, logical_id) == ("cluster", lt_id)  # only the GPU launch template names the type


def test_nothing_in_the_cluster_stack_waits_for_gpu_nodes(synth):
    """No resource depends on the GPU node group (the GPU DaemonSets' Helm charts wait for zero pods
    on zero nodes), so nothing of the cluster's creation is held up by its nodes."""
    synthesized = synth("p5")
    nodegroup_id, _ = gpu_nodegroup_resource(synthesized)
    for logical_id, resource in synthesized.templates["cluster"]["Resources"].items():
        assert nodegroup_id not in _depends_on(resource), logical_id


def _log_group(synthesized, role: str, name: str) -> dict:
    groups = synthesized.resources(role, "AWS::Logs::LogGroup").values()
    (group,) = [g for g in groups if g["Properties"]["LogGroupName"] == name]
    return group


def _key_grant_names_only(synthesized, role: str, group: dict, name: str) -> None:
    key_id = group["Properties"]["KmsKeyId"]["Fn::GetAtt"][0]
    statements = synthesized.templates[role]["Resources"][key_id]["Properties"]["KeyPolicy"]["Statement"]
    (logs_grant,) = [s for s in statements if "logs." in json.dumps(s.get("Principal", {}))]
    context = logs_grant["Condition"]["ArnEquals"]["kms:EncryptionContext:aws:logs:arn"]
    assert json.dumps(context).endswith(f':log-group:{name}"]]}}'), context


def test_the_control_plane_log_group_exists_with_a_retention_before_the_cluster(synth):
    """EKS writes into /aws/eks/<cluster>/cluster when it exists, and otherwise creates it with no
    retention. The storage stack (deployed before the cluster stack, kept by a default teardown
    like the audit log it holds) creates it first."""
    synthesized = synth("p5")
    name = f"/aws/eks/{synthesized.config.cluster_name}/cluster"
    group = _log_group(synthesized, "storage", name)
    assert CONTROL_PLANE_LOG_RETENTION == logs.RetentionDays.THREE_MONTHS
    assert group["Properties"]["RetentionInDays"] == 90
    _key_grant_names_only(synthesized, "storage", group, name)
    (group_id,) = [k for k, g in synthesized.resources("storage", "AWS::Logs::LogGroup").items() if g is group]
    (file_system,) = synthesized.resources("storage", "AWS::FSx::FileSystem").values()
    assert group_id in _depends_on(file_system)  # a name clash fails before FSx's long create
    manifest = json.loads((synthesized.outdir / "manifest.json").read_text())
    cluster_stack = manifest["artifacts"][synthesized.stack_names["cluster"]]
    assert synthesized.stack_names["storage"] in cluster_stack["dependencies"]


def test_the_training_metrics_log_group_is_the_deployments_with_a_retention(synth):
    synthesized = synth("p5")
    name = training_metrics.log_group(synthesized.config.name)
    group = _log_group(synthesized, "cluster", name)
    assert group["Properties"]["RetentionInDays"] == 30
    _key_grant_names_only(synthesized, "cluster", group, name)
    (group_id,) = [k for k, g in synthesized.resources("cluster", "AWS::Logs::LogGroup").items() if g is group]
    (agent,) = [
        a
        for a in synthesized.resources("cluster", "AWS::EKS::Addon").values()
        if a["Properties"]["AddonName"] == "amazon-cloudwatch-observability"
    ]
    assert group_id in _depends_on(agent)  # made before the agent runs, deleted after it stops


def test_no_training_metrics_log_group_without_the_cloudwatch_add_on(synth):
    synthesized = synth("g5-smoke")
    assert not synthesized.config.addons.cloudwatch_observability
    names = [g["Properties"]["LogGroupName"] for g in synthesized.resources("cluster", "AWS::Logs::LogGroup").values()]
    assert training_metrics.log_group(synthesized.config.name) not in names


def test_system_nodes_keep_pods_away_from_imds(synth):
    """The job's coordinator runs on the system nodes: their launch template allows one hop to
    IMDSv2, as the GPU nodes' does, so no pod outside the host network reaches the node role."""
    synthesized = synth("p5")
    system = system_nodegroup(synthesized)
    lt_id = system["LaunchTemplate"]["Id"]["Ref"]
    assert system["LaunchTemplate"]["Version"] == {"Fn::GetAtt": [lt_id, "LatestVersionNumber"]}
    data = synthesized.templates["cluster"]["Resources"][lt_id]["Properties"]["LaunchTemplateData"]
    one_hop = {"HttpTokens": "required", "HttpPutResponseHopLimit": 1, "HttpEndpoint": "enabled"}
    assert data["MetadataOptions"] == one_hop
    assert data["MetadataOptions"] == launch_template_data(synthesized)["MetadataOptions"]
    (root,) = data["BlockDeviceMappings"]
    assert root["Ebs"] == {"VolumeSize": 50, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}
    assert "DiskSize" not in system  # rejected beside a launch template
    assert "ImageId" not in data and "UserData" not in data  # EKS's AL2023 image and bootstrap


def test_the_fsx_csi_controller_is_given_its_region(synth):
    """The FSx CSI controller is not in the host network; with IMDS out of reach it needs its region."""
    synthesized = synth("p5")
    (fsx,) = [
        a["Properties"]
        for a in synthesized.resources("cluster", "AWS::EKS::Addon").values()
        if a["Properties"]["AddonName"] == "aws-fsx-csi-driver"
    ]
    assert json.loads(fsx["ConfigurationValues"]) == {"controller": {"region": synthesized.config.region}}


def test_a_reservation_made_in_a_cluster_placement_group_launches_into_that_group(synth):
    config = config_with(
        "p5",
        gpu_nodes__capacity_reservation_id="cr-0123456789abcdef0",
        gpu_nodes__placement_group=False,
        gpu_nodes__placement_group_name="p5-training-cpg",
    )
    synthesized = synth(config)
    data = launch_template_data(synthesized)
    assert data["Placement"] == {"GroupName": "p5-training-cpg"}
    target = data["CapacityReservationSpecification"]["CapacityReservationTarget"]
    assert target == {"CapacityReservationId": "cr-0123456789abcdef0"}
    assert not synthesized.resources("cluster", "AWS::EC2::PlacementGroup")  # the group is not ours


def test_retired_checkpoints_stay_in_s3_for_days_not_a_month(synth):
    """Every save retires a checkpoint, and the runs export keeps each retired one as a noncurrent
    version: for the 8b job on 2 p5 (96 GB, a save about every 62 minutes) 30 days parked about
    67 TB; 3 days park about 7 TB and still undo a mistaken delete found after a weekend."""
    synthesized = synth("p5")
    (bucket,) = [
        b["Properties"] for k, b in synthesized.resources("storage", "AWS::S3::Bucket").items() if k.startswith("Data")
    ]
    (runs,) = [r for r in bucket["LifecycleConfiguration"]["Rules"] if r.get("Prefix") == f"{RUNS_COPY_PREFIX}/"]
    assert runs["NoncurrentVersionExpiration"] == {"NoncurrentDays": 3}
