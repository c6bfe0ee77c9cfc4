"""A Kubernetes API client for the deployed EKS cluster, built in memory.

Authentication is what `aws eks get-token` does, with boto3: presign an STS GetCallerIdentity
request that carries the header `x-k8s-aws-id: <cluster name>`, and send the URL, base64url-encoded
without padding and prefixed with `k8s-aws-v1.`, as the bearer token. The EKS authenticator replays
the URL against STS to learn who is calling. No kubeconfig, `aws` CLI or `kubectl` is involved; the
token is refreshed before it expires (EKS accepts one for 15 minutes), so long `logs -f` and status
watches keep working.
"""

from __future__ import annotations

import atexit
import base64
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import urllib3
from botocore.exceptions import BotoCoreError, ClientError
from kubernetes import client as k8s

from infra.config import DeploymentConfig
from nvrx_eks.deploy.stack_outputs import StackOutputs, aws_error

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_ID_HEADER = "x-k8s-aws-id"
#: Lifetime of the presigned URL as `aws eks get-token` sets it; the authenticator itself accepts
#: a token for 15 minutes after signing, so we refresh well before that.
PRESIGN_EXPIRES_S = 60
TOKEN_REFRESH_AFTER_S = 10 * 60
CONNECT_TIMEOUT_S = 15


@dataclass
class EksToken:
    value: str
    created_at: float = field(default_factory=time.monotonic)

    @property
    def stale(self) -> bool:
        return time.monotonic() - self.created_at > TOKEN_REFRESH_AFTER_S


def eks_token(session: boto3.Session, cluster_name: str, region: str) -> EksToken:
    """A bearer token for the EKS cluster named `cluster_name`, as `aws eks get-token` makes it."""
    # Regional STS endpoint: the authenticator accepts the region's own STS host, and the global
    # endpoint may be disabled in opt-in regions.
    sts = session.client("sts", region_name=region, endpoint_url=f"https://sts.{region}.amazonaws.com")

    def add_cluster_header(request, **_kwargs):
        request.headers[CLUSTER_ID_HEADER] = cluster_name

    # The header must be part of the signature: the authenticator rejects tokens without it, which
    # is what stops a token for one cluster from being replayed against another.
    sts.meta.events.register("before-sign.sts.GetCallerIdentity", add_cluster_header)
    url = sts.generate_presigned_url("get_caller_identity", Params={}, ExpiresIn=PRESIGN_EXPIRES_S, HttpMethod="GET")
    encoded = base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")
    return EksToken(TOKEN_PREFIX + encoded)


def _write_ca_file(ca_data_b64: str) -> str:
    """The client library wants a CA bundle path: a private temp file, removed at exit."""
    fd, path = tempfile.mkstemp(prefix="nvrx-eks-ca-", suffix=".crt")
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(ca_data_b64))
    atexit.register(Path(path).unlink, missing_ok=True)
    return path


def client_configuration(host: str, token_source, ca_data_b64: str | None = None) -> k8s.Configuration:
    """A Configuration whose bearer token comes from `token_source()` and is refreshed when stale."""
    configuration = k8s.Configuration()
    configuration.host = host.rstrip("/")
    if ca_data_b64:
        configuration.ssl_ca_cert = _write_ca_file(ca_data_b64)
        configuration.verify_ssl = True
    token = token_source()

    # The header value carries its own "Bearer " prefix: client versions disagree on which key
    # the prefix is looked up under, but all send api_key["authorization"] as the header.
    def refresh(cfg: k8s.Configuration) -> None:
        nonlocal token
        if token.stale:
            token = token_source()
        cfg.api_key["authorization"] = f"Bearer {token.value}"

    configuration.api_key = {"authorization": f"Bearer {token.value}"}
    configuration.refresh_api_key_hook = refresh
    return configuration


def api_client_for(
    outputs: StackOutputs, config: DeploymentConfig, session: boto3.Session | None = None
) -> k8s.ApiClient:
    """An ApiClient for the deployed cluster, from its stack outputs and the caller's AWS identity."""
    session = session or boto3.Session(region_name=outputs.region)

    def token_source() -> EksToken:
        try:
            return eks_token(session, outputs.cluster_name, outputs.region)
        except (BotoCoreError, ClientError) as e:
            raise aws_error(e, config, "signing the EKS authentication token") from None

    api_client = k8s.ApiClient(client_configuration(outputs.endpoint, token_source, outputs.certificate_authority_data))
    # Without a connect timeout, a private endpoint seen from outside the VPC hangs for minutes
    # (the OS's SYN retries) before the CLI can say what is wrong. Reads stay unbounded for
    # `logs -f`.
    api_client.rest_client.pool_manager.connection_pool_kw["timeout"] = urllib3.Timeout(
        connect=CONNECT_TIMEOUT_S, read=None
    )
    return api_client
