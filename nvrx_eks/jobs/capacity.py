"""How many GPU nodes a job may launch (how many it takes by default: nvrx_eks/deploy/node_count.py).

Every launched node (active + hot spares: JobSpec.launched_nodes) runs one pod that asks for all
of a node's GPUs, so a job that launches more nodes than the GPU node group can hold is not an
error anywhere in Kubernetes: its extra pods wait in Pending forever while the nodes that did
start bill by the hour. Nothing scales the node group past its maximum, and a capacity
reservation (ODCR or Capacity Block) launches no more instances than it holds.

So the job commands refuse such a job before anything is created:
- render, validate and submit against the profile's gpu_nodes.max_size (offline, in
  nvrx_eks.jobs.commands.build_spec, the one place they all build a job);
- submit, which reaches AWS anyway, also against what is deployed: the node group's
  scalingConfig.maxSize (a profile raised but not deployed yet, or a group changed by hand) and,
  with gpu_nodes.capacity_reservation_id, the reservation's TotalInstanceCount.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from nvrx_eks.deploy import reservations
from nvrx_eks.deploy.deployment import Deployment
from nvrx_eks.deploy.stack_outputs import StackOutputs, aws_error
from nvrx_eks.facts.errors import ConfigError, FieldPath
from nvrx_eks.facts.stack_outputs import OutputKey

if TYPE_CHECKING:
    from nvrx_eks.jobs.spec import JobSpec

#: Error codes of a read the caller's IAM identity may not make: submit then goes on without
#: that check (it needs only the Kubernetes access entry) and says which check it skipped.
_DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"}


@dataclass(frozen=True)
class NodeLimit:
    """At most `limit` GPU nodes can run, because of the setting at `field`."""

    field: FieldPath
    limit: int
    #: What sets the limit, completing "gpu_nodes.max_size: ...", e.g. "is 2 in profile p5".
    what: str
    #: How to raise it.
    fix: str


def refuse_beyond(spec: JobSpec, limits: Iterable[NodeLimit]) -> None:
    """ConfigError (exit 2) naming every limit the job's launched nodes exceed, with its fix."""
    issues = []
    for limit in limits:
        if spec.launched_nodes > limit.limit:
            fewer = "--nodes" if not spec.spare_nodes else "--nodes plus --spare-nodes"
            smaller = f", or use {fewer} <= {limit.limit}" if limit.limit else ""  # no job fits in 0
            issues.append((limit.field, f"{limit.what}; {limit.fix}{smaller}"))
    if issues:
        launched = f"--nodes {spec.nodes}" + (f" + --spare-nodes {spec.spare_nodes}" if spec.spare_nodes else "")
        raise ConfigError(
            f"the job launches {spec.launched_nodes} GPU nodes ({launched}), one pod each, more than can "
            "start; the pods beyond the limit would wait in Pending forever:",
            issues=issues,
        )


def profile_limit(deployment: Deployment) -> NodeLimit:
    """The profile's gpu_nodes.max_size: the largest the deployed node group can be."""
    nodes = deployment.config.gpu_nodes
    # The node group is created empty whatever desired_size says (infra/constructs/gpu_nodes.py):
    # the maximum alone decides what it can grow to.
    return NodeLimit(
        ("gpu_nodes", "max_size"),
        nodes.max_size,
        f"is {nodes.max_size} in {deployment.source}",
        f"raise gpu_nodes.max_size in the profile and run `{deployment.deploy_command}` (your vCPU quota or "
        "capacity reservation must cover the extra nodes: `nvrx-eks preflight --nodes N`)",
    )


@dataclass(frozen=True)
class DeployedNodes:
    """The GPU node group as EKS reports it, and the reservation it launches into."""

    nodegroup: str
    #: scalingConfig.maxSize and desiredSize; None where the identity may not read the node group.
    max_size: int | None
    desired_size: int | None
    #: TotalInstanceCount of gpu_nodes.capacity_reservation_id (0 when it no longer exists); None
    #: without one, or where the identity may not read it.
    reservation_total: int | None
    reservation_missing: bool = False
    #: Checks that could not be made (the identity may not read), for a note.
    skipped: tuple[str, ...] = ()


def deployed_nodes(deployment: Deployment, outputs: StackOutputs, session: boto3.Session) -> DeployedNodes:
    """Read the node group's scaling config and the reservation's size (both read-only calls)."""
    config = deployment.config
    nodegroup = outputs[OutputKey.GPU_NODEGROUP_NAME]
    skipped: list[str] = []
    max_size = desired_size = None
    try:
        described = session.client("eks", region_name=config.region).describe_nodegroup(
            clusterName=outputs.cluster_name, nodegroupName=nodegroup
        )["nodegroup"]
        scaling = described.get("scalingConfig", {})
        max_size, desired_size = scaling.get("maxSize"), scaling.get("desiredSize")
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code == "ResourceNotFoundException":
            raise ConfigError(
                f"the GPU node group {nodegroup} of cluster {outputs.cluster_name} (stack output "
                f"{OutputKey.GPU_NODEGROUP_NAME.value}) does not exist, so no GPU node can start; deploy again: "
                f"`{deployment.deploy_command}`"
            ) from None
        if code not in _DENIED:
            raise aws_error(e, config, f"reading node group {nodegroup}") from None
        skipped.append("the node group's maxSize (eks:DescribeNodegroup denied)")
    except BotoCoreError as e:
        raise aws_error(e, config, f"reading node group {nodegroup}") from None

    reservation_total, reservation_missing = None, False
    reservation_id = config.gpu_nodes.capacity_reservation_id
    if reservation_id is not None:
        try:
            found = reservations.describe(session, config.region, reservation_id)
            # A Capacity Block not started yet shows no instances but holds them from its start.
            reservation_total = 0 if found is None else reservations.reserved_instances(found)
            reservation_missing = found is None
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in _DENIED:
                skipped.append(
                    f"the size of capacity reservation {reservation_id} (ec2:DescribeCapacityReservations denied)"
                )
            else:
                raise aws_error(e, config, f"reading capacity reservation {reservation_id}") from None
        except BotoCoreError as e:
            raise aws_error(e, config, f"reading capacity reservation {reservation_id}") from None
    return DeployedNodes(nodegroup, max_size, desired_size, reservation_total, reservation_missing, tuple(skipped))


def live_limits(deployment: Deployment, outputs: StackOutputs, deployed: DeployedNodes) -> list[NodeLimit]:
    """The limits what is deployed sets, each with the fix a user can apply."""
    config = deployment.config
    scale = (
        f"aws eks update-nodegroup-config --cluster-name {outputs.cluster_name} --nodegroup-name "
        f"{deployed.nodegroup} --scaling-config maxSize=N,desiredSize=N"
    )
    limits = []
    if deployed.max_size is not None:
        limits.append(
            NodeLimit(
                ("gpu_nodes", "max_size"),
                deployed.max_size,
                f"the deployed node group {deployed.nodegroup} has scalingConfig.maxSize {deployed.max_size} "
                f"(the profile says {config.gpu_nodes.max_size})",
                f"deploy the profile (`{deployment.deploy_command}`) or raise it with `{scale}`",
            )
        )
    if deployed.reservation_total is not None:
        reservation_id = config.gpu_nodes.capacity_reservation_id
        limits.append(
            NodeLimit(
                ("gpu_nodes", "capacity_reservation_id"),
                deployed.reservation_total,
                f"capacity reservation {reservation_id} does not exist in {config.region} (ended or cancelled), "
                "and the node group launches only into it"
                if deployed.reservation_missing
                else f"capacity reservation {reservation_id} holds {deployed.reservation_total} instances "
                "(TotalInstanceCount), and the node group launches only into it",
                f"set gpu_nodes.capacity_reservation_id to a larger reservation or Capacity Block and run "
                f"`{deployment.deploy_command}`",
            )
        )
    return limits
