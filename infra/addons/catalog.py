"""The cluster's add-ons as data: one record per add-on with everything about it (name, chart and
repository, pinned version, namespace, image, configuration, the profile field that overrides the
version). The config model takes its default versions from here; infra/addons/install.py picks
and pins the ones a config installs, which infra/constructs/addons.py creates on the cluster; the
job commands, the preflight check and the tests read the same records. Records only: no CDK, no
config, so everything above can read it without a circle or the CDK's runtime.

EKS managed add-ons (with EKS Pod Identity where they call AWS APIs) cover networking, DNS, the
FSx CSI driver, CloudWatch observability and node health monitoring; Helm charts cover the EFA
and NVIDIA device plugins, the JobSet controller and the DCGM exporter. Helm values are passed
verbatim to the chart, so they use the charts' own camelCase keys. The builds that follow the
Kubernetes minor are pinned by minor in nvrx_eks/facts/kubernetes_versions.py.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

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
    """An EKS managed add-on."""

    name: str
    #: The field of `addons.versions` in a profile that overrides `version`.
    config_field: str
    #: The pinned build. None in the catalog: the build follows the Kubernetes minor
    #: (nvrx_eks/facts/kubernetes_versions.py); None once resolved: EKS's default for the minor.
    version: str | None = None
    pod_identity: PodIdentity | None = None
    #: Managed add-ons that must exist first (pod identity needs its agent).
    after: tuple[str, ...] = ()
    #: The add-on's configuration values (its own JSON schema: describe-addon-configuration).
    configuration: dict | None = None
    #: Where its configuration takes the AWS region, for a pod that would otherwise read it from
    #: IMDS, which the nodes' one-hop limit keeps from pods (infra/constructs/node_launch_template.py).
    region_setting: tuple[str, ...] = ()

    def configured_for(self, region: str) -> ManagedAddon:
        """The record with the region written where region_setting says (a no-op without one)."""
        if not self.region_setting:
            return self
        configuration = copy.deepcopy(self.configuration or {})
        *parents, leaf = self.region_setting
        node = configuration
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = region
        return replace(self, configuration=configuration)


@dataclass(frozen=True)
class HelmAddon:
    """A Helm chart installed by the cluster's kubectl provider."""

    construct_id: str
    chart: str
    repository: str
    version: str
    namespace: str
    #: The field of `addons.versions` in a profile that overrides `version`.
    config_field: str
    #: The image the chart must run, set explicitly in the values so a chart default (or a
    #: chart whose version differs from its plugin's) cannot change it; tests render the real
    #: chart and compare. `{version}` in the tag stands for the chart version.
    image_repository: str
    image_tag: str
    values: dict = field(default_factory=dict)

    @property
    def image(self) -> str:
        return f"{self.image_repository}:{self.image_tag.format(version=self.version)}"

    @property
    def chart_values(self) -> dict:
        image = {"repository": self.image_repository, "tag": self.image_tag.format(version=self.version)}
        return {**self.values, "image": {**self.values.get("image", {}), **image}}


@dataclass(frozen=True)
class KustomizeAddon:
    """An add-on without a Helm chart, applied from its upstream kustomize overlay in-cluster."""

    name: str
    overlay: str
    version: str
    #: The field of `addons.versions` in a profile that overrides `version`.
    config_field: str

    @property
    def overlay_url(self) -> str:
        return f"{self.overlay}?ref={self.version}"


# ----- EKS managed add-ons --------------------------------------------------------------------

#: Its network policy agent enforces the NetworkPolicy objects the training jobs carry (without it
#: they are accepted and ignored).
VPC_CNI_ADDON = ManagedAddon(VPC_CNI, "vpc_cni", configuration={"enableNetworkPolicy": "true"})
COREDNS_ADDON = ManagedAddon(COREDNS, "coredns")
KUBE_PROXY_ADDON = ManagedAddon(KUBE_PROXY, "kube_proxy")
POD_IDENTITY_AGENT_ADDON = ManagedAddon(POD_IDENTITY_AGENT, "pod_identity_agent")
#: Node auto repair acts on GPU/EFA health only through the node conditions this agent reports;
#: without it repair sees NodeReady alone.
NODE_MONITORING_AGENT_ADDON = ManagedAddon(NODE_MONITORING_AGENT, "node_monitoring_agent")
FSX_CSI_DRIVER = ManagedAddon(
    "aws-fsx-csi-driver",
    "fsx_csi_driver",
    "v1.7.0-eksbuild.1",
    # Static provisioning only needs the driver to describe the file system it mounts.
    pod_identity=PodIdentity(
        service_account="fsx-csi-controller-sa",
        grants=(PolicyGrant(actions=("fsx:DescribeFileSystems",), resources=("*",)),),
    ),
    after=(POD_IDENTITY_AGENT,),
    # The controller (a Deployment, not in the host network) reads its region from IMDS unless
    # the chart's controller.region sets AWS_REGION; with IMDS out of its reach it cannot start
    # ("Could not determine region from any metadata service", pkg/driver/controller.go;
    # aws-fsx-csi-driver docs/install.md sets it for the same reason on EKS Auto Mode). That the
    # managed add-on's configuration schema takes the chart's controller.region is a guess: no
    # schema was read here (`aws eks describe-addon-configuration --addon-name aws-fsx-csi-driver`).
    region_setting=("controller", "region"),
)
#: The agent's configuration replaces the add-on's default one, so it restates that default
#: (Container Insights with its GPU and EFA metrics, Application Signals) and adds the EMF
#: listener the trainer's live metrics arrive on (nvrx_eks/facts/training_metrics.py).
CLOUDWATCH_OBSERVABILITY = ManagedAddon(
    "amazon-cloudwatch-observability",
    "cloudwatch_observability",
    "v4.6.0-eksbuild.1",
    pod_identity=PodIdentity(service_account="cloudwatch-agent", managed_policies=("CloudWatchAgentServerPolicy",)),
    after=(POD_IDENTITY_AGENT,),
    configuration={
        "agent": {
            "config": {
                "logs": {
                    "metrics_collected": {
                        "kubernetes": {"enhanced_container_insights": True, "accelerated_compute_metrics": True},
                        "application_signals": {},
                        "emf": {},
                    }
                },
                "traces": {"traces_collected": {"application_signals": {}}},
            }
        }
    },
)
#: The managed add-ons whose build follows the Kubernetes minor.
PER_MINOR_MANAGED_ADDONS = (
    VPC_CNI_ADDON,
    COREDNS_ADDON,
    KUBE_PROXY_ADDON,
    POD_IDENTITY_AGENT_ADDON,
    NODE_MONITORING_AGENT_ADDON,
)

# ----- Helm charts ----------------------------------------------------------------------------

EFA_DEVICE_PLUGIN = HelmAddon(
    "EfaDevicePlugin",
    chart="aws-efa-k8s-device-plugin",
    repository="https://aws.github.io/eks-charts",
    # Chart v0.5.30 carries device plugin v0.5.20 (the chart version is not the plugin's).
    version="v0.5.30",
    namespace="kube-system",
    config_field="efa_device_plugin_chart",
    image_repository="602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin",
    # The image chart v0.5.30 ships (eks-charts index).
    image_tag="v0.5.20",
    values=_ON_GPU_NODES,
)
NVIDIA_DEVICE_PLUGIN = HelmAddon(
    "NvidiaDevicePlugin",
    chart="nvidia-device-plugin",
    repository="https://nvidia.github.io/k8s-device-plugin",
    version="0.18.0",
    namespace="kube-system",
    config_field="nvidia_device_plugin_chart",
    image_repository="nvcr.io/nvidia/k8s-device-plugin",
    image_tag="v{version}",
    # The chart's default affinity requires node-feature-discovery labels or
    # nvidia.com/gpu.present, which nodeadm sets only from Kubernetes 1.35. Helm merges a
    # `{}` into that default; only null removes it, leaving our node selector in charge.
    values={**_ON_GPU_NODES, "affinity": None},
)
JOBSET = HelmAddon(
    "JobSet",
    chart="jobset",
    repository="oci://registry.k8s.io/jobset/charts/jobset",
    version="0.12.0",
    namespace="jobset-system",
    config_field="jobset_chart",
    # The chart's source tree defaults to the staging registry's `main` tag; the released
    # controller image lives on registry.k8s.io under the chart's version.
    image_repository="registry.k8s.io/jobset/jobset",
    image_tag="v{version}",
    values={"image": {"pullPolicy": "IfNotPresent"}},
)
DCGM_EXPORTER = HelmAddon(
    "DcgmExporter",
    chart="dcgm-exporter",
    repository="https://nvidia.github.io/dcgm-exporter/helm-charts",
    version="4.6.0",
    namespace="monitoring",
    config_field="dcgm_exporter_chart",
    image_repository="nvcr.io/nvidia/k8s/dcgm-exporter",
    # The image of chart 4.6.0 (DCGM 4.4.1).
    image_tag="4.4.1-4.6.0-ubuntu22.04",
    # No Prometheus Operator is installed here; scrape the pods' annotations instead.
    values={**_ON_GPU_NODES, "serviceMonitor": {"enabled": False}},
)

# ----- kustomize ------------------------------------------------------------------------------

#: Kubeflow training operator v1 (for PyTorchJob); off unless addons.install_training_operator.
TRAINING_OPERATOR = KustomizeAddon(
    "training-operator",
    overlay="github.com/kubeflow/training-operator.git/manifests/overlays/standalone",
    version="v1.9.4",
    config_field="training_operator",
)
