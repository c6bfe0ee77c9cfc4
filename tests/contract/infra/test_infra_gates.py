"""Offline gates over the synthesized templates: cdk-nag (no unacknowledged finding), cfn-lint
(no error), and the CDK CLI's own `cdk synth --no-lookups` for every shipped profile."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_s3 as s3

from infra.config import PROFILES_DIR
from infra.stacks.nag import CLUSTER_STACK_ACKNOWLEDGMENTS, enable_nag
from nvrx_eks.deploy.cdk_cli import cdk_argv, cdk_environment
from tests.support import REPO_ROOT

ROOT = REPO_ROOT
PROFILES = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))

pytestmark = [pytest.mark.synth, pytest.mark.xdist_group("synth")]

#: cfn-lint warnings accepted on purpose, each with its reason. Anything else fails the gate.
ACCEPTED_CFN_LINT_WARNINGS = {
    "W3005": "CDK-generated DependsOn next to a GetAtt on the same resource (aws-cdk-lib internals)",
    "W3010": "availability zones are pinned on purpose: p5 capacity (and reservations) exist per AZ",
    "W6001": "the cluster stack re-exports storage values so the CLI reads every output from one stack",
}


@pytest.mark.parametrize("profile", PROFILES)
def test_cdk_nag_report_is_clean(synth, profile):
    synthesized = synth(profile)  # synthesis itself raises on an unacknowledged finding
    report = json.loads((synthesized.outdir / "validation-report.json").read_text())
    assert report["pluginReports"] == []


def test_cdk_nag_fails_synth_on_a_new_finding(tmp_path):
    """The gate is live: an unacknowledged finding (a bucket without SSL enforcement, logging,
    ...) makes synthesis fail."""
    app = App(outdir=str(tmp_path), builtin_cloud_formation_validation=False)
    stack = Stack(app, "Leaky")
    s3.Bucket(stack, "Bucket")
    enable_nag(app)
    with pytest.raises(Exception, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    rules = {v["ruleName"] for r in report["pluginReports"] for v in r["violations"]}
    assert "AwsSolutions-S10" in rules  # SSL not enforced


def test_every_acknowledgment_has_a_specific_reason():
    for path, finding_id, reason in CLUSTER_STACK_ACKNOWLEDGMENTS:
        assert finding_id.startswith("AwsSolutions-"), finding_id
        assert len(reason) > 40, (path, finding_id)
    ids = [(p, f) for p, f, _ in CLUSTER_STACK_ACKNOWLEDGMENTS]
    assert len(ids) == len(set(ids)), "duplicate acknowledgment"


def test_cfn_lint_finds_no_errors(synth, tmp_path):
    templates = []
    for profile in PROFILES:
        synthesized = synth(profile)
        for role, stack_name in synthesized.stack_names.items():
            path = tmp_path / f"{stack_name}.template.json"
            path.write_text(json.dumps(synthesized.templates[role]))
            templates.append(str(path))
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    result = subprocess.run(
        [str(cfn_lint), "--format", "json", *templates], capture_output=True, text=True, timeout=300
    )
    # Exit status is a bit field: 2 errors, 4 warnings, 8 informational; 1 means it did not run.
    assert result.returncode & 1 == 0, result.stderr
    findings = json.loads(result.stdout)
    unexpected = [f for f in findings if f["Rule"]["Id"] not in ACCEPTED_CFN_LINT_WARNINGS]
    assert not unexpected, json.dumps(unexpected[:5], indent=1)
    assert all(f["Level"] != "Error" for f in findings)


@pytest.mark.slow
@pytest.mark.parametrize("profile", PROFILES)
def test_cdk_cli_synth_offline_no_lookups(tmp_path, profile):
    """The user's path: the CDK CLI runs app.py; no lookup may be needed (--no-lookups fails
    instead of using dummy values), no credentials, no network."""
    argv = cdk_argv("synth", "--no-lookups", "--no-notices", "--no-validation", "--quiet")
    assert Path(argv[0]).exists(), "run `make setup` (installs the CDK CLI from package.json)"
    # The project's CDK CLI environment (nvrx_eks.deploy.cdk_cli), without credentials or IMDS.
    env = {**cdk_environment(), "AWS_EC2_METADATA_DISABLED": "true"}
    for var in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        env.pop(var, None)
    out = tmp_path / "cdk.out"
    result = subprocess.run(
        [*argv, "-c", f"profile={profile}", "--output", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    templates = sorted(p.name for p in out.glob("*.template.json"))
    assert len(templates) == 3, templates
    shutil.rmtree(out)
