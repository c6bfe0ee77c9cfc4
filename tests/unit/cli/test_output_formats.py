"""`-o table|json|yaml` on the read commands, as kubectl's: the table for people, the same facts as
data on stdout for scripts, and a failing command still exits 2 after printing its data.
(`status -o` is tested against a cluster in tests/unit/jobs/test_existing_cluster.py.)"""

from __future__ import annotations

import json
import urllib.error

import pytest
import yaml

from nvrx_eks.ops import preflight
from tests.support import cli_harness
from tests.support.cli_harness import run_cli

no_credentials = cli_harness.no_credentials


def _parse(output: str, text: str):
    return json.loads(text) if output == "json" else yaml.safe_load(text)


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_validate_prints_the_report_as_data(output):
    rendered = run_cli("render", "--nodes", "2")
    result = run_cli("validate", "-", "-o", output, stdin=rendered.stdout)
    assert result.code == 0, result.output
    report = _parse(output, result.stdout)
    assert {k: report[k] for k in ("valid", "documents_checked", "skipped_layers")} == {
        "valid": True,
        "documents_checked": 3,
        "skipped_layers": [],
    }
    # A warning is valid, and still data: the offline render's placeholder image.
    [finding] = report["findings"]
    assert finding["severity"] == "warning" and finding["document"] == "JobSet/train"
    assert finding["path"].endswith("containers[0].image") and "offline placeholder" in finding["message"]


def test_validate_of_a_broken_manifest_prints_its_findings_then_exits_2():
    text = run_cli("render", "--nodes", "2").stdout.replace("vpc.amazonaws.com/efa: 32", "vpc.amazonaws.com/efa: 8")
    result = run_cli("validate", "-", "-o", "json", stdin=text)
    assert result.code == 2 and "failed validation" in result.stderr
    report = json.loads(result.stdout)
    assert report["valid"] is False
    paths = {f["path"] for f in report["findings"] if f["severity"] == "error"}
    assert any(p.endswith('limits["vpc.amazonaws.com/efa"]') for p in paths)
    assert any(p.endswith('requests["vpc.amazonaws.com/efa"]') for p in paths)
    assert "Validation findings" not in result.output  # no table beside the data


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_preflight_prints_every_check_as_data(output, no_credentials, monkeypatch):
    def unreachable():
        raise urllib.error.URLError("tests do not reach the network")

    monkeypatch.setattr(preflight, "fetch_egress_ip", unreachable)
    result = run_cli("preflight", "-o", output)
    assert result.code == 2  # no credentials, and the shipped profile's placeholders
    data = _parse(output, result.stdout)
    assert data["passed"] is False
    checks = {c["name"]: c for c in data["checks"]}
    assert checks["AWS credentials"]["status"] == "FAIL" and "AWS_PROFILE" in checks["AWS credentials"]["fix"]
    assert checks["profile has no placeholders"]["status"] == "FAIL"
    assert [c["status"] for c in data["checks"][1:7]] == ["SKIP"] * 6
    assert set(data["checks"][0]) == {"name", "status", "detail", "fix"}


def test_plan_as_yaml_is_the_same_data_as_json():
    as_json = run_cli("plan", "-o", "json")
    as_yaml = run_cli("plan", "-o", "yaml")
    assert as_json.code == as_yaml.code == 0, as_yaml.output
    assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)


@pytest.mark.parametrize("command", [["plan"], ["validate"], ["status"], ["preflight"]])
def test_an_unknown_format_is_refused_naming_the_choices(command):
    result = run_cli(*command, "-o", "xml")
    assert result.code == 2
    assert "-o/--output 'xml': use table, json or yaml" in result.stderr and "Traceback" not in result.output
