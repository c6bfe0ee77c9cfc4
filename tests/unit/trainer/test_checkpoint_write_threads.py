"""checkpoint.write_threads: the NVRx worker writes a rank's shards with that many threads, each
its own file, and the checkpoint commits and loads whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support import trainer_fixtures
from workloads.checkpoint.checkpointer import Checkpointer
from workloads.config import TrainConfig
from workloads.events import EventLog
from workloads.faults import FaultInjector

single_rank = trainer_fixtures.single_rank


def test_the_default_writes_with_more_than_one_thread():
    assert TrainConfig().checkpoint.write_threads == 2


@pytest.mark.parametrize("threads", [1, 3])
def test_each_write_thread_writes_its_own_file_and_the_checkpoint_loads(single_rank, tmp_path: Path, threads: int):
    cfg = TrainConfig.from_dict(
        {}, "x", [f"run_dir={tmp_path}", "checkpoint.backend=nvrx", f"checkpoint.write_threads={threads}"]
    )
    events = EventLog(tmp_path, 0)
    ckpt = Checkpointer(
        cfg,
        events=events,
        faults=FaultInjector((), 0, tmp_path / "faults", events.emit),
        device=torch.device("cpu"),
        identity={"world_size": 1, "preset": cfg.model.preset},
    )
    # Tensors of several sizes (the worker splits them by size), their count and sizes distinct
    # per case so the worker's cached write plan of another case cannot serve this one.
    state = {f"t{i}": torch.arange(1024.0 * (i + 1) + threads) for i in range(4 + threads)}
    ckpt.save(4, state)
    ckpt.wait()
    loaded = ckpt.load_latest(lambda: {k: torch.zeros_like(v) for k, v in state.items()})
    ckpt.close()
    assert loaded is not None and loaded.step == 4
    assert all(torch.equal(loaded.state[k], v) for k, v in state.items())
    shards = sorted(p.name for p in Path(cfg.checkpoint_dir).glob("step_*/__0_*.distcp"))
    assert len(shards) == threads, shards
