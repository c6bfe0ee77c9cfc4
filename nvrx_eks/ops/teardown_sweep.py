"""What outlives a deployment's stacks, found and swept by teardown.

CloudFormation deletes what a stack owns; what AWS services create on a stack's behalf it does not:
network interfaces the VPC CNI and Lambda created, the EKS-created cluster security group,
placement groups, detached EBS volumes, control-plane, Container Insights and Lambda log groups,
FSx backups. They are found by the deployment tag, the cluster's own tags and the stack names;
what a stack that still exists owns is left to CloudFormation. Data (FSx backups, the control-plane
log groups with the API audit log) is only reported unless `teardown --delete-data`. Each kind is
one record of ORPHAN_KINDS: how to find the deployment's, how to delete one, and whether it can
block a stack's deletion.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from functools import cached_property, partial
from typing import NamedTuple

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
    #: What data it holds (an FSx backup, the audit log); None: none. Data goes only with --delete-data.
    data: str | None = None
    outcome: str = "found"


class Found(NamedTuple):
    """One resource a finder of ORPHAN_KINDS found: its kind is the finder's."""

    identifier: str
    detail: str
    data: str | None = None


@dataclass(frozen=True)
class Scope:
    """Where the sweep looks and deletes: the deployment's account and region, and its stacks that
    still exist (what they own is left to CloudFormation)."""

    session: boto3.Session
    config: DeploymentConfig
    living_stacks: Collection[str] = ()

    @cached_property
    def ec2(self):
        return self.session.client("ec2", region_name=self.config.region)

    @cached_property
    def logs(self):
        return self.session.client("logs", region_name=self.config.region)

    @cached_property
    def fsx(self):
        return self.session.client("fsx", region_name=self.config.region)

    @property
    def ours(self) -> dict:
        """The EC2 filter on the deployment's tag."""
        return _tag_filter(DEPLOYMENT_TAG_KEY, self.config.name)

    def left_to_a_stack(self, resource: dict) -> bool:
        return _owned_by_living_stack(resource, self.living_stacks)


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


# ----- the kinds -------------------------------------------------------------------------------


def _network_interfaces(scope: Scope) -> Iterator[Found]:
    ec2, config = scope.ec2, scope.config
    enis: dict[str, dict] = {}
    for tag_filter in (scope.ours, _tag_filter("cluster.k8s.amazonaws.com/name", config.cluster_name)):
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
        if not scope.left_to_a_stack(eni):
            yield Found(eni_id, f"{eni.get('Status')} in {eni.get('VpcId')}")


def _security_groups(scope: Scope) -> Iterator[Found]:
    groups: dict[str, dict] = {}
    for tag_filter in (scope.ours, _tag_filter("aws:eks:cluster-name", scope.config.cluster_name)):
        for group in scope.ec2.describe_security_groups(Filters=[tag_filter])["SecurityGroups"]:
            if group.get("GroupName") != "default":
                groups[group["GroupId"]] = group
    for group_id, group in sorted(groups.items()):
        if not scope.left_to_a_stack(group):
            yield Found(group_id, group.get("GroupName", ""))


def _placement_groups(scope: Scope) -> Iterator[Found]:
    for group in scope.ec2.describe_placement_groups(Filters=[scope.ours])["PlacementGroups"]:
        if not scope.left_to_a_stack(group):
            yield Found(group["GroupName"], group.get("Strategy", ""))


def _detached_volumes(scope: Scope) -> Iterator[Found]:
    detached = {"Name": "status", "Values": ["available"]}
    for volume in scope.ec2.describe_volumes(Filters=[scope.ours, detached])["Volumes"]:
        if not scope.left_to_a_stack(volume):
            yield Found(volume["VolumeId"], f"{volume['Size']} GiB, detached")


def _log_groups(scope: Scope) -> Iterator[Found]:
    config = scope.config
    # (prefix, what it holds if it is data, which names under the prefix are ours): Container
    # Insights metrics and Lambda logs (the kubectl provider's, kept by DeletionPolicy Retain, and
    # those Lambda creates itself) are not worth keeping.
    prefixes: list[tuple[str, str | None, Callable[[str], bool]]] = [
        (f"/aws/eks/{config.cluster_name}/", "control-plane and audit logs", lambda _name: True),
        (f"/aws/containerinsights/{config.cluster_name}/", None, lambda _name: True),
    ]
    for role in STACK_ROLES:
        stack_name = config.stack_name(role)
        if stack_name not in scope.living_stacks:  # a living stack's functions still write there
            prefixes.append(
                (f"/aws/lambda/{stack_name}-", None, partial(_is_function_log_group, stack_name=stack_name))
            )
    for prefix, data, is_ours in prefixes:
        for page in scope.logs.get_paginator("describe_log_groups").paginate(logGroupNamePrefix=prefix):
            for group in page["logGroups"]:
                if is_ours(group["logGroupName"]):
                    yield Found(group["logGroupName"], f"{group.get('storedBytes', 0)} bytes", data)


def _fsx_backups(scope: Scope) -> Iterator[Found]:
    for page in scope.fsx.get_paginator("describe_backups").paginate():
        for backup in page["Backups"]:
            tags = {t["Key"]: t["Value"] for t in backup.get("Tags", [])}
            if tags.get(DEPLOYMENT_TAG_KEY) == scope.config.name:
                yield Found(backup["BackupId"], backup.get("Lifecycle", ""), "data")


@dataclass(frozen=True)
class OrphanKind:
    """How teardown finds what of one kind outlived the deployment's stacks, and deletes one."""

    find: Callable[[Scope], Iterator[Found]]
    delete: Callable[[Scope, str], object]
    #: Can keep a stack's subnets, security groups or VPC from being deleted (DependencyViolation):
    #: swept before a failed `cdk destroy` is tried again.
    blocks_stacks: bool = False


#: What outlives a stack, by kind, in the order teardown looks for and deletes them: network
#: interfaces before security groups, as an ENI holds its groups until it is deleted.
ORPHAN_KINDS: dict[str, OrphanKind] = {
    "network interface": OrphanKind(
        _network_interfaces,
        lambda scope, eni: scope.ec2.delete_network_interface(NetworkInterfaceId=eni),
        blocks_stacks=True,
    ),
    "security group": OrphanKind(
        _security_groups, lambda scope, group: scope.ec2.delete_security_group(GroupId=group), blocks_stacks=True
    ),
    "placement group": OrphanKind(
        _placement_groups, lambda scope, name: scope.ec2.delete_placement_group(GroupName=name)
    ),
    "EBS volume": OrphanKind(_detached_volumes, lambda scope, volume: scope.ec2.delete_volume(VolumeId=volume)),
    "log group": OrphanKind(_log_groups, lambda scope, name: scope.logs.delete_log_group(logGroupName=name)),
    "FSx backup": OrphanKind(_fsx_backups, lambda scope, backup: scope.fsx.delete_backup(BackupId=backup)),
}


# ----- the sweep -------------------------------------------------------------------------------


def find_orphans(
    session: boto3.Session,
    config: DeploymentConfig,
    *,
    living_stacks: Collection[str] = (),
    blockers_only: bool = False,
) -> list[Orphan]:
    """Resources of this deployment that survived its stacks, by tag and by the cluster's name.

    `living_stacks`: the deployment's stacks that still exist; what they own is left to them, and
    their Lambda functions' log groups are still in use. `blockers_only`: just the kinds that can
    block a stack's deletion.
    """
    scope = Scope(session, config, living_stacks)
    return [
        Orphan(name, *found)
        for name, kind in ORPHAN_KINDS.items()
        if kind.blocks_stacks or not blockers_only
        for found in kind.find(scope)
    ]


def sweep(
    session: boto3.Session, config: DeploymentConfig, orphans: list[Orphan], *, delete_data: bool
) -> list[Orphan]:
    """Delete what find_orphans found, data only with delete_data; sets and returns each outcome."""
    scope = Scope(session, config)
    for orphan in orphans:
        if orphan.data is not None and not delete_data:
            orphan.outcome = f"kept ({orphan.data}; --delete-data deletes it)"
        else:
            orphan.outcome = _delete(scope, orphan)
    return orphans


def _delete(scope: Scope, orphan: Orphan) -> str:
    try:
        ORPHAN_KINDS[orphan.kind].delete(scope, orphan.identifier)
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
