"""`delete` keeps the job's NetworkPolicy until its pods are gone: they run on for up to their
termination grace period with unauthenticated stores, which only the policy fences in. Against the
loopback Kubernetes API test server (whose garbage collector removes a job's pods at once, so a
pod "still terminating" is one the test adds back)."""

from __future__ import annotations

import pytest

from nvrx_eks.facts.job_kinds import JOBSET
from tests.support import cli_harness
from tests.support.cli_harness import add_fsx_volume, add_job_pods, deploy_fake_environment, run_cli

aws = cli_harness.aws
k8s_server = cli_harness.k8s_server

JOBSETS = f"/apis/{JOBSET.api_version}/namespaces/training/{JOBSET.plural}"
NETWORK_POLICIES = "/apis/networking.k8s.io/v1/namespaces/training/networkpolicies"


@pytest.fixture
def cluster(aws, k8s_server):
    deploy_fake_environment(k8s_server.url)
    add_fsx_volume(k8s_server)
    assert run_cli("submit", "--nodes", "2").code == 0
    k8s_server.requests.clear()  # what follows is delete's alone
    return k8s_server


def _policy(cluster) -> dict | None:
    return cluster.get("networking.k8s.io/v1", "networkpolicies", "training", "train")


def _index(cluster, method: str, path: str) -> int:
    return next(i for i, r in enumerate(cluster.requests) if r.method == method and r.path == path)


def test_the_policy_goes_with_the_last_pod_not_with_the_job(cluster):
    names = add_job_pods(cluster, "train", 2)
    pods = {name: cluster.get("v1", "pods", "training", name)["metadata"]["uid"] for name in names}
    result = run_cli("delete", "train")
    assert result.code == 0, result.output
    assert cluster.list(JOBSET.api_version, JOBSET.plural) == []
    # The pods own the policy now: the garbage collector deletes it once the last of them is gone,
    # and it was handed over before the job's deletion began (which deletes the job's dependents).
    policy = _policy(cluster)
    assert policy is not None
    assert {(r["kind"], r["name"], r["uid"]) for r in policy["metadata"]["ownerReferences"]} >= {
        ("Pod", name, uid) for name, uid in pods.items()
    }
    assert _index(cluster, "PATCH", f"{NETWORK_POLICIES}/train") < _index(cluster, "DELETE", f"{JOBSETS}/train")
    assert not cluster.requests_to("DELETE", f"{NETWORK_POLICIES}/train")


def test_with_wait_the_policy_is_deleted_after_the_pods_are_gone(cluster):
    add_job_pods(cluster, "train", 2)
    result = run_cli("delete", "train", "--wait")
    assert result.code == 0, result.output
    assert _policy(cluster) is None
    last_pod_listing = max(i for i, r in enumerate(cluster.requests) if r.method == "GET" and r.path.endswith("/pods"))
    assert _index(cluster, "DELETE", f"{NETWORK_POLICIES}/train") > last_pod_listing


def test_a_job_without_pods_takes_its_policy_at_once(cluster):
    assert run_cli("delete", "train").code == 0
    assert _policy(cluster) is None
    assert not cluster.requests_to("PATCH", f"{NETWORK_POLICIES}/train")
