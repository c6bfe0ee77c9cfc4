"""Cluster add-ons: one table entry per add-on, its version pinned in the config, composed onto
the cluster by `install_addons`.

EKS managed add-ons (with EKS Pod Identity where they call AWS APIs) cover networking, DNS, the
FSx CSI driver and CloudWatch observability; Helm charts cover the EFA and NVIDIA device plugins,
the JobSet controller and the DCGM exporter. Helm values are passed verbatim to the chart, so
they use the charts' own camelCase keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aws_cdk import aws_eks as eks_l1
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.config import DeploymentConfig
from infra.conventions import GPU_NODE_LABEL_KEY, GPU_NODE_LABEL_VALUE, GPU_TAINT_KEY

#: Schedules a DaemonSet onto GPU nodes only, through their taint.
_ON_GPU_NODES = {
    "nodeSelector": {GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE},
    "tolerations": [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
}


@dataclass(frozen=True)
class PodIdentity:
    """An IAM role for one service account, bound through EKS Pod Identity."""

    service_account: str
    managed_policies: tuple[str, ...] = ()
    statements: tuple[iam.PolicyStatement, ...] = ()


@dataclass(frozen=True)
class ManagedAddon:
    name: str
    version: str
    pod_identity: PodIdentity | None = None
    #: Managed add-ons that must exist first (pod identity needs its agent).
    after: tuple[str, ...] = ()


@dataclass(frozen=True)
class HelmAddon:
    construct_id: str
    chart: str
    repository: str
    version: str
    namespace: str
    values: dict = field(default_factory=dict)


def managed_addons(config: DeploymentConfig) -> list[ManagedAddon]:
    v = config.addons.versions
    addons = [
        ManagedAddon("vpc-cni", v.vpc_cni),
        ManagedAddon("coredns", v.coredns),
        ManagedAddon("kube-proxy", v.kube_proxy),
        ManagedAddon("eks-pod-identity-agent", v.pod_identity_agent),
        ManagedAddon(
            "aws-fsx-csi-driver",
            v.fsx_csi_driver,
            # Static provisioning only needs the driver to describe the file system it mounts.
            pod_identity=PodIdentity(
                service_account="fsx-csi-controller-sa",
                statements=(iam.PolicyStatement(actions=["fsx:DescribeFileSystems"], resources=["*"]),),
            ),
            after=("eks-pod-identity-agent",),
        ),
    ]
    if config.addons.cloudwatch_observability:
        addons.append(
            ManagedAddon(
                "amazon-cloudwatch-observability",
                v.cloudwatch_observability,
                pod_identity=PodIdentity(
                    service_account="cloudwatch-agent",
                    managed_policies=("CloudWatchAgentServerPolicy",),
                ),
                after=("eks-pod-identity-agent",),
            )
        )
    return addons


def helm_addons(config: DeploymentConfig) -> list[HelmAddon]:
    v = config.addons.versions
    addons = [
        HelmAddon(
            "EfaDevicePlugin",
            chart="aws-efa-k8s-device-plugin",
            repository="https://aws.github.io/eks-charts",
            version=v.efa_device_plugin_chart,
            namespace="kube-system",
            values=_ON_GPU_NODES,
        ),
        HelmAddon(
            "NvidiaDevicePlugin",
            chart="nvidia-device-plugin",
            repository="https://nvidia.github.io/k8s-device-plugin",
            version=v.nvidia_device_plugin_chart,
            namespace="kube-system",
            # The chart's default affinity waits for node-feature-discovery labels, which EKS
            # nodes do not have; select our GPU node label instead.
            values={**_ON_GPU_NODES, "affinity": {}},
        ),
        HelmAddon(
            "JobSet",
            chart="jobset",
            repository="oci://registry.k8s.io/jobset/charts/jobset",
            version=v.jobset_chart,
            namespace="jobset-system",
        ),
    ]
    if config.addons.dcgm_exporter:
        addons.append(
            HelmAddon(
                "DcgmExporter",
                chart="dcgm-exporter",
                repository="https://nvidia.github.io/dcgm-exporter/helm-charts",
                version=v.dcgm_exporter_chart,
                namespace="monitoring",
                # No Prometheus Operator is installed here; scrape the pods' annotations instead.
                values={**_ON_GPU_NODES, "serviceMonitor": {"enabled": False}},
            )
        )
    return addons


def training_operator_installer(config: DeploymentConfig) -> list[dict]:
    """A one-shot Job that installs the Kubeflow training operator v1 (PyTorchJob) from its
    upstream kustomize overlay. The operator ships no Helm chart and its CRDs are far larger than
    a CloudFormation custom resource can carry, so it is applied from inside the cluster."""
    v = config.addons.versions
    name = "training-operator-installer"
    overlay = f"github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref={v.training_operator}"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": "kube-system"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            # Installing CRDs, a namespace and cluster roles needs cluster-admin.
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "kube-system"}],
        },
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"{name}-{v.training_operator.replace('.', '-')}", "namespace": "kube-system"},
            "spec": {
                "backoffLimit": 4,
                "ttlSecondsAfterFinished": 3600,
                "template": {
                    "spec": {
                        "serviceAccountName": name,
                        "restartPolicy": "OnFailure",
                        "containers": [
                            {
                                "name": "install",
                                "image": v.training_operator_installer_image,
                                # Server-side apply: the CRDs exceed the client-side annotation limit.
                                "command": ["kubectl", "apply", "--server-side", "-k", overlay],
                            }
                        ],
                    }
                },
            },
        },
    ]


def install_addons(scope: Construct, cluster: eks.Cluster, config: DeploymentConfig) -> dict[str, Construct]:
    """Create every add-on of the config on the cluster; returns them by name/id."""
    created: dict[str, Construct] = {}
    for addon in managed_addons(config):
        associations = None
        if addon.pod_identity is not None:
            role = _pod_identity_role(scope, addon)
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
            cluster_name=cluster.cluster_name,
            pod_identity_associations=associations,
            resolve_conflicts="OVERWRITE",
            preserve_on_delete=False,
        )
        for dependency in addon.after:
            cfn.node.add_dependency(created[dependency])
        created[addon.name] = cfn

    for chart in helm_addons(config):
        created[chart.construct_id] = eks.HelmChart(
            scope,
            chart.construct_id,
            cluster=cluster,
            chart=chart.chart,
            repository=chart.repository,
            version=chart.version,
            namespace=chart.namespace,
            create_namespace=True,
            values=chart.values,
            wait=True,
        )
    if config.addons.install_training_operator:
        created["TrainingOperator"] = cluster.add_manifest("TrainingOperator", *training_operator_installer(config))
    return created


def _pod_identity_role(scope: Construct, addon: ManagedAddon) -> iam.Role:
    identity = addon.pod_identity
    assert identity is not None
    # EKS Pod Identity: the pods service assumes the role and tags the session.
    role = iam.Role(
        scope,
        f"PodIdentityRole-{addon.name}",
        assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com").with_session_tags(),
        description=f"EKS Pod Identity role for {addon.name}/{identity.service_account}",
        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(p) for p in identity.managed_policies],
    )
    for statement in identity.statements:
        role.add_to_policy(statement)
    return role
