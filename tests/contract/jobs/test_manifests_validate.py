"""Validation: every golden manifest is clean; each seeded mistake is caught by the layer that
owns it and reported with the path of the offending field, the CRD layer against the upstream
schemas in tests/upstream/crds. One module over 500 lines: the seeded mistakes are one table per
layer over the same golden cases."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import yaml

from infra.config import resolve_config
from nvrx_eks.jobs.crds import CRD_DIR_ENV
from nvrx_eks.jobs.render import render_job
from nvrx_eks.jobs.spec import OFFLINE_PLACEHOLDER_IMAGE, build_jobspec
from nvrx_eks.jobs.validate import Expectations, validate_documents
from nvrx_eks.jobs.validate.findings import format_path
from tests.support.manifest_cases import GOLDEN_CASES, GOLDEN_IMAGE, Case
from workloads.config import TrainConfig

P5 = Expectations("1.35", "training", "fsx-lustre", "p5.48xlarge")
POD = "spec.replicatedJobs[0].template.spec.template.spec"
CONTAINER = f"{POD}.containers[0]"


@pytest.mark.parametrize("case", GOLDEN_CASES, ids=lambda c: c.id)
def test_golden_manifests_are_valid(case: Case):
    documents = list(yaml.safe_load_all(case.golden_path.read_text()))
    report = validate_documents(documents, case.expectations())
    assert report.findings == [], "\n".join(map(str, report.findings))


def _jobset_documents(**kwargs) -> list[dict]:
    spec = build_jobspec(resolve_config(), nodes=4, name="train", image=GOLDEN_IMAGE, **kwargs)
    return copy.deepcopy(render_job(spec).documents)


def _pytorchjob_documents() -> list[dict]:
    spec = build_jobspec(resolve_config(), nodes=4, name="train", api="pytorchjob", image=GOLDEN_IMAGE)
    return copy.deepcopy(render_job(spec).documents)


def _pod(docs) -> dict:
    return docs[1]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def _container(docs) -> dict:
    return _pod(docs)["containers"][0]


def _replace_in_script(docs, old: str, new: str) -> None:
    args = _container(docs)["args"]
    assert old in args[2]
    args[2] = args[2].replace(old, new)


def _edit_train_yaml(docs, old: str, new: str) -> None:
    assert old in docs[0]["data"]["train.yaml"]
    docs[0]["data"]["train.yaml"] = docs[0]["data"]["train.yaml"].replace(old, new)


def _drop_volume(docs, name: str) -> None:
    pod = _pod(docs)
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != name]


def _security(docs) -> dict:
    return _container(docs)["securityContext"]


def _network_policy(docs) -> dict:
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"]
    return policy


RULES = "spec.failurePolicy.rules"

# (id, mutation, layer, exact path of the offending field)
SEEDED_MISTAKES: list[tuple[str, Callable[[list], None], str, str]] = [
    (
        "privileged container",
        lambda d: _security(d).__setitem__("privileged", True),
        "project",
        f"{CONTAINER}.securityContext.privileged",
    ),
    ("host PID namespace", lambda d: _pod(d).__setitem__("hostPID", True), "project", f"{POD}.hostPID"),
    ("host network", lambda d: _pod(d).__setitem__("hostNetwork", True), "project", f"{POD}.hostNetwork"),
    ("host IPC namespace", lambda d: _pod(d).__setitem__("hostIPC", True), "project", f"{POD}.hostIPC"),
    (
        "hostPath volume outside the allow-list",
        lambda d: _pod(d)["volumes"].append({"name": "root", "hostPath": {"path": "/"}}),
        "project",
        f"{POD}.volumes[4].hostPath",
    ),
    (
        "host port",
        lambda d: _container(d)["ports"][0].__setitem__("hostPort", 29500),
        "project",
        f"{CONTAINER}.ports[0].hostPort",
    ),
    (
        "capability other than IPC_LOCK",
        lambda d: _security(d)["capabilities"]["add"].append("SYS_ADMIN"),
        "project",
        f"{CONTAINER}.securityContext.capabilities.add",
    ),
    (
        "ft_launcher's numactl binding under RuntimeDefault seccomp",
        lambda d: _container(d)["env"].insert(0, {"name": "NVRX_GPUS_PER_NUMA", "value": "4"}),
        "project",
        f"{CONTAINER}.env[0]",
    ),
    (
        "capabilities not dropped",
        lambda d: _security(d)["capabilities"].pop("drop"),
        "project",
        f"{CONTAINER}.securityContext.capabilities.drop",
    ),
    (
        "privilege escalation allowed",
        lambda d: _security(d).__setitem__("allowPrivilegeEscalation", True),
        "project",
        f"{CONTAINER}.securityContext.allowPrivilegeEscalation",
    ),
    (
        "no seccomp profile",
        lambda d: _pod(d).pop("securityContext"),
        "project",
        f"{POD}.securityContext.seccompProfile.type",
    ),
    (
        "service-account token mounted",
        lambda d: _pod(d).pop("automountServiceAccountToken"),
        "project",
        f"{POD}.automountServiceAccountToken",
    ),
    (
        "no deadline",
        lambda d: d[1]["spec"]["replicatedJobs"][0]["template"]["spec"].pop("activeDeadlineSeconds"),
        "project",
        "spec.replicatedJobs[0].template.spec.activeDeadlineSeconds",
    ),
    (
        "deadline shorter than the setup section",
        lambda d: d[1]["spec"]["replicatedJobs"][0]["template"]["spec"].__setitem__("activeDeadlineSeconds", 60),
        "project",
        "spec.replicatedJobs[0].template.spec.activeDeadlineSeconds",
    ),
    (
        "deadline restarts the JobSet instead of failing it",
        lambda d: d[1]["spec"]["failurePolicy"].__setitem__(
            "rules", [r for r in d[1]["spec"]["failurePolicy"]["rules"] if r["name"] != "DeadlineExceeded"]
        ),
        "project",
        RULES,
    ),
    (
        "no NetworkPolicy for the job",
        lambda d: d.remove(_network_policy(d)),
        "project",
        "metadata.labels",
    ),
    (
        "NetworkPolicy admits other namespaces",
        lambda d: _network_policy(d)["spec"]["ingress"][0]["from"].append({"namespaceSelector": {}}),
        "project",
        "spec.ingress[0].from[1]",
    ),
    (
        "NetworkPolicy with an unknown field",
        lambda d: _network_policy(d)["spec"].__setitem__("podSelecter", {}),
        "kubernetes",
        "spec.podSelecter",
    ),
    (
        "wrong type: parallelism as a string",
        lambda d: d[1]["spec"]["replicatedJobs"][0]["template"]["spec"].__setitem__("parallelism", "four"),
        "kubernetes",
        "spec.replicatedJobs[0].template.spec.parallelism",
    ),
    (
        "unknown field in a container (typo of limits)",
        lambda d: _container(d)["resources"].__setitem__("limts", {"cpu": 1}),
        "kubernetes",
        f"{CONTAINER}.resources.limts",
    ),
    (
        "unknown field in the JobSet spec",
        lambda d: d[1]["spec"].__setitem__("failurPolicy", {"maxRestarts": 1}),
        "crd",
        "spec.failurPolicy",
    ),
    (
        "wrong enum in the JobSet failure policy",
        lambda d: d[1]["spec"]["failurePolicy"].__setitem__("restartStrategy", "Sometimes"),
        "crd",
        "spec.failurePolicy.restartStrategy",
    ),
    (
        "mismatched EFA count",
        lambda d: _container(d)["resources"]["limits"].__setitem__("vpc.amazonaws.com/efa", 16),
        "project",
        f'{CONTAINER}.resources.limits["vpc.amazonaws.com/efa"]',
    ),
    (
        "mismatched GPU count",
        lambda d: _container(d)["resources"]["requests"].__setitem__("nvidia.com/gpu", 4),
        "project",
        f'{CONTAINER}.resources.requests["nvidia.com/gpu"]',
    ),
    (
        "missing volume that a mount refers to",
        lambda d: _drop_volume(d, "dshm"),
        "project",
        f"{CONTAINER}.volumeMounts[3].name",
    ),
    (
        "bad rendezvous host (an IP instead of pod 0's DNS name)",
        lambda d: _replace_in_script(
            d, "--rdzv-endpoint train-coordinator-0-0.train:29500", "--rdzv-endpoint 10.0.3.7:29500"
        ),
        "project",
        f"{CONTAINER}.args[2]",
    ),
    (
        "exit-93 pod failure policy removed",
        lambda d: d[1]["spec"]["replicatedJobs"][0]["template"]["spec"].pop("podFailurePolicy"),
        "project",
        "spec.replicatedJobs[0].template.spec.podFailurePolicy",
    ),
    (
        "JobSet exit-93 rule removed",
        lambda d: d[1]["spec"]["failurePolicy"].__setitem__("rules", []),
        "project",
        "spec.failurePolicy.rules",
    ),
    (
        "the disruption rule's message pattern widened to every pod failure policy failure (exit 93 restarts)",
        lambda d: d[1]["spec"]["failurePolicy"]["rules"][0].__setitem__("onJobFailureMessagePatterns", [".*"]),
        "project",
        "spec.failurePolicy.rules[0]",
    ),
    (
        "PVC name differs from the stack's claim",
        lambda d: _pod(d)["volumes"][0]["persistentVolumeClaim"].__setitem__("claimName", "fsx-claim"),
        "project",
        f"{POD}.volumes[0].persistentVolumeClaim.claimName",
    ),
    (
        "world size: parallelism disagrees with ft_launcher --nnodes",
        lambda d: d[1]["spec"]["replicatedJobs"][0]["template"]["spec"].update(parallelism=3, completions=3),
        "project",
        f"{CONTAINER}.args[2]",
    ),
    (
        "grace period shorter than the trainer's checkpoint finalize",
        lambda d: _pod(d).__setitem__("terminationGracePeriodSeconds", 30),
        "project",
        f"{POD}.terminationGracePeriodSeconds",
    ),
    (
        "timeouts: ft_launcher flag hand-edited away from the trainer config",
        lambda d: _replace_in_script(
            d, f"--term-timeout {TrainConfig().launcher_term_timeout_s():g}", "--term-timeout 30"
        ),
        "project",
        f"{CONTAINER}.args[2]",
    ),
    (
        "trainer config with an unknown key",
        lambda d: _edit_train_yaml(d, "interval_steps: 50", "intervall_steps: 50"),
        "project",
        'data["train.yaml"].checkpoint.intervall_steps',
    ),
    (
        "trainer config with inconsistent timeouts",
        lambda d: _edit_train_yaml(d, "soft_timeout_s: 60.0", "soft_timeout_s: 95.0"),
        "project",
        'data["train.yaml"].inprocess.soft_timeout_s',
    ),
    (
        "fault injected on a rank that does not exist",
        lambda d: _edit_train_yaml(d, "faults: ''", "faults: sigkill@10:40"),
        "project",
        'data["train.yaml"].faults',
    ),
    (
        "image not set",
        lambda d: _container(d).__setitem__("image", ""),
        "project",
        f"{CONTAINER}.image",
    ),
    (
        "image without a fixed tag",
        lambda d: _container(d).__setitem__("image", "111122223333.dkr.ecr.us-east-1.amazonaws.com/trainer:latest"),
        "project",
        f"{CONTAINER}.image",
    ),
    (
        "IPC_LOCK missing",
        lambda d: _container(d)["securityContext"]["capabilities"].__setitem__("add", []),
        "project",
        f"{CONTAINER}.securityContext.capabilities.add",
    ),
    (
        "GPU taint not tolerated",
        lambda d: _pod(d).__setitem__("tolerations", []),
        "project",
        f"{POD}.tolerations",
    ),
    (
        "wrong instance type selected",
        lambda d: _pod(d)["nodeSelector"].__setitem__("node.kubernetes.io/instance-type", "p4d.24xlarge"),
        "project",
        f'{POD}.nodeSelector["node.kubernetes.io/instance-type"]',
    ),
    (
        "/dev/shm on disk instead of memory",
        lambda d: _pod(d)["volumes"][3]["emptyDir"].pop("medium"),
        "project",
        f"{POD}.volumes[3].emptyDir.medium",
    ),
    (
        "wrong namespace",
        lambda d: d[1]["metadata"].__setitem__("namespace", "default"),
        "project",
        "metadata.namespace",
    ),
    (
        "command set, replacing the image's tini entrypoint",
        lambda d: _container(d).__setitem__("command", ["python"]),
        "project",
        f"{CONTAINER}.command",
    ),
    (
        "restartPolicy OnFailure defeats the pod failure policy",
        lambda d: _pod(d).__setitem__("restartPolicy", "OnFailure"),
        "project",
        "spec.replicatedJobs[0].template.spec.template.spec.restartPolicy",
    ),
]


@pytest.mark.parametrize("mistake, mutate, layer, path", SEEDED_MISTAKES, ids=[m[0] for m in SEEDED_MISTAKES])
def test_seeded_mistake_is_reported_at_its_field(mistake, mutate, layer, path):
    documents = _jobset_documents()
    assert validate_documents(documents, P5).errors == []
    mutate(documents)
    report = validate_documents(documents, P5)
    found = [(f.layer, f.path) for f in report.errors]
    assert (layer, path) in found, f"{mistake}: expected [{layer}] {path}, got:\n" + "\n".join(
        map(str, report.findings)
    )


PYTORCHJOB_MISTAKES = [
    (
        "restartPolicy other than ExitCode",
        lambda d: d[1]["spec"]["pytorchReplicaSpecs"]["Worker"].__setitem__("restartPolicy", "OnFailure"),
        "project",
        "spec.pytorchReplicaSpecs.Worker.restartPolicy",
    ),
    (
        "container not named pytorch",
        lambda d: d[1]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0].__setitem__(
            "name", "trainer"
        ),
        "project",
        "spec.pytorchReplicaSpecs.Master.template.spec.containers",
    ),
    (
        "two masters",
        lambda d: d[1]["spec"]["pytorchReplicaSpecs"]["Master"].__setitem__("replicas", 2),
        "project",
        "spec.pytorchReplicaSpecs.Master.replicas",
    ),
    (
        "unknown replica-spec field",
        lambda d: d[1]["spec"]["pytorchReplicaSpecs"]["Worker"].__setitem__("replica", 3),
        "crd",
        "spec.pytorchReplicaSpecs.Worker.replica",
    ),
    (
        "unknown field in a lifted pod template",
        lambda d: d[1]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"].__setitem__("nodeSelectr", {}),
        "kubernetes",
        "spec.pytorchReplicaSpecs.Worker.template.spec.nodeSelectr",
    ),
]


@pytest.mark.parametrize("mistake, mutate, layer, path", PYTORCHJOB_MISTAKES, ids=[m[0] for m in PYTORCHJOB_MISTAKES])
def test_pytorchjob_mistake_is_reported_at_its_field(mistake, mutate, layer, path):
    documents = _pytorchjob_documents()
    assert validate_documents(documents, P5).errors == []
    mutate(documents)
    found = [(f.layer, f.path) for f in validate_documents(documents, P5).errors]
    assert (layer, path) in found, f"{mistake}: {found}"


def test_at_least_ten_distinct_mistakes_are_seeded():
    assert len({path for *_, path in SEEDED_MISTAKES + PYTORCHJOB_MISTAKES}) >= 10


def test_missing_crd_folder_skips_only_that_layer(monkeypatch, tmp_path):
    monkeypatch.setenv(CRD_DIR_ENV, str(tmp_path / "no-crds-here"))
    documents = _jobset_documents()
    documents[1]["spec"]["failurPolicy"] = {}  # only the CRD layer would see this one
    _container(documents)["resources"]["limts"] = {}  # the Kubernetes layer sees this
    _container(documents)["resources"]["limits"]["vpc.amazonaws.com/efa"] = 1  # the project layer
    report = validate_documents(documents, P5)
    assert len(report.skipped) == 1 and "CRD schema layer skipped" in report.skipped[0]
    layers = {f.layer for f in report.errors}
    assert layers == {"kubernetes", "project"}


def test_placeholder_image_is_a_warning_offline_and_an_error_live():
    spec = build_jobspec(resolve_config(), nodes=2, name="train")
    assert spec.image == OFFLINE_PLACEHOLDER_IMAGE
    documents = render_job(spec).documents
    offline = validate_documents(documents, P5)
    assert offline.ok and [f.severity for f in offline.findings] == ["warning"]
    live = validate_documents(documents, Expectations("1.35", "training", "fsx-lustre", "p5.48xlarge", live=True))
    assert [f.path for f in live.errors] == [f"{CONTAINER}.image"]


def test_validation_uses_the_clusters_kubernetes_version():
    """A field that does not exist in the cluster's version is an unknown field there."""
    documents = _jobset_documents()
    # Pod-level `resources` arrived in Kubernetes 1.32 (PodLevelResources); older schemas reject it.
    _pod(documents)["resources"] = {"limits": {"cpu": "1"}}
    old = validate_documents(documents, Expectations("1.30", "training", "fsx-lustre", "p5.48xlarge"))
    assert ("kubernetes", f"{POD}.resources") in [(f.layer, f.path) for f in old.errors]
    current = validate_documents(documents, P5)
    assert ("kubernetes", f"{POD}.resources") not in [(f.layer, f.path) for f in current.errors]


def test_format_path_quotes_keys_with_dots_and_slashes():
    assert format_path(["spec", "containers", 0, "resources", "limits", "vpc.amazonaws.com/efa"]) == (
        'spec.containers[0].resources.limits["vpc.amazonaws.com/efa"]'
    )


def test_fabric_test_is_validated_too():
    documents = copy.deepcopy(Case("p5", "fabric", 2).render().documents)
    job = documents[0]
    pod = job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["resources"]["limits"]["vpc.amazonaws.com/efa"] = 4
    errors = validate_documents(documents, P5).errors
    assert [f.path for f in errors] == [
        'spec.replicatedJobs[0].template.spec.template.spec.containers[0].resources.limits["vpc.amazonaws.com/efa"]'
    ]


# ----- pod security ------------------------------------------------------------------------

#: The manifest of the security review: a pod that owns its node.
NODE_OWNING_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "owner", "namespace": "training"},
    "spec": {
        "hostPID": True,
        "hostNetwork": True,
        "containers": [
            {
                "name": "x",
                "image": "r.example.com/x:1",
                "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}},
                "volumeMounts": [{"name": "root", "mountPath": "/host"}],
            }
        ],
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
    },
}


def test_the_reviews_node_owning_pod_is_rejected_field_by_field():
    documents = _jobset_documents() + [copy.deepcopy(NODE_OWNING_POD)]
    report = validate_documents(documents, P5)
    owner = {f.path for f in report.errors if f.document == "Pod/owner"}
    assert owner == {
        "spec.hostPID",
        "spec.hostNetwork",
        "spec.containers[0].securityContext.privileged",
        "spec.containers[0].securityContext.capabilities.add",
        "spec.volumes[0].hostPath",
    }


def test_the_same_pod_inside_the_jobset_is_rejected_too():
    documents = _jobset_documents()
    pod = _pod(documents)
    pod.update(hostPID=True, hostNetwork=True)
    pod["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    _security(documents).update(privileged=True)
    _security(documents)["capabilities"]["add"].append("SYS_ADMIN")
    paths = {f.path for f in validate_documents(documents, P5).errors}
    assert {
        f"{POD}.hostPID",
        f"{POD}.hostNetwork",
        f"{POD}.volumes[4].hostPath",
        f"{CONTAINER}.securityContext.privileged",
        f"{CONTAINER}.securityContext.capabilities.add",
    } <= paths


def _pod_templates_of(documents) -> list[tuple[dict, dict]]:
    """(labels, spec) of every pod template: the labels name the job whose directories it may write."""
    from nvrx_eks.jobs.validate.rules.base import get, pod_specs

    return [(get(doc, [*path[:-1], "metadata", "labels"]), spec) for doc in documents for path, spec in pod_specs(doc)]


@pytest.mark.parametrize("case", GOLDEN_CASES, ids=lambda c: c.id)
def test_rendered_pods_pass_pod_security_baseline_with_only_ipc_lock_added(case: Case):
    from infra.pod_security import FABRIC_TEST_CAPABILITIES, HOST_PATH_ALLOW_LIST, pss_baseline_violations

    templates = _pod_templates_of(case.render().documents)
    assert templates
    for labels, spec in templates:
        if spec["containers"][0]["name"] == "coordinator":
            # The job's coordinator needs nothing beyond baseline, and runs as no one.
            assert pss_baseline_violations(spec) == []
            assert spec["containers"][0]["securityContext"]["runAsNonRoot"] is True
            assert "volumes" not in spec and spec["automountServiceAccountToken"] is False
            continue
        allowed = frozenset({"IPC_LOCK"})
        assert (
            pss_baseline_violations(
                spec, labels=labels, allowed_extra_capabilities=allowed, allowed_host_paths=HOST_PATH_ALLOW_LIST
            )
            == []
        )
        # IPC_LOCK and the reviewed node-local checkpoint directory (training pods) are the
        # exceptions: without them, baseline fails on those alone.
        host_paths = [
            f"spec.volumes[{i}].hostPath: hostPath volumes are not allowed"
            for i, v in enumerate(spec["volumes"])
            if "hostPath" in v
        ]
        assert host_paths == (
            [] if case.api == "fabric" else ["spec.volumes[2].hostPath: hostPath volumes are not allowed"]
        )
        assert pss_baseline_violations(spec, labels=labels) == host_paths + [
            "spec.containers[0].securityContext.capabilities.add: IPC_LOCK is beyond baseline"
        ]
        container = spec["containers"][0]["securityContext"]
        assert container["allowPrivilegeEscalation"] is False and container["capabilities"]["drop"] == ["ALL"]
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        expected = ["IPC_LOCK"] if case.api != "fabric" else list(FABRIC_TEST_CAPABILITIES)
        assert container["capabilities"]["add"] == expected


def test_pod_security_baseline_check_rejects_the_node_owning_pod():
    from infra.pod_security import pss_baseline_violations

    problems = pss_baseline_violations(NODE_OWNING_POD["spec"], allowed_extra_capabilities=frozenset({"IPC_LOCK"}))
    assert problems == [
        "spec.hostNetwork: host namespaces are not allowed",
        "spec.hostPID: host namespaces are not allowed",
        "spec.volumes[0].hostPath: hostPath volumes are not allowed",
        "spec.containers[0].securityContext.privileged: privileged containers are not allowed",
        "spec.containers[0].securityContext.capabilities.add: SYS_ADMIN is beyond baseline",
    ]


def test_host_path_allow_list_admits_a_reviewed_path(monkeypatch):
    from infra import pod_security

    monkeypatch.setattr(pod_security, "HOST_PATH_ALLOW_LIST", (*pod_security.HOST_PATH_ALLOW_LIST, "/opt/dlami/nvme"))
    documents = _jobset_documents()
    _pod(documents)["volumes"].append({"name": "nvme", "hostPath": {"path": "/opt/dlami/nvme"}})
    assert validate_documents(documents, P5).errors == []
    _pod(documents)["volumes"][-1]["hostPath"]["path"] = "/opt"
    assert [f.path for f in validate_documents(documents, P5).errors] == [f"{POD}.volumes[4].hostPath"]


def test_fabric_test_may_add_sshds_capabilities_but_not_more():
    documents = copy.deepcopy(Case("p5", "fabric", 2).render().documents)
    assert validate_documents(documents, P5).errors == []
    container = documents[0]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"]["capabilities"]["add"].append("NET_ADMIN")
    assert [f.path for f in validate_documents(documents, P5).errors] == [
        f"{CONTAINER}.securityContext.capabilities.add"
    ]


def test_network_policy_admits_only_the_jobs_own_pods():
    documents = _jobset_documents()
    policy = _network_policy(documents)
    labels = documents[1]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["labels"]
    # It selects the job's pods and admits TCP from them alone.
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["ingress"] == [
        {"from": [{"podSelector": policy["spec"]["podSelector"]}], "ports": [{"protocol": "TCP"}]}
    ]
    other = _jobset_documents()
    other[1]["metadata"]["labels"]["app.kubernetes.io/instance"] = "other"
    # Another job's policy does not cover this job.
    found = [f.path for f in validate_documents([other[0], other[1], policy], P5).errors]
    assert "metadata.labels" in found


def test_pytorchjob_has_a_deadline_too():
    documents = _pytorchjob_documents()
    assert documents[1]["spec"]["runPolicy"]["activeDeadlineSeconds"] > 0
    del documents[1]["spec"]["runPolicy"]["activeDeadlineSeconds"]
    assert "spec.runPolicy.activeDeadlineSeconds" in [f.path for f in validate_documents(documents, P5).errors]


def test_deadline_bounds_a_run_with_every_restart_and_follows_the_step_time():
    from nvrx_eks.jobs.backstop import active_deadline_s

    spec = build_jobspec(resolve_config(), nodes=2, name="train", max_step_time_s=2)
    train = spec.train
    grace = train.recommended_termination_grace_period_s()
    # 100 steps x 2 s + setup 900 + 10 in-process restarts x (90 + 120 + 50 x 2)
    # + 3 launcher restarts x (900 + 50 x 2) + the termination grace period.
    bound = 200 + 900 + 10 * 310 + 3 * 1000 + grace
    assert spec.active_deadline_s == bound
    assert active_deadline_s(train, kubernetes_restarts=3, step_time_s=2) == bound + 3 * 1000
    # A PyTorchJob's deadline spans its pod recreations; a JobSet's Jobs each get their own.
    pytorchjob = build_jobspec(resolve_config(), nodes=2, name="train", api="pytorchjob", max_step_time_s=2)
    assert pytorchjob.active_deadline_s == bound + 3 * 1000
    # Without a measured step time the trainer's own step timeout bounds each step.
    default = build_jobspec(resolve_config(), nodes=2, name="train")
    assert default.active_deadline_s == active_deadline_s(train, kubernetes_restarts=0, step_time_s=300)
    rendered = render_job(spec).job_document
    assert rendered["spec"]["replicatedJobs"][0]["template"]["spec"]["activeDeadlineSeconds"] == bound


def test_cli_validate_rejects_the_node_owning_pod():
    from tests.support.cli_harness import run_cli

    rendered = run_cli("render", "--nodes", "2", "--image", GOLDEN_IMAGE)
    assert rendered.code == 0, rendered.output
    manifest = rendered.stdout + "---\n" + yaml.safe_dump(NODE_OWNING_POD)
    result = run_cli("validate", "-", stdin=manifest)
    assert result.code == 2 and "Traceback" not in result.output
    for field in ("spec.hostPID", "spec.hostNetwork", "privileged", "capabilities.add", "spec.volumes[0].hostPath"):
        assert field in result.stdout
