"""The node-local checkpoint tier on EKS: the rendered trainer pods mount the job's directory of
the reviewed instance-store root at checkpoint.local.dir, and the validator refuses a job whose
config turns the tier on without that mount."""

from __future__ import annotations

import copy

import pytest
import yaml

from infra import pod_security
from infra.config import resolve_config
from nvrx_eks.jobs.render import render_job
from nvrx_eks.jobs.spec import LOCAL_CHECKPOINT_MOUNT_PATH, build_jobspec
from nvrx_eks.jobs.validate import validate_documents
from tests.support.manifest_cases import GOLDEN_IMAGE, Case
from workloads.config import TrainConfig

POD = "spec.replicatedJobs[0].template.spec.template.spec"


def _pod(documents) -> dict:
    return documents[1]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("profile", ["p5", "g5-smoke"])
def test_rendered_jobset_mounts_the_jobs_node_local_directory_and_validates(profile):
    case = Case(profile, "jobset", 2)
    documents = case.render().documents
    train = yaml.safe_load(documents[0]["data"]["train.yaml"])
    assert train["checkpoint"]["local"]["dir"] == LOCAL_CHECKPOINT_MOUNT_PATH
    assert train["checkpoint"]["local"]["interval_steps"] >= 1
    pod = _pod(documents)
    volume = next(v for v in pod["volumes"] if "hostPath" in v)
    assert volume["hostPath"] == {"path": pod_security.LOCAL_CHECKPOINT_HOST_PATH, "type": "DirectoryOrCreate"}
    assert pod_security.LOCAL_CHECKPOINT_HOST_PATH in pod_security.HOST_PATH_ALLOW_LIST
    assert pod_security.LOCAL_CHECKPOINT_HOST_PATH.startswith(pod_security.NODE_LOCAL_STORAGE_MOUNT + "/")
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
    assert mount == {"name": volume["name"], "mountPath": LOCAL_CHECKPOINT_MOUNT_PATH, "subPath": "train"}
    assert validate_documents(documents, case.expectations()).findings == []


def test_validator_refuses_the_tier_without_its_mount():
    case = Case("p5", "jobset", 2)
    documents = copy.deepcopy(case.render().documents)
    pod = _pod(documents)
    pod["containers"][0]["volumeMounts"] = [
        m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] != LOCAL_CHECKPOINT_MOUNT_PATH
    ]
    pod["volumes"] = [v for v in pod["volumes"] if "hostPath" not in v]
    errors = validate_documents(documents, case.expectations()).errors
    assert [f.path for f in errors] == [f"{POD}.containers[0].volumeMounts"]
    assert "checkpoint.local.interval_steps turns the node-local tier on" in errors[0].message


def test_validator_refuses_a_local_tier_on_fsx():
    case = Case("p5", "jobset", 2)
    documents = copy.deepcopy(case.render().documents)
    documents[0]["data"]["train.yaml"] = documents[0]["data"]["train.yaml"].replace(
        f"dir: {LOCAL_CHECKPOINT_MOUNT_PATH}", "dir: /fsx/local"
    )
    findings = validate_documents(documents, case.expectations()).findings
    assert any(f.path.endswith("checkpoint.local.dir") and "is on FSx" in f.message for f in findings)


def test_tier_off_renders_no_host_path():
    train = TrainConfig.from_dict({"checkpoint": {"local": {"interval_steps": None}}})
    spec = build_jobspec(resolve_config("p5"), nodes=2, name="train", image=GOLDEN_IMAGE, train=train)
    documents = render_job(spec).documents
    assert not any("hostPath" in v for v in _pod(documents)["volumes"])
    assert validate_documents(documents, Case("p5", "jobset", 2).expectations()).findings == []
