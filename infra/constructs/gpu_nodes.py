"""GPU node group: a managed node group on a launch template that wires every EFA interface.

The launch template, not the node group, names the instance type: aws_eks_v2 refuses
p5.48xlarge with the NVIDIA AMI type in `instance_types` (its GPU list stops at p4d/g6e), and
EKS accepts it from the template. Network interfaces follow the EC2 guide for multi-card EFA
instances: card 0 carries the primary ENA+EFA interface, every other card one EFA-only interface.

The group is created empty, in every profile: ScalingConfig {MinSize 0, DesiredSize 0,
MaxSize gpu_nodes.max_size}. A group that had to launch p5s inside the cluster stack made the
whole stack hostage to capacity: an on-demand p5 shortfall in a placement group failed the node
group (AsgInstanceLaunchFailures, NodeCreationFailure) some 40 minutes in and rolled back the
cluster, its add-ons and charts. `nvrx-eks capacity up` scales the deployed group
(UpdateNodegroupConfig, outside CloudFormation) to gpu_nodes.desired_size; a shortfall then fails
that one request, and nothing bills until it succeeds.

A later `cdk deploy` compares templates, not live state, so the live size survives any deploy
whose template leaves ScalingConfig as it was: user data, tags, the AMI, labels, taints, add-ons.
EKS: "Whenever this parameter [desiredSize] changes, the number of worker nodes in the node group
is updated to the specified size" (NodegroupScalingConfig). DesiredSize stays 0 in every template,
so it never changes there; MaxSize does when gpu_nodes.max_size changes, and whether
CloudFormation's update then sends the template's DesiredSize 0 along with it is not documented
(guess: assume it does, and the running nodes are terminated). `nvrx-eks deploy` warns before such
a deploy, and before one that replaces the group or rolls its nodes (nvrx_eks/deploy/gpu_changes.py).
"""

from __future__ import annotations

from aws_cdk import CfnResource, Fn
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.config import DeploymentConfig
from infra.constructs.node_launch_template import (
    encrypted_root_volume,
    node_metadata_options,
    node_tag_specifications,
)
from infra.constructs.node_user_data import gpu_node_user_data
from nvrx_eks.facts.instances import InstanceFacts
from nvrx_eks.facts.names import (
    GPU_NODE_LABEL_KEY,
    GPU_NODE_LABEL_VALUE,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
)


def efa_network_interfaces(
    facts: InstanceFacts, security_group_ids: list[str]
) -> list[ec2.CfnLaunchTemplate.NetworkInterfaceProperty]:
    """One interface per network card: card 0 'efa' (ENA + EFA, device 0, the primary interface),
    cards 1..n-1 'efa-only' (device 0 of their card). Security groups go on each interface: a
    launch template with interfaces cannot set instance-level security groups."""
    return [
        ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
            network_card_index=card,
            device_index=0,
            interface_type="efa" if card == 0 else "efa-only",
            groups=security_group_ids,
            delete_on_termination=True,
            description=f"EFA network card {card}",
        )
        for card in range(facts.efa_interfaces)
    ]


class GpuNodeGroup(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: DeploymentConfig,
        cluster: eks.Cluster,
        subnet: ec2.ISubnet,
        node_security_group: ec2.ISecurityGroup,
        node_role: iam.IRole,
    ) -> None:
        super().__init__(scope, construct_id)
        nodes = config.gpu_nodes
        facts = nodes.facts

        self.placement_group: ec2.CfnPlacementGroup | None = None
        placement = None
        if nodes.placement_group:
            self.placement_group = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")
            placement = ec2.CfnLaunchTemplate.PlacementProperty(group_name=self.placement_group.ref)
        elif nodes.placement_group_name:
            # The group the On-Demand Capacity Reservation was created in (not ours to create).
            placement = ec2.CfnLaunchTemplate.PlacementProperty(group_name=nodes.placement_group_name)

        reservation = None
        if nodes.capacity_reservation_id:
            reservation = ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
                capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
                    capacity_reservation_id=nodes.capacity_reservation_id
                )
            )
        market = None
        if nodes.capacity_type == "capacity-block":
            market = ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty(market_type="capacity-block")

        security_group_ids = [node_security_group.security_group_id, cluster.cluster_security_group_id]
        self.launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                instance_type=facts.instance_type,
                network_interfaces=efa_network_interfaces(facts, security_group_ids),
                placement=placement,
                capacity_reservation_specification=reservation,
                instance_market_options=market,
                block_device_mappings=[encrypted_root_volume(nodes.root_volume_gib)],
                metadata_options=node_metadata_options(),
                user_data=Fn.base64(gpu_node_user_data(config)),
                tag_specifications=node_tag_specifications(config),
            ),
        )

        self.nodegroup = cluster.add_nodegroup_capacity(
            "GpuNodes",
            nodegroup_name=config.gpu_nodegroup_name,
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_NVIDIA,
            capacity_type=(
                eks.CapacityType.CAPACITY_BLOCK
                if nodes.capacity_type == "capacity-block"
                else eks.CapacityType.ON_DEMAND
            ),
            launch_template_spec=eks.LaunchTemplateSpec(
                id=self.launch_template.ref, version=self.launch_template.attr_latest_version_number
            ),
            # Created empty; `nvrx-eks capacity up` starts the nodes (see the module docstring).
            min_size=0,
            desired_size=0,
            max_size=nodes.max_size,
            subnets=ec2.SubnetSelection(subnets=[subnet]),
            node_role=node_role,
            labels={GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE},
            taints=[eks.TaintSpec(effect=eks.TaintEffect.NO_SCHEDULE, key=GPU_TAINT_KEY, value=GPU_TAINT_VALUE)],
            enable_node_auto_repair=nodes.auto_repair,
            # Replace one node at a time: a training job needs all of them, so rolling more at
            # once only lengthens the outage.
            max_unavailable=1,
        )
        # An update (new AMI, any user-data or tag change: a new launch template version) by
        # default launches the new instance before terminating the old one, and an ODCR sized to
        # the job, a Capacity Block or a full placement group has no p5 to spare: the update stalls
        # with NodeCreationFailure. MINIMAL terminates first ("useful ... with hardware
        # accelerators such as GPUs", EKS NodegroupUpdateConfig); eks_v2 does not expose it.
        nodegroup_resource = self.nodegroup.node.default_child
        assert isinstance(nodegroup_resource, CfnResource)
        nodegroup_resource.add_property_override("UpdateConfig.UpdateStrategy", "MINIMAL")
