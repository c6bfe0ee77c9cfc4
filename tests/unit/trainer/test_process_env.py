"""The trainer processes' environment and the NCCL versions they run on (workloads.process_env)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from workloads import process_env
from workloads.process_env import TRAINER_PROCESS_ENV, nccl_version_problem


@pytest.mark.parametrize(
    ("version", "refused"),
    [
        ((2, 26, 1), "older than 2.26.2"),
        ((2, 26, 2), None),
        ((2, 28, 2), None),
        ((2, 28, 3), "2.28.3-2.28.8"),
        ((2, 28, 8), "2.28.3-2.28.8"),
        ((2, 28, 9), None),  # torch 2.11's
        ((2, 29, 7), None),  # torch 2.13's
    ],
)
def test_nccl_versions_the_in_process_restart_runs_on(version, refused):
    problem = nccl_version_problem(version)
    assert problem is None if refused is None else refused in problem


def test_the_check_exits_1_with_the_reason_on_an_avoided_nccl(monkeypatch, capsys):
    import torch
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 28, 5))
    assert process_env.main(["--check-nccl"]) == 1
    assert "NCCL 2.28.5 is in 2.28.3-2.28.8" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 29, 7))
    assert process_env.main(["--check-nccl"]) == 0
    assert process_env.main([]) == 2


def test_the_check_refuses_a_torch_without_nccl_in_one_line():
    # As the image build runs it, on this machine's CPU build of torch.
    result = subprocess.run(
        [sys.executable, "-m", "workloads.process_env", "--check-nccl"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1 and "has no NCCL" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_pod_env_carries_the_allocator_setting():
    from infra.config import resolve_config
    from nvrx_eks.jobs.render import trainer_env
    from nvrx_eks.jobs.spec import build_jobspec, load_train_config

    spec = build_jobspec(resolve_config("p5"), nodes=2, name="t", train=load_train_config(None, [], None))
    env = trainer_env(spec)
    assert {k: env[k] for k in TRAINER_PROCESS_ENV} == TRAINER_PROCESS_ENV
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
