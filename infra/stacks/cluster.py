"""The training cluster: EKS (native AWS::EKS::Cluster via aws_eks_v2) with a system node group,
the EFA-wired GPU node group, the add-ons, the FSx volume, the trainer image and the outputs
the CLI reads back.
"""

from __future__ import annotations

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk.lambda_layer_kubectl_v35 import KubectlV35Layer
from constructs import Construct

from infra.addons.catalog import CLOUDWATCH_OBSERVABILITY
from infra.config import DeploymentConfig
from infra.constructs.addons import install_addons
from infra.constructs.dashboard import TrainingDashboard
from infra.constructs.fsx_volume import FsxVolume
from infra.constructs.gpu_nodes import GpuNodeGroup
from infra.constructs.image import TrainerImage
from infra.constructs.log_groups import encrypted_log_group
from infra.constructs.node_launch_template import system_launch_template
from infra.constructs.secure_defaults import rotated_key
from infra.pod_security import admission_policy_manifests
from nvrx_eks.facts import training_metrics
from nvrx_eks.facts.kubernetes_versions import KUBECTL_LAYER_V35, pins_for
from nvrx_eks.facts.names import (
    FSX_PVC_NAME,
    GPU_NODE_LABEL_KEY,
    SYSTEM_NODE_LABEL_VALUE,
    TRAINING_NAMESPACE,
)
from nvrx_eks.facts.stack_outputs import OutputKey

#: The kubectl Lambda layer packages installed, by the layer name in nvrx_eks/facts/kubernetes_versions.py.
_KUBECTL_LAYERS = {KUBECTL_LAYER_V35: KubectlV35Layer}

ALL_CONTROL_PLANE_LOGS = [
    eks.ClusterLoggingTypes.API,
    eks.ClusterLoggingTypes.AUDIT,
    eks.ClusterLoggingTypes.AUTHENTICATOR,
    eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
    eks.ClusterLoggingTypes.SCHEDULER,
]


class TrainingClusterStack(Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: DeploymentConfig,
        vpc: ec2.IVpc,
        gpu_subnet: ec2.ISubnet,
        gpu_node_security_group: ec2.ISecurityGroup,
        file_system_id: str,
        file_system_dns_name: str,
        file_system_mount_name: str,
        data_bucket: s3.IBucket,
        **kwargs,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        private_subnets = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        self.cluster = self._control_plane(config, vpc, private_subnets)
        if config.admin_principal_arn:
            self._grant_cluster_admin(config.admin_principal_arn)
        self.system_nodegroup = self._system_nodes(config, private_subnets)
        self.gpu_nodes = GpuNodeGroup(
            self,
            "GpuNodeGroup",
            config=config,
            cluster=self.cluster,
            subnet=gpu_subnet,
            node_security_group=gpu_node_security_group,
            node_role=worker_node_role(self, "GpuNodeRole"),
        )
        self._addons(config)
        self.fsx_volume = FsxVolume(
            self,
            "FsxVolume",
            cluster=self.cluster,
            config=config,
            file_system_id=file_system_id,
            dns_name=file_system_dns_name,
            mount_name=file_system_mount_name,
        )
        self.pod_security = self.cluster.add_manifest("PodSecurity", *admission_policy_manifests())
        self.image = TrainerImage(self, "TrainerImage", config=config)
        self.dashboard = TrainingDashboard(self, "TrainingDashboard", config=config, file_system_id=file_system_id)
        outputs = self._outputs(config, file_system_id, file_system_dns_name, file_system_mount_name, data_bucket)
        for key, (value, description) in outputs.items():
            CfnOutput(self, key.value, value=value, description=description)

    def _control_plane(
        self, config: DeploymentConfig, vpc: ec2.IVpc, private_subnets: ec2.SubnetSelection
    ) -> eks.Cluster:
        """The EKS cluster itself: private subnets, secrets envelope-encrypted, every
        control-plane log on, no default capacity (the node groups below are its capacity)."""
        secrets_key = rotated_key(self, "SecretsKey", f"{config.name}: EKS secrets envelope encryption")
        if config.endpoint.access == "private":
            endpoint = eks.EndpointAccess.PRIVATE
        else:
            endpoint = eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*config.endpoint.public_cidrs)
        return eks.Cluster(
            self,
            "Cluster",
            cluster_name=config.cluster_name,
            version=eks.KubernetesVersion.of(config.kubernetes_version),
            vpc=vpc,
            vpc_subnets=[private_subnets],
            endpoint_access=endpoint,
            secrets_encryption_key=secrets_key,
            cluster_logging=ALL_CONTROL_PLANE_LOGS,
            # Managed node groups, not EKS Auto Mode: Auto Mode cannot take our EFA launch template.
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=_KUBECTL_LAYERS[pins_for(config.kubernetes_version).kubectl_layer](self, "KubectlLayer"),
                # The kubectl Lambda runs inside the VPC: the public endpoint (if any) admits only
                # the profile's CIDRs, so the private endpoint is the one it can always reach.
                private_subnets=vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnets,
            ),
        )

    def _grant_cluster_admin(self, principal_arn: str) -> None:
        self.cluster.grant_access(
            "AdminAccess",
            principal_arn,
            [
                eks.AccessPolicy.from_access_policy_name(
                    "AmazonEKSClusterAdminPolicy", access_scope_type=eks.AccessScopeType.CLUSTER
                )
            ],
        )

    def _system_nodes(self, config: DeploymentConfig, private_subnets: ec2.SubnetSelection) -> eks.Nodegroup:
        """The node group the add-ons' controllers and the job's coordinator run on."""
        system = config.system_nodes
        # The job's coordinator runs here: one hop to IMDS, as on the GPU nodes (node_launch_template.py).
        system_template = system_launch_template(self, "SystemNodeLaunchTemplate", config)
        return self.cluster.add_nodegroup_capacity(
            "SystemNodes",
            nodegroup_name=config.system_nodegroup_name,
            instance_types=[ec2.InstanceType(system.instance_type)],
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            launch_template_spec=eks.LaunchTemplateSpec(
                id=system_template.ref, version=system_template.attr_latest_version_number
            ),
            min_size=system.min_size,
            desired_size=system.desired_size,
            max_size=system.max_size,
            subnets=private_subnets,
            labels={GPU_NODE_LABEL_KEY: SYSTEM_NODE_LABEL_VALUE},
            node_role=worker_node_role(self, "SystemNodeRole"),
        )

    def _addons(self, config: DeploymentConfig) -> None:
        # Add-ons need somewhere to run (CoreDNS, controllers, Helm's wait): after system nodes.
        addons = install_addons(self, self.cluster, config)
        for addon in addons.values():
            addon.node.add_dependency(self.system_nodegroup)
        if config.addons.cloudwatch_observability:
            # The agent writes the trainer's EMF documents here (nvrx_eks/facts/training_metrics.py).
            # Created before the add-on and deleted after it, so no agent recreates it unbounded.
            self.training_metrics_logs = encrypted_log_group(
                self,
                "TrainingMetricsLogs",
                name=training_metrics.log_group(config.name),
                retention=logs.RetentionDays.ONE_MONTH,
                description=f"{config.name}: training metrics log encryption",
            )
            addons[CLOUDWATCH_OBSERVABILITY.name].node.add_dependency(self.training_metrics_logs)

    def _outputs(
        self,
        config: DeploymentConfig,
        file_system_id: str,
        file_system_dns_name: str,
        file_system_mount_name: str,
        data_bucket: s3.IBucket,
    ) -> dict[OutputKey, tuple[str, str]]:
        """What the CLI reads back from the stack (nvrx_eks/facts/stack_outputs.py): value, description."""
        return {
            OutputKey.CLUSTER_NAME: (self.cluster.cluster_name, "EKS cluster name"),
            OutputKey.REGION: (self.region, "AWS region"),
            OutputKey.UPDATE_KUBECONFIG_COMMAND: (
                f"aws eks update-kubeconfig --name {config.cluster_name} --region {self.region}",
                "Optional: configure kubectl (nvrx-eks needs no kubeconfig)",
            ),
            OutputKey.CLUSTER_ENDPOINT: (self.cluster.cluster_endpoint, "Kubernetes API endpoint"),
            OutputKey.CLUSTER_CA_DATA: (
                self.cluster.cluster_certificate_authority_data,
                "Kubernetes API certificate authority (base64)",
            ),
            OutputKey.KUBERNETES_VERSION: (config.kubernetes_version, "Kubernetes version"),
            OutputKey.FSX_FILE_SYSTEM_ID: (file_system_id, "FSx for Lustre file system id"),
            OutputKey.FSX_DNS_NAME: (file_system_dns_name, "FSx for Lustre DNS name"),
            OutputKey.FSX_MOUNT_NAME: (file_system_mount_name, "FSx for Lustre mount name"),
            OutputKey.FSX_PVC_NAME: (FSX_PVC_NAME, "PersistentVolumeClaim of the file system"),
            OutputKey.TRAINING_NAMESPACE: (TRAINING_NAMESPACE, "Namespace for training jobs"),
            OutputKey.DATA_BUCKET_NAME: (data_bucket.bucket_name, "S3 bucket linked to FSx"),
            OutputKey.IMAGE_URI: (self.image.image_uri, "Trainer container image"),
            OutputKey.GPU_NODEGROUP_NAME: (self.gpu_nodes.nodegroup.nodegroup_name, "GPU node group"),
            OutputKey.GPU_INSTANCE_TYPE: (config.gpu_nodes.instance_type, "GPU instance type"),
            # The node group's maximum: the job size it is built for. (A Capacity Block group is
            # created at desired 0 and scaled up when the block starts.)
            OutputKey.GPU_NODE_COUNT: (str(config.gpu_nodes.max_size), "GPU nodes (node group maximum)"),
        }


def worker_node_role(scope: Construct, construct_id: str) -> iam.Role:
    """The EKS worker node role: kubelet registration, image pulls, VPC CNI, SSM for debugging."""
    return iam.Role(
        scope,
        construct_id,
        assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
        managed_policies=[
            iam.ManagedPolicy.from_aws_managed_policy_name(name)
            for name in (
                "AmazonEKSWorkerNodePolicy",
                "AmazonEC2ContainerRegistryPullOnly",
                "AmazonEKS_CNI_Policy",
                "AmazonSSMManagedInstanceCore",
            )
        ],
    )
