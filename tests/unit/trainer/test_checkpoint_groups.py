"""The gloo groups of the checkpoint components (workloads.checkpoint.groups) on any run: their
collectives are bounded by the save's own bound, not torch's 30-minute gloo default; the
in-process abort releases them on NCCL runs too; and the local tier reports progress to the
in-process watchdog while it waits for the previous iteration's writer (one process, gloo)."""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from workloads.checkpoint import local_tier
from workloads.checkpoint.local_tier import LocalTier
from workloads.checkpoint.writers import DcpAsyncWriter, build_writer
from workloads.config import InProcessConfig, TrainConfig
from workloads.events import EventLog


@pytest.fixture
def single_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _config(tmp_path: Path) -> TrainConfig:
    return TrainConfig.from_dict(
        {"run_dir": str(tmp_path), "checkpoint": {"finalize_timeout_s": 45, "local": {"interval_steps": 2}}}
    )


def _timeout(group: dist.ProcessGroup) -> datetime.timedelta:
    return group._get_backend(torch.device("cpu")).options._timeout


def test_the_local_tier_and_dcp_async_groups_give_up_after_the_saves_bound(single_rank, tmp_path):
    cfg = _config(tmp_path)
    bound = datetime.timedelta(seconds=cfg.checkpoint.finalize_timeout_s)

    tier = LocalTier(cfg, events=EventLog(tmp_path, 0), nproc_per_node=1)
    writer = build_writer(
        "dcp-async",
        rank=0,
        device=torch.device("cpu"),
        with_sha=True,
        commit=lambda pending: None,
        unguarded=contextlib.nullcontext,
        group_timeout_s=cfg.checkpoint.finalize_timeout_s,
        write_threads=cfg.checkpoint.write_threads,
        attempt="a",
    )

    assert _timeout(tier._group) == bound
    assert isinstance(writer, DcpAsyncWriter) and _timeout(writer._group) == bound


def test_the_local_tier_pings_while_it_waits_for_the_previous_iterations_writer(single_rank, tmp_path, monkeypatch):
    """A thread blocked in join runs no pending calls, so without pings the in-process watchdog
    sees no progress for as long as the failed iteration's writer takes."""
    writer = threading.Thread(target=time.sleep, args=(0.5,), daemon=True)
    writer.start()
    monkeypatch.setattr(local_tier, "_previous_writer", writer)
    pings: list[float] = []

    tier = LocalTier(_config(tmp_path), events=EventLog(tmp_path, 0), nproc_per_node=1, ping=lambda: pings.append(1))

    assert not writer.is_alive() and local_tier._previous_writer is None
    assert len(pings) >= 5  # every _PING_EVERY_S of the 0.5 s join
    assert tier.disabled is None


def test_the_abort_releases_the_gloo_groups_after_nccls_abort_and_first_on_gloo():
    from nvidia_resiliency_ext.inprocess.abort import AbortTorchDistributed

    from workloads.inprocess import ReleaseGlooPeers, abort_chain

    # Compose runs right to left.
    nccl = abort_chain(InProcessConfig(), "nccl", 29501)
    assert [type(a) for a in reversed(nccl)] == [AbortTorchDistributed, ReleaseGlooPeers]
    gloo = abort_chain(InProcessConfig(), "gloo", 29501)
    assert [type(a) for a in reversed(gloo)] == [ReleaseGlooPeers, AbortTorchDistributed]
    off = InProcessConfig(release_gloo_sockets=False)
    assert [type(a) for a in abort_chain(off, "nccl", 29501)] == [AbortTorchDistributed]
