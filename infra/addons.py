"""Cluster add-ons: one record per add-on (name, chart and repository, version, namespace,
pinned image), composed onto the cluster by `install_addons`. Versions that follow the
Kubernetes minor come from infra/kubernetes_versions.py through the config.

EKS managed add-ons (with EKS Pod Identity where they call AWS APIs) cover networking, DNS, the
FSx CSI driver and CloudWatch observability; Helm charts cover the EFA and NVIDIA device plugins,
the JobSet controller and the DCGM exporter. Helm values are passed verbatim to the chart, so
they use the charts' own camelCase keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from aws_cdk import aws_eks as eks_l1
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.config import DeploymentConfig
from infra.conventions import GPU_NODE_LABEL_KEY, GPU_NODE_LABEL_VALUE, GPU_TAINT_KEY
from infra.kubernetes_versions import (
    COREDNS,
    KUBE_PROXY,
    NODE_MONITORING_AGENT,
    POD_IDENTITY_AGENT,
    VPC_CNI,
)

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
    #: None: EKS installs its default build for the cluster's Kubernetes minor.
    version: str | None
    pod_identity: PodIdentity | None = None
    #: Managed add-ons that must exist first (pod identity needs its agent).
    after: tuple[str, ...] = ()
    #: The add-on's configuration values (its own JSON schema: describe-addon-configuration).
    configuration: dict | None = None


@dataclass(frozen=True)
class HelmAddon:
    construct_id: str
    chart: str
    repository: str
    version: str
    namespace: str
    #: The image the chart must run, set explicitly in the values so a chart default (or a
    #: chart whose version differs from its plugin's) cannot change it; tests render the real
    #: chart and compare.
    image_repository: str
    image_tag: str
    values: dict = field(default_factory=dict)

    @property
    def image(self) -> str:
        return f"{self.image_repository}:{self.image_tag}"

    @property
    def chart_values(self) -> dict:
        image = {"repository": self.image_repository, "tag": self.image_tag}
        return {**self.values, "image": {**self.values.get("image", {}), **image}}


#: VPC CNI configuration: its network policy agent enforces the NetworkPolicy objects the
#: training jobs carry (without it they are accepted and ignored).
VPC_CNI_CONFIGURATION = {"enableNetworkPolicy": "true"}


def managed_addons(config: DeploymentConfig) -> list[ManagedAddon]:
    v = config.addons.versions
    addons = [
        ManagedAddon(VPC_CNI, config.addon_version(VPC_CNI), configuration=VPC_CNI_CONFIGURATION),
        ManagedAddon(COREDNS, config.addon_version(COREDNS)),
        ManagedAddon(KUBE_PROXY, config.addon_version(KUBE_PROXY)),
        ManagedAddon(POD_IDENTITY_AGENT, config.addon_version(POD_IDENTITY_AGENT)),
        ManagedAddon(
            "aws-fsx-csi-driver",
            v.fsx_csi_driver,
            # Static provisioning only needs the driver to describe the file system it mounts.
            pod_identity=PodIdentity(
                service_account="fsx-csi-controller-sa",
                statements=(iam.PolicyStatement(actions=["fsx:DescribeFileSystems"], resources=["*"]),),
            ),
            after=(POD_IDENTITY_AGENT,),
        ),
    ]
    if config.gpu_nodes.auto_repair:
        # Node auto repair acts on GPU/EFA health only through the node conditions this agent
        # reports; without it repair sees NodeReady alone.
        addons.append(ManagedAddon(NODE_MONITORING_AGENT, config.addon_version(NODE_MONITORING_AGENT)))
    if config.addons.cloudwatch_observability:
        addons.append(
            ManagedAddon(
                "amazon-cloudwatch-observability",
                v.cloudwatch_observability,
                pod_identity=PodIdentity(
                    service_account="cloudwatch-agent",
                    managed_policies=("CloudWatchAgentServerPolicy",),
                ),
                after=(POD_IDENTITY_AGENT,),
            )
        )
    return addons


#: aws-efa-k8s-device-plugin image that chart v0.5.30 ships (eks-charts index).
EFA_DEVICE_PLUGIN_TAG = "v0.5.20"
#: dcgm-exporter image of chart 4.6.0 (DCGM 4.4.1).
DCGM_EXPORTER_TAG = "4.4.1-4.6.0-ubuntu22.04"


def helm_addons(config: DeploymentConfig) -> list[HelmAddon]:
    v = config.addons.versions
    addons = [
        HelmAddon(
            "EfaDevicePlugin",
            chart="aws-efa-k8s-device-plugin",
            repository="https://aws.github.io/eks-charts",
            version=v.efa_device_plugin_chart,
            namespace="kube-system",
            image_repository="602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin",
            image_tag=EFA_DEVICE_PLUGIN_TAG,
            values=_ON_GPU_NODES,
        ),
        HelmAddon(
            "NvidiaDevicePlugin",
            chart="nvidia-device-plugin",
            repository="https://nvidia.github.io/k8s-device-plugin",
            version=v.nvidia_device_plugin_chart,
            namespace="kube-system",
            image_repository="nvcr.io/nvidia/k8s-device-plugin",
            image_tag=f"v{v.nvidia_device_plugin_chart}",
            # The chart's default affinity requires node-feature-discovery labels or
            # nvidia.com/gpu.present, which nodeadm sets only from Kubernetes 1.35. Helm merges a
            # `{}` into that default; only null removes it, leaving our node selector in charge.
            values={**_ON_GPU_NODES, "affinity": None},
        ),
        HelmAddon(
            "JobSet",
            chart="jobset",
            repository="oci://registry.k8s.io/jobset/charts/jobset",
            version=v.jobset_chart,
            namespace="jobset-system",
            # The chart's source tree defaults to the staging registry's `main` tag; the
            # released controller image lives on registry.k8s.io under the chart's version.
            image_repository="registry.k8s.io/jobset/jobset",
            image_tag=f"v{v.jobset_chart}",
            values={"image": {"pullPolicy": "IfNotPresent"}},
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
                image_repository="nvcr.io/nvidia/k8s/dcgm-exporter",
                image_tag=DCGM_EXPORTER_TAG,
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
            # Installing CRDs, a namespace and cluster roles needs cluster-admin; the Job deletes
            # this binding as its last step, so the grant does not outlive the install.
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
                                "image": config.training_operator_installer_image,
                                # Server-side apply: the CRDs exceed the client-side annotation limit.
                                "command": [
                                    "sh",
                                    "-c",
                                    f"kubectl apply --server-side -k '{overlay}' && "
                                    f"kubectl delete clusterrolebinding {name} --ignore-not-found",
                                ],
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
            cluster=cluster,
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
        helm_chart.node.default_child.node.default_child.add_property_override("Values", json.dumps(chart.chart_values))
        created[chart.construct_id] = helm_chart
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
