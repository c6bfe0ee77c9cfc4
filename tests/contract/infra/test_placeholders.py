"""Documentation placeholders (infra/config/placeholders.py): what counts as one, and synth's
warning, one line per field with its fix, while synthesis still succeeds (the offline rehearsal
synthesizes the shipped profiles as they are). Preflight's failure is in tests/unit/ops/test_preflight.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from infra.config import PROFILES_DIR, documentation_placeholders, resolve_config
from infra.config.placeholders import is_documentation_cidr
from nvrx_eks.deploy.synth import cdk_context
from tests.support import REPO_ROOT
from tests.support.cli_process import WIDE_TERMINAL, cli_process
from tests.support.profiles import config_with

SHIPPED = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))
FIELDS = ["account", "admin_principal_arn", "endpoint.public_cidrs"]
#: A user's own values (198.18.0.0/15 is RFC 2544 benchmarking space, not documentation).
OWN = {
    "account": "210987654321",
    "admin_principal_arn": "arn:aws:iam::210987654321:role/Admin",
    "endpoint__public_cidrs": ["198.18.7.0/24"],
}


@pytest.mark.parametrize("profile", SHIPPED)
def test_every_shipped_profile_carries_the_three_placeholders(profile):
    assert [p.field for p in documentation_placeholders(resolve_config(profile))] == FIELDS


def test_the_admin_principal_fix_names_the_roles_full_arn():
    """An SSO role's ARN has a path its session ARN leaves out; the role without it does not
    exist, and EKS refuses both the session ARN and the pathless one."""
    (admin,) = [p for p in documentation_placeholders(resolve_config("p5")) if p.field == "admin_principal_arn"]
    assert "including its path (`aws iam get-role --role-name NAME --query Role.Arn`" in admin.fix
    assert "role/<name>" not in admin.fix


def test_a_users_own_values_are_no_placeholders():
    assert documentation_placeholders(config_with(**OWN)) == []


@pytest.mark.parametrize(
    "cidr, placeholder",
    [
        ("192.0.2.0/24", True),
        ("198.51.100.7/32", True),
        ("203.0.113.128/25", True),
        ("203.0.0.0/16", False),  # a real range that merely contains TEST-NET-3
        ("198.18.7.0/24", False),
        ("10.0.0.0/8", False),
    ],
)
def test_a_documentation_cidr_lies_inside_an_rfc_5737_network(cidr, placeholder):
    assert is_documentation_cidr(cidr) is placeholder


def _warnings(stream: str) -> list[str]:
    return [line for line in stream.splitlines() if line.startswith("warning:")]


def _expect_one_line_per_field(lines: list[str]) -> None:
    assert [line.split(":")[1].strip() for line in lines] == FIELDS, lines
    assert lines[0] == (
        "warning: account: 111122223333 is a documentation placeholder; set it to the 12-digit id of the "
        "account you deploy to (aws sts get-caller-identity --query Account)"
    )
    assert "set it to the IAM role or user" in lines[1]
    assert lines[2].startswith("warning: endpoint.public_cidrs: 203.0.113.0/24 is a documentation placeholder; ")


def test_cdk_app_warns_per_placeholder_and_still_synthesizes(tmp_path):
    """The path `cdk synth|deploy` takes: the CDK CLI runs app.py with the context in CDK_CONTEXT_JSON."""
    outdir = tmp_path / "cdk.out"
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps({**cdk_context(), "profile": "g5-smoke"})}
    env["CDK_OUTDIR"] = str(outdir)
    result = subprocess.run(
        [sys.executable, "app.py"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _expect_one_line_per_field(_warnings(result.stderr))
    assert len(list(outdir.glob("*.template.json"))) == 3


def test_nvrx_eks_synth_warns_per_placeholder_and_still_synthesizes():
    result = cli_process("synth", "--profile", "g5-smoke", env={**os.environ, **WIDE_TERMINAL}, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # soft_wrap: each warning stays one line whatever the terminal width.
    _expect_one_line_per_field(_warnings(result.stdout))
    assert "0 unacknowledged findings" in result.stdout


def test_no_warning_for_a_profile_with_the_users_own_values(tmp_path):
    from tests.support.profiles import profile_file

    path = profile_file(tmp_path, "g5-smoke", **OWN)
    result = cli_process("synth", "--config", str(path), env={**os.environ, **WIDE_TERMINAL}, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert _warnings(result.stdout) == []
