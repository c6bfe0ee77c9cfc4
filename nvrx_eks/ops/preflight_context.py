"""What every preflight check is given and gives back: the context (config, node count, AWS
session) and one result with its fix. Shared by the account checks (preflight.py), the identity
checks (preflight_identity.py) and the checks of an existing cluster (preflight_cluster.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import boto3
from botocore.exceptions import ClientError

from infra.config import DeploymentConfig
from nvrx_eks.facts.instances import InstanceFacts

PASS, FAIL, WARN, SKIP = "PASS", "FAIL", "WARN", "SKIP"


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class PreflightContext:
    config: DeploymentConfig
    nodes: int
    session: boto3.Session
    #: How to learn this machine's egress address; None: preflight.fetch_egress_ip (tests pass their own).
    egress_ip: Callable[[], str] | None = None

    @property
    def facts(self) -> InstanceFacts:
        return self.config.gpu_nodes.facts

    def client(self, service: str):
        return self.session.client(service, region_name=self.config.region)


def error_code(e: ClientError) -> str:
    return e.response.get("Error", {}).get("Code", "")


def denied(e: ClientError) -> bool:
    return error_code(e) in {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"}


def error_result(name: str, e: Exception, permission: str) -> CheckResult:
    if isinstance(e, ClientError) and denied(e):
        return CheckResult(name, FAIL, f"not allowed: {e.response['Error'].get('Message', '')}", f"grant {permission}")
    return CheckResult(name, FAIL, f"could not check: {e}", "retry; if it persists, check the AWS service health page")
