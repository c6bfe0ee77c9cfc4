"""Shared helpers for the trainer tests: port allocation safe across xdist workers, a local run
under ft_launcher, and the check that a run left no process behind."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from tests.support import REPO_ROOT

REPO = REPO_ROOT


@contextlib.contextmanager
def coordinator_serving(port: int, nnodes: int | str = 1, rdzv_id: str = "nvrx-eks") -> Iterator[None]:
    """The job's coordinator (workloads.coordinator) on 127.0.0.1:port and port + 1, started as
    `nvrx-eks local` starts it, for a test that runs ft_launcher itself (with
    build_ft_launcher_argv's default rendezvous id)."""
    from nvrx_eks.local.processes import start_coordinator, stop_coordinator
    from workloads.config import TrainConfig
    from workloads.launch import MULTI_LAUNCHER_ENV

    # Several simulated nodes on this host: the coordinator's rendezvous loop must not close on them.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), MULTI_LAUNCHER_ENV: "1"}
    coordinator = start_coordinator(TrainConfig(), nnodes, port, env, subprocess.DEVNULL, rdzv_id=rdzv_id)
    try:
        yield
    finally:
        stop_coordinator(coordinator)


def single_rank_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment ft_launcher gives a world of one rank, for a test that runs the trainer's
    attempt (workloads.train.train_attempt) in its own process."""
    from nvrx_eks.local.processes import free_port_pair

    for name, value in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port_pair()),
    }.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def single_rank() -> Iterator[None]:
    """A process group of this process alone (gloo), for code that needs one; the NVRx checkpoint
    worker it may start is stopped after."""
    import torch.distributed as dist

    from workloads.checkpoint.nvrx_worker import checkpoint_worker

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    checkpoint_worker.stop()
    dist.destroy_process_group()


def port_pair() -> int:
    """A port P with P and P+1 free. Each xdist worker draws from its own range below the
    ephemeral ports, so parallel runs never pick the same pair."""
    from nvrx_eks.local.processes import free_port_pair

    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    return free_port_pair(low=20000 + index * 1000, high=20000 + index * 1000 + 998)


def local_run(
    run_dir: Path,
    *,
    steps: int,
    faults: str = "",
    interval: int = 5,
    backend: str = "nvrx",
    nproc: int = 2,
    nodes: int = 1,
    overrides: tuple[str, ...] = (),
) -> dict:
    """Run the trainer under ft_launcher like `nvrx-eks local` and return local_run.json."""
    from nvrx_eks.local.runner import LocalRun, run_local

    run = LocalRun(
        nproc=nproc,
        nodes=nodes,
        steps=steps,
        faults=faults,
        run_dir=run_dir,
        preset="tiny",
        checkpoint_interval=interval,
        backend=backend,
        overrides=overrides,
        port=port_pair(),
    )
    run_local(run, console=Console(file=open(os.devnull, "w")))  # noqa: SIM115
    return json.loads((run_dir / "local_run.json").read_text())


def session_root(tmp_path_factory) -> Path:
    """A directory shared by all xdist workers of this pytest session (and only this one)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def exclusive_trainer_runs(tmp_path_factory) -> Iterator[None]:
    """Multi-process trainer runs happen one at a time across the session's xdist workers: their
    short local timeouts assume the CPU is not shared with another trainer run. The trainer test
    modules share one xdist_group, so this lock only matters for a run started from elsewhere."""
    with open(session_root(tmp_path_factory) / "trainer-runs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.info["cmdline"] and text in " ".join(proc.info["cmdline"]):
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


def assert_nothing_left(run_dir: Path, record: dict) -> None:
    """Every process of the run exited by itself (the runner killed nothing) and none whose
    command line names the run directory is alive."""
    assert record["killed_after_exit"] == [], f"processes had to be killed: {record}"
    assert processes_mentioning(str(run_dir)) == []
