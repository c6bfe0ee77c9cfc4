"""What the node-local tier (workloads.checkpoint.local_tier) refuses or gives up, in one process
(world size 1, gloo): a copy of this run written with another identity ends the run with the named
error instead of failing in fill_state restart after restart, a copy that records no identity is
skipped, and a root that cannot be created turns the tier off instead of failing the setup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from nvrx_eks.facts.errors import ConfigError
from workloads.checkpoint.errors import CheckpointIncompatible
from workloads.checkpoint.local_copies import step_dir
from workloads.checkpoint.local_tier import LocalTier, drop_host_copy
from workloads.config import TrainConfig
from workloads.events import EventLog, load_run


@pytest.fixture
def single_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _tier(run_dir: Path, local_dir: Path, *settings: str) -> LocalTier:
    cfg = TrainConfig.from_dict(
        {"run_dir": str(run_dir), "checkpoint": {"local": {"interval_steps": 2, "dir": str(local_dir)}}},
        "x",
        list(settings),
    )
    return LocalTier(cfg, events=EventLog(run_dir, 0), nproc_per_node=1)


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((8,), value)}, "train": {"step": int(value)}}


def _saved(run_dir: Path, local_dir: Path, step: int) -> None:
    tier = _tier(run_dir, local_dir)
    tier.save(step, _state(float(step)))
    tier.wait()


def test_a_copy_of_another_layout_is_skipped_for_the_fsx_checkpoint(single_rank, tmp_path):
    """A resume on another world size or shard mode: the copy is one rank's shard of the old
    layout, so the tier steps aside and the FSx checkpoint is resharded instead."""
    _saved(tmp_path, tmp_path / "local", 4)
    assert (
        _tier(tmp_path, tmp_path / "local", "distributed.shard=hybrid").restore(lambda: _state(0.0), fsx_step=-1)
        is None
    )
    (skipped,) = load_run(tmp_path).of("local_copy_skipped")
    assert skipped["reason"] == "laid out for {'shard': 'full'}, this run for {'shard': 'hybrid'}"


@pytest.mark.parametrize(("setting", "named"), [("model.preset=small", "model.preset")])
def test_a_copy_of_another_identity_ends_the_run_with_the_setting_named(single_rank, tmp_path, setting, named):
    _saved(tmp_path, tmp_path / "local", 4)
    resumed = _tier(tmp_path, tmp_path / "local", setting)
    with pytest.raises(CheckpointIncompatible) as refused:
        resumed.restore(lambda: _state(0.0), fsx_step=-1)
    message = str(refused.value)
    assert isinstance(refused.value, ConfigError)  # the trainer ends with 93: no restart can fix it
    assert message.startswith(f"checkpoint.local.dir: the node-local copy {step_dir(tmp_path / 'local', 4)}/rank0.json")
    assert f"resume with the same {named} or point checkpoint.dir and checkpoint.local.dir at empty" in message


def test_a_copy_that_records_no_identity_is_skipped_and_the_same_run_restores(single_rank, tmp_path):
    _saved(tmp_path, tmp_path / "local", 4)
    assert _tier(tmp_path, tmp_path / "local").restore(lambda: _state(0.0), fsx_step=-1).step == 4
    drop_host_copy()  # as in a new process: the files are all there is
    record_path = step_dir(tmp_path / "local", 4) / "rank0.json"
    record = json.loads(record_path.read_text())
    del record["identity"]  # as written before copies carried one
    record_path.write_text(json.dumps(record))
    assert _tier(tmp_path, tmp_path / "local").restore(lambda: _state(0.0), fsx_step=-1) is None
    (skipped,) = load_run(tmp_path).of("local_copy_skipped")
    assert skipped["reason"] == "records no run identity (written before copies carried one)"


def test_a_root_that_cannot_be_created_turns_the_tier_off_with_one_event(single_rank, tmp_path):
    # Under a regular file, mkdir fails with ENOTDIR whoever runs it: the tests run as root,
    # for whom neither file modes nor a read-only parent directory made with chmod refuse it.
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    tier = _tier(tmp_path, blocker / "local")
    assert tier.disabled is not None
    assert tier.save(2, _state(2.0)) == 0.0
    tier.wait()
    assert tier.restore(lambda: _state(0.0), fsx_step=-1) is None
    assert tier.corrupt_newest() is None
    (event,) = load_run(tmp_path).of("local_tier_disabled")
    assert event["reason"] == (
        f"rank 0: checkpoint.local.dir {blocker / 'local'} cannot be created: Not a directory (errno 20)"
    )
    assert not load_run(tmp_path).of("local_save")
