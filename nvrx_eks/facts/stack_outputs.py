"""The CloudFormation outputs the stacks export, by key. The CLI reads them back with boto3.

Each key is defined here once; the stacks emit exactly these (tests assert it) and the CLI looks
them up by these names, so neither side retypes a string.
"""

from __future__ import annotations

from enum import StrEnum


class OutputKey(StrEnum):
    CLUSTER_NAME = "ClusterName"
    REGION = "Region"
    UPDATE_KUBECONFIG_COMMAND = "UpdateKubeconfigCommand"
    CLUSTER_ENDPOINT = "ClusterEndpoint"
    CLUSTER_CA_DATA = "ClusterCertificateAuthorityData"
    KUBERNETES_VERSION = "KubernetesVersion"
    FSX_FILE_SYSTEM_ID = "FsxFileSystemId"
    FSX_DNS_NAME = "FsxDnsName"
    FSX_MOUNT_NAME = "FsxMountName"
    FSX_PVC_NAME = "FsxPvcName"
    TRAINING_NAMESPACE = "TrainingNamespace"
    DATA_BUCKET_NAME = "DataBucketName"
    IMAGE_URI = "TrainerImageUri"
    GPU_NODEGROUP_NAME = "GpuNodegroupName"
    GPU_INSTANCE_TYPE = "GpuInstanceType"
    GPU_NODE_COUNT = "GpuNodeCount"


#: Every key the training environment stack must export.
REQUIRED_OUTPUTS: tuple[OutputKey, ...] = tuple(OutputKey)
