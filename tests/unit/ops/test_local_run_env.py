"""The environment `nvrx-eks local` and `gpu-smoke` give ft_launcher and its ranks carries NVRx's
NCCL restart settings, as the pod's does (workloads.process_env.NCCL_RESTART_ENV)."""

from __future__ import annotations

from rich.console import Console

from nvrx_eks.local import runner
from workloads.process_env import NCCL_RESTART_ENV


def test_the_launch_environment_carries_the_nccl_restart_settings_of_the_pod(tmp_path, monkeypatch):
    # What ft_launcher would otherwise do: set TearDown when the variable is unset. A shell that
    # exported it gets the pod's value too.
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    seen: list[dict[str, str]] = []

    def refuse_after_seeing_the_env(config_path, world, env, console):
        seen.append(env)
        return ["stopped here: the launch environment is what this test checks"]

    monkeypatch.setattr(runner, "preflight", refuse_after_seeing_the_env)
    with open(tmp_path / "console.txt", "w") as sink:
        run = runner.LocalRun(
            nproc=1, steps=2, faults="", run_dir=tmp_path / "run", preset="tiny", checkpoint_interval=1, backend="nvrx"
        )
        runner.run_local(run, console=Console(file=sink), print_summary=False)

    assert len(seen) == 1
    assert {name: seen[0].get(name) for name in NCCL_RESTART_ENV} == NCCL_RESTART_ENV
