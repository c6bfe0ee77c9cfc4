"""What every node's launch template states, GPU and system alike: IMDSv2 with one hop, an
encrypted gp3 root volume, and the deployment's tags on what the instance creates.

One hop: the instance metadata service answers a pod's token request only if the answer may
cross one more hop, and a pod's network namespace is that hop, so with a limit of 1 no pod
outside the host network reaches IMDS, and with it the node role (ENI management through the
VPC CNI policy, ECR pulls, SSM). The job's coordinator runs the full trainer image on the system
nodes and serves the job's stores, so the system nodes get this template too: without one, the
limit is whatever EKS puts in the template it generates (its AL2023 page says one hop, its
launch-template page only that EKS sets it; not verified on a node), and ours states it. Pods that call AWS
get their credentials from EKS Pod Identity (no IMDS), and the add-on pods that need the node's
metadata run in the host network (VPC CNI, kube-proxy, the Pod Identity agent, the CloudWatch
agent and its Fluent Bit: aws-observability/helm-charts, `hostNetwork: true`). The one that
does not, the FSx CSI controller, reads its region from IMDS unless given one, so its add-on
configuration gives it (infra/addons/catalog.py, FSX_CSI_DRIVER).
"""

from __future__ import annotations

from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from infra.config import DeploymentConfig

#: The system nodes' root volume: the AL2023 image, add-on images and the coordinator's trainer
#: image (several GB unpacked).
SYSTEM_ROOT_VOLUME_GIB = 50


def node_metadata_options() -> ec2.CfnLaunchTemplate.MetadataOptionsProperty:
    """IMDSv2 only, one hop: a container cannot reach the node role through the metadata service."""
    return ec2.CfnLaunchTemplate.MetadataOptionsProperty(
        http_tokens="required", http_put_response_hop_limit=1, http_endpoint="enabled"
    )


def encrypted_root_volume(gib: int) -> ec2.CfnLaunchTemplate.BlockDeviceMappingProperty:
    """The AL2023 root device as gp3, encrypted, gone with the instance. (A node group with a
    launch template may not set disk_size; the template says it.)"""
    return ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
        device_name="/dev/xvda",
        ebs=ec2.CfnLaunchTemplate.EbsProperty(
            volume_size=gib, volume_type="gp3", encrypted=True, delete_on_termination=True
        ),
    )


def node_tag_specifications(config: DeploymentConfig) -> list[ec2.CfnLaunchTemplate.TagSpecificationProperty]:
    """The profile's tags and the deployment tag on the instance, its volumes and its network
    interfaces: teardown finds what a node left behind by the deployment tag."""
    return [
        ec2.CfnLaunchTemplate.TagSpecificationProperty(
            resource_type=resource_type,
            tags=[{"key": k, "value": v} for k, v in config.profile_tags.items()],
        )
        for resource_type in ("instance", "volume", "network-interface")
    ]


def system_launch_template(scope: Construct, construct_id: str, config: DeploymentConfig) -> ec2.CfnLaunchTemplate:
    """The system node group's template: no image, instance type or user data of its own (EKS
    merges its bootstrap into a template without an image), only the settings above."""
    return ec2.CfnLaunchTemplate(
        scope,
        construct_id,
        launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
            block_device_mappings=[encrypted_root_volume(SYSTEM_ROOT_VOLUME_GIB)],
            metadata_options=node_metadata_options(),
            tag_specifications=node_tag_specifications(config),
        ),
    )
