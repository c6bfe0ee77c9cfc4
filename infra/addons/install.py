"""What a config installs: the catalog's records it chooses, each at the version the config pins.
infra/constructs/addons.py creates these on the cluster and the preflight check compares the
cluster's add-ons with them, so both read one choice.
"""

from __future__ import annotations

from dataclasses import replace

from infra.addons.catalog import (
    CLOUDWATCH_OBSERVABILITY,
    COREDNS_ADDON,
    DCGM_EXPORTER,
    EFA_DEVICE_PLUGIN,
    FSX_CSI_DRIVER,
    JOBSET,
    KUBE_PROXY_ADDON,
    NODE_MONITORING_AGENT_ADDON,
    NVIDIA_DEVICE_PLUGIN,
    PER_MINOR_MANAGED_ADDONS,
    POD_IDENTITY_AGENT_ADDON,
    TRAINING_OPERATOR,
    VPC_CNI_ADDON,
    HelmAddon,
    ManagedAddon,
)
from infra.config import DeploymentConfig
from nvrx_eks.facts.kubernetes_versions import pins_for


def _pinned(record, config: DeploymentConfig):
    """The record at the version the config asks for: the profile's `addons.versions` field (whose
    default is the record's pin), else, for a build that follows the minor, the minor's pin."""
    version = getattr(config.addons.versions, record.config_field)
    if version is None and record in PER_MINOR_MANAGED_ADDONS:
        version = pins_for(config.kubernetes_version).addons[record.name]
    return replace(record, version=version)


def managed_addons(config: DeploymentConfig) -> list[ManagedAddon]:
    chosen = [VPC_CNI_ADDON, COREDNS_ADDON, KUBE_PROXY_ADDON, POD_IDENTITY_AGENT_ADDON, FSX_CSI_DRIVER]
    if config.gpu_nodes.auto_repair:
        chosen.append(NODE_MONITORING_AGENT_ADDON)
    if config.addons.cloudwatch_observability:
        chosen.append(CLOUDWATCH_OBSERVABILITY)
    return [_pinned(addon, config).configured_for(config.region) for addon in chosen]


def helm_addons(config: DeploymentConfig) -> list[HelmAddon]:
    addons = [_pinned(chart, config) for chart in (EFA_DEVICE_PLUGIN, NVIDIA_DEVICE_PLUGIN, JOBSET)]
    if config.addons.dcgm_exporter:
        addons.append(_pinned(DCGM_EXPORTER, config))
    return addons


def training_operator_installer(config: DeploymentConfig) -> list[dict]:
    """A one-shot Job that installs the Kubeflow training operator v1 (PyTorchJob) from its
    upstream kustomize overlay. The operator ships no Helm chart and its CRDs are far larger than
    a CloudFormation custom resource can carry, so it is applied from inside the cluster."""
    operator = _pinned(TRAINING_OPERATOR, config)
    name = f"{operator.name}-installer"
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
            "metadata": {"name": f"{name}-{operator.version.replace('.', '-')}", "namespace": "kube-system"},
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
                                    f"kubectl apply --server-side -k '{operator.overlay_url}' && "
                                    f"kubectl delete clusterrolebinding {name} --ignore-not-found",
                                ],
                            }
                        ],
                    }
                },
            },
        },
    ]
