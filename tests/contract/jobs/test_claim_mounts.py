"""A job's pods write only their own directories on the shared FSx claim: the claim is mounted
read-only at /fsx and the job's run directory (and a checkpoint directory set apart from it) on
top of it, writable, through subPath. Before, every pod mounted the whole claim read-write and
could plant a checkpoint or data file in any other job's directory. (That these directories lie in
the job's own, /fsx/runs/<name>, is tests/contract/jobs/test_own_run_dir.py's.)"""

from __future__ import annotations

from infra.config import resolve_config
from nvrx_eks.jobs.render import render_job
from nvrx_eks.jobs.spec import build_jobspec, load_train_config

CONFIG = resolve_config("p5")


def _fsx_mounts(overrides: list[str], workload: str = "train") -> list[dict]:
    train = load_train_config(None, overrides, None, config=CONFIG, nodes=2)
    spec = build_jobspec(CONFIG, nodes=2, name="train", train=train, workload=workload)  # type: ignore[arg-type]
    job = render_job(spec).job_document
    pod = job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "fsx"]


def _described(mounts: list[dict]) -> list[tuple[str, str | None, bool]]:
    return [(m["mountPath"], m.get("subPath"), bool(m.get("readOnly"))) for m in mounts]


def test_the_claim_is_read_only_and_only_the_run_directory_is_writable():
    assert _described(_fsx_mounts([])) == [("/fsx", None, True), ("/fsx/runs/train", "runs/train", False)]


def test_a_checkpoint_directory_apart_from_the_run_is_writable_too():
    mounts = _fsx_mounts(["run_dir=runs/train/run", "checkpoint.dir=runs/train/ckpt"])
    assert _described(mounts) == [
        ("/fsx", None, True),
        ("/fsx/runs/train/ckpt", "runs/train/ckpt", False),
        ("/fsx/runs/train/run", "runs/train/run", False),
    ]


def test_a_checkpoint_directory_inside_the_run_shares_its_mount():
    mounts = _fsx_mounts(["checkpoint.dir=runs/train/ckpt"])
    assert _described(mounts) == [("/fsx", None, True), ("/fsx/runs/train", "runs/train", False)]


def test_the_fabric_test_writes_only_its_exchange_directory_in_its_own():
    mounts = _fsx_mounts([], workload="nccl-test")
    assert _described(mounts) == [
        ("/fsx", None, True),
        ("/fsx/runs/train/key-exchange", "runs/train/key-exchange", False),
    ]
