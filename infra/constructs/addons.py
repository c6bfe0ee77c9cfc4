"""Creates the add-ons a config installs (infra/addons/install.py) on the cluster: EKS managed
add-ons (with their EKS Pod Identity roles), Helm charts and the optional training-operator
installer.
"""

from __future__ import annotations

import json
from typing import cast

from aws_cdk import CfnResource, Stack
from aws_cdk import aws_eks as eks_l1
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.addons.catalog import ManagedAddon
from infra.addons.install import helm_addons, managed_addons, training_operator_installer
from infra.config import DeploymentConfig


def install_addons(scope: Construct, cluster: eks.Cluster, config: DeploymentConfig) -> dict[str, Construct]:
    """Create every add-on of the config on the cluster; returns them by name/id."""
    created: dict[str, Construct] = {}
    for addon in managed_addons(config):
        associations = None
        if addon.pod_identity is not None:
            role = _pod_identity_role(scope, addon, cluster)
            associations = [
                eks_l1.CfnAddon.PodIdentityAssociationProperty(
                    service_account=addon.pod_identity.service_account, role_arn=role.role_arn
                )
            ]
        cfn = eks_l1.CfnAddon(
            scope,
            f"Addon-{addon.name}",
            addon_name=addon.name,
            addon_version=addon.version,
            configuration_values=json.dumps(addon.configuration) if addon.configuration else None,
            cluster_name=cluster.cluster_name,
            pod_identity_associations=associations,
            resolve_conflicts="OVERWRITE",
            preserve_on_delete=False,
        )
        for dependency in addon.after:
            cfn.node.add_dependency(created[dependency])
        created[addon.name] = cfn

    for chart in helm_addons(config):
        helm_chart = eks.HelmChart(
            scope,
            chart.construct_id,
            # aws_eks_v2.Cluster is an ICluster; its type stubs miss one protocol member.
            cluster=cluster,  # type: ignore[arg-type]
            chart=chart.chart,
            repository=chart.repository,
            version=chart.version,
            namespace=chart.namespace,
            create_namespace=True,
            wait=True,
        )
        # The values are written to the custom resource as JSON here rather than through
        # `values=`: jsii turns a Python None into "absent", and a null is how a Helm value
        # removes a chart default (the NVIDIA plugin's affinity).
        custom_resource = cast(Construct, helm_chart.node.default_child).node.default_child
        cast(CfnResource, custom_resource).add_property_override("Values", json.dumps(chart.chart_values))
        created[chart.construct_id] = helm_chart
    if config.addons.install_training_operator:
        created["TrainingOperator"] = cluster.add_manifest("TrainingOperator", *training_operator_installer(config))
    return created


def _pod_identity_role(scope: Construct, addon: ManagedAddon, cluster: eks.Cluster) -> iam.Role:
    identity = addon.pod_identity
    assert identity is not None
    # EKS Pod Identity: the pods service assumes the role and tags the session with the cluster,
    # namespace and service account it assumes it for. Without conditions on those tags any Pod
    # Identity association in the account (another cluster, another service account) could be
    # pointed at this role (Amazon EKS user guide, "Create IAM role with trust policy required by
    # EKS Pod Identity").
    conditions = {
        "StringEquals": {
            "aws:SourceAccount": Stack.of(scope).account,
            "aws:RequestTag/eks-cluster-name": cluster.cluster_name,
            "aws:RequestTag/kubernetes-service-account": identity.service_account,
        }
    }
    role = iam.Role(
        scope,
        f"PodIdentityRole-{addon.name}",
        assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com", conditions=conditions).with_session_tags(),
        description=f"EKS Pod Identity role for {addon.name}/{identity.service_account}",
        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(p) for p in identity.managed_policies],
    )
    for grant in identity.grants:
        role.add_to_policy(iam.PolicyStatement(actions=list(grant.actions), resources=list(grant.resources)))
    return role
