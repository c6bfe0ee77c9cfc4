"""DeploymentConfig: every shipped profile loads; every mistake a user can make is rejected
before any construct is built, with a message naming the field and the fix, and exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from infra.config import PROFILES_DIR, DeploymentConfig, load_config, resolve_config
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.instances import INSTANCE_FACTS, facts_for
from tests.support import REPO_ROOT
from tests.support.profiles import config_with, profile_data

ROOT = REPO_ROOT


def with_changes(**changes) -> dict:
    """The p5 profile with dotted-path changes applied (value None deletes the key)."""
    return profile_data("p5", **changes)


@pytest.mark.parametrize("profile", sorted(p.stem for p in PROFILES_DIR.glob("*.yaml")))
def test_shipped_profiles_are_valid(profile):
    config = resolve_config(profile)
    assert config.gpu_nodes.instance_type in INSTANCE_FACTS


def test_default_profile_is_p5_on_demand():
    config = resolve_config()
    assert config.gpu_nodes.instance_type == "p5.48xlarge"
    assert config.gpu_nodes.desired_size == 2
    assert config.gpu_nodes.capacity_type == "on-demand"


# (changes to the p5 profile, field path that must be named, a word of the fix)
INVALID = {
    "unknown instance type": ({"gpu_nodes__instance_type": "p9.96xlarge"}, "gpu_nodes.instance_type", "p5.48xlarge"),
    "non-EFA instance type": ({"gpu_nodes__instance_type": "g5.xlarge"}, "gpu_nodes.instance_type", "EFA"),
    # The GPU group is always created at 0 with a minimum of 0: there is no minimum to set.
    "GPU min_size": ({"gpu_nodes__min_size": 0}, "gpu_nodes.min_size", "unknown field"),
    "desired above max": ({"gpu_nodes__desired_size": 4}, "gpu_nodes", "desired_size <= max_size"),
    "no GPU node to start": ({"gpu_nodes__desired_size": 0}, "gpu_nodes.desired_size", "greater than or equal to 1"),
    "FSx capacity not a PERSISTENT_2 size": (
        {"fsx__storage_gib": 3000, "fsx__efa_enabled": False},
        "fsx",
        "multiple of 2400",
    ),
    "FSx capacity not valid for EFA at the chosen throughput": (
        {"fsx__storage_gib": 4800, "fsx__throughput_per_tib": 250},
        "fsx",
        "multiple of 19200",
    ),
    "invalid throughput tier": ({"fsx__throughput_per_tib": 200}, "fsx.throughput_per_tib", "125, 250, 500, 1000"),
    "EFA FSx with an instance that cannot mount it over EFA": (
        {"gpu_nodes__instance_type": "g5.8xlarge"},
        "efa_enabled",
        "efa_enabled: false",
    ),
    "AZ not in region": ({"gpu_availability_zone": "us-west-2a"}, "gpu_availability_zone", "us-east-1a"),
    "capacity block without reservation": (
        {"gpu_nodes__capacity_type": "capacity-block", "gpu_nodes__placement_group": False},
        "gpu_nodes",
        "capacity_reservation_id",
    ),
    "reservation together with a placement group": (
        {"gpu_nodes__capacity_reservation_id": "cr-0123456789abcdef0"},
        "gpu_nodes",
        "placement_group must be false",
    ),
    "malformed reservation id": (
        {"gpu_nodes__capacity_reservation_id": "reservation-1", "gpu_nodes__placement_group": False},
        "gpu_nodes.capacity_reservation_id",
        "cr-",
    ),
    "bad CIDR": ({"endpoint__public_cidrs": ["10.0.0.1/8"]}, "endpoint.public_cidrs", "host bits"),
    "API open to the internet without the flag": (
        {"endpoint__public_cidrs": ["0.0.0.0/0"]},
        "endpoint",
        "allow_public_internet",
    ),
    "public access without CIDRs": ({"endpoint__public_cidrs": []}, "endpoint", "public_cidrs"),
    "unsupported Kubernetes version": ({"kubernetes_version": "1.29"}, "kubernetes_version", "1.35"),
    "Kubernetes version as a YAML float": ({"kubernetes_version": 1.3}, "kubernetes_version", "string"),
    "misspelled section": ({"gpu_node": {"desired_size": 4}}, "gpu_node", "unknown field"),
    "account id not 12 digits": ({"account": "12345"}, "account", "12-digit"),
    "admin principal not an ARN": ({"admin_principal_arn": "admin"}, "admin_principal_arn", "arn:aws:iam"),
    # What `aws sts get-caller-identity` prints for an SSO user: EKS access entries refuse it.
    "admin principal an STS session": (
        {"admin_principal_arn": "arn:aws:sts::210987654321:assumed-role/AWSReservedSSO_Admin_0123456789abcdef/jane"},
        "admin_principal_arn",
        "aws iam get-role --role-name AWSReservedSSO_Admin_0123456789abcdef --query Role.Arn",
    ),
    "admin principal a federated STS user": (
        {"admin_principal_arn": "arn:aws:sts::210987654321:federated-user/jane"},
        "admin_principal_arn",
        "EKS access entries refuse",
    ),
    "no admin principal": ({"admin_principal_arn": None}, "admin_principal_arn is required", "--query Role.Arn"),
    "placement group name without a reservation": (
        {"gpu_nodes__placement_group": False, "gpu_nodes__placement_group_name": "cpg"},
        "gpu_nodes",
        "capacity_reservation_id and placement_group: false",
    ),
    "two DCGM exporters": ({"addons__dcgm_exporter": True}, "addons", "enable only one"),
    "image both built and given": (
        {"image__uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1"},
        "image",
        "not both",
    ),
    "GPU type for the system node group": ({"system_nodes__instance_type": "p5.48xlarge"}, "system_nodes", "m7i"),
    "invalid metadata IOPS": ({"fsx__metadata_iops": 5000}, "fsx.metadata_iops", "12000"),
    "reserved tag prefix": ({"tags__aws:owner": "me"}, "tags", "reserved"),
    "VPC too small for pod IPs": ({"vpc_cidr": "10.0.0.0/24"}, "vpc_cidr", "/16"),
}


@pytest.mark.parametrize("changes,field,fix", INVALID.values(), ids=INVALID.keys())
def test_invalid_config_exits_2_naming_field_and_fix(tmp_path, capsys, monkeypatch, changes, field, fix):
    """Through the CLI entry point (in process: validation fails before anything heavy loads)."""
    from nvrx_eks.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(with_changes(**changes)))
    monkeypatch.setattr(sys, "argv", ["nvrx-eks", "synth", "--config", str(path)])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    message = capsys.readouterr().err
    assert field in message, message
    assert fix in " ".join(message.split()), message  # the console may wrap long lines
    assert "Traceback" not in message


@pytest.mark.parametrize(
    "arn",
    [
        "arn:aws:iam::210987654321:role/Admin",
        # An IAM Identity Center role: its ARN has a path, which its session ARN leaves out.
        "arn:aws:iam::210987654321:role/aws-reserved/sso.amazonaws.com/eu-west-1/AWSReservedSSO_Admin_0123456789abcdef",
        "arn:aws:iam::210987654321:user/ops/jane",
        "arn:aws-us-gov:iam::210987654321:role/Admin",
    ],
)
def test_iam_roles_with_their_path_and_users_are_admin_principals(arn):
    assert config_with(admin_principal_arn=arn).admin_principal_arn == arn


def test_an_existing_cluster_needs_no_admin_principal():
    """Nothing is deployed for a cluster: section, so there is no access entry to make."""
    cluster = {"context": "team-a", "namespace": "ml", "pvc": "shared", "image": "registry.example/t:1"}
    config = config_with(admin_principal_arn=None, cluster=cluster)
    assert config.admin_principal_arn is None


def test_a_capacity_block_profile_names_the_nodes_capacity_up_starts():
    """desired_size is the node count `nvrx-eks capacity up` scales to; the template creates the
    group at 0 whatever it says (EKS: a Capacity Block group is created, and updated, at 0)."""
    config = config_with("p5-capacity-block", gpu_nodes__desired_size=2)
    assert config.gpu_nodes.desired_size == 2 and config.gpu_nodes.capacity_type == "capacity-block"


def test_error_lists_every_wrong_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(with_changes(account="1", kubernetes_version="1.2")))
    message = str(pytest.raises(ConfigError, load_config, path).value)
    assert "account" in message and "kubernetes_version" in message


def test_unknown_profile_lists_the_shipped_ones():
    message = str(pytest.raises(ConfigError, resolve_config, "p6").value)
    assert "g5-smoke" in message and "p5en" in message


def test_instance_facts_are_consistent():
    for facts in INSTANCE_FACTS.values():
        assert facts.efa_interfaces <= facts.network_cards
        assert 0 < facts.allocatable_memory_gib < facts.memory_gib
        assert 0 < facts.allocatable_vcpus < facts.vcpus
    assert facts_for("p5.48xlarge").efa_interfaces == 32
    assert facts_for("p5en.48xlarge").efa_interfaces == 16
    with pytest.raises(ValueError, match="supported EFA-capable"):
        facts_for("t3.micro")


def _bad_profile(tmp_path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(with_changes(gpu_nodes__desired_size=5)))
    return path


def test_cli_exits_2_with_one_message_and_no_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "nvrx_eks.cli", "synth", "--config", str(_bad_profile(tmp_path))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "gpu_nodes" in result.stderr and "desired_size <= max_size" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_cdk_app_exits_2_before_building_constructs(tmp_path):
    """The path `cdk synth -c config=...` takes: the CLI runs app.py with the context in
    CDK_CONTEXT_JSON. Nothing is synthesized (no template or manifest in the output folder)."""
    outdir = tmp_path / "cdk.out"
    env = {
        **os.environ,
        "CDK_CONTEXT_JSON": json.dumps({"config": str(_bad_profile(tmp_path))}),
        "CDK_OUTDIR": str(outdir),
    }
    result = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "gpu_nodes" in result.stderr
    assert "Traceback" not in result.stderr
    assert not outdir.exists() or not list(outdir.glob("*.json"))


def test_profiles_are_frozen_models():
    config = resolve_config()
    assert isinstance(config, DeploymentConfig)
    with pytest.raises(ValidationError, match="frozen"):
        config.name = "other"  # type: ignore[misc]
