"""Two jobs never write one run directory: a job writes only /fsx/runs/<its name> (render refuses
a run_dir or checkpoint.dir elsewhere, so before anything is sent to the cluster), and `submit`
refuses a name that a job of either kind already has, running or finished. Against the loopback
Kubernetes API test server."""

from __future__ import annotations

import pytest

from nvrx_eks.facts.job_kinds import JOBSET, PYTORCHJOB
from tests.support import cli_harness
from tests.support.cli_harness import add_fsx_volume, deploy_fake_environment, run_cli

aws = cli_harness.aws
k8s_server = cli_harness.k8s_server


@pytest.fixture
def cluster(aws, k8s_server):
    deploy_fake_environment(k8s_server.url)
    add_fsx_volume(k8s_server)
    k8s_server.installed.add(PYTORCHJOB.api_version)
    return k8s_server


def _submit(*args: str):
    return run_cli("submit", "--nodes", "2", *args)


def _jobs(cluster) -> set[str]:
    return {
        job["metadata"]["name"]
        for kind in (JOBSET, PYTORCHJOB)
        for job in cluster.list(kind.api_version, kind.plural, "training")
    }


def _sent_for(cluster, name: str) -> list:
    return [r for r in cluster.requests if r.method == "POST" and r.body["metadata"]["name"].startswith(name)]


def _finish(cluster, kind, name: str) -> None:
    job = cluster.objects[(kind.api_version, kind.plural, "training", name)]
    job["status"] = {"conditions": [{"type": "Completed", "status": "True"}, {"type": "Succeeded", "status": "True"}]}


@pytest.mark.parametrize(
    "overrides, field, path",
    [
        (["--set", "run_dir=runs/first"], "run_dir", "/fsx/runs/first"),
        (["--set", "checkpoint.dir=runs/first/checkpoints"], "checkpoint.dir", "/fsx/runs/first/checkpoints"),
        (["--set", "run_dir=runs"], "run_dir", "/fsx/runs"),
    ],
    ids=["its run_dir", "checkpoint.dir inside its run_dir", "run_dir above it"],
)
def test_submit_refuses_another_jobs_run_even_once_it_finished(cluster, overrides, field, path):
    """Before, only a live writer was refused: a finished run could be written over (and resumed
    from, by a job it was not)."""
    assert _submit("--name", "first").code == 0
    _finish(cluster, JOBSET, "first")
    result = _submit("--name", "second", *overrides)
    assert result.code == 2, result.output
    assert "Traceback" not in result.output
    assert f"--set {field}: {path} is outside this job's own directory /fsx/runs/second" in result.stderr
    # Refused before anything was sent: not even a dry run of the second job.
    assert not _sent_for(cluster, "second")
    assert _jobs(cluster) == {"first"}


@pytest.mark.parametrize("finished", [False, True], ids=["running", "finished"])
def test_submit_refuses_a_name_a_job_of_the_other_kind_has(cluster, finished):
    """A JobSet and a PyTorchJob of one name would write one run directory."""
    assert _submit("--name", "first", "--api", "pytorchjob").code == 0
    if finished:
        _finish(cluster, PYTORCHJOB, "first")
    sent = len(cluster.requests)
    result = _submit("--name", "first")
    assert result.code == 2, result.output
    assert "PyTorchJob 'first' already exists in 'training'" in result.stderr
    assert "nvrx-eks delete first" in result.stderr and "another --name" in result.stderr
    assert not [r for r in cluster.requests[sent:] if r.method != "GET"]  # refused before anything was sent


def test_jobs_of_their_own_names_run_side_by_side(cluster):
    assert _submit("--name", "first").code == 0
    # runs/firsts shares a prefix with runs/first, not a directory.
    assert _submit("--name", "firsts").code == 0
    assert _submit("--name", "third", "--api", "pytorchjob").code == 0
    assert _jobs(cluster) == {"first", "firsts", "third"}
