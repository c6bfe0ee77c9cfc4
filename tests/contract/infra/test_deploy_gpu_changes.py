"""`nvrx-eks deploy`: what a deploy would do to running GPU nodes, read off the deployed and the new
cluster template (nvrx_eks/deploy/gpu_changes.py), and the command that says so and asks before
`cdk deploy` (nvrx_eks/deploy/deploy.py), with CloudFormation and EKS in moto and a stand-in CDK CLI.

The comparisons run on real synthesized templates (the session's shared synthesis, plus one
profile with changed tags and max_size), edited where a real change would be a second synthesis."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import boto3
import pytest
from rich.console import Console

from infra.config import resolve_config
from nvrx_eks.deploy import deploy as deploy_module
from nvrx_eks.deploy.deployment import load_deployment
from nvrx_eks.deploy.gpu_changes import gpu_changes
from tests.support import cli_harness
from tests.support.cli_harness import REGION, run_cli
from tests.support.cluster_template import gpu_launch_template_id, gpu_nodegroup_resource
from tests.support.profiles import config_with

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS..EKS..Nodegroup:UserWarning")  # moto skips it


def _cluster(synthesized) -> dict:
    return copy.deepcopy(synthesized.templates["cluster"])


def _with_user_data(synthesized, user_data: str) -> dict:
    template = _cluster(synthesized)
    lt = template["Resources"][gpu_launch_template_id(synthesized)]
    lt["Properties"]["LaunchTemplateData"]["UserData"] = {"Fn::Base64": user_data}
    return template


@pytest.mark.synth
@pytest.mark.xdist_group("synth")
def test_a_routine_redeploy_or_a_first_deploy_touches_no_gpu_node(synth):
    synthesized = synth("p5")
    assert gpu_changes(_cluster(synthesized), synthesized.templates["cluster"], synthesized.config) == []
    assert gpu_changes(None, synthesized.templates["cluster"], synthesized.config) == []


@pytest.mark.synth
@pytest.mark.xdist_group("synth")
def test_a_tag_change_replaces_every_node_and_a_max_size_change_resets_their_count(synth):
    """Two edits a user makes to a profile, synthesized for real: the tags reach the launch template
    (a new version: every node replaced), max_size reaches the ScalingConfig."""
    before = synth("p5")
    after = synth(config_with("p5", tags__team="vision", gpu_nodes__max_size=4))
    rolling, scaling = gpu_changes(before.templates["cluster"], after.templates["cluster"], after.config)
    assert rolling.what == "the GPU launch template TagSpecifications"
    assert "EKS replaces every running GPU node, one at a time" in rolling.consequence
    assert scaling.what == "the GPU node group's ScalingConfig (MaxSize 2 -> 4)"
    assert "DesiredSize is 0" in scaling.consequence and "nvrx-eks capacity up" in scaling.consequence


@pytest.mark.synth
@pytest.mark.xdist_group("synth")
def test_a_user_data_change_replaces_every_node(synth):
    synthesized = synth("p5")
    (change,) = gpu_changes(_with_user_data(synthesized, "old"), synthesized.templates["cluster"], synthesized.config)
    assert change.what == "the GPU launch template UserData"
    assert "capacity down" not in change.consequence  # on-demand: EKS updates a running group


@pytest.mark.synth
@pytest.mark.xdist_group("synth")
def test_a_capacity_block_group_is_told_to_scale_to_zero_before_the_update(synth):
    synthesized = synth("p5-capacity-block")
    (change,) = gpu_changes(_with_user_data(synthesized, "old"), synthesized.templates["cluster"], synthesized.config)
    assert "a Capacity Block node group is updated only at 0 nodes (EKS): `nvrx-eks capacity down` first" in str(change)


@pytest.mark.synth
@pytest.mark.xdist_group("synth")
def test_a_changed_create_only_property_replaces_the_node_group(synth):
    synthesized = synth("p5")
    deployed = _cluster(synthesized)
    nodegroup_id, _ = gpu_nodegroup_resource(synthesized)
    deployed["Resources"][nodegroup_id]["Properties"]["Subnets"] = [{"Fn::ImportValue": "another-subnet"}]
    (change,) = gpu_changes(deployed, synthesized.templates["cluster"], synthesized.config)
    assert change.what == "the GPU node group's Subnets"
    assert "CloudFormation replaces the node group: its running nodes are terminated" in change.consequence


# ----- the command ------------------------------------------------------------------------------

# The moto fixture shared with the other CLI test modules.
aws = cli_harness.aws

CONFIG = resolve_config("p5")
STACK = CONFIG.stack_name("cluster")


def _template(user_data: str) -> dict:
    """The GPU node group and its launch template, as small as moto can hold."""
    return {
        "Resources": {
            "GpuLt": {
                "Type": "AWS::EC2::LaunchTemplate",
                "Properties": {
                    "LaunchTemplateData": {"InstanceType": "p5.48xlarge", "UserData": {"Fn::Base64": user_data}}
                },
            },
            "GpuNodes": {
                "Type": "AWS::EKS::Nodegroup",
                "Properties": {
                    "NodegroupName": CONFIG.gpu_nodegroup_name,
                    "ClusterName": CONFIG.cluster_name,
                    "NodeRole": "node-role",
                    "Subnets": ["subnet-1"],
                    "LaunchTemplate": {
                        "Id": {"Ref": "GpuLt"},
                        "Version": {"Fn::GetAtt": ["GpuLt", "LatestVersionNumber"]},
                    },
                    "ScalingConfig": {"MinSize": 0, "DesiredSize": 0, "MaxSize": 2},
                },
            },
        }
    }


class StandInCdk:
    """`cdk synth --output DIR` writes `template` as the cluster stack's; every call is recorded."""

    def __init__(self, template: dict):
        self.template = template
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> int:
        self.calls.append(argv[1:])
        if argv[1] == "synth":
            out = Path(argv[argv.index("--output") + 1])
            out.mkdir(parents=True)
            (out / f"{STACK}.template.json").write_text(json.dumps(self.template))
        return 0

    @property
    def deploys(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] == "deploy"]


def _deployed(user_data: str, running: int | None) -> None:
    boto3.client("cloudformation", region_name=REGION).create_stack(
        StackName=STACK, TemplateBody=json.dumps(_template(user_data))
    )
    if running is not None:
        eks = boto3.client("eks", region_name=REGION)
        role = "arn:aws:iam::111122223333:role/node"
        eks.create_cluster(name=CONFIG.cluster_name, roleArn=role, resourcesVpcConfig={"subnetIds": ["subnet-1"]})
        eks.create_nodegroup(
            clusterName=CONFIG.cluster_name,
            nodegroupName=CONFIG.gpu_nodegroup_name,
            nodeRole=role,
            subnets=["subnet-1"],
            scalingConfig={"minSize": 0, "desiredSize": running, "maxSize": 2},
        )


def _deploy(cdk: StandInCdk, *, yes: bool = False, answer: bool | None = None) -> tuple[int, str, list[str]]:
    asked: list[str] = []

    def confirm(question: str) -> bool:
        asked.append(question)
        assert answer is not None, "asked, though nothing should be"
        return answer

    console = Console(record=True, width=200)
    status = deploy_module.deploy(
        load_deployment("p5"), yes=yes, no_rollback=False, console=console, confirm=confirm, runner=cdk
    )
    return status, console.export_text(), asked


def test_running_gpu_nodes_are_not_replaced_without_a_yes(aws):
    _deployed("v1", running=2)
    cdk = StandInCdk(_template("v2"))
    status, text, asked = _deploy(cdk, answer=False)
    assert status == 1 and asked == ["Deploy anyway?"]
    assert "This deploy changes the GPU nodes (running now: 2):" in text
    assert "the GPU launch template UserData: a new launch template version: EKS replaces every running" in text
    assert cdk.deploys == [] and "Not deployed." in text


def test_yes_deploys_the_assembly_that_was_compared(aws):
    _deployed("v1", running=2)
    cdk = StandInCdk(_template("v2"))
    status, _, asked = _deploy(cdk, yes=True)
    assert status == 0 and asked == []
    (synth_call,) = [c for c in cdk.calls if c[0] == "synth"]
    assembly = synth_call[synth_call.index("--output") + 1]
    assert synth_call[-2:] == ["-c", "profile=p5"]
    assert cdk.deploys == [["deploy", "--all", "--app", assembly]]


@pytest.mark.parametrize(
    "deployed, running",
    [(None, None), ("v1", 0), ("v2", 2)],
    ids=["first-deploy", "no-gpu-node-runs", "gpu-nodes-unchanged"],
)
def test_no_question_when_no_running_node_changes(aws, deployed, running):
    if deployed is not None:
        _deployed(deployed, running)
    cdk = StandInCdk(_template("v2"))
    status, text, asked = _deploy(cdk)
    assert status == 0 and asked == [] and len(cdk.deploys) == 1
    assert ("No GPU node runs, so none is disturbed." in text) == (running == 0)


def test_the_cli_command_asks_and_exits_1_on_no(aws, monkeypatch):
    _deployed("v1", running=2)
    cdk = StandInCdk(_template("v2"))
    monkeypatch.setattr(deploy_module, "run_command", cdk)
    result = run_cli("deploy", "--profile", "p5", stdin="n\n")
    assert result.code == 1, result.output
    assert "Deploy anyway? [y/N]" in result.output and cdk.deploys == []
