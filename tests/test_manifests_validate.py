"""Validation: every golden manifest is clean; each seeded mistake is caught by the layer that
owns it and reported with the path of the offending field; the CRD layer is skipped (only it)
when ../shared/crds is absent."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import yaml

from infra.config import resolve_config
from scripts.jobspec import OFFLINE_PLACEHOLDER_IMAGE, build_jobspec
from scripts.render import render_job
from scripts.validate import CRD_DIR_ENV, DEFAULT_CRD_DIR, Expectations, format_path, validate_documents
from tests.manifest_cases import GOLDEN_CASES, GOLDEN_IMAGE, Case
from workloads.config import TrainConfig

P5 = Expectations("1.35", "training", "fsx-lustre", "p5.48xlarge")
POD = "spec.replicatedJobs[0].template.spec.template.spec"
CONTAINER = f"{POD}.containers[0]"
CRDS_PRESENT = DEFAULT_CRD_DIR.is_dir()


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


# (id, mutation, layer, exact path of the offending field)
SEEDED_MISTAKES: list[tuple[str, Callable[[list], None], str, str]] = [
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
        f"{CONTAINER}.volumeMounts[2].name",
    ),
    (
        "bad rendezvous host (an IP instead of pod 0's DNS name)",
        lambda d: _replace_in_script(
            d, "--rdzv-endpoint train-worker-0-0.train:29500", "--rdzv-endpoint 10.0.3.7:29500"
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
        lambda d: _pod(d)["volumes"][2]["emptyDir"].pop("medium"),
        "project",
        f"{POD}.volumes[2].emptyDir.medium",
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
    if layer == "crd" and not CRDS_PRESENT:
        pytest.skip("the CRD schemas in ../shared/crds are absent in this checkout; the crd layer cannot run")
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
    if layer == "crd" and not CRDS_PRESENT:
        pytest.skip("the CRD schemas in ../shared/crds are absent in this checkout; the crd layer cannot run")
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
    [job] = copy.deepcopy(Case("p5", "fabric", 2).render().documents)
    pod = job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["resources"]["limits"]["vpc.amazonaws.com/efa"] = 4
    errors = validate_documents([job], P5).errors
    assert [f.path for f in errors] == [
        'spec.replicatedJobs[0].template.spec.template.spec.containers[0].resources.limits["vpc.amazonaws.com/efa"]'
    ]
