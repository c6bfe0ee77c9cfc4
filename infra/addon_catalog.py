"""The cluster's add-ons as data: one record per add-on (name, chart and repository, version,
namespace, pinned image, configuration). infra/addons.py creates them on the cluster; the
preflight check and the tests read the same records. No CDK import here, so the CLI can read the
catalog without starting the CDK's runtime.

EKS managed add-ons (with EKS Pod Identity where they call AWS APIs) cover networking, DNS, the
FSx CSI driver, CloudWatch observability and node health monitoring; Helm charts cover the EFA
and NVIDIA device plugins, the JobSet controller and the DCGM exporter. Helm values are passed
verbatim to the chart, so they use the charts' own camelCase keys. Versions that follow the
Kubernetes minor come from nvrx_eks/facts/kubernetes_versions.py through the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infra.config import DeploymentConfig, version_field
from nvrx_eks.facts.kubernetes_versions import (
    COREDNS,
    KUBE_PROXY,
    NODE_MONITORING_AGENT,
    POD_IDENTITY_AGENT,
    VPC_CNI,
)
from nvrx_eks.facts.names import GPU_NODE_LABEL_KEY, GPU_NODE_LABEL_VALUE, GPU_TAINT_KEY

#: Schedules a DaemonSet onto GPU nodes only, through their taint.
_ON_GPU_NODES = {
    "nodeSelector": {GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE},
    "tolerations": [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
}


@dataclass(frozen=True)
class PolicyGrant:
    actions: tuple[str, ...]
    resources: tuple[str, ...]


@dataclass(frozen=True)
class PodIdentity:
    """An IAM role for one service account, bound through EKS Pod Identity."""

    service_account: str
    managed_policies: tuple[str, ...] = ()
    grants: tuple[PolicyGrant, ...] = ()


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
    #: The field of `addons.versions` in a profile that overrides `version`.
    config_field: str = ""


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


def _per_minor(config: DeploymentConfig, addon: str, **kwargs) -> ManagedAddon:
    """An EKS add-on whose build follows the Kubernetes minor (nvrx_eks/facts/kubernetes_versions.py)."""
    return ManagedAddon(addon, config.addon_version(addon), config_field=version_field(addon), **kwargs)


def managed_addons(config: DeploymentConfig) -> list[ManagedAddon]:
    v = config.addons.versions
    addons = [
        _per_minor(config, VPC_CNI, configuration=VPC_CNI_CONFIGURATION),
        _per_minor(config, COREDNS),
        _per_minor(config, KUBE_PROXY),
        _per_minor(config, POD_IDENTITY_AGENT),
        ManagedAddon(
            "aws-fsx-csi-driver",
            v.fsx_csi_driver,
            # Static provisioning only needs the driver to describe the file system it mounts.
            pod_identity=PodIdentity(
                service_account="fsx-csi-controller-sa",
                grants=(PolicyGrant(actions=("fsx:DescribeFileSystems",), resources=("*",)),),
            ),
            after=(POD_IDENTITY_AGENT,),
            config_field="fsx_csi_driver",
        ),
    ]
    if config.gpu_nodes.auto_repair:
        # Node auto repair acts on GPU/EFA health only through the node conditions this agent
        # reports; without it repair sees NodeReady alone.
        addons.append(_per_minor(config, NODE_MONITORING_AGENT))
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
                config_field="cloudwatch_observability",
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
