"""What every preflight check is given and gives back: the context (config, node count, AWS
session), one result with its fix, and the record that puts a check in a preflight table. Shared by
the account checks (preflight.py), the identity checks (preflight_identity.py) and the checks of an
existing cluster (preflight_cluster.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, ParamSpec, TypeVar

import boto3
from botocore.exceptions import ClientError

from infra.config import DeploymentConfig
from nvrx_eks.facts.instances import InstanceFacts

PASS, FAIL, WARN, SKIP = "PASS", "FAIL", "WARN", "SKIP"

Given = ParamSpec("Given")
T = TypeVar("T")


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
    #: What once() has looked up in this run.
    _looked_up: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def facts(self) -> InstanceFacts:
        return self.config.gpu_nodes.facts

    def client(self, service: str):
        return self.session.client(service, region_name=self.config.region)

    def once(self, look_up: Callable[[PreflightContext], T]) -> T:
        """look_up(self), asked of AWS once in this run however many checks read it (the capacity
        reservation: its own row, and the vCPU quota it covers)."""
        if look_up not in self._looked_up:
            self._looked_up[look_up] = look_up(self)
        return self._looked_up[look_up]


@dataclass(frozen=True)
class Check(Generic[Given]):
    """One row of a preflight table. A check that needs access (working AWS credentials; a usable
    kubeconfig context) is not run when the check of that access, the run's first row, fails: it is
    a SKIP row under `name`. A check that runs names its row itself, often more exactly (the
    instance type and the AZ it looked for)."""

    name: str
    run: Callable[Given, CheckResult]
    #: False: it needs neither credentials nor the cluster, and runs either way.
    needs_access: bool = True

    def skipped(self, why: str) -> CheckResult:
        return CheckResult(self.name, SKIP, why)


def error_code(e: ClientError) -> str:
    return e.response.get("Error", {}).get("Code", "")


def denied(e: ClientError) -> bool:
    return error_code(e) in {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"}


def error_result(name: str, e: Exception, permission: str) -> CheckResult:
    if isinstance(e, ClientError) and denied(e):
        return CheckResult(name, FAIL, f"not allowed: {e.response['Error'].get('Message', '')}", f"grant {permission}")
    return CheckResult(name, FAIL, f"could not check: {e}", "retry; if it persists, check the AWS service health page")
