"""preflight's admin principal check against moto's IAM and STS: admin_principal_arn must exist
exactly as written (an SSO role's ARN carries a path that `aws sts get-caller-identity` does not
show) and be the caller, whose assumed-role session is mapped to its role's ARN with iam:GetRole."""

from __future__ import annotations

import boto3
import pytest

from nvrx_eks.ops import preflight
from nvrx_eks.ops.preflight import FAIL, PASS, WARN, PreflightContext
from nvrx_eks.ops.preflight_identity import check_admin_principal
from tests.support import cli_harness
from tests.support.aws_gaps import ServiceError, ServiceGaps
from tests.support.cli_harness import REGION
from tests.unit.ops.test_preflight import OWN_ACCOUNT, become, own_config

aws = cli_harness.aws

SSO_PATH = "/aws-reserved/sso.amazonaws.com/"
SSO_ROLE = "AWSReservedSSO_AdministratorAccess_0123456789abcdef"


@pytest.fixture
def account(aws, monkeypatch):
    monkeypatch.setenv("MOTO_ACCOUNT_ID", OWN_ACCOUNT)


def check(admin: str | None) -> preflight.CheckResult:
    config = own_config(admin_principal_arn=admin)
    return check_admin_principal(PreflightContext(config, 2, boto3.Session(region_name=REGION)))


def test_an_sso_admin_given_with_its_path_who_runs_preflight_passes(account, monkeypatch):
    role = become(monkeypatch, SSO_ROLE, SSO_PATH)
    assert role == f"arn:aws:iam::{OWN_ACCOUNT}:role{SSO_PATH}{SSO_ROLE}"
    result = check(role)
    assert (result.status, result.detail) == (PASS, f"{role} exists, and it is you")


def test_an_sso_role_without_its_path_fails_with_the_full_arn(account, monkeypatch):
    """(deploy N2, first-contact 1) EKS refuses the role without its path: invalid principal."""
    role = become(monkeypatch, SSO_ROLE, SSO_PATH)
    result = check(f"arn:aws:iam::{OWN_ACCOUNT}:role/{SSO_ROLE}")
    assert result.status == FAIL
    assert f"lacks the path of the role's ARN, {role}: EKS access entries need it exactly" in result.detail
    assert result.fix == f"set admin_principal_arn: {role}"


def test_an_admin_role_that_does_not_exist_fails(account, monkeypatch):
    role = become(monkeypatch, "Engineer")
    result = check(f"arn:aws:iam::{OWN_ACCOUNT}:role/Admin")
    assert result.status == FAIL
    assert result.detail.startswith(f"no role Admin in account {OWN_ACCOUNT}: the access entry would fail")
    assert result.fix == f"set admin_principal_arn: {role}"


def test_a_caller_who_is_not_the_admin_fails(account, monkeypatch):
    """Deploys fine, then every nvrx-eks command that reaches the cluster gets 401."""
    boto3.client("iam").create_role(RoleName="Admin", AssumeRolePolicyDocument="{}")
    me = become(monkeypatch, "Engineer")
    admin = f"arn:aws:iam::{OWN_ACCOUNT}:role/Admin"
    result = check(admin)
    assert result.status == FAIL
    assert result.detail.startswith(f"you are {me}, not admin_principal_arn {admin}")
    assert result.fix == f"set admin_principal_arn: {me}, or run nvrx-eks with {admin}'s credentials"


def test_get_role_denied_is_a_warning_with_the_command_to_check_by_hand(account, monkeypatch):
    become(monkeypatch, "Admin")
    session = boto3.Session(region_name=REGION)

    def denied(_params):
        raise ServiceError("AccessDenied", "not authorized to perform iam:GetRole", 403)

    ServiceGaps(session).answer("iam", "GetRole", denied)
    result = check_admin_principal(PreflightContext(own_config(), 2, session))
    assert result.status == WARN and "(iam:GetRole denied)" in result.detail
    assert "aws iam get-role --role-name Admin --query Role.Arn" in result.fix
