"""The Helm values the stacks pass, checked against the real charts: every chart the cluster
stack installs is rendered with the real `helm` and the values from the synthesized template, and
each device-plugin DaemonSet must schedule onto the GPU nodes of every supported Kubernetes minor
and run the pinned image.

The GPU node is modelled from the synthesized node group (its labels and taints, set from
nvrx_eks/facts/names.py), the launch template's instance type, the labels every node carries, and
what nodeadm adds per minor (nvidia.com/gpu.present=true only from 1.35,
nvrx_eks/facts/kubernetes_versions.py).
"""

from __future__ import annotations

import json

import pytest

from infra.addons.install import helm_addons
from infra.config import DeploymentConfig, resolve_config
from nvrx_eks.facts.kubernetes_versions import SUPPORTED_KUBERNETES_VERSIONS, pins_for
from nvrx_eks.facts.names import INSTANCE_TYPE_LABEL_KEY
from tests.support.cluster_template import gpu_nodegroup, launch_template_data
from tests.support.helm_charts import daemonsets, extract_helm, render, why_not_scheduled

pytestmark = [
    pytest.mark.synth,
    pytest.mark.xdist_group("synth"),
]

_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


@pytest.fixture(scope="session")
def helm(tmp_path_factory):
    return extract_helm(tmp_path_factory.mktemp("helm-bin"))


def at_minor(profile: str, minor: str) -> DeploymentConfig:
    base = resolve_config(profile)
    return DeploymentConfig.model_validate({**base.model_dump(), "kubernetes_version": minor})


def installed_charts(synthesized) -> dict[str, dict]:
    """Chart name -> the HelmChart custom resource's properties, as CloudFormation gets them."""
    return {
        c["Properties"]["Chart"]: c["Properties"]
        for c in synthesized.resources("cluster", "Custom::AWSCDK-EKS-HelmChart").values()
    }


def gpu_node(synthesized) -> tuple[dict[str, str], list[dict]]:
    """Labels and taints a GPU node of this deployment carries once it has joined."""
    nodegroup = gpu_nodegroup(synthesized)
    template = launch_template_data(synthesized)
    labels = {
        **nodegroup["Labels"],
        INSTANCE_TYPE_LABEL_KEY: template["InstanceType"],
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "eks.amazonaws.com/nodegroup": nodegroup["NodegroupName"],
        "eks.amazonaws.com/capacityType": nodegroup.get("CapacityType", "ON_DEMAND"),
    }
    if pins_for(synthesized.config.kubernetes_version).nodeadm_labels_gpu_present:
        labels["nvidia.com/gpu.present"] = "true"
    taints = [
        {"key": t["Key"], "value": t.get("Value", ""), "effect": _EFFECTS[t["Effect"]]} for t in nodegroup["Taints"]
    ]
    return labels, taints


def rendered_daemonset(helm, tmp_path, synthesized, chart: str) -> tuple[dict, dict]:
    """(the chart's DaemonSet rendered with the synthesized values, the project's chart record)."""
    properties = installed_charts(synthesized)[chart]
    values = json.loads(properties["Values"])
    docs = render(helm, chart, properties["Version"], properties["Namespace"], values, tmp_path)
    (daemonset,) = daemonsets(docs, chart)
    (record,) = [a for a in helm_addons(synthesized.config) if a.chart == chart]
    return daemonset, record


@pytest.mark.parametrize("minor", SUPPORTED_KUBERNETES_VERSIONS)
@pytest.mark.parametrize("chart", ["nvidia-device-plugin", "aws-efa-k8s-device-plugin"])
def test_device_plugins_schedule_on_gpu_nodes_of_every_minor(synth, helm, tmp_path, minor, chart):
    synthesized = synth(at_minor("p5", minor))
    daemonset, record = rendered_daemonset(helm, tmp_path, synthesized, chart)
    labels, taints = gpu_node(synthesized)
    pod = daemonset["spec"]["template"]["spec"]
    assert why_not_scheduled(pod, labels, taints) == [], f"{chart} would not run on a {minor} GPU node"
    assert [c["image"] for c in pod["containers"]] == [record.image]


@pytest.mark.parametrize("profile", ["p5en", "g5-smoke"])
def test_device_plugins_schedule_on_the_other_instance_types(synth, helm, tmp_path, profile):
    synthesized = synth(profile)
    labels, taints = gpu_node(synthesized)
    for chart in ("nvidia-device-plugin", "aws-efa-k8s-device-plugin"):
        daemonset, _ = rendered_daemonset(helm, tmp_path, synthesized, chart)
        assert why_not_scheduled(daemonset["spec"]["template"]["spec"], labels, taints) == [], chart


@pytest.mark.parametrize("minor", SUPPORTED_KUBERNETES_VERSIONS)
def test_dcgm_exporter_schedules_on_gpu_nodes_with_the_pinned_image(synth, helm, tmp_path, minor):
    synthesized = synth(at_minor("g5-smoke", minor))
    daemonset, record = rendered_daemonset(helm, tmp_path, synthesized, "dcgm-exporter")
    labels, taints = gpu_node(synthesized)
    pod = daemonset["spec"]["template"]["spec"]
    assert why_not_scheduled(pod, labels, taints) == []
    assert [c["image"] for c in pod["containers"]] == [record.image]


def test_jobset_controller_runs_the_released_image(synth, helm, tmp_path):
    synthesized = synth("p5")
    properties = installed_charts(synthesized)["jobset"]
    docs = render(
        helm, "jobset", properties["Version"], properties["Namespace"], json.loads(properties["Values"]), tmp_path
    )
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (record,) = [a for a in helm_addons(synthesized.config) if a.chart == "jobset"]
    images = [c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert images == [record.image] == [f"registry.k8s.io/jobset/jobset:v{properties['Version']}"]


def test_an_empty_affinity_would_keep_the_nvidia_plugin_off_1_34_nodes(synth, helm, tmp_path):
    """Why the values say `affinity: null`: Helm merges `{}` into the chart's default affinity,
    which needs a label nodeadm sets only from 1.35. Guards the check above against a model that
    admits everything."""
    synthesized = synth(at_minor("p5", "1.34"))
    properties = installed_charts(synthesized)["nvidia-device-plugin"]
    values = {**json.loads(properties["Values"]), "affinity": {}}
    docs = render(helm, "nvidia-device-plugin", properties["Version"], properties["Namespace"], values, tmp_path)
    (daemonset,) = daemonsets(docs, "nvidia-device-plugin")
    labels, taints = gpu_node(synthesized)
    reasons = why_not_scheduled(daemonset["spec"]["template"]["spec"], labels, taints)
    assert reasons and "nvidia.com/gpu.present" in reasons[0]
