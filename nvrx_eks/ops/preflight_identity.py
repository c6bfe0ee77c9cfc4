"""Preflight's identity check: admin_principal_arn names an IAM principal that exists, exactly as
written, and it is who runs nvrx-eks.

Why both matter. The cluster authenticates through EKS access entries only, and the stacks create
one: for admin_principal_arn. EKS's CreateAccessEntry refuses an STS session ARN ("The
principalArn parameter format is not valid") and a role ARN without its path or a principal that
does not exist ("invalid principal"); it does so after the cluster is built, 10-15 minutes in, and
the whole cluster stack rolls back. An IAM Identity Center (SSO) role's ARN has a path
(role/aws-reserved/sso.amazonaws.com/...), which `aws sts get-caller-identity` does not show: it
prints the session, arn:aws:sts::ACCOUNT:assumed-role/NAME/SESSION. iam:GetRole takes the bare
name and answers with the ARN and its path. And a caller other than the admin deploys fine, then
every nvrx-eks command that reaches the cluster (submit, status, logs, `capacity up`'s wait for
nodes, teardown's job deletion) gets 401: no access entry names it. That is a FAIL, not a warning:
a CI role that deploys for a human admin is legitimate, but then that human runs preflight (and
nvrx-eks) with their own credentials, and the check passes for them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from botocore.exceptions import BotoCoreError, ClientError

from nvrx_eks.ops.preflight_context import FAIL, PASS, WARN, CheckResult, PreflightContext, denied, error_code

NAME = "admin principal"
_ARN_RE = re.compile(
    r"^arn:(?P<partition>aws[a-z-]*):(?P<service>iam|sts)::(?P<account>\d{12}):"
    r"(?P<kind>role|user|assumed-role|federated-user|root)(?P<rest>/.*)?$"
)


@dataclass(frozen=True)
class Principal:
    arn: str
    service: str
    account: str
    kind: str
    #: The last component: the role's or user's name (for an assumed role, the role's).
    name: str


def parse(arn: str) -> Principal | None:
    match = _ARN_RE.match(arn)
    if match is None:
        return None
    parts = (match["rest"] or "").strip("/").split("/")
    # assumed-role/NAME/SESSION: the role is the first component; role/PATH/NAME: the last.
    name = parts[0] if match["kind"] == "assumed-role" else parts[-1]
    return Principal(arn, match["service"], match["account"], match["kind"], name)


class _Unresolved(Exception):
    """A principal iam:GetRole/GetUser could not resolve, with what to show for it."""

    def __init__(self, result: CheckResult):
        super().__init__(result.detail)
        self.result = result


def _iam_arn(ctx: PreflightContext, principal: Principal) -> str | None:
    """The principal's IAM ARN, with its path, as IAM reports it; None where it does not exist."""
    iam = ctx.client("iam")
    try:
        if principal.kind in ("role", "assumed-role"):
            return iam.get_role(RoleName=principal.name)["Role"]["Arn"]
        if principal.kind == "user":
            return iam.get_user(UserName=principal.name)["User"]["Arn"]
    except ClientError as e:
        if error_code(e) == "NoSuchEntity":
            return None
        permission = "iam:GetRole" if principal.kind != "user" else "iam:GetUser"
        if denied(e):
            raise _Unresolved(
                CheckResult(
                    NAME,
                    WARN,
                    f"could not look up {principal.arn} ({permission} denied)",
                    f"grant {permission}, or check by hand that admin_principal_arn is the full ARN: aws iam "
                    f"get-role --role-name {principal.name} --query Role.Arn",
                )
            ) from None
        raise
    return principal.arn  # the account root: it has no IAM entity to look up


def _caller(ctx: PreflightContext) -> str | None:
    """The IAM principal behind the credentials: an assumed role mapped to its role's ARN."""
    arn = ctx.client("sts").get_caller_identity()["Arn"]
    principal = parse(arn)
    if principal is None or principal.kind == "federated-user":
        return None
    return _iam_arn(ctx, principal)


def check_admin_principal(ctx: PreflightContext) -> CheckResult:
    admin = ctx.config.admin_principal_arn
    # The config requires it for a deployment of the stacks and refuses STS session ARNs
    # (infra.config.deployment.admin_principal_problem); preflight checks what only AWS can tell.
    assert admin is not None
    try:
        return _check(ctx, admin, _caller(ctx))
    except _Unresolved as e:
        return e.result
    except (ClientError, BotoCoreError) as e:
        return CheckResult(NAME, FAIL, f"could not check: {e}", "retry; if it persists, check the AWS service health")


def _check(ctx: PreflightContext, admin: str, caller: str | None) -> CheckResult:
    principal = parse(admin)
    by_hand = "aws iam get-role --role-name NAME --query Role.Arn prints it"
    if principal is None:
        return CheckResult(NAME, FAIL, f"{admin} is not an IAM role or user ARN", f"give the full ARN: {by_hand}")
    if principal.account != ctx.config.account:
        return CheckResult(
            NAME,
            WARN,
            f"{admin} is in account {principal.account}, not the deployment's {ctx.config.account}: not looked up",
            "make sure it exists there, with its path if it has one",
        )
    real = _iam_arn(ctx, principal)
    if real is None:
        return CheckResult(
            NAME,
            FAIL,
            f"no {principal.kind} {principal.name} in account {principal.account}: the access entry would fail and "
            "the cluster stack roll back",
            f"set admin_principal_arn: {caller}" if caller else f"give an existing role's ARN ({by_hand})",
        )
    if real != admin:
        return CheckResult(
            NAME,
            FAIL,
            f"{admin} lacks the path of the {principal.kind}'s ARN, {real}: EKS access entries need it exactly",
            f"set admin_principal_arn: {real}",
        )
    if caller is not None and caller != admin:
        return CheckResult(
            NAME,
            FAIL,
            f"you are {caller}, not admin_principal_arn {admin}: the cluster's only admin access entry would name "
            "someone else, so nvrx-eks commands that reach it (submit, status, logs, capacity up, teardown) would "
            "get 401",
            f"set admin_principal_arn: {caller}, or run nvrx-eks with {admin}'s credentials",
        )
    return CheckResult(NAME, PASS, f"{admin} exists, and it is you" if caller else f"{admin} exists")
