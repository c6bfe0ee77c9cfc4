"""What outlives a deployment's stacks, found and swept by teardown.

CloudFormation deletes what a stack owns; what AWS services create on a stack's behalf it does not:
network interfaces the VPC CNI and Lambda created, the EKS-created cluster security group,
placement groups, detached EBS volumes, control-plane, Container Insights and Lambda log groups,
FSx backups. They are found by the deployment tag, the cluster's own tags and the stack names;
what a stack that still exists owns is left to CloudFormation. Data (FSx backups, the control-plane
log groups with the API audit log) is only reported unless `teardown --delete-data`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial

import boto3
from botocore.exceptions import ClientError

from infra.config import STACK_ROLES, DeploymentConfig
from nvrx_eks.facts.names import DEPLOYMENT_TAG_KEY
from nvrx_eks.ops.teardown_data import deployment_file_systems

#: The tag CloudFormation puts on every taggable resource of a stack.
STACK_NAME_TAG = "aws:cloudformation:stack-name"
#: How Lambda describes the ENIs it creates for a function in a VPC.
LAMBDA_ENI_DESCRIPTION = "AWS Lambda VPC ENI"


@dataclass
class Orphan:
    kind: str
    identifier: str
    detail: str = ""
    #: Deleting it would delete data: only with --delete-data.
    is_data: bool = False
    #: What data it holds, for the "kept" outcome.
    data_note: str = "data"
    outcome: str = "found"


def _tag_filter(key: str, value: str) -> dict:
    return {"Name": f"tag:{key}", "Values": [value]}


def _tags(resource: dict) -> dict[str, str]:
    # EC2 names the list "Tags" on most resources and "TagSet" on network interfaces.
    return {t["Key"]: t["Value"] for t in resource.get("Tags", resource.get("TagSet", []))}


def _owned_by_living_stack(resource: dict, living_stacks: Collection[str]) -> bool:
    """CloudFormation deletes its own resources (and a network stack kept for the file system
    still needs its security groups); the sweep takes only what no remaining stack owns."""
    return _tags(resource).get(STACK_NAME_TAG) in living_stacks


def _deployment_vpcs(ec2, config: DeploymentConfig) -> list[str]:
    vpcs = ec2.describe_vpcs(Filters=[_tag_filter(DEPLOYMENT_TAG_KEY, config.name)])["Vpcs"]
    return sorted(vpc["VpcId"] for vpc in vpcs)


def _is_function_log_group(name: str, stack_name: str) -> bool:
    """Whether `name` is the log group of a Lambda function CloudFormation created in the stack.

    CloudFormation names such a function `<stack>-<logical id>-<random suffix>`, and logical ids
    have no hyphen. Checking that shape keeps another deployment whose name starts with
    `<ours>-<role>` out: its functions are `<ours>-<role>-<its role>-<logical id>-<suffix>`.
    """
    prefix = f"/aws/lambda/{stack_name}-"
    if not name.startswith(prefix):
        return False
    parts = name[len(prefix) :].split("-")
    return len(parts) == 2 and all(part.isalnum() for part in parts)


def find_orphans(
    session: boto3.Session,
    config: DeploymentConfig,
    *,
    living_stacks: Collection[str] = (),
    blockers_only: bool = False,
) -> list[Orphan]:
    """Resources of this deployment that survived its stacks, by tag and by the cluster's name.

    `living_stacks`: the deployment's stacks that still exist; what they own is left to them, and
    their Lambda functions' log groups are still in use. `blockers_only`: just the network
    interfaces and security groups, which can block a stack's deletion.
    """
    ec2 = session.client("ec2", region_name=config.region)
    ours = _tag_filter(DEPLOYMENT_TAG_KEY, config.name)
    orphans: list[Orphan] = []

    enis: dict[str, dict] = {}
    for tag_filter in (ours, _tag_filter("cluster.k8s.amazonaws.com/name", config.cluster_name)):
        for eni in ec2.describe_network_interfaces(Filters=[tag_filter])["NetworkInterfaces"]:
            enis[eni["NetworkInterfaceId"]] = eni
    # Lambda releases a VPC function's ENIs minutes after the function is deleted, and carries no
    # tag of ours over to them; an unused one in the deployment's VPC still blocks its subnet.
    vpcs = _deployment_vpcs(ec2, config)
    if vpcs:
        lambda_enis = ec2.describe_network_interfaces(
            Filters=[
                {"Name": "vpc-id", "Values": vpcs},
                {"Name": "status", "Values": ["available"]},
                {"Name": "description", "Values": [f"{LAMBDA_ENI_DESCRIPTION}*"]},
            ]
        )["NetworkInterfaces"]
        for eni in lambda_enis:
            enis[eni["NetworkInterfaceId"]] = eni
    for eni_id, eni in sorted(enis.items()):
        if not _owned_by_living_stack(eni, living_stacks):
            orphans.append(Orphan("network interface", eni_id, f"{eni.get('Status')} in {eni.get('VpcId')}"))

    groups: dict[str, dict] = {}
    for tag_filter in (ours, _tag_filter("aws:eks:cluster-name", config.cluster_name)):
        for group in ec2.describe_security_groups(Filters=[tag_filter])["SecurityGroups"]:
            if group.get("GroupName") != "default":
                groups[group["GroupId"]] = group
    for group_id, group in sorted(groups.items()):
        if not _owned_by_living_stack(group, living_stacks):
            orphans.append(Orphan("security group", group_id, group.get("GroupName", "")))
    if blockers_only:
        return orphans

    for group in ec2.describe_placement_groups(Filters=[ours])["PlacementGroups"]:
        if not _owned_by_living_stack(group, living_stacks):
            orphans.append(Orphan("placement group", group["GroupName"], group.get("Strategy", "")))

    for volume in ec2.describe_volumes(Filters=[ours, {"Name": "status", "Values": ["available"]}])["Volumes"]:
        if not _owned_by_living_stack(volume, living_stacks):
            orphans.append(Orphan("EBS volume", volume["VolumeId"], f"{volume['Size']} GiB, detached"))

    logs = session.client("logs", region_name=config.region)
    # (prefix, what it holds if it is data, which names under the prefix are ours): Container
    # Insights metrics and Lambda logs (the kubectl provider's, kept by DeletionPolicy Retain, and
    # those Lambda creates itself) are not worth keeping.
    prefixes: list[tuple[str, str | None, Callable[[str], bool]]] = [
        (f"/aws/eks/{config.cluster_name}/", "control-plane and audit logs", lambda _name: True),
        (f"/aws/containerinsights/{config.cluster_name}/", None, lambda _name: True),
    ]
    for role in STACK_ROLES:
        stack_name = config.stack_name(role)
        if stack_name not in living_stacks:  # a living stack's functions still write there
            prefixes.append(
                (f"/aws/lambda/{stack_name}-", None, partial(_is_function_log_group, stack_name=stack_name))
            )
    for prefix, data_note, is_ours in prefixes:
        for page in logs.get_paginator("describe_log_groups").paginate(logGroupNamePrefix=prefix):
            for group in page["logGroups"]:
                if not is_ours(group["logGroupName"]):
                    continue
                detail = f"{group.get('storedBytes', 0)} bytes"
                if data_note is None:
                    orphans.append(Orphan("log group", group["logGroupName"], detail))
                else:
                    orphans.append(Orphan("log group", group["logGroupName"], detail, True, data_note))

    fsx = session.client("fsx", region_name=config.region)
    for page in fsx.get_paginator("describe_backups").paginate():
        for backup in page["Backups"]:
            tags = {t["Key"]: t["Value"] for t in backup.get("Tags", [])}
            if tags.get(DEPLOYMENT_TAG_KEY) == config.name:
                orphans.append(Orphan("FSx backup", backup["BackupId"], backup.get("Lifecycle", ""), is_data=True))
    return orphans


def sweep(
    session: boto3.Session, config: DeploymentConfig, orphans: list[Orphan], *, delete_data: bool
) -> list[Orphan]:
    """Delete what find_orphans found, data only with delete_data; sets and returns each outcome."""
    for orphan in orphans:
        if orphan.is_data and not delete_data:
            orphan.outcome = f"kept ({orphan.data_note}; --delete-data deletes it)"
        else:
            orphan.outcome = delete_orphan(session, config, orphan)
    return orphans


def delete_orphan(session: boto3.Session, config: DeploymentConfig, orphan: Orphan) -> str:
    ec2 = session.client("ec2", region_name=config.region)
    try:
        if orphan.kind == "network interface":
            ec2.delete_network_interface(NetworkInterfaceId=orphan.identifier)
        elif orphan.kind == "security group":
            ec2.delete_security_group(GroupId=orphan.identifier)
        elif orphan.kind == "placement group":
            ec2.delete_placement_group(GroupName=orphan.identifier)
        elif orphan.kind == "EBS volume":
            ec2.delete_volume(VolumeId=orphan.identifier)
        elif orphan.kind == "log group":
            session.client("logs", region_name=config.region).delete_log_group(logGroupName=orphan.identifier)
        elif orphan.kind == "FSx backup":
            session.client("fsx", region_name=config.region).delete_backup(BackupId=orphan.identifier)
        else:  # pragma: no cover - every kind find_orphans returns is handled above
            return f"kept: unknown kind {orphan.kind}"
    except ClientError as e:
        error = e.response.get("Error", {})
        return f"failed: {error.get('Code')}: {error.get('Message')}"
    return "deleted"


def vpc_contents(
    session: boto3.Session, config: DeploymentConfig, *, other_stacks: Collection[str] = ()
) -> dict[str, list[str]]:
    """What is still in the deployment's VPC besides its default security group: file systems,
    network interfaces (their description names their owner) and security groups, less what
    `other_stacks` (stacks that stay for now) own, which is meant to be there."""
    ec2 = session.client("ec2", region_name=config.region)
    contents: dict[str, list[str]] = {}
    for vpc in _deployment_vpcs(ec2, config):
        found: list[str] = []
        in_vpc = [{"Name": "vpc-id", "Values": [vpc]}]
        subnets = {s["SubnetId"] for s in ec2.describe_subnets(Filters=in_vpc)["Subnets"]}
        for fs_id, fs in sorted(deployment_file_systems(session, config, None, subnets=subnets).items()):
            if not _owned_by_living_stack(fs, other_stacks):
                found.append(f"FSx file system {fs_id}")
        for eni in sorted(
            ec2.describe_network_interfaces(Filters=in_vpc)["NetworkInterfaces"], key=lambda e: e["NetworkInterfaceId"]
        ):
            if not _owned_by_living_stack(eni, other_stacks):
                what = ", ".join(filter(None, [eni.get("Status"), eni.get("Description")]))
                found.append(f"{eni['NetworkInterfaceId']} ({what})")
        for group in sorted(ec2.describe_security_groups(Filters=in_vpc)["SecurityGroups"], key=lambda g: g["GroupId"]):
            if group.get("GroupName") != "default" and not _owned_by_living_stack(group, other_stacks):
                found.append(f"{group['GroupId']} ({group.get('GroupName', '')})")
        if found:
            contents[vpc] = found
    return contents
