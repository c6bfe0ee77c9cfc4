"""checkov, the security scanner, on what a deployment creates: the synthesized CloudFormation
and the pods of every rendered job. checkov looks inside neither JobSets nor PyTorchJobs, so
their pod templates are lifted out as the batch/v1 Jobs they become, beside the job's
NetworkPolicy. Both scans must be clean under .checkov.yaml, whose every skip has a reason.

checkov lives in its own virtualenv (.venv-checkov, made by scripts/setup_env.sh; its pins
conflict with aws-cdk-lib's); without it these tests skip, saying so. It runs offline
(BC_SKIP_MAPPING: no download of the check-to-guideline mapping).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import REPO_ROOT
from tests.support.manifest_cases import Case

ROOT = REPO_ROOT
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
CONFIG = ROOT / ".checkov.yaml"

pytestmark = [
    pytest.mark.synth,
    pytest.mark.xdist_group("synth"),
    pytest.mark.skipif(
        not CHECKOV.exists(), reason=f"{CHECKOV} is absent; `make setup` (scripts/setup_env.sh) creates it"
    ),
]

#: The CDK-internal resources the CloudFormation skips in .checkov.yaml are for (logical-id
#: prefixes): the kubectl provider's functions and log groups, the VpcRestrictDefaultSG custom
#: resource's handler, and the access-log bucket.
CDK_INTERNAL = ("ClusterKubectlProvider", "CustomVpcRestrictDefaultSGCustomResourceProvider", "AccessLogBucket")


def _checkov(directory: Path, framework: str, *, config: Path | None) -> dict:
    argv = [str(CHECKOV), "-d", str(directory), "--framework", framework, "-o", "json"]
    if config is not None:
        argv += ["--config-file", str(config)]
    # cwd: the scan directory, so checkov does not pick up .checkov.yaml on its own.
    done = subprocess.run(
        argv,
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    report = json.loads(done.stdout)
    [result] = report if isinstance(report, list) else [report]
    assert result["summary"]["parsing_errors"] == 0
    return result


def _failures(result: dict) -> list[str]:
    return [f"{f['check_id']} {f['resource']} ({f['check_name']})" for f in result["results"]["failed_checks"]]


@pytest.fixture(scope="module")
def cloudformation(synth, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("cfn")
    for role, template in synth("p5").templates.items():
        (directory / f"{role}.json").write_text(json.dumps(template))
    return directory


def test_cloudformation_is_clean_with_the_reasoned_skips(cloudformation):
    result = _checkov(cloudformation, "cloudformation", config=CONFIG)
    assert _failures(result) == []
    assert result["summary"]["passed"] > 100


def test_cloudformation_skips_cover_only_cdk_internal_resources(cloudformation):
    skipped = set(yaml.safe_load(CONFIG.read_text())["skip-check"])
    result = _checkov(cloudformation, "cloudformation", config=None)
    failed = result["results"]["failed_checks"]
    assert failed, "nothing fails without the skips: remove the ones no longer needed"
    for finding in failed:
        logical_id = finding["resource"].split(".", 1)[1]
        assert finding["check_id"] in skipped
        assert logical_id.startswith(CDK_INTERNAL), f"{finding['check_id']} on our own resource {logical_id}"


def lifted_jobs(documents: list[dict], suffix: str) -> list[dict]:
    """The pod templates of a JobSet / PyTorchJob as batch/v1 Jobs, and the NetworkPolicy."""
    out = []
    for doc in documents:
        meta = doc["metadata"]
        if doc["kind"] == "JobSet":
            for rj in doc["spec"]["replicatedJobs"]:
                template = rj["template"]
                name = f"{meta['name']}-{suffix}-{rj['name']}"
                out.append(_job(name, meta["namespace"], template["metadata"]["labels"], template["spec"]))
        elif doc["kind"] == "PyTorchJob":
            for replica, spec in doc["spec"]["pytorchReplicaSpecs"].items():
                name = f"{meta['name']}-{suffix}-{replica.lower()}"
                job_spec = {"backoffLimit": 0, "template": spec["template"]}
                out.append(_job(name, meta["namespace"], spec["template"]["metadata"]["labels"], job_spec))
        elif doc["kind"] == "NetworkPolicy":
            out.append({**doc, "metadata": {**meta, "name": f"{meta['name']}-{suffix}"}})
    return out


def _job(name: str, namespace: str, labels: dict, spec: dict) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }


def test_rendered_pods_are_clean_with_the_reasoned_skips(tmp_path):
    documents = []
    for api in ("jobset", "pytorchjob", "fabric"):
        documents += lifted_jobs(Case("p5", api, 2).render().documents, api)
    # The JobSet's workers and coordinator, the PyTorchJob's master and workers, the fabric test.
    assert sum(d["kind"] == "Job" for d in documents) == 5
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump_all(documents))
    result = _checkov(tmp_path, "kubernetes", config=CONFIG)
    assert _failures(result) == []
    passed = {f["check_id"] for f in result["results"]["passed_checks"]}
    # What the pod hardening fixed is now checked and passing, not skipped.
    assert {"CKV2_K8S_6", "CKV_K8S_20", "CKV_K8S_28", "CKV_K8S_31", "CKV_K8S_37", "CKV_K8S_38"} <= passed
