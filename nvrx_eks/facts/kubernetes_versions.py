"""What follows the Kubernetes minor version: one record per supported minor, one table.

EKS managed add-ons are built per minor (a kube-proxy for 1.35 is refused by a 1.34 cluster with
"Addon version specified is not supported"), the kubectl client in the CDK's kubectl Lambda and
in the one-shot installer must stay within one minor of the API server (Kubernetes' version-skew
policy), and what nodeadm labels a GPU node with changed in 1.35. Everything that depends on the
minor is read from here; nothing else names a minor.

An add-on version of None leaves the choice to EKS: it installs its default build for the
cluster's minor. That is used where no build string for the minor could be confirmed from
published sources; `nvrx-eks preflight` reports what EKS offers either way
(`aws eks describe-addon-versions --kubernetes-version X --addon-name N` is the authority).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

#: EKS managed add-ons whose builds are per Kubernetes minor, by EKS add-on name.
KUBE_PROXY = "kube-proxy"
COREDNS = "coredns"
VPC_CNI = "vpc-cni"
POD_IDENTITY_AGENT = "eks-pod-identity-agent"
NODE_MONITORING_AGENT = "eks-node-monitoring-agent"
PER_MINOR_ADDONS = (VPC_CNI, COREDNS, KUBE_PROXY, POD_IDENTITY_AGENT, NODE_MONITORING_AGENT)

#: kubectl minor of the only kubectl Lambda layer package installed
#: (aws-cdk.lambda-layer-kubectl-v35). Its kubectl and helm talk to API servers 1.34-1.36 within
#: Kubernetes' version-skew policy (kubectl: one minor either way).
KUBECTL_LAYER_V35 = "1.35"


@dataclass(frozen=True)
class MinorPins:
    minor: str
    #: EKS managed add-on builds for this minor, by add-on name (None: EKS's default build).
    addons: dict[str, str | None]
    #: kubectl minor of the aws-cdk.lambda-layer-kubectl-vNN package that gives the CDK's
    #: kubectl Lambda its kubectl and helm.
    kubectl_layer: str
    #: Image of the one-shot training-operator installer (kubectl + git): its kubectl minor
    #: within one of the cluster's. Pinned by tag (the only published tag that was checked is
    #: 1.35.0, which serves 1.34-1.36 within the skew policy); no digest for it was verified.
    installer_image: str
    #: nodeadm labels NVIDIA nodes `nvidia.com/gpu.present=true` only from Kubernetes 1.35
    #: (amazon-eks-ami nodeadm); the device plugin's chart default affinity depends on it.
    nodeadm_labels_gpu_present: bool


# Sources of the build strings (checked 2026-11-30): the EKS user guide's per-minor tables
# ("kube-proxy versions", "CoreDNS versions") for 1.34 and 1.35. The VPC CNI and Pod Identity
# Agent builds are not per minor (one build spans every supported minor); their pins are the
# project's tested ones. For 1.36 no table entry was found: EKS picks its default build.
_TABLE = (
    MinorPins(
        minor="1.34",
        addons={
            VPC_CNI: "v1.20.4-eksbuild.2",
            COREDNS: "v1.13.2-eksbuild.4",
            KUBE_PROXY: "v1.34.6-eksbuild.2",
            POD_IDENTITY_AGENT: "v1.3.10-eksbuild.1",
            NODE_MONITORING_AGENT: None,
        },
        # No v34 layer package is installed; v35 is within the skew policy (+1 minor).
        kubectl_layer=KUBECTL_LAYER_V35,
        installer_image="alpine/k8s:1.35.0",
        nodeadm_labels_gpu_present=False,
    ),
    MinorPins(
        minor="1.35",
        addons={
            VPC_CNI: "v1.20.4-eksbuild.2",
            COREDNS: "v1.13.2-eksbuild.4",
            KUBE_PROXY: "v1.35.3-eksbuild.2",
            POD_IDENTITY_AGENT: "v1.3.10-eksbuild.1",
            NODE_MONITORING_AGENT: None,
        },
        kubectl_layer=KUBECTL_LAYER_V35,
        installer_image="alpine/k8s:1.35.0",
        nodeadm_labels_gpu_present=True,
    ),
    MinorPins(
        minor="1.36",
        addons={
            VPC_CNI: None,
            COREDNS: None,
            KUBE_PROXY: None,
            POD_IDENTITY_AGENT: None,
            NODE_MONITORING_AGENT: None,
        },
        # No v36 layer package is installed; v35 is within the skew policy (-1 minor).
        kubectl_layer=KUBECTL_LAYER_V35,
        installer_image="alpine/k8s:1.35.0",
        nodeadm_labels_gpu_present=True,
    ),
)

PINS_BY_MINOR = MappingProxyType({pins.minor: pins for pins in _TABLE})
SUPPORTED_KUBERNETES_VERSIONS = tuple(PINS_BY_MINOR)


def pins_for(minor: str) -> MinorPins:
    return PINS_BY_MINOR[minor]


def addon_matches_minor(addon: str, version: str, minor: str) -> bool:
    """Whether an add-on build can belong to `minor`, as far as its name tells: kube-proxy builds
    carry the Kubernetes version they were made for (v1.35.3-eksbuild.2). The other add-ons'
    compatibility is not in their version string; preflight asks EKS."""
    if addon == KUBE_PROXY:
        return version.startswith(f"v{minor}.")
    return True
