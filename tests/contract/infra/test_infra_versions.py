"""Versions follow the Kubernetes minor: every supported minor synthesizes with the add-on builds
and kubectl layer pinned for it in nvrx_eks/facts/kubernetes_versions.py, and a pin for another minor is
a config error (exit 2, the field and the fix named)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from infra.config import PROFILES_DIR, DeploymentConfig, load_config, resolve_config
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.kubernetes_versions import (
    KUBE_PROXY,
    NODE_MONITORING_AGENT,
    PER_MINOR_ADDONS,
    PINS_BY_MINOR,
    SUPPORTED_KUBERNETES_VERSIONS,
    pins_for,
)
from tests.support import REPO_ROOT

pytestmark = [pytest.mark.synth, pytest.mark.xdist_group("synth")]


def at_minor(profile: str, minor: str, **addon_versions) -> DeploymentConfig:
    raw = resolve_config(profile).model_dump()
    raw["kubernetes_version"] = minor
    raw["addons"]["versions"].update(addon_versions)
    return DeploymentConfig.model_validate(raw)


def managed_addons(synthesized) -> dict[str, dict]:
    return {
        a["Properties"]["AddonName"]: a["Properties"]
        for a in synthesized.resources("cluster", "AWS::EKS::Addon").values()
    }


def test_every_supported_minor_has_a_complete_record():
    assert SUPPORTED_KUBERNETES_VERSIONS == ("1.34", "1.35", "1.36")
    for minor, pins in PINS_BY_MINOR.items():
        assert set(pins.addons) == set(PER_MINOR_ADDONS), minor
        kube_proxy = pins.addons[KUBE_PROXY]
        assert kube_proxy is None or kube_proxy.startswith(f"v{minor}."), minor


def test_every_add_on_record_names_the_profile_field_that_overrides_it():
    from infra.addons import catalog
    from infra.config.sections import AddonVersions

    record_types = (catalog.ManagedAddon, catalog.HelmAddon, catalog.KustomizeAddon)
    records = [r for r in vars(catalog).values() if isinstance(r, record_types)]
    assert len(records) == 12
    assert {r.name for r in catalog.PER_MINOR_MANAGED_ADDONS} == set(PER_MINOR_ADDONS)
    defaults = AddonVersions()
    for record in records:
        # A pinned record's version is the field's default; a per-minor one defers to the table.
        assert getattr(defaults, record.config_field) == record.version, record


@pytest.mark.parametrize("minor", SUPPORTED_KUBERNETES_VERSIONS)
def test_synth_of_each_minor_pins_that_minors_add_ons(synth, minor):
    synthesized = synth(at_minor("p5", minor))
    cluster = synthesized.one("cluster", "AWS::EKS::Cluster")["Properties"]
    assert cluster["Version"] == minor
    installed = managed_addons(synthesized)
    for addon, version in pins_for(minor).addons.items():
        assert addon in installed, addon
        # None: no version property, EKS installs its default build for the cluster's minor.
        assert installed[addon].get("AddonVersion") == version, addon
    if installed[KUBE_PROXY].get("AddonVersion"):
        assert installed[KUBE_PROXY]["AddonVersion"].startswith(f"v{minor}.")


@pytest.mark.parametrize("minor", SUPPORTED_KUBERNETES_VERSIONS)
def test_kubectl_layer_is_the_one_the_table_names(synth, minor):
    synthesized = synth(at_minor("p5", minor))
    layers = synthesized.resources("cluster", "AWS::Lambda::LayerVersion")
    described = [layer["Properties"].get("Description", "") for layer in layers.values()]
    layer = pins_for(minor).kubectl_layer
    # The layer package describes its contents: "/opt/kubectl/kubectl 1.35.2; /opt/helm/helm 4.1.3".
    assert any(f"/opt/kubectl/kubectl {layer}." in d for d in described), described
    # Kubernetes' version-skew policy: kubectl within one minor of the API server.
    assert abs(int(layer.split(".")[1]) - int(minor.split(".")[1])) <= 1


def test_a_kube_proxy_for_another_minor_is_a_config_error_naming_the_field(tmp_path):
    raw = yaml.safe_load((PROFILES_DIR / "p5.yaml").read_text())
    raw["kubernetes_version"] = "1.34"
    raw["addons"] = {"versions": {"kube_proxy": "v1.35.3-eksbuild.2"}}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    message = str(e.value)
    assert "addons.versions.kube_proxy 'v1.35.3-eksbuild.2'" in message
    assert "kubernetes_version 1.34" in message and "v1.34.x" in message
    assert "remove the field" in message


def test_an_override_for_the_right_minor_is_installed(synth):
    synthesized = synth(at_minor("g5-smoke", "1.34", kube_proxy="v1.34.1-eksbuild.2"))
    assert managed_addons(synthesized)[KUBE_PROXY]["AddonVersion"] == "v1.34.1-eksbuild.2"


def test_node_auto_repair_always_comes_with_the_node_monitoring_agent(synth):
    for profile in ("p5", "p5en", "g5-smoke", "p5-capacity-block"):
        config = resolve_config(profile)
        assert config.gpu_nodes.auto_repair
        installed = managed_addons(synth(profile))
        assert NODE_MONITORING_AGENT in installed, profile
    raw = resolve_config("g5-smoke").model_dump()
    raw["gpu_nodes"]["auto_repair"] = False
    assert NODE_MONITORING_AGENT not in managed_addons(synth(DeploymentConfig.model_validate(raw)))


def test_cli_exits_2_on_a_pin_for_another_minor(tmp_path):
    raw = yaml.safe_load((PROFILES_DIR / "p5.yaml").read_text())
    raw["addons"] = {"versions": {"kube_proxy": "v1.34.6-eksbuild.2"}}  # p5 runs 1.35
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = subprocess.run(
        [sys.executable, "-m", "nvrx_eks.cli", "synth", "--config", str(path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "addons.versions.kube_proxy" in result.stderr and "kubernetes_version 1.35" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("profile", ["p5", "p5en", "g5-smoke", "p5-capacity-block"])
def test_every_shipped_profile_synthesizes_with_the_pins_of_its_minor(synth, profile):
    synthesized = synth(profile)
    installed = managed_addons(synthesized)
    for addon, version in pins_for(synthesized.config.kubernetes_version).addons.items():
        assert installed[addon].get("AddonVersion") == version, addon
