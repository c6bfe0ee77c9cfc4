"""The file system inside Kubernetes: the training namespace, a static PersistentVolume for the
FSx for Lustre file system and the claim the job manifests mount.

Static provisioning binds exactly the file system the storage stack created; its reclaim policy
is Retain so deleting the claim (teardown does) never deletes checkpoints or data.
"""

from __future__ import annotations

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from infra.config import DeploymentConfig
from infra.pod_security import NAMESPACE_LABELS
from nvrx_eks.facts.names import FSX_PV_NAME, FSX_PVC_NAME, FSX_STORAGE_CLASS, TRAINING_NAMESPACE


def fsx_volume_manifests(
    config: DeploymentConfig, *, file_system_id: str, dns_name: str, mount_name: str
) -> list[dict]:
    capacity = f"{config.fsx.storage_gib}Gi"
    return [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": TRAINING_NAMESPACE, "labels": dict(NAMESPACE_LABELS)},
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": FSX_PV_NAME},
            "spec": {
                "capacity": {"storage": capacity},
                "volumeMode": "Filesystem",
                "accessModes": ["ReadWriteMany"],
                # flock: checkpoint writers on different nodes coordinate through file locks.
                "mountOptions": ["flock"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": FSX_STORAGE_CLASS,
                "csi": {
                    "driver": "fsx.csi.aws.com",
                    "volumeHandle": file_system_id,
                    "volumeAttributes": {"dnsname": dns_name, "mountname": mount_name},
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": FSX_PVC_NAME, "namespace": TRAINING_NAMESPACE},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": FSX_STORAGE_CLASS,
                "volumeName": FSX_PV_NAME,
                "resources": {"requests": {"storage": capacity}},
            },
        },
    ]


class FsxVolume(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        config: DeploymentConfig,
        file_system_id: str,
        dns_name: str,
        mount_name: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.manifest = cluster.add_manifest(
            "FsxVolume",
            *fsx_volume_manifests(config, file_system_id=file_system_id, dns_name=dns_name, mount_name=mount_name),
        )
