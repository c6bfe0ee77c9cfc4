"""Network: the VPC, its flow logs and endpoints, and the security groups of the GPU fabric.

The GPU-node and FSx security groups live here, not in the cluster or storage stacks, because
their rules reference each other (EFA traffic between nodes and the file system); keeping both
in one stack avoids a cross-stack dependency cycle.
"""

from __future__ import annotations

from typing import cast

from aws_cdk import Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.config import DeploymentConfig
from infra.constructs.log_groups import encrypted_log_group
from nvrx_eks.facts.errors import ConfigError

#: Lustre: TCP 988 (LNet) and 1018-1023 (data channels), from the FSx for Lustre user guide.
LUSTRE_PORTS = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))


class NetworkStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, *, config: DeploymentConfig, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.config = config

        # Pods take VPC IPs (VPC CNI): a p5 node can hold hundreds, so private subnets are large.
        private_mask = 18 if config.vpc_max_azs <= 3 else 19
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(config.vpc_cidr),
            availability_zones=self._vpc_availability_zones(),
            # One NAT gateway, in the GPU AZ: the GPU nodes' image pulls and S3 traffic never
            # cross AZs, and the other AZs only host control-plane ENIs and system nodes.
            nat_gateways=1,
            nat_gateway_subnets=ec2.SubnetSelection(
                subnet_group_name="public", availability_zones=[config.gpu_availability_zone]
            ),
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(
                    name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=private_mask
                ),
            ],
            gateway_endpoints={"S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)},
        )
        # Public subnets hold only the NAT gateway: nothing launched there gets a public IP.
        for subnet in self.vpc.public_subnets:
            cast(ec2.CfnSubnet, subnet.node.default_child).add_property_override("MapPublicIpOnLaunch", False)

        flow_log_group = encrypted_log_group(
            self,
            "FlowLogs",
            name=f"/{config.name}/vpc-flow-logs",
            retention=logs.RetentionDays.ONE_MONTH,
            description=f"{config.name}: VPC flow log encryption",
        )
        self.vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.REJECT,
        )

        # EFA requires a security group that allows all traffic to and from itself; CIDR rules do
        # not count. It goes on every EFA interface of the GPU nodes.
        self.gpu_node_sg = ec2.SecurityGroup(
            self,
            "GpuNodeSecurityGroup",
            vpc=self.vpc,
            description=f"{config.name}: GPU nodes (EFA all-traffic within the group)",
            # Nodes pull images and call AWS APIs; all outbound also covers EFA egress to the group.
            allow_all_outbound=True,
        )
        self.gpu_node_sg.add_ingress_rule(self.gpu_node_sg, ec2.Port.all_traffic(), "EFA within the group")

        self.fsx_sg = ec2.SecurityGroup(
            self,
            "FsxSecurityGroup",
            vpc=self.vpc,
            description=f"{config.name}: FSx for Lustre, reachable only from GPU nodes",
            allow_all_outbound=False,
        )
        if config.fsx.efa_enabled:
            # EFA-enabled Lustre: file system and clients must allow all traffic to and from each
            # other and the file system group to and from itself, by group id.
            for src, dst in (
                (self.fsx_sg, self.fsx_sg),
                (self.gpu_node_sg, self.fsx_sg),
                (self.fsx_sg, self.gpu_node_sg),
            ):
                dst.add_ingress_rule(src, ec2.Port.all_traffic(), "EFA-enabled Lustre")
            self.fsx_sg.add_egress_rule(self.fsx_sg, ec2.Port.all_traffic(), "EFA-enabled Lustre")
            self.fsx_sg.add_egress_rule(self.gpu_node_sg, ec2.Port.all_traffic(), "EFA-enabled Lustre")
        else:
            for port in LUSTRE_PORTS:
                self.fsx_sg.add_ingress_rule(self.gpu_node_sg, port, "Lustre from GPU nodes")
                # Lustre servers talk to each other on the same ports.
                self.fsx_sg.add_ingress_rule(self.fsx_sg, port, "Lustre between file servers")
                self.fsx_sg.add_egress_rule(self.fsx_sg, port, "Lustre between file servers")
                self.fsx_sg.add_egress_rule(self.gpu_node_sg, port, "Lustre replies to clients")
                self.gpu_node_sg.add_ingress_rule(self.fsx_sg, port, "Lustre callbacks from FSx")

    def _vpc_availability_zones(self) -> list[str]:
        """The GPU AZ first, then the next AZs of the region (from the pinned context lookup)."""
        gpu_az = self.config.gpu_availability_zone
        known = self.availability_zones
        if not any(az.startswith("dummy") for az in known) and gpu_az not in known:
            raise ConfigError(
                f"gpu_availability_zone '{gpu_az}' is not an availability zone of account "
                f"{self.config.account} in {self.config.region} (known: {', '.join(known)}); choose one "
                "of those, or refresh the lookup with `cdk context --clear` and a credentialed synth"
            )
        others = [az for az in self.availability_zones if az != gpu_az]
        return [gpu_az, *others][: self.config.vpc_max_azs]

    @property
    def gpu_subnet(self) -> ec2.ISubnet:
        """The private subnet in the GPU AZ: GPU nodes and the file system both live here."""
        return self.vpc.select_subnets(
            subnet_group_name="private", availability_zones=[self.config.gpu_availability_zone]
        ).subnets[0]
