"""Read a deployed environment back from CloudFormation: the outputs of the `<name>-cluster` stack.

The keys are the ones nvrx_eks/facts/stack_outputs.py defines; the stacks emit exactly those, so nothing here
retypes an output name. Every way this can go wrong for a user (no credentials, nothing deployed
yet, a stack still rolling out or rolled back, an older deployment lacking an output) ends in a
ConfigError that says what to do next.
"""

from __future__ import annotations

from dataclasses import dataclass

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

from infra.config import DeploymentConfig
from nvrx_eks.deploy.deployment import Deployment
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.stack_outputs import REQUIRED_OUTPUTS, OutputKey

#: Stack states in which the outputs are those of a finished deployment.
_USABLE_STATES = {"CREATE_COMPLETE", "UPDATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE", "IMPORT_COMPLETE"}


@dataclass(frozen=True)
class StackOutputs:
    """The cluster stack's outputs, by key, with typed accessors for the ones the CLI uses."""

    stack_name: str
    values: dict[OutputKey, str]

    def __getitem__(self, key: OutputKey) -> str:
        return self.values[key]

    @property
    def cluster_name(self) -> str:
        return self.values[OutputKey.CLUSTER_NAME]

    @property
    def region(self) -> str:
        return self.values[OutputKey.REGION]

    @property
    def endpoint(self) -> str:
        return self.values[OutputKey.CLUSTER_ENDPOINT]

    @property
    def certificate_authority_data(self) -> str:
        return self.values[OutputKey.CLUSTER_CA_DATA]

    @property
    def kubernetes_version(self) -> str:
        return self.values[OutputKey.KUBERNETES_VERSION]

    @property
    def namespace(self) -> str:
        return self.values[OutputKey.TRAINING_NAMESPACE]

    @property
    def pvc_name(self) -> str:
        return self.values[OutputKey.FSX_PVC_NAME]

    @property
    def image_uri(self) -> str:
        return self.values[OutputKey.IMAGE_URI]

    @property
    def instance_type(self) -> str:
        return self.values[OutputKey.GPU_INSTANCE_TYPE]

    @property
    def node_count(self) -> int:
        return int(self.values[OutputKey.GPU_NODE_COUNT])

    @property
    def fsx_file_system_id(self) -> str:
        return self.values[OutputKey.FSX_FILE_SYSTEM_ID]

    @property
    def data_bucket_name(self) -> str:
        return self.values[OutputKey.DATA_BUCKET_NAME]


def aws_session(config: DeploymentConfig) -> boto3.Session:
    return boto3.Session(region_name=config.region)


def describe_stack(session: boto3.Session, name: str, config: DeploymentConfig) -> dict | None:
    """The stack's description, or None when no such stack exists (never deployed, or deleted)."""
    cfn = session.client("cloudformation")
    try:
        return cfn.describe_stacks(StackName=name)["Stacks"][0]
    except ClientError as e:
        error = e.response.get("Error", {})
        if error.get("Code") == "ValidationError" and "does not exist" in error.get("Message", ""):
            return None
        raise aws_error(e, config, f"reading stack {name}") from None
    except BotoCoreError as e:
        raise aws_error(e, config, f"reading stack {name}") from None


def read_stack_outputs(deployment: Deployment, session: boto3.Session | None = None) -> StackOutputs:
    """The cluster stack's outputs; ConfigError (with the fix) if they cannot be used."""
    config = deployment.config
    session = session or aws_session(config)
    name = config.stack_name("cluster")
    stack = describe_stack(session, name, config)
    if stack is None:
        raise ConfigError(
            f"stack {name} does not exist in account {config.account} region {config.region}: "
            f"nothing is deployed for this profile yet; deploy it first with `{deployment.deploy_command}`"
        )
    status = stack["StackStatus"]
    if status not in _USABLE_STATES:
        if status.endswith("_IN_PROGRESS"):
            fix = "wait for it to finish (cdk deploy prints progress), then retry"
        else:
            fix = "look at its events in the CloudFormation console, fix the cause and deploy again"
        raise ConfigError(f"stack {name} is {status}, so its outputs cannot be trusted; {fix}")
    found = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    missing = [key.value for key in REQUIRED_OUTPUTS if key.value not in found]
    if missing:
        raise ConfigError(
            f"stack {name} lacks the outputs {', '.join(missing)}: it was deployed by an older "
            f"version of this project; deploy again with this version: `{deployment.deploy_command}`"
        )
    return StackOutputs(name, {key: found[key.value] for key in REQUIRED_OUTPUTS})


def aws_error(error: Exception, config: DeploymentConfig, doing: str) -> ConfigError:
    """A user-facing message for the AWS failures a user can fix (credentials, permissions)."""
    if isinstance(error, NoCredentialsError):
        return ConfigError(
            f"no AWS credentials found while {doing}; configure them (AWS_PROFILE, "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or `aws configure sso`) for account "
            f"{config.account} and retry"
        )
    if isinstance(error, NoRegionError):
        return ConfigError(f"no AWS region while {doing}; set region in the profile")
    if isinstance(error, ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        message = error.response.get("Error", {}).get("Message", "")
        if code in {"ExpiredToken", "ExpiredTokenException", "RequestExpired"}:
            return ConfigError(f"your AWS credentials have expired ({doing}); refresh them and retry")
        if code in {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "InvalidClientTokenId"}:
            return ConfigError(
                f"AWS denied {doing}: {code}: {message}; use credentials for account {config.account} "
                "that are allowed to do this"
            )
        return ConfigError(f"AWS error while {doing}: {code}: {message}")
    return ConfigError(f"AWS error while {doing}: {error}")
