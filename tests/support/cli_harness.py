"""Running `nvrx-eks` in-process against moto and the loopback Kubernetes API test server.

`run_cli` calls the console script's real entry point (`nvrx_eks.cli.main`, which turns
ConfigError into exit 2) and captures what it prints. `deploy_fake_environment` creates the three
CloudFormation stacks in moto, with the cluster stack's outputs pointing at the test server, so
the CLI reads outputs, signs an EKS token and talks to "the cluster" exactly as it would in AWS.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from infra.config import DeploymentConfig, resolve_config
from nvrx_eks.facts.job_kinds import JOB_COMPLETION_INDEX_LABEL, JOBSET, JOBSET_RESTART_ATTEMPT_LABEL
from nvrx_eks.facts.job_names import TRAINER_CONTAINER
from nvrx_eks.facts.names import FSX_PV_NAME, FSX_PVC_NAME, GPU_RESOURCE, TRAINING_NAMESPACE
from nvrx_eks.facts.stack_outputs import OutputKey
from tests.support.k8s_api_server import KubeApiTestServer

#: The example account of the shipped profiles; moto pretends to be it (MOTO_ACCOUNT_ID).
ACCOUNT = "111122223333"
REGION = "us-east-1"
DEPLOYED_IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/cdk-hnb659fds-container-assets:abc123"
_FAKE_CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n").decode()


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_cli(*args: str, stdin: str | None = None) -> CliResult:
    from nvrx_eks import cli

    out, err = io.StringIO(), io.StringIO()
    argv, real_stdin = sys.argv, sys.stdin
    # Rich sizes tables to the terminal; a wide one keeps names whole for the assertions.
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "220"
    sys.argv = ["nvrx-eks", *args]
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv, sys.stdin = argv, real_stdin
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns
    return CliResult(code, out.getvalue(), err.getvalue())


@pytest.fixture
def aws(monkeypatch):
    """moto, as account 111122223333 with working fake credentials."""
    from moto import mock_aws

    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("MOTO_ACCOUNT_ID", ACCOUNT)
    with mock_aws():
        yield


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    """An environment where boto3 finds no credentials anywhere (and never asks IMDS)."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_SECURITY_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    monkeypatch.delenv("AWS_WEB_IDENTITY_TOKEN_FILE", raising=False)


@pytest.fixture
def k8s_server():
    server = KubeApiTestServer(required_auth_prefix="Bearer k8s-aws-v1.")
    server.add_namespace(TRAINING_NAMESPACE)
    with server:
        yield server


#: A profile: a shipped one by name, or a config file (tests/support/profiles.py writes copies).
Profile = str | Path


def _config(profile: Profile) -> DeploymentConfig:
    return resolve_config(profile) if isinstance(profile, str) else resolve_config(config=str(profile))


def cluster_outputs(endpoint: str, profile: Profile = "p5", **overrides: str) -> dict[str, str]:
    config = _config(profile)
    outputs = {
        OutputKey.CLUSTER_NAME: config.cluster_name,
        OutputKey.REGION: config.region,
        OutputKey.UPDATE_KUBECONFIG_COMMAND: f"aws eks update-kubeconfig --name {config.cluster_name}",
        OutputKey.CLUSTER_ENDPOINT: endpoint,
        OutputKey.CLUSTER_CA_DATA: _FAKE_CA,
        OutputKey.KUBERNETES_VERSION: config.kubernetes_version,
        OutputKey.FSX_FILE_SYSTEM_ID: "fs-0123456789abcdef0",
        OutputKey.FSX_DNS_NAME: "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
        OutputKey.FSX_MOUNT_NAME: "abcdefgh",
        OutputKey.FSX_PVC_NAME: FSX_PVC_NAME,
        OutputKey.TRAINING_NAMESPACE: TRAINING_NAMESPACE,
        OutputKey.DATA_BUCKET_NAME: f"{config.name}-storage-databucket-1a2b3c",
        OutputKey.IMAGE_URI: DEPLOYED_IMAGE,
        OutputKey.GPU_NODEGROUP_NAME: f"{config.name}-gpu",
        OutputKey.GPU_INSTANCE_TYPE: config.gpu_nodes.instance_type,
        OutputKey.GPU_NODE_COUNT: str(config.gpu_nodes.desired_size),
    }
    outputs.update(overrides)
    return {str(k.value if isinstance(k, OutputKey) else k): v for k, v in outputs.items()}


def create_stack(name: str, outputs: dict[str, str] | None = None) -> None:
    template = {
        # A parameter is the smallest resource moto's CloudFormation creates without complaint.
        "Resources": {
            "Marker": {
                "Type": "AWS::SSM::Parameter",
                "Properties": {"Name": f"/{name}/marker", "Type": "String", "Value": name},
            }
        },
        "Outputs": {key: {"Value": value} for key, value in (outputs or {}).items()},
    }
    boto3.client("cloudformation", region_name=REGION).create_stack(StackName=name, TemplateBody=json.dumps(template))


def deploy_fake_environment(
    endpoint: str, profile: Profile = "p5", *, gpu_max_size: int | None = None, **overrides: str
) -> None:
    """The three stacks of a deployment, as CloudFormation reports them after `cdk deploy`, and
    the EKS cluster with its GPU node group (scaled as the profile says, or to `gpu_max_size`: a
    node group changed by hand, or a profile edited but not deployed)."""
    config = _config(profile)
    create_stack(config.stack_name("network"))
    create_stack(config.stack_name("storage"))
    outputs = cluster_outputs(endpoint, profile, **overrides)
    create_stack(config.stack_name("cluster"), outputs)
    eks = boto3.client("eks", region_name=REGION)
    subnets = ["subnet-0123456789abcdef0"]  # moto's EKS does not look them up
    eks.create_cluster(
        name=outputs[OutputKey.CLUSTER_NAME.value],
        roleArn=f"arn:aws:iam::{ACCOUNT}:role/{config.name}-cluster",
        resourcesVpcConfig={"subnetIds": subnets},
    )
    nodes = config.gpu_nodes
    max_size = nodes.max_size if gpu_max_size is None else gpu_max_size
    eks.create_nodegroup(
        clusterName=outputs[OutputKey.CLUSTER_NAME.value],
        nodegroupName=outputs[OutputKey.GPU_NODEGROUP_NAME.value],
        nodeRole=f"arn:aws:iam::{ACCOUNT}:role/{config.name}-gpu-node",
        subnets=subnets,
        # As `nvrx-eks capacity up` leaves it: the group is created at 0 and scaled to desired_size.
        scalingConfig={
            "minSize": 0,
            "maxSize": max_size,
            "desiredSize": min(nodes.desired_size, max_size),
        },
    )


def add_fsx_volume(server: KubeApiTestServer) -> None:
    """The claim and volume the cluster stack creates."""
    server.add(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": FSX_PV_NAME},
            "spec": {
                "capacity": {"storage": "4800Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
            },
        }
    )
    server.add(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": FSX_PVC_NAME, "namespace": TRAINING_NAMESPACE},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "volumeName": FSX_PV_NAME,
                "resources": {"requests": {"storage": "4800Gi"}},
            },
        }
    )


@pytest.fixture
def deployed_cluster(aws, k8s_server):
    """The loopback API server as the cluster our stacks deployed (their outputs in moto), with the
    FSx volume bound: what submit, status, logs and delete work against."""
    deploy_fake_environment(k8s_server.url)
    add_fsx_volume(k8s_server)
    return k8s_server


def add_job_pods(
    server: KubeApiTestServer,
    job: str,
    nodes: int,
    *,
    gpus: int = 8,
    phase: str = "Running",
    exit_code: int | None = None,
    restart_attempt: int = 0,
) -> list[str]:
    """The pods the JobSet controller would create for `job` (one per node, Indexed)."""
    names = []
    for index in range(nodes):
        name = f"{job}-worker-0-{index}-x{restart_attempt}"
        state = {"running": {}} if exit_code is None else {"terminated": {"exitCode": exit_code, "reason": "Error"}}
        server.add(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": TRAINING_NAMESPACE,
                    "labels": {
                        JOBSET.pod_label: job,
                        JOBSET_RESTART_ATTEMPT_LABEL: str(restart_attempt),
                        JOB_COMPLETION_INDEX_LABEL: str(index),
                    },
                },
                "spec": {
                    "nodeName": f"ip-10-0-0-{index}.ec2.internal",
                    "containers": [
                        {
                            "name": TRAINER_CONTAINER,
                            "image": DEPLOYED_IMAGE,
                            "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
                        }
                    ],
                    "volumes": [{"name": "fsx", "persistentVolumeClaim": {"claimName": FSX_PVC_NAME}}],
                },
                "status": {
                    "phase": phase,
                    "containerStatuses": [
                        {
                            "name": "trainer",
                            "ready": phase == "Running",
                            "restartCount": 0,
                            "image": DEPLOYED_IMAGE,
                            "imageID": "",
                            "state": state,
                        }
                    ],
                },
            }
        )
        names.append(name)
    return names
