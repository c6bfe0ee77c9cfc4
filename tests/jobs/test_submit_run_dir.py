"""`submit` refuses a job whose run or checkpoint directory a live job of this tool already writes
(two writers delete each other's checkpoints), against the loopback Kubernetes API test server."""

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


@pytest.mark.parametrize(
    "overrides, ours, relation, theirs",
    [
        (["--set", "run_dir=runs/first"], "run directory /fsx/runs/first", "is also", "/fsx/runs/first"),
        (["--set", "run_dir=/fsx/runs/./first/"], "run directory /fsx/runs/first", "is also", "/fsx/runs/first"),
        (
            ["--set", "checkpoint.dir=runs/first/checkpoints"],
            "checkpoint directory /fsx/runs/first/checkpoints",
            "lies inside",
            "/fsx/runs/first",
        ),
        (["--set", "run_dir=runs"], "run directory /fsx/runs", "holds", "/fsx/runs/first"),
    ],
    ids=["same run_dir", "same run_dir spelled differently", "checkpoint.dir inside its run_dir", "run_dir above it"],
)
def test_submit_refuses_a_directory_a_live_job_writes(cluster, overrides, ours, relation, theirs):
    assert _submit("--name", "first").code == 0
    result = _submit("--name", "second", *overrides)
    assert result.code == 2, result.output
    assert "Traceback" not in result.output
    message = " ".join(result.stderr.split())
    assert f"this job's {ours} {relation} {theirs}, the run directory of JobSet 'first'" in message
    assert "nvrx-eks delete first" in message and "another run_dir" in message
    # Refused before anything was sent: not even a dry run of the second job.
    assert not [r for r in cluster.requests if r.method == "POST" and r.body["metadata"]["name"].startswith("second")]
    assert _jobs(cluster) == {"first"}


def test_a_job_set_apart_by_its_checkpoint_dir_blocks_on_that_too(cluster):
    assert _submit("--name", "first", "--set", "checkpoint.dir=shared/ckpt").code == 0
    result = _submit("--name", "second", "--set", "checkpoint.dir=shared/ckpt")
    assert result.code == 2
    assert "the checkpoint directory of JobSet 'first'" in " ".join(result.stderr.split())


def test_jobs_on_their_own_directories_run_side_by_side(cluster):
    assert _submit("--name", "first").code == 0
    # runs/firsts shares a prefix with runs/first, not a directory.
    assert _submit("--name", "second", "--set", "run_dir=runs/firsts").code == 0
    assert _submit("--name", "third").code == 0
    assert _jobs(cluster) == {"first", "second", "third"}


@pytest.mark.parametrize("condition", ["Completed", "Failed"])
def test_a_finished_jobset_does_not_block(cluster, condition):
    assert _submit("--name", "first").code == 0
    first = cluster.objects[(JOBSET.api_version, JOBSET.plural, "training", "first")]
    first["status"] = {"conditions": [{"type": condition, "status": "True"}]}
    assert _submit("--name", "second", "--set", "run_dir=runs/first").code == 0


def test_a_live_pytorchjob_blocks_and_a_finished_one_does_not(cluster):
    assert _submit("--name", "first", "--api", "pytorchjob").code == 0
    result = _submit("--name", "second", "--set", "run_dir=runs/first")
    assert result.code == 2
    assert "the run directory of PyTorchJob 'first'" in " ".join(result.stderr.split())
    first = cluster.objects[(PYTORCHJOB.api_version, PYTORCHJOB.plural, "training", "first")]
    first["status"] = {"conditions": [{"type": "Running", "status": "False"}, {"type": "Succeeded", "status": "True"}]}
    assert _submit("--name", "second", "--set", "run_dir=runs/first").code == 0
