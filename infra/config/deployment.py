"""DeploymentConfig: the one validated description of a training environment.

A profile YAML (infra/profiles/NAME.yaml, or any file given with `-c config=PATH`) is loaded into
this model (infra/config/profiles.py) before any construct is built. Every mistake a user can
make is rejected here or in its section (infra/config/sections.py) with a message that names the
field and the fix; the stacks can then trust what they read.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator, model_validator

from infra.addons import catalog
from infra.config.sections import (
    AddonsConfig,
    EndpointConfig,
    ExistingClusterConfig,
    FsxConfig,
    GpuNodeGroupConfig,
    ImageConfig,
    StrictModel,
    SystemNodeGroupConfig,
    ipv4_network,
)
from nvrx_eks.facts.job_presets import JOB_PRESETS
from nvrx_eks.facts.kubernetes_versions import SUPPORTED_KUBERNETES_VERSIONS, addon_matches_minor, pins_for
from nvrx_eks.facts.names import DEFAULT_DEPLOYMENT_NAME, DEPLOYMENT_TAG_KEY

#: The stacks of one deployment, in deployment order (see infra/stacks/environment.py).
STACK_ROLES = ("network", "storage", "cluster")

#: The fields a pattern decides, with what to say when a value does not match it.
_PATTERNS = {
    "name": (
        re.compile(r"^[a-z][a-z0-9-]{1,30}[a-z0-9]$"),
        "'{}' must be 3-32 lowercase letters, digits or '-', starting with a letter",
    ),
    "account": (re.compile(r"^\d{12}$"), "'{}' is not a 12-digit AWS account id (quote it in YAML)"),
    "region": (re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$"), "'{}' is not an AWS region name such as us-east-1"),
}

#: An IAM role (with its path, if it has one) or user: what an EKS access entry accepts.
_IAM_PRINCIPAL_RE = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/([\w+=,.@-]+/)*[\w+=,.@-]+$")
#: An STS session: `aws sts get-caller-identity` prints this form for an assumed role (SSO included).
_ASSUMED_ROLE_RE = re.compile(r"^arn:aws[a-z-]*:sts::\d{12}:assumed-role/(?P<role>[\w+=,.@-]+)/")
#: How to find a role's full ARN: an SSO role's has a path (aws-reserved/sso.amazonaws.com/...)
#: that its session ARN leaves out, and the role without its path does not exist.
ROLE_ARN_COMMAND = "aws iam get-role --role-name {role} --query Role.Arn"


def admin_principal_problem(arn: str) -> str | None:
    """Why `arn` cannot be the admin principal of an EKS access entry, with the fix; None if it can.
    EKS refuses STS session ARNs ("You can't use the STS session principal type with access
    entries", CreateAccessEntry), and only after the cluster exists, so the stack rolls back."""
    if _IAM_PRINCIPAL_RE.match(arn):
        return None
    assumed = _ASSUMED_ROLE_RE.match(arn)
    if assumed:
        return (
            f"'{arn}' is an STS session (assumed-role) ARN, which EKS access entries refuse, so the cluster stack "
            "would roll back 10-15 minutes into the deploy; give the role's own ARN, including its path: "
            f"`{ROLE_ARN_COMMAND.format(role=assumed.group('role'))}`"
        )
    if arn.startswith("arn:") and ":sts::" in arn:
        return (
            f"'{arn}' is an STS session ARN, which EKS access entries refuse; give the IAM role or user behind "
            f"it (a role's full ARN, including its path: `{ROLE_ARN_COMMAND.format(role='NAME')}`)"
        )
    return (
        f"'{arn}' is not an IAM role or user ARN such as arn:aws:iam::123456789012:role/Admin (a role's full ARN, "
        f"including its path: `{ROLE_ARN_COMMAND.format(role='NAME')}`)"
    )


class DeploymentConfig(StrictModel):
    #: Prefix of the stack names and of the cluster name.
    name: str = DEFAULT_DEPLOYMENT_NAME
    account: str
    region: str
    #: The availability zone of the GPU nodes and the file system (EFA traffic stays in one AZ).
    gpu_availability_zone: str
    #: How many AZs the VPC spans (the GPU AZ plus the next ones of the region).
    vpc_max_azs: Annotated[int, Field(ge=2, le=4)] = 2
    vpc_cidr: str = "10.0.0.0/16"
    kubernetes_version: str = "1.35"
    endpoint: EndpointConfig = EndpointConfig()
    #: The IAM role or user granted cluster admin through an EKS access entry: whoever runs
    #: nvrx-eks and kubectl. Required for a deployment: without it only CloudFormation's execution
    #: role could reach the cluster, and nothing tells you so until after a 40-minute deploy.
    admin_principal_arn: str | None = None
    gpu_nodes: GpuNodeGroupConfig = GpuNodeGroupConfig()
    system_nodes: SystemNodeGroupConfig = SystemNodeGroupConfig()
    fsx: FsxConfig = FsxConfig()
    addons: AddonsConfig = AddonsConfig()
    image: ImageConfig = ImageConfig()
    #: A cluster this project did not create, for the job commands (infra/config/sections.py);
    #: None: the cluster the stacks deploy, read back from their outputs.
    cluster: ExistingClusterConfig | None = None
    #: The job `render`/`submit`/`plan` train without --train-config: a name in
    #: nvrx_eks/facts/job_presets.py. None: none chosen; refused on GPUs a job is sized for, else
    #: the smoke job (nvrx_eks.jobs.spec.default_job_name).
    default_job: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)

    @field_validator("default_job")
    @classmethod
    def _default_job(cls, name: str | None) -> str | None:
        if name is not None and name not in JOB_PRESETS:
            raise ValueError(f"'{name}' is not a job preset; use one of: {', '.join(sorted(JOB_PRESETS))}")
        return name

    @field_validator(*_PATTERNS)
    @classmethod
    def _matches_pattern(cls, value: str | None, info: ValidationInfo) -> str | None:
        pattern, message = _PATTERNS[info.field_name or ""]
        if value is not None and not pattern.match(value):
            raise ValueError(message.format(value))
        return value

    @field_validator("admin_principal_arn")
    @classmethod
    def _admin_principal(cls, arn: str | None) -> str | None:
        problem = None if arn is None else admin_principal_problem(arn)
        if problem:
            raise ValueError(problem)
        return arn

    @field_validator("vpc_cidr")
    @classmethod
    def _vpc_cidr(cls, cidr: str) -> str:
        net = ipv4_network(cidr)
        if not net.is_private or net.prefixlen > 16:
            raise ValueError(
                f"'{cidr}' must be a private /16 (or larger) range, e.g. 10.0.0.0/16: each GPU "
                "node takes hundreds of pod IPs"
            )
        return cidr

    @field_validator("kubernetes_version")
    @classmethod
    def _k8s_version(cls, version: str) -> str:
        if version not in SUPPORTED_KUBERNETES_VERSIONS:
            raise ValueError(
                f"Kubernetes {version} is not supported; use one of "
                f'{", ".join(SUPPORTED_KUBERNETES_VERSIONS)} (quote it in YAML: "1.35")'
            )
        return version

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: dict[str, str]) -> dict[str, str]:
        for key in tags:
            if key.lower().startswith("aws:"):
                raise ValueError(f"tag key '{key}' uses the reserved aws: prefix; rename it")
        return tags

    @model_validator(mode="after")
    def _az_in_region(self) -> DeploymentConfig:
        if not re.fullmatch(re.escape(self.region) + r"[a-z]", self.gpu_availability_zone):
            raise ValueError(
                f"gpu_availability_zone '{self.gpu_availability_zone}' is not an availability zone of "
                f"{self.region}; use {self.region} followed by a letter, e.g. {self.region}a"
            )
        return self

    @model_validator(mode="after")
    def _someone_can_reach_the_cluster(self) -> DeploymentConfig:
        if self.cluster is None and self.admin_principal_arn is None:
            raise ValueError(
                "admin_principal_arn is required: the IAM role or user that runs nvrx-eks and kubectl, granted "
                "cluster admin through an EKS access entry (without it nobody but CloudFormation can reach the "
                f"cluster); a role's full ARN, including its path: `{ROLE_ARN_COMMAND.format(role='NAME')}`"
            )
        return self

    @model_validator(mode="after")
    def _fsx_efa_needs_efa_clients(self) -> DeploymentConfig:
        if self.fsx.efa_enabled and not self.gpu_nodes.facts.fsx_efa_client:
            raise ValueError(
                f"fsx.efa_enabled: {self.gpu_nodes.instance_type} cannot mount FSx for Lustre over EFA "
                "(FSx supports EFA clients on p5, p5e and p5en); set fsx.efa_enabled: false"
            )
        return self

    @model_validator(mode="after")
    def _addon_pins_match_the_minor(self) -> DeploymentConfig:
        for addon in catalog.PER_MINOR_MANAGED_ADDONS:
            field_name = addon.config_field
            version = getattr(self.addons.versions, field_name)
            if version is not None and not addon_matches_minor(addon.name, version, self.kubernetes_version):
                raise ValueError(
                    f"addons.versions.{field_name} '{version}' is a {addon.name} build for another Kubernetes "
                    f"version than kubernetes_version {self.kubernetes_version}; use a "
                    f"v{self.kubernetes_version}.x build (aws eks describe-addon-versions --kubernetes-version "
                    f"{self.kubernetes_version} --addon-name {addon.name}) or remove the field to use the pinned one"
                )
        return self

    @property
    def training_operator_installer_image(self) -> str:
        override = self.addons.versions.training_operator_installer_image
        return override or pins_for(self.kubernetes_version).installer_image

    def stack_name(self, role: str) -> str:
        """CloudFormation stack name of one of the STACK_ROLES."""
        if role not in STACK_ROLES:
            raise ValueError(f"unknown stack role {role!r}; expected one of {STACK_ROLES}")
        return f"{self.name}-{role}"

    @property
    def cluster_name(self) -> str:
        return self.name

    @property
    def control_plane_log_group(self) -> str:
        """Where EKS writes the control-plane logs: a fixed name it writes into if it exists."""
        return f"/aws/eks/{self.cluster_name}/cluster"

    @property
    def gpu_nodegroup_name(self) -> str:
        return f"{self.name}-gpu"

    @property
    def system_nodegroup_name(self) -> str:
        return f"{self.name}-system"

    @property
    def profile_tags(self) -> dict[str, str]:
        """Tags applied to every resource: the user's, plus the deployment tag teardown sweeps by."""
        return {**self.tags, DEPLOYMENT_TAG_KEY: self.name}
