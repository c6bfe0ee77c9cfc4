"""`validate` holds every pod to Pod Security baseline (infra/pod_security.py) and to the job's own
directories (the claim writable only in its run directory, the local tier only in its own
subdirectory, the pods labelled as the job's NetworkPolicy selects): hostile variants of a rendered
JobSet, each rejected at the path of the offending field, and what is allowed still passes."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import yaml

from infra.pod_security import APPARMOR_ANNOTATION_PREFIX, LOCAL_CHECKPOINT_HOST_PATH, pss_baseline_violations
from nvrx_eks.facts.job_names import APP_INSTANCE_LABEL, APP_NAME_LABEL
from nvrx_eks.jobs.validate import validate_documents
from nvrx_eks.jobs.validate.findings import format_path
from tests.support.manifest_cases import GOLDEN_DIR, Case

CASE = Case("p5", "jobset", 2)
TEMPLATE = ["spec", "replicatedJobs", 0, "template", "spec", "template"]
POD = [*TEMPLATE, "spec"]
CONTAINER = [*POD, "containers", 0]
COORDINATOR_TEMPLATE = ["spec", "replicatedJobs", 1, "template", "spec", "template"]


def _documents() -> list[dict]:
    return [d for d in yaml.safe_load_all((GOLDEN_DIR / f"{CASE.id}.yaml").read_text()) if d]


def _job(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] == "JobSet")


def _pod(docs: list[dict]) -> dict:
    return _job(docs)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def _security(docs: list[dict]) -> dict:
    return _pod(docs)["containers"][0]["securityContext"]


def _local_tier_mount(docs: list[dict]) -> tuple[int, dict]:
    """The trainer's mount of the node-local checkpoint tier (its index and the mount)."""
    volume = next(v["name"] for v in _pod(docs)["volumes"] if "hostPath" in v)
    mounts = _pod(docs)["containers"][0]["volumeMounts"]
    return next((i, m) for i, m in enumerate(mounts) if m["name"] == volume)


def _local_tier_path(docs: list[dict], field: str) -> list:
    return [*CONTAINER, "volumeMounts", _local_tier_mount(docs)[0], field]


def _add_init_container(docs: list[dict], security_context: dict) -> None:
    _pod(docs)["initContainers"] = [{"name": "init", "image": "busybox:1.36", "securityContext": security_context}]


def _template(docs: list[dict], index: int = 0) -> dict:
    return _job(docs)["spec"]["replicatedJobs"][index]["template"]["spec"]["template"]


def _claim_mount(docs: list[dict], mount_path: str) -> tuple[int, dict]:
    """The trainer's mount of the FSx claim at `mount_path` (its index and the mount)."""
    mounts = _pod(docs)["containers"][0]["volumeMounts"]
    return next((i, m) for i, m in enumerate(mounts) if m["name"] == "fsx" and m["mountPath"] == mount_path)


def _claim_path(docs: list[dict], mount_path: str) -> list:
    return [*CONTAINER, "volumeMounts", _claim_mount(docs, mount_path)[0], "readOnly"]


def _run_dir_mount_at(sub_path: str) -> Callable[[list], None]:
    """The run directory's writable mount pointed at `sub_path` of the claim instead."""
    return lambda d: _claim_mount(d, "/fsx/runs/train")[1].update(subPath=sub_path)


def _claim_in_another_container(section: str) -> Callable[[list], None]:
    mount = {"name": "fsx", "mountPath": "/data"}
    return lambda d: (
        _pod(d).setdefault(section, []).append({"name": "side", "image": "busybox:1.36", "volumeMounts": [mount]})
    )


# (id, mutation, path of the offending field in the JobSet; a callable when it depends on the documents)
HOSTILE: list[tuple[str, Callable[[list], None], list | Callable[[list], list]]] = [
    (
        "procMount Unmasked",
        lambda d: _security(d).update(procMount="Unmasked"),
        [*CONTAINER, "securityContext", "procMount"],
    ),
    (
        "unsafe sysctl",
        lambda d: _pod(d)["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "65536"}]),
        [*POD, "securityContext", "sysctls", 0, "name"],
    ),
    (
        "AppArmor Unconfined on the pod",
        lambda d: _pod(d)["securityContext"].update(appArmorProfile={"type": "Unconfined"}),
        [*POD, "securityContext", "appArmorProfile", "type"],
    ),
    (
        "AppArmor Unconfined on the container",
        lambda d: _security(d).update(appArmorProfile={"type": "Unconfined"}),
        [*CONTAINER, "securityContext", "appArmorProfile", "type"],
    ),
    (
        "AppArmor unconfined annotation",
        lambda d: _job(d)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"].update(
            annotations={f"{APPARMOR_ANNOTATION_PREFIX}trainer": "unconfined"}
        ),
        [*TEMPLATE, "metadata", "annotations", f"{APPARMOR_ANNOTATION_PREFIX}trainer"],
    ),
    (
        "SELinux type spc_t on the pod",
        lambda d: _pod(d)["securityContext"].update(seLinuxOptions={"type": "spc_t"}),
        [*POD, "securityContext", "seLinuxOptions", "type"],
    ),
    (
        "SELinux type spc_t on the container",
        lambda d: _security(d).update(seLinuxOptions={"type": "spc_t"}),
        [*CONTAINER, "securityContext", "seLinuxOptions", "type"],
    ),
    (
        "SELinux user",
        lambda d: _security(d).update(seLinuxOptions={"user": "system_u"}),
        [*CONTAINER, "securityContext", "seLinuxOptions", "user"],
    ),
    (
        "SELinux role",
        lambda d: _pod(d)["securityContext"].update(seLinuxOptions={"role": "system_r"}),
        [*POD, "securityContext", "seLinuxOptions", "role"],
    ),
    (
        "seccomp Unconfined on the container, RuntimeDefault on the pod",
        lambda d: _security(d).update(seccompProfile={"type": "Unconfined"}),
        [*CONTAINER, "securityContext", "seccompProfile", "type"],
    ),
    (
        "seccomp Unconfined on an init container",
        lambda d: _add_init_container(d, {"seccompProfile": {"type": "Unconfined"}}),
        [*POD, "initContainers", 0, "securityContext", "seccompProfile", "type"],
    ),
    (
        "windows hostProcess on the pod",
        lambda d: _pod(d)["securityContext"].update(windowsOptions={"hostProcess": True}),
        [*POD, "securityContext", "windowsOptions", "hostProcess"],
    ),
    (
        "windows hostProcess on the container",
        lambda d: _security(d).update(windowsOptions={"hostProcess": True}),
        [*CONTAINER, "securityContext", "windowsOptions", "hostProcess"],
    ),
    (
        "probe with a host",
        lambda d: _pod(d)["containers"][0].update(
            livenessProbe={"httpGet": {"host": "169.254.169.254", "path": "/", "port": 80}}
        ),
        [*CONTAINER, "livenessProbe", "httpGet", "host"],
    ),
    (
        "lifecycle hook with a host",
        lambda d: _pod(d)["containers"][0].update(
            lifecycle={"preStop": {"tcpSocket": {"host": "10.0.0.1", "port": 22}}}
        ),
        [*CONTAINER, "lifecycle", "preStop", "tcpSocket", "host"],
    ),
    (
        "the whole local tier mounted",
        lambda d: _local_tier_mount(d)[1].pop("subPath"),
        lambda d: _local_tier_path(d, "subPath"),
    ),
    (
        "the local tier mounted with an empty subPath",
        lambda d: _local_tier_mount(d)[1].update(subPath=""),
        lambda d: _local_tier_path(d, "subPath"),
    ),
    (
        "a subPath out of the local tier",
        lambda d: _local_tier_mount(d)[1].update(subPath="../../etc"),
        lambda d: _local_tier_path(d, "subPath"),
    ),
    (
        "a subPathExpr",
        lambda d: _local_tier_mount(d)[1].update(subPathExpr="$(POD_NAME)"),
        lambda d: _local_tier_path(d, "subPathExpr"),
    ),
    # The job's own directories: the local tier by its own subdirectory alone (V3, V4) ...
    (
        "the local tier's root, as '.'",
        lambda d: _local_tier_mount(d)[1].update(subPath="."),
        lambda d: _local_tier_path(d, "subPath"),
    ),
    (
        "the local tier's root, as './'",
        lambda d: _local_tier_mount(d)[1].update(subPath="./"),
        lambda d: _local_tier_path(d, "subPath"),
    ),
    (
        "another job's local-tier directory",
        lambda d: _local_tier_mount(d)[1].update(subPath="other-job"),
        lambda d: _local_tier_path(d, "subPath"),
    ),
    # ... the claim writable only in its own run directory (V5, V6) ...
    (
        "the claim writable at /fsx",
        lambda d: _claim_mount(d, "/fsx")[1].pop("readOnly"),
        lambda d: _claim_path(d, "/fsx"),
    ),
    (
        "the claim at /fsx with readOnly false",
        lambda d: _claim_mount(d, "/fsx")[1].update(readOnly=False),
        lambda d: _claim_path(d, "/fsx"),
    ),
    ("the claim's root writable, as '.'", _run_dir_mount_at("."), lambda d: _claim_path(d, "/fsx/runs/train")),
    ("every run writable", _run_dir_mount_at("runs"), lambda d: _claim_path(d, "/fsx/runs/train")),
    ("another job's run writable", _run_dir_mount_at("runs/other-job"), lambda d: _claim_path(d, "/fsx/runs/train")),
    (
        "a run whose name only begins with the job's",
        _run_dir_mount_at("runs/train2"),
        lambda d: _claim_path(d, "/fsx/runs/train"),
    ),
    (
        "a second container with the claim writable",
        _claim_in_another_container("containers"),
        [*POD, "containers", 1, "volumeMounts", 0, "readOnly"],
    ),
    (
        "an init container with the claim writable",
        _claim_in_another_container("initContainers"),
        [*POD, "initContainers", 0, "volumeMounts", 0, "readOnly"],
    ),
    (
        "a pod without its job label writing the run directory",
        lambda d: _template(d)["metadata"]["labels"].pop(APP_INSTANCE_LABEL),
        lambda d: _claim_path(d, "/fsx/runs/train"),
    ),
    (
        "a pod without its job label on the local tier",
        lambda d: _template(d)["metadata"]["labels"].pop(APP_INSTANCE_LABEL),
        lambda d: _local_tier_path(d, "subPath"),
    ),
    (
        "a pod labelled as another job",
        lambda d: _template(d)["metadata"]["labels"].update({APP_INSTANCE_LABEL: "other"}),
        lambda d: _claim_path(d, "/fsx/runs/train"),
    ),
    # ... and every pod labelled as the job's NetworkPolicy selects (V8).
    (
        "worker pods labelled as another job",
        lambda d: _template(d)["metadata"]["labels"].update({APP_INSTANCE_LABEL: "other"}),
        [*TEMPLATE, "metadata", "labels", APP_INSTANCE_LABEL],
    ),
    (
        "the coordinator's pod labelled as another job",
        lambda d: _template(d, 1)["metadata"]["labels"].update({APP_INSTANCE_LABEL: "other"}),
        [*COORDINATOR_TEMPLATE, "metadata", "labels", APP_INSTANCE_LABEL],
    ),
    (
        "worker pods of another app",
        lambda d: _template(d)["metadata"]["labels"].update({APP_NAME_LABEL: "other-app"}),
        [*TEMPLATE, "metadata", "labels", APP_NAME_LABEL],
    ),
    (
        "the job labelled as another job",
        lambda d: _job(d)["metadata"]["labels"].update({APP_INSTANCE_LABEL: "other"}),
        ["metadata", "labels", APP_INSTANCE_LABEL],
    ),
]


def test_the_golden_jobset_passes():
    assert validate_documents(_documents(), CASE.expectations()).errors == []


@pytest.mark.parametrize("variant, mutate, path", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_each_baseline_violation_is_rejected_at_its_path(variant, mutate, path):
    documents = _documents()
    mutate(documents)
    expected = format_path(path(documents) if callable(path) else path)
    found = [(f.document, f.path) for f in validate_documents(documents, CASE.expectations()).errors]
    assert ("JobSet/train", expected) in found, f"{variant}: expected {expected}, got {found}"


def _claim_volume_read_only(docs: list[dict]) -> None:
    """The claim's volume read-only as a whole: no mount of it can write, whatever it says."""
    next(v for v in _pod(docs)["volumes"] if v["name"] == "fsx")["persistentVolumeClaim"]["readOnly"] = True
    _claim_mount(docs, "/fsx")[1].pop("readOnly")
    _claim_mount(docs, "/fsx/runs/train")[1]["subPath"] = "runs/other-job"


ALLOWED: list[tuple[str, Callable[[list], None]]] = [
    (
        "safe sysctls",
        lambda d: _pod(d)["securityContext"].update(
            sysctls=[
                {"name": "net.ipv4.tcp_keepalive_time", "value": "60"},
                {"name": "kernel.shm_rmid_forced", "value": "1"},
            ]
        ),
    ),
    ("SELinux container_engine_t", lambda d: _security(d).update(seLinuxOptions={"type": "container_engine_t"})),
    ("SELinux level alone", lambda d: _pod(d)["securityContext"].update(seLinuxOptions={"level": "s0:c1,c2"})),
    ("AppArmor RuntimeDefault", lambda d: _security(d).update(appArmorProfile={"type": "RuntimeDefault"})),
    (
        "AppArmor localhost annotation",
        lambda d: _job(d)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"].update(
            annotations={f"{APPARMOR_ANNOTATION_PREFIX}trainer": "localhost/trainer"}
        ),
    ),
    ("procMount Default", lambda d: _security(d).update(procMount="Default")),
    (
        "a probe on the pod's own port",
        lambda d: _pod(d)["containers"][0].update(livenessProbe={"tcpSocket": {"port": 29500}}),
    ),
    (
        "a subdirectory of the run directory writable",
        lambda d: _pod(d)["containers"][0]["volumeMounts"].append(
            {"name": "fsx", "mountPath": "/scratch", "subPath": "runs/train/scratch"}
        ),
    ),
    (
        "another job's run read-only",
        lambda d: _pod(d)["containers"][0]["volumeMounts"].append(
            {"name": "fsx", "mountPath": "/other", "subPath": "runs/other-job", "readOnly": True}
        ),
    ),
    ("the claim read-only as a volume, at any subPath", _claim_volume_read_only),
]


@pytest.mark.parametrize("variant, mutate", ALLOWED, ids=[a[0] for a in ALLOWED])
def test_what_baseline_allows_still_passes(variant, mutate):
    documents = _documents()
    mutate(documents)
    assert validate_documents(documents, CASE.expectations()).errors == []


def test_a_pod_of_any_document_is_held_to_baseline_too():
    """A Pod beside the job, not only the job's own templates."""
    documents = _documents() + [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "side",
                "namespace": "training",
                "annotations": {f"{APPARMOR_ANNOTATION_PREFIX}side": "unconfined"},
            },
            "spec": {
                "containers": [{"name": "side", "image": "busybox:1.36", "securityContext": {"procMount": "Unmasked"}}],
                "securityContext": {"sysctls": [{"name": "kernel.sem", "value": "1"}]},
            },
        }
    ]
    found = {f.path for f in validate_documents(documents, CASE.expectations()).errors if f.document == "Pod/side"}
    assert found == {
        format_path(["metadata", "annotations", f"{APPARMOR_ANNOTATION_PREFIX}side"]),
        "spec.containers[0].securityContext.procMount",
        "spec.securityContext.sysctls[0].name",
    }


def test_the_baseline_check_reads_the_apparmor_annotation():
    spec = copy.deepcopy(_pod(_documents()))
    annotations = {f"{APPARMOR_ANNOTATION_PREFIX}trainer": "unconfined"}
    extra = {
        "labels": _template(_documents())["metadata"]["labels"],
        "allowed_extra_capabilities": frozenset({"IPC_LOCK"}),
        "allowed_host_paths": (LOCAL_CHECKPOINT_HOST_PATH,),
    }
    assert pss_baseline_violations(spec, **extra) == []
    assert pss_baseline_violations(spec, annotations=annotations, **extra) == [
        f"metadata.annotations[\"{APPARMOR_ANNOTATION_PREFIX}trainer\"]: AppArmor profile 'unconfined' is not "
        "allowed (runtime/default or localhost/<profile>)"
    ]
