"""What a deploy would do to the GPU nodes, read off two cluster-stack templates: the one
CloudFormation holds and the one about to be deployed.

Three kinds of change touch running GPU nodes, and none says so in a `cdk diff`:
- the launch template changes (user data, tags, any instance setting): CloudFormation creates a
  new template version, the node group's `LaunchTemplate.Version` (a GetAtt, the same text in
  both templates) follows it, and EKS replaces every node, one at a time, terminating first
  (UpdateStrategy MINIMAL, ForceUpdateEnabled): a running job loses its nodes in turn. A Capacity
  Block group must be at 0 nodes for such an update (EKS, "Capacity Blocks for ML");
- a node-group property that CloudFormation can only set at creation changes (the
  createOnlyProperties of AWS::EKS::Nodegroup in the CloudFormation registry schema, as cfn-lint
  1.58 ships it): the group is replaced, its nodes terminated, the new one created empty;
- ScalingConfig changes (gpu_nodes.max_size): CloudFormation updates the group's scaling from
  the template, whose DesiredSize is 0 (infra/constructs/gpu_nodes.py says why, and what is a guess).

The templates are compared directly rather than through `cdk diff`'s text, which is written for
people (its layout changes between CLI releases, it has no machine-readable form in the pinned
CLI) and cannot show the first kind at all: the node group's own properties read the same.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from infra.config import DeploymentConfig

NODEGROUP = "AWS::EKS::Nodegroup"
#: createOnlyProperties of AWS::EKS::Nodegroup (CloudFormation registry schema): a change replaces the group.
REPLACING_PROPERTIES = (
    "AmiType",
    "CapacityType",
    "ClusterName",
    "DiskSize",
    "InstanceTypes",
    "NodeRole",
    "NodegroupName",
    "RemoteAccess",
    "Subnets",
)
#: Node-group properties whose change makes EKS replace every node in place (an AMI release).
ROLLING_PROPERTIES = ("ReleaseVersion", "Version")


@dataclass(frozen=True)
class GpuChange:
    """One change a deploy would make to the GPU node group, and what it does to running nodes."""

    what: str
    consequence: str

    def __str__(self) -> str:
        return f"{self.what}: {self.consequence}"


def _gpu_nodegroup(template: dict[str, Any], name: str, logical_id: str | None = None) -> tuple[str, dict] | None:
    """(logical id, resource) of the node group named `name`, else the node group at `logical_id`."""
    resources = template.get("Resources", {})
    for key, resource in resources.items():
        if resource.get("Type") == NODEGROUP and resource.get("Properties", {}).get("NodegroupName") == name:
            return key, resource
    if logical_id is not None and resources.get(logical_id, {}).get("Type") == NODEGROUP:
        return logical_id, resources[logical_id]
    return None


def _launch_template(template: dict[str, Any], nodegroup: dict) -> dict:
    """The launch template resource the node group's LaunchTemplate.Id refers to ({} if none)."""
    reference = nodegroup.get("Properties", {}).get("LaunchTemplate", {}).get("Id", {})
    logical_id = reference.get("Ref") if isinstance(reference, dict) else None
    return template.get("Resources", {}).get(logical_id, {}) if logical_id else {}


def _changed(old: dict, new: dict, keys) -> list[str]:
    return [key for key in keys if json.dumps(old.get(key), sort_keys=True) != json.dumps(new.get(key), sort_keys=True)]


def gpu_changes(
    deployed: dict[str, Any] | None, synthesized: dict[str, Any], config: DeploymentConfig
) -> list[GpuChange]:
    """What deploying `synthesized` over `deployed` (None: nothing deployed yet) does to the GPU
    node group; [] when it leaves the group and its launch template as they are."""
    name = config.gpu_nodegroup_name
    new = _gpu_nodegroup(synthesized, name)
    if new is None:
        raise ValueError(f"the synthesized cluster template has no node group {name}")
    if deployed is None:
        return []
    new_id, new_group = new
    old = _gpu_nodegroup(deployed, name, new_id)
    if old is None:
        return [
            GpuChange(
                f"the GPU node group {name}",
                "is not in the deployed stack: it is created empty, and a GPU node group of another name is "
                "deleted with its nodes",
            )
        ]
    old_group = old[1]
    old_props, new_props = old_group.get("Properties", {}), new_group.get("Properties", {})
    changes = []
    replacing = _changed(old_props, new_props, REPLACING_PROPERTIES)
    if replacing:
        changes.append(
            GpuChange(
                f"the GPU node group's {', '.join(replacing)}",
                "CloudFormation replaces the node group: its running nodes are terminated and the new group "
                "starts empty (`nvrx-eks capacity up` starts nodes again)",
            )
        )
    rolling = _changed(old_props, new_props, ROLLING_PROPERTIES)
    old_template, new_template = _launch_template(deployed, old_group), _launch_template(synthesized, new_group)
    old_data = old_template.get("Properties", {}).get("LaunchTemplateData", {})
    new_data = new_template.get("Properties", {}).get("LaunchTemplateData", {})
    data_keys = sorted(set(old_data) | set(new_data))
    rolling += [f"launch template {key}" for key in _changed(old_data, new_data, data_keys)]
    if rolling and not replacing:
        consequence = (
            "a new launch template version: EKS replaces every running GPU node, one at a time, terminating "
            "it first, and a running job loses each node in turn"
        )
        if config.gpu_nodes.capacity_type == "capacity-block":
            consequence += (
                "; a Capacity Block node group is updated only at 0 nodes (EKS): `nvrx-eks capacity down` first, "
                "then deploy, then `nvrx-eks capacity up`"
            )
        changes.append(GpuChange(f"the GPU {', '.join(rolling)}", consequence))
    old_scaling, new_scaling = old_props.get("ScalingConfig", {}), new_props.get("ScalingConfig", {})
    if not replacing and old_scaling != new_scaling:
        moved = ", ".join(
            f"{key} {old_scaling.get(key)} -> {new_scaling.get(key)}"
            for key in sorted(set(old_scaling) | set(new_scaling))
            if old_scaling.get(key) != new_scaling.get(key)
        )
        changes.append(
            GpuChange(
                f"the GPU node group's ScalingConfig ({moved})",
                "CloudFormation updates the group's scaling from the template, whose DesiredSize is 0: assume "
                "the running GPU nodes stop, and start them again with `nvrx-eks capacity up`",
            )
        )
    return changes
