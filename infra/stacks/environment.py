"""Composes the three stacks of a training environment from one DeploymentConfig.

network (VPC, security groups) -> storage (FSx, S3) -> cluster (EKS, nodes, add-ons, outputs).
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import App, Environment, Tags

from infra.config import DeploymentConfig
from infra.stacks.cluster import TrainingClusterStack
from infra.stacks.network import NetworkStack
from infra.stacks.storage import StorageStack
from nvrx_eks.facts.errors import ConfigError


@dataclass
class TrainingEnvironment:
    network: NetworkStack
    storage: StorageStack
    cluster: TrainingClusterStack

    @property
    def stacks(self):
        return [self.network, self.storage, self.cluster]


def build_environment(app: App, config: DeploymentConfig) -> TrainingEnvironment:
    if config.cluster is not None:
        # Deploying it would create a whole second environment beside the cluster it names.
        raise ConfigError(
            "cluster: names a cluster this project did not create, for the job commands only; the stacks "
            "create one: synthesize or deploy a profile without a cluster: section"
        )
    env = Environment(account=config.account, region=config.region)
    prefix = config.name
    network = NetworkStack(
        app,
        config.stack_name("network"),
        config=config,
        env=env,
        description=f"{prefix}: VPC and fabric security groups",
    )
    storage = StorageStack(
        app,
        config.stack_name("storage"),
        config=config,
        subnet=network.gpu_subnet,
        security_group=network.fsx_sg,
        env=env,
        description=f"{prefix}: FSx for Lustre and its S3 data bucket",
    )
    cluster = TrainingClusterStack(
        app,
        config.stack_name("cluster"),
        config=config,
        vpc=network.vpc,
        gpu_subnet=network.gpu_subnet,
        gpu_node_security_group=network.gpu_node_sg,
        file_system_id=storage.file_system.ref,
        file_system_dns_name=storage.dns_name,
        file_system_mount_name=storage.mount_name,
        data_bucket=storage.data_bucket,
        env=env,
        description=f"{prefix}: EKS cluster, EFA GPU nodes, add-ons, trainer image",
    )
    # Explicit, beside the references that imply it: EKS must find its control-plane log group
    # (storage stack) when it creates the cluster, or it creates one that never expires.
    cluster.add_stack_dependency(storage, "the EKS control-plane log group exists before the cluster")
    for key, value in config.profile_tags.items():
        Tags.of(app).add(key, value)
    return TrainingEnvironment(network, storage, cluster)
