"""A cluster this project did not create (the config's `cluster:` section): render, submit,
status, logs, delete and preflight against the loopback Kubernetes API server, reached through a
kubeconfig context as kubectl reaches it, with no AWS credentials and no stack read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from nvrx_eks.facts.job_kinds import JOBSET, PYTORCHJOB
from nvrx_eks.facts.names import EFA_RESOURCE, GPU_NODE_LABEL_KEY, GPU_RESOURCE, INSTANCE_TYPE_LABEL_KEY
from tests.support import cli_harness, k8s_api_server
from tests.support.cli_harness import add_job_pods, run_cli
from tests.support.k8s_api_server import KubeApiTestServer
from tests.support.profiles import profile_file

no_credentials = cli_harness.no_credentials

NAMESPACE = "ml-jobs"
CLAIM = "shared-lustre"
IMAGE = "registry.example.com/team/trainer:2.0"
CONTEXT = "team-a"
TOKEN = "team-a-token"
POOL = {"example.com/pool": "training"}


def _cluster(**changes) -> dict:
    return {"context": CONTEXT, "namespace": NAMESPACE, "pvc": CLAIM, "image": IMAGE, "node_selector": POOL} | changes


def _config(tmp_path: Path, kubeconfig: Path | None = None, **changes) -> str:
    cluster = _cluster(**changes)
    if kubeconfig is not None:
        cluster["kubeconfig"] = str(kubeconfig)
    return str(profile_file(tmp_path, gpu_nodes__max_size=4, cluster=cluster))


def _kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig as a user's own: a context of a cluster with a static token, and another
    context that must not be used."""
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "team-a", "cluster": {"server": server}},
            {"name": "other", "cluster": {"server": server}},
        ],
        "users": [{"name": "team-a", "user": {"token": TOKEN}}, {"name": "other", "user": {"token": "wrong"}}],
        "contexts": [
            {"name": CONTEXT, "context": {"cluster": "team-a", "user": "team-a"}},
            {"name": "other", "context": {"cluster": "other", "user": "other"}},
        ],
        "current-context": "other",
    }
    path.write_text(yaml.safe_dump(document))
    return path


def _node(name: str, *, labels: dict[str, str], gpus: int = 8, efa: int = 32) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {GPU_RESOURCE: str(gpus), EFA_RESOURCE: str(efa)}},
    }


def _eligible(name: str) -> dict:
    labels = {GPU_NODE_LABEL_KEY: "gpu", INSTANCE_TYPE_LABEL_KEY: "p5.48xlarge", **POOL}
    return _node(name, labels=labels)


def _pods_in_namespace(server: KubeApiTestServer, names: list[str]) -> list[str]:
    """The pods add_job_pods made (in our own namespace), moved to the user's."""
    for name in names:
        pod = server.objects.pop(("v1", "pods", "training", name))
        pod["metadata"]["namespace"] = NAMESPACE
        server.objects[("v1", "pods", NAMESPACE, name)] = pod
    return names


@pytest.fixture
def server(monkeypatch, no_credentials):
    """The user's cluster: a namespace, a bound ReadWriteMany claim, two GPU nodes labelled for
    the jobs and one that is not. No AWS credentials anywhere."""
    monkeypatch.setitem(k8s_api_server.RESOURCES["v1"], "nodes", ("Node", False))
    cluster = KubeApiTestServer(required_auth_prefix=f"Bearer {TOKEN}")
    cluster.add_namespace(NAMESPACE)
    cluster.add(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": CLAIM, "namespace": NAMESPACE},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1200Gi"}}},
            "status": {"phase": "Bound", "accessModes": ["ReadWriteMany"], "capacity": {"storage": "1200Gi"}},
        }
    )
    for name in ("gpu-a", "gpu-b"):
        cluster.add(_eligible(name))
    cluster.add(_node("gpu-unlabelled", labels={INSTANCE_TYPE_LABEL_KEY: "p5.48xlarge"}))
    with cluster:
        yield cluster


@pytest.fixture
def config(server, tmp_path, monkeypatch) -> str:
    import nvrx_eks.jobs.commands as job_commands

    def no_stack(*_args, **_kwargs):
        raise AssertionError("a config with a cluster: section must not read our stack's outputs")

    monkeypatch.setattr(job_commands, "read_stack_outputs", no_stack)
    return _config(tmp_path, _kubeconfig(tmp_path / "kubeconfig", server.url))


def test_render_takes_namespace_claim_image_and_node_selector_from_the_cluster_section(tmp_path):
    config = _config(tmp_path)
    rendered = run_cli("render", "-c", config, "--nodes", "2")
    assert rendered.code == 0, rendered.output
    documents = list(yaml.safe_load_all(rendered.stdout))
    assert {d["metadata"]["namespace"] for d in documents} == {NAMESPACE}
    pod = next(d for d in documents if d["kind"] == "JobSet")["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"
    ]["spec"]
    assert pod["containers"][0]["image"] == IMAGE
    assert pod["nodeSelector"] == {GPU_NODE_LABEL_KEY: "gpu", INSTANCE_TYPE_LABEL_KEY: "p5.48xlarge", **POOL}
    assert [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v] == [CLAIM]
    # The coordinator's pod selects no node pool: the user's cluster has no system nodes of ours.
    coordinator = next(d for d in documents if d["kind"] == "JobSet")["spec"]["replicatedJobs"][1]
    assert coordinator["name"] == "coordinator"
    coordinator_pod = coordinator["template"]["spec"]["template"]["spec"]
    assert "nodeSelector" not in coordinator_pod and coordinator_pod["containers"][0]["image"] == IMAGE
    validated = run_cli("validate", "-c", config, "-", stdin=rendered.stdout)
    assert validated.code == 0, validated.output


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"namespace": "ML_Jobs"}, "cluster.namespace: 'ML_Jobs' is not a Kubernetes name"),
        ({"image": "trainer"}, "cluster.image: 'trainer' is not an image reference with a tag or digest"),
        ({"node_selector": {GPU_NODE_LABEL_KEY: "x"}}, f"'{GPU_NODE_LABEL_KEY}' is selected on by every job pod"),
        ({"node_selector": {"bad key!": "x"}}, "'bad key!' is not a label key"),
        ({"pvc": None}, "cluster.pvc: required field is missing"),
        ({"namspace": "x"}, "cluster.namspace: unknown field"),
    ],
)
def test_a_wrong_cluster_section_names_the_field(tmp_path, changes, message):
    cluster = {k: v for k, v in _cluster(**changes).items() if v is not None}
    config = str(profile_file(tmp_path, cluster=cluster))
    result = run_cli("render", "-c", config)
    assert result.code == 2 and message in result.stderr, result.output
    assert "Traceback" not in result.output


def test_synth_refuses_a_config_that_names_an_existing_cluster(tmp_path):
    result = run_cli("synth", "-c", _config(tmp_path))
    assert result.code == 2 and "cluster: names a cluster this project did not create" in result.stderr, result.output
    assert "Traceback" not in result.output


def test_live_and_s3_data_are_refused_for_an_existing_cluster(tmp_path):
    config = _config(tmp_path)
    live = run_cli("render", "-c", config, "--live")
    assert live.code == 2 and "drop --live" in live.stderr
    data = run_cli("render", "-c", config, "--data", "s3://bucket/data/x")
    assert data.code == 2 and "give the path where the shards are on the claim" in data.stderr


def test_submit_status_logs_delete_through_the_kubeconfig_context(server, config):
    """Acceptance (4): render/submit/status against an existing-cluster config."""
    submitted = run_cli("submit", "-c", config, "--nodes", "2")
    assert submitted.code == 0, submitted.output
    assert f"created JobSet train in {NAMESPACE}" in submitted.stderr
    jobset = server.get(JOBSET.api_version, JOBSET.plural, NAMESPACE, "train")
    assert jobset is not None
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == IMAGE
    assert server.get("v1", "configmaps", NAMESPACE, "train-config") is not None
    # Every request used the named context's credentials, not the current context's.
    assert {r.headers["authorization"] for r in server.requests} == {f"Bearer {TOKEN}"}
    # The server-side dry run ran before the creation, as for our own cluster.
    assert [r.param("dryRun") for r in server.requests if r.method == "POST"] == ["All"] * 3 + [None] * 3

    pods = _pods_in_namespace(server, add_job_pods(server, "train", 2))
    status = run_cli("status", "-c", config, "train")
    assert status.code == 0, status.output
    assert "JobSet train: Running" in status.stdout and pods[1] in status.stdout

    server.set_log(NAMESPACE, pods[1], ["[rank9] step 10 loss 2.1"])
    logs = run_cli("logs", "-c", config, "train", "--node", "1")
    assert logs.code == 0 and logs.stdout.splitlines() == ["[rank9] step 10 loss 2.1"]

    deleted = run_cli("delete", "-c", config, "train")
    assert deleted.code == 0, deleted.output
    assert server.get(JOBSET.api_version, JOBSET.plural, NAMESPACE, "train") is None


def test_status_as_json_and_yaml(server, config):
    assert run_cli("submit", "-c", config, "--nodes", "2").code == 0
    listed = json.loads(run_cli("status", "-c", config, "-o", "json").stdout)
    assert listed["namespace"] == NAMESPACE and [j["name"] for j in listed["jobs"]] == ["train"]
    server.objects[(JOBSET.api_version, JOBSET.plural, NAMESPACE, "train")]["status"] = {"restarts": 1}
    one = run_cli("status", "-c", config, "train", "-o", "yaml")
    assert one.code == 0, one.output
    data = yaml.safe_load(one.stdout)
    assert data["kind"] == "JobSet" and data["phase"] == "Pending"
    assert data["restarts"] == {"kubernetes": 1, "max_kubernetes": 3, "containers": 0}
    assert data["pods"] == [] and data["nodes"] is None


def test_submit_refuses_more_nodes_than_the_selector_matches(server, config):
    result = run_cli("submit", "-c", config, "--nodes", "4")
    assert result.code == 2
    assert "cluster.node_selector: 2 node(s) of the cluster match" in result.stderr
    assert f"label nodes -l {INSTANCE_TYPE_LABEL_KEY}=p5.48xlarge {GPU_NODE_LABEL_KEY}=gpu" in result.stderr
    assert not [r for r in server.requests if r.method == "POST"]


def test_submit_with_an_unknown_context_names_the_field(server, tmp_path):
    config = _config(tmp_path, _kubeconfig(tmp_path / "kubeconfig", server.url), context="nope")
    result = run_cli("submit", "-c", config, "--nodes", "2")
    assert result.code == 2 and "cluster.context: 'nope' cannot be used from" in result.stderr
    missing = _config(tmp_path / "other", tmp_path / "no-such-kubeconfig")
    result = run_cli("status", "-c", missing)
    assert result.code == 2 and "cluster.kubeconfig:" in result.stderr and "does not exist" in result.stderr


def test_token_and_kubeconfig_point_at_the_users_own_context(tmp_path):
    for command in ("token", "kubeconfig"):
        result = run_cli(command, "-c", _config(tmp_path))
        assert result.code == 2 and f"kubectl --context {CONTEXT}" in result.stderr


def test_preflight_checks_the_existing_cluster(server, config):
    result = run_cli("preflight", "-c", config, "--nodes", "2", "-o", "json")
    assert result.code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] is True
    assert [c["status"] for c in data["checks"]] == ["PASS"] * 6
    assert "Bound, ReadWriteMany, 1200Gi" in data["checks"][3]["detail"]


def test_preflight_fails_on_what_a_job_would_miss(server, config):
    server.objects.pop(("v1", "persistentvolumeclaims", NAMESPACE, CLAIM))
    server.installed.clear()
    server.installed.add(PYTORCHJOB.api_version)
    server.add(_node("gpu-small", labels=_eligible("x")["metadata"]["labels"], gpus=4))
    server.kubernetes_version = ("1", "34+")
    result = run_cli("preflight", "-c", config, "--nodes", "2", "-o", "yaml")
    assert result.code == 2
    checks = {c["name"]: c for c in yaml.safe_load(result.stdout)["checks"]}
    assert (
        checks["Kubernetes 1.35"]["status"] == "WARN"
        and 'kubernetes_version: "1.34"' in checks["Kubernetes 1.35"]["fix"]
    )
    assert checks[f"claim {CLAIM}"]["status"] == "FAIL"
    assert checks["job API"]["status"] == "WARN" and "--api pytorchjob" in checks["job API"]["fix"]
    assert checks["2 GPU node(s) for the pods"]["status"] == "FAIL"
    assert "gpu-small do not offer 8 nvidia.com/gpu" in checks["2 GPU node(s) for the pods"]["detail"]
    assert "preflight check(s) failed" in result.stderr and "submitting a job to the cluster" in result.stderr
