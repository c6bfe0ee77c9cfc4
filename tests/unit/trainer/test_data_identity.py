"""The data loader's state records which data set it indexes: a resume onto other shards of the
same size is refused naming data.path, the same shards resume wherever they were copied, synthetic
data resumes as before, and a checkpoint written before the digest was saved still loads, with a
warning that its data could not be compared."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from nvrx_eks.data.prepare import prepare
from nvrx_eks.facts.errors import ConfigError
from workloads.checkpoint.checkpointer import Checkpointer
from workloads.config import DataConfig, TrainConfig
from workloads.data import build_batches
from workloads.events import EventLog, load_run
from workloads.faults import FaultInjector


def _shard_set(tmp_path: Path, name: str, text: str) -> Path:
    source = tmp_path / f"{name}.txt"
    source.write_text(text)
    prepare([source], tmp_path / name, "byte", shard_tokens=2000)
    return tmp_path / name


def _batches(path: Path | None):
    source = {"source": "memmap", "path": str(path)} if path is not None else {}
    return build_batches(DataConfig(seq_len=16, batch_size=2, **source), rank=0, world_size=1, vocab_size=256, seed=1)


def test_other_shards_with_as_many_windows_are_refused_naming_data_path(tmp_path):
    a = _shard_set(tmp_path, "a", "abcd" * 1000)
    b = _shard_set(tmp_path, "b", "wxyz" * 1000)  # same token count, other tokens
    trained = _batches(a)
    trained.next_batch()
    state = trained.state_dict()
    assert state["epoch_length"] == _batches(b).state_dict()["epoch_length"]
    with pytest.raises(ConfigError, match=r"^data.path: the data set differs from the one the checkpoint was trained"):
        _batches(b).load_state_dict(state)
    # The same shard set, copied elsewhere (e.g. to FSx), is the same data.
    copied = shutil.copytree(a, tmp_path / "copy-of-a")
    resumed = _batches(copied)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.next_batch()[0], trained.next_batch()[0])


def test_synthetic_data_resumes_as_before():
    trained = _batches(None)
    trained.next_batch()
    resumed = _batches(None)
    resumed.load_state_dict(trained.state_dict())
    assert torch.equal(resumed.next_batch()[0], trained.next_batch()[0])


class _WrittenBeforeTheDigest:
    """The loader's state as checkpoints held it before the digest was saved."""

    def __init__(self, batches):
        self.batches = batches

    def state_dict(self) -> dict:
        state = self.batches.state_dict()
        del state["dataset_sha256"]
        return state

    def load_state_dict(self, state: dict) -> None:
        raise AssertionError("only saved")


@pytest.fixture
def single_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _checkpointer(run_dir: Path, batches) -> Checkpointer:
    cfg = TrainConfig.from_dict({}, "x", [f"run_dir={run_dir}", "checkpoint.backend=sync"])
    events = EventLog(run_dir, 0)
    return Checkpointer(
        cfg,
        events=events,
        faults=FaultInjector((), 0, run_dir / "faults", events.emit),
        device=torch.device("cpu"),
        identity={"world_size": 1, "preset": "tiny"},
        states={"data": batches},
    )


def test_a_checkpoint_without_the_digest_loads_with_a_warning(single_rank, tmp_path):
    shards = _shard_set(tmp_path, "a", "abcd" * 1000)
    old = _batches(shards)
    for _ in range(3):
        old.next_batch()
    writer = _checkpointer(tmp_path, _WrittenBeforeTheDigest(old))
    writer.save(3, writer.state_dict())
    writer.close()

    resumed = _batches(shards)
    assert _checkpointer(tmp_path, resumed).restore() == 3
    assert (resumed.epoch, resumed.cursor) == (old.epoch, old.cursor)
    (unknown,) = load_run(tmp_path).of("checkpoint_state_unknown")
    assert unknown["keys"] == ["data.dataset_sha256"]
