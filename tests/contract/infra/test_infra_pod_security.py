"""Pod security of the training namespace, checked on the synthesized cluster manifests: the
namespace's Pod Security labels and the ValidatingAdmissionPolicy ("baseline except IPC_LOCK",
and each job's pods writing only their own directories), whose CEL expressions are evaluated
offline with cel-python against pods that must be rejected and the project's own rendered pods,
which must pass.
"""

from __future__ import annotations

import copy
import json

import celpy
import pytest
import yaml

from infra.pod_security import (
    APPARMOR_ANNOTATION_PREFIX,
    HOST_PATH_ALLOW_LIST,
    JOB_LABEL,
    LOCAL_CHECKPOINT_HOST_PATH,
    pss_baseline_violations,
)
from nvrx_eks.facts.names import TRAINING_NAMESPACE
from tests.support import REPO_ROOT

pytestmark = [pytest.mark.synth, pytest.mark.xdist_group("synth")]

GOLDEN = REPO_ROOT / "tests" / "golden"


def cluster_manifests(synthesized) -> list[dict]:
    """Every manifest the cluster stack applies. A manifest holding deploy-time values (the file
    system id) is an Fn::Join: those values are read as the string TOKEN."""
    documents = []
    for resource in synthesized.resources("cluster", "Custom::AWSCDK-EKS-KubernetesResource").values():
        manifest = resource["Properties"]["Manifest"]
        if isinstance(manifest, dict):
            separator, parts = manifest["Fn::Join"]
            manifest = separator.join(p if isinstance(p, str) else "TOKEN" for p in parts)
        documents.extend(json.loads(manifest))
    return documents


@pytest.fixture(scope="module")
def manifests(synth):
    return cluster_manifests(synth("p5"))


@pytest.fixture(scope="module")
def policy(manifests):
    (found,) = [m for m in manifests if m["kind"] == "ValidatingAdmissionPolicy"]
    return found


def violations(policy: dict, pod: dict) -> list[str]:
    """Messages of the policy's validations that fail for this pod (an evaluation error counts as
    a failure, as failurePolicy Fail makes the API server treat it)."""
    environment = celpy.Environment()
    activation = {"object": celpy.json_to_cel(pod)}
    failed = []
    for validation in policy["spec"]["validations"]:
        program = environment.program(environment.compile(validation["expression"]))
        try:
            result = program.evaluate(activation)
        except celpy.CELEvalError as e:
            failed.append(f"{validation['message']} (evaluation error: {e})")
            continue
        if isinstance(result, celpy.CELEvalError) or not bool(result):
            failed.append(validation["message"])
    return failed


def trainer_pod(labels: dict | None = None) -> dict:
    """A pod like the trainer's, of job `train`: IPC_LOCK added, the FSx claim mounted read-only
    with its own run directory writable on top, nothing else special."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "trainer",
            "namespace": TRAINING_NAMESPACE,
            "labels": {JOB_LABEL: "train"} if labels is None else labels,
        },
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "image": "example.com/trainer:1",
                    "ports": [{"containerPort": 29500}],
                    "securityContext": {"capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}},
                    "volumeMounts": [
                        {"name": "fsx", "mountPath": "/fsx", "readOnly": True},
                        {"name": "fsx", "mountPath": "/fsx/runs/train", "subPath": "runs/train"},
                    ],
                }
            ],
            "volumes": [{"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-lustre"}}],
        },
    }


def _with(pod: dict, change) -> dict:
    pod = copy.deepcopy(pod)
    change(pod["spec"])
    return pod


def _claim_mount(spec: dict, mount_path: str) -> dict:
    return next(m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == mount_path)


def _run_dir_at(sub_path: str):
    """The writable run-directory mount pointed at `sub_path` of the claim."""
    return lambda s: _claim_mount(s, "/fsx/runs/train").update(subPath=sub_path)


def _claim_in(section: str, mount: dict):
    """A second container in `section` mounting the claim as `mount` says."""
    return lambda s: s.setdefault(section, []).append(
        {"name": "side", "image": "busybox:1", "volumeMounts": [{"name": "fsx", **mount}]}
    )


REJECTED = {
    "privileged": lambda s: s["containers"][0]["securityContext"].update(privileged=True),
    "hostNetwork": lambda s: s.update(hostNetwork=True),
    "hostPID": lambda s: s.update(hostPID=True),
    "hostIPC": lambda s: s.update(hostIPC=True),
    "hostPath": lambda s: s["volumes"].append({"name": "root", "hostPath": {"path": "/"}}),
    "hostPort": lambda s: s["containers"][0]["ports"].append({"containerPort": 22, "hostPort": 22}),
    "SYS_ADMIN": lambda s: s["containers"][0]["securityContext"]["capabilities"]["add"].append("SYS_ADMIN"),
    "NET_ADMIN in an init container": lambda s: s.update(
        initContainers=[
            {"name": "init", "image": "busybox:1", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}
        ]
    ),
    "seccomp Unconfined": lambda s: s.update(securityContext={"seccompProfile": {"type": "Unconfined"}}),
    "container seccomp Unconfined": lambda s: s["containers"][0]["securityContext"].update(
        seccompProfile={"type": "Unconfined"}
    ),
    "procMount Unmasked": lambda s: s["containers"][0]["securityContext"].update(procMount="Unmasked"),
    "unsafe sysctl": lambda s: s.update(securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}),
    "AppArmor Unconfined on the pod": lambda s: s.update(securityContext={"appArmorProfile": {"type": "Unconfined"}}),
    "AppArmor Unconfined on a container": lambda s: s["containers"][0]["securityContext"].update(
        appArmorProfile={"type": "Unconfined"}
    ),
    "SELinux type spc_t": lambda s: s.update(securityContext={"seLinuxOptions": {"type": "spc_t"}}),
    "SELinux user": lambda s: s["containers"][0]["securityContext"].update(seLinuxOptions={"user": "system_u"}),
    "SELinux role": lambda s: s["containers"][0]["securityContext"].update(seLinuxOptions={"role": "system_r"}),
    "windows hostProcess on the pod": lambda s: s.update(securityContext={"windowsOptions": {"hostProcess": True}}),
    "windows hostProcess on a container": lambda s: s["containers"][0]["securityContext"].update(
        windowsOptions={"hostProcess": True}
    ),
    "probe with a host": lambda s: s["containers"][0].update(
        livenessProbe={"httpGet": {"host": "169.254.169.254", "path": "/", "port": 80}}
    ),
    "lifecycle hook with a host": lambda s: s["containers"][0].update(
        lifecycle={"preStop": {"tcpSocket": {"host": "10.0.0.1", "port": 22}}}
    ),
    "the whole local tier mounted": lambda s: _mount_local_tier(s, {}),
    "the local tier mounted with an empty subPath": lambda s: _mount_local_tier(s, {"subPath": ""}),
    "a subPath out of its volume": lambda s: _mount_local_tier(s, {"subPath": "../../etc"}),
    "a subPathExpr": lambda s: _mount_local_tier(s, {"subPathExpr": "$(POD_NAME)"}),
    # The job's own directories: the local tier by exactly the job's subdirectory ...
    "the local tier's root as '.'": lambda s: _mount_local_tier(s, {"subPath": "."}),
    "the local tier's root as './'": lambda s: _mount_local_tier(s, {"subPath": "./"}),
    "another job's local-tier directory": lambda s: _mount_local_tier(s, {"subPath": "other-job"}),
    # ... and the claim writable only in the job's own run directory.
    "the claim writable at /fsx": lambda s: _claim_mount(s, "/fsx").pop("readOnly"),
    "the claim at /fsx with readOnly false": lambda s: _claim_mount(s, "/fsx").update(readOnly=False),
    "the claim's root writable as '.'": _run_dir_at("."),
    "every run writable": _run_dir_at("runs"),
    "another job's run writable": _run_dir_at("runs/other-job"),
    "a run whose name only begins with the job's": _run_dir_at("runs/train2"),
    "a second container with the claim writable": _claim_in("containers", {"mountPath": "/data"}),
    "an init container with the claim writable": _claim_in("initContainers", {"mountPath": "/data"}),
    "an ephemeral container with the claim writable": _claim_in("ephemeralContainers", {"mountPath": "/data"}),
}

#: What baseline still allows: a pod with each of these is admitted.
ADMITTED = {
    "a safe sysctl": lambda s: s.update(
        securityContext={"sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]}
    ),
    "SELinux container_engine_t": lambda s: s.update(
        securityContext={"seLinuxOptions": {"type": "container_engine_t"}}
    ),
    "AppArmor RuntimeDefault": lambda s: s["containers"][0]["securityContext"].update(
        appArmorProfile={"type": "RuntimeDefault"}
    ),
    "procMount Default": lambda s: s["containers"][0]["securityContext"].update(procMount="Default"),
    "the job's own local-tier directory": lambda s: _mount_local_tier(s, {"subPath": "train"}),
    "a probe without a host": lambda s: s["containers"][0].update(livenessProbe={"tcpSocket": {"port": 29500}}),
    "a subdirectory of the job's run writable": _run_dir_at("runs/train/checkpoints"),
    "another job's run read-only": _claim_in(
        "containers", {"mountPath": "/other", "subPath": "runs/other-job", "readOnly": True}
    ),
    "the claim read-only anywhere in an init container": _claim_in(
        "initContainers", {"mountPath": "/data", "readOnly": True}
    ),
    "the claim read-only as a volume": lambda s: _claim_volume_read_only(s),
}

#: Pods whose labels decide: (the pod's labels, a change to its spec), each rejected.
REJECTED_BY_LABELS = {
    "the run directory writable without a job label": ({}, lambda s: None),
    "the run directory writable with an empty job label": ({JOB_LABEL: ""}, lambda s: None),
    "the run directory writable for a pod of another job": ({JOB_LABEL: "other"}, lambda s: None),
    "the local tier without a job label": ({}, lambda s: _local_tier_beside_a_read_only_run(s)),
}


def _claim_volume_read_only(spec: dict) -> None:
    """The claim's volume read-only as a whole: no mount of it writes, whatever the mount says."""
    spec["volumes"][0]["persistentVolumeClaim"]["readOnly"] = True
    _claim_mount(spec, "/fsx").pop("readOnly")


def _local_tier_beside_a_read_only_run(spec: dict) -> None:
    """The job's local-tier directory, with nothing of the claim writable: only the label decides."""
    _claim_mount(spec, "/fsx/runs/train")["readOnly"] = True
    _mount_local_tier(spec, {"subPath": "train"})


def _mount_local_tier(spec: dict, how: dict) -> None:
    """Mount the node-local checkpoint tier's host directory, as the job templates do, `how`
    (subPath or subPathExpr) set as given."""
    spec["volumes"].append({"name": "local", "hostPath": {"path": LOCAL_CHECKPOINT_HOST_PATH}})
    spec["containers"][0]["volumeMounts"].append({"name": "local", "mountPath": "/local-checkpoints", **how})


def _case_pod(case: str) -> dict:
    """The trainer-like pod changed as the case of REJECTED, ADMITTED or REJECTED_BY_LABELS says."""
    if case in REJECTED_BY_LABELS:
        labels, change = REJECTED_BY_LABELS[case]
        return _with(trainer_pod(labels), change)
    return _with(trainer_pod(), {**REJECTED, **ADMITTED}[case])


def test_namespace_warns_and_audits_restricted(manifests):
    (namespace,) = [m for m in manifests if m["kind"] == "Namespace"]
    assert namespace["metadata"]["name"] == TRAINING_NAMESPACE
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"
    # PSA cannot exempt IPC_LOCK from baseline, so it does not enforce; the policy below does.
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


def test_policy_is_bound_to_the_training_namespace_and_denies(manifests, policy):
    (binding,) = [m for m in manifests if m["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": TRAINING_NAMESPACE}
    }
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert "pods" in rule["resources"] and set(rule["operations"]) == {"CREATE", "UPDATE"}


def test_a_trainer_like_pod_with_ipc_lock_is_admitted(policy):
    assert violations(policy, trainer_pod()) == []


@pytest.mark.parametrize("violation", sorted(REJECTED) + sorted(REJECTED_BY_LABELS))
def test_each_baseline_violation_is_rejected(policy, violation):
    assert len(violations(policy, _case_pod(violation))) == 1


@pytest.mark.parametrize("violation", sorted(REJECTED))
def test_each_baseline_violation_is_rejected_in_a_pod_with_annotations(policy, violation):
    """A Job's pods always carry annotations (the completion index). The AppArmor check's
    annotation clause, joined without parentheses, once admitted an Unconfined profile in any
    pod that had an annotation."""
    pod = _with(trainer_pod(), REJECTED[violation])
    pod["metadata"]["annotations"] = {"batch.kubernetes.io/job-completion-index": "0"}
    assert len(violations(policy, pod)) == 1


@pytest.mark.parametrize("allowed", sorted(ADMITTED))
def test_what_baseline_allows_is_admitted(policy, allowed):
    assert violations(policy, _with(trainer_pod(), ADMITTED[allowed])) == []


@pytest.mark.parametrize("annotation", ["unconfined", "docker-default"])
def test_apparmor_annotation_other_than_default_or_localhost_is_rejected(policy, annotation):
    pod = trainer_pod()
    pod["metadata"]["annotations"] = {f"{APPARMOR_ANNOTATION_PREFIX}trainer": annotation}
    assert len(violations(policy, pod)) == 1
    for admitted in ("runtime/default", "localhost/nvrx-eks", ""):
        pod["metadata"]["annotations"] = {f"{APPARMOR_ANNOTATION_PREFIX}trainer": admitted}
        assert violations(policy, pod) == []


@pytest.mark.parametrize("case", sorted(REJECTED) + sorted(REJECTED_BY_LABELS) + sorted(ADMITTED))
def test_the_offline_check_agrees_with_the_policy(policy, case):
    """The validator's check (pod_security_violations) and the admission policy reject the same
    pods: one statement of the rules, two enforcers."""
    pod = _case_pod(case)
    offline = pss_baseline_violations(
        pod["spec"],
        labels=pod["metadata"]["labels"],
        allowed_extra_capabilities=frozenset({"IPC_LOCK"}),
        allowed_host_paths=HOST_PATH_ALLOW_LIST,
    )
    assert bool(offline) == bool(violations(policy, pod)), offline
    assert bool(offline) == (case not in ADMITTED), offline


def test_the_reviews_privileged_hostpath_pod_is_rejected(policy):
    """The manifest of the security review: privileged, hostPID, hostNetwork, hostPath / and
    SYS_ADMIN."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "evil", "namespace": TRAINING_NAMESPACE},
        "spec": {
            "hostPID": True,
            "hostNetwork": True,
            "containers": [
                {
                    "name": "x",
                    "image": "busybox:1",
                    "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}},
                    "volumeMounts": [{"name": "root", "mountPath": "/host"}],
                }
            ],
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
        },
    }
    assert len(violations(policy, pod)) == 4  # privileged, host namespaces, hostPath, capability


def _pod_templates(node) -> list[dict]:
    """Every pod template (metadata and spec) in a document."""
    if isinstance(node, dict):
        if "containers" in _dict(node.get("spec")):
            return [node]
        return [template for value in node.values() for template in _pod_templates(value)]
    if isinstance(node, list):
        return [template for value in node for template in _pod_templates(value)]
    return []


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


@pytest.mark.parametrize("golden", ["p5-jobset-2n.yaml", "p5-pytorchjob-2n.yaml", "p5-fabric-2n.yaml"])
def test_the_rendered_job_pods_are_admitted(policy, golden):
    """Each pod as its controller creates it: the template's metadata (its job's labels) and spec."""
    documents = [doc for doc in yaml.safe_load_all((GOLDEN / golden).read_text()) if doc]
    templates = [template for doc in documents for template in _pod_templates(doc)]
    assert templates
    for template in templates:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"], "spec": template["spec"]}
        assert violations(policy, pod) == []
