"""What a checkpoint load trusts, in one process (world size 1, gloo): a shard this process
committed is loaded without re-hashing only while its metadata shows no change, damage that the
metadata cannot show refuses the next commit, and a stale pointer does not hide a newer commit."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import workloads.checkpoint.files as ckpt_files
from nvrx_eks.facts.checkpoint_layout import POINTER_FILE, checkpoint_dirs, commit_state, pointer_text, step_of
from workloads.checkpoint.checkpointer import Checkpointer
from workloads.checkpoint.errors import TrustedFileDamaged
from workloads.config import TrainConfig
from workloads.events import EventLog, load_run
from workloads.faults import FaultInjector


@pytest.fixture
def single_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _checkpointer(run_dir: Path) -> Checkpointer:
    cfg = TrainConfig.from_dict({}, "x", [f"run_dir={run_dir}", "checkpoint.backend=sync", "checkpoint.keep=2"])
    events = EventLog(run_dir, 0)
    faults = FaultInjector((), 0, run_dir / "faults", events.emit)
    return Checkpointer(
        cfg, events=events, faults=faults, device=torch.device("cpu"), identity={"world_size": 1, "preset": "tiny"}
    )


def _state(value: float) -> dict:
    return {"weights": torch.full((4096,), value), "train": {"step": int(value)}}


def _flip_a_byte_keeping_size_and_mtime(shard: Path) -> None:
    """Storage damage, or a tool that puts the times back: one byte differs, size and mtime do not."""
    before = shard.stat()
    # File times have the kernel clock's tick as resolution (milliseconds on older kernels): a
    # write within the commit's tick would leave even the ctime as it was.
    time.sleep(0.05)
    with open(shard, "r+b") as f:
        f.seek(before.st_size // 2)
        byte = f.read(1)
        f.seek(before.st_size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = shard.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def _committed(run_dir: Path, ckpt: Checkpointer, *steps: int) -> None:
    for step in steps:
        ckpt.save(step, _state(float(step)))
    ckpt.close()


def test_a_shard_changed_behind_its_mtime_is_hashed_and_the_load_falls_back(single_rank, tmp_path, caplog):
    ckpt = _checkpointer(tmp_path)
    _committed(tmp_path, ckpt, 10, 20)
    newest = max(checkpoint_dirs(tmp_path / "checkpoints"), key=lambda p: step_of(p.name))
    _flip_a_byte_keeping_size_and_mtime(newest / "__0_0.distcp")
    # The reload an in-process restart makes: same process, so the shard is one it committed.
    with caplog.at_level(logging.WARNING):
        loaded = _checkpointer(tmp_path).load_latest(lambda: _state(0.0))
    assert loaded is not None and loaded.step == 10
    assert torch.equal(loaded.state["weights"], torch.full((4096,), 10.0))
    fallback = load_run(tmp_path).of("checkpoint_fallback")
    assert [Path(e["path"]) for e in fallback] == [newest]
    assert "__0_0.distcp does not match its recorded SHA-256" in fallback[0]["reason"]


def test_damage_the_metadata_cannot_show_refuses_the_next_commit_then_the_reload_falls_back(single_rank, tmp_path):
    ckpt = _checkpointer(tmp_path)
    _committed(tmp_path, ckpt, 10, 20)
    newest = max(checkpoint_dirs(tmp_path / "checkpoints"), key=lambda p: step_of(p.name))
    _flip_a_byte_keeping_size_and_mtime(newest / "__0_0.distcp")
    # Bit rot below the file system changes no metadata at all: as if the commit had recorded
    # the damaged file's metadata.
    ckpt_files.remember_verified(newest, {"__0_0.distcp": None})

    restarted = _checkpointer(tmp_path)
    loaded = restarted.load_latest(lambda: _state(0.0))
    assert loaded is not None and loaded.step == 20  # trusted: the metadata is what was committed
    assert load_run(tmp_path).of("checkpoint_load")[-1]["trusted_files"] == 1
    with pytest.raises(TrustedFileDamaged, match=r"__0_0.distcp does not match its recorded SHA-256.*step 25 is not"):
        restarted.save(25, _state(25.0))
    assert [step_of(n) for n in json.loads((tmp_path / "checkpoints" / POINTER_FILE).read_text())["committed"]] == [
        20,
        10,
    ]
    assert load_run(tmp_path).of("checkpoint_trust_failed")

    # The restart after that fault hashes the file and falls back to the step before.
    again = _checkpointer(tmp_path).load_latest(lambda: _state(0.0))
    assert again is not None and again.step == 10


def test_a_load_trusts_only_files_this_process_committed_and_nobody_touched(single_rank, tmp_path):
    ckpt = _checkpointer(tmp_path)
    _committed(tmp_path, ckpt, 10)
    restarted = _checkpointer(tmp_path)
    assert restarted.load_latest(lambda: _state(0.0)).step == 10
    assert load_run(tmp_path).of("checkpoint_load")[-1]["trusted_files"] == 1
    # A clean re-hash lets the next commit through.
    restarted.save(15, _state(15.0))
    restarted.close()
    assert [step_of(n) for n in json.loads((tmp_path / "checkpoints" / POINTER_FILE).read_text())["committed"]] == [
        15,
        10,
    ]


def test_a_stale_pointer_gives_way_to_the_newer_verified_commit_and_nothing_leaks(single_rank, tmp_path, caplog):
    ckpt = _checkpointer(tmp_path)
    _committed(tmp_path, ckpt, 10, 20, 30)
    ckpt_dir = tmp_path / "checkpoints"
    names = {step_of(p.name): p.name for p in checkpoint_dirs(ckpt_dir)}
    assert sorted(names) == [20, 30]
    # A readable pointer that names step 20 only, e.g. put back from an older copy.
    (ckpt_dir / POINTER_FILE).write_text(pointer_text([names[20]]))

    restarted = _checkpointer(tmp_path)
    with caplog.at_level(logging.WARNING):
        loaded = restarted.load_latest(lambda: _state(0.0))
    assert loaded is not None and loaded.step == 30
    stale = load_run(tmp_path).of("checkpoint_pointer_stale")
    assert stale and names[30] in stale[0]["reason"] and stale[0]["committed"][:2] == [names[30], names[20]]
    assert f"names step 20 but {names[30]}" in caplog.text

    # The next commit keeps the newest two and deletes the rest: no directory is left behind.
    restarted.save(40, _state(40.0))
    restarted.close()
    assert sorted(step_of(p.name) for p in checkpoint_dirs(ckpt_dir)) == [30, 40]
    assert len(load_run(tmp_path).of("checkpoint_pointer_stale")) == 1  # the commit does not repeat it


def test_an_unnamed_commit_older_than_the_pointers_newest_stays_abandoned(single_rank, tmp_path):
    ckpt = _checkpointer(tmp_path)
    _committed(tmp_path, ckpt, 10, 30)
    ckpt_dir = tmp_path / "checkpoints"
    names = {step_of(p.name): p.name for p in checkpoint_dirs(ckpt_dir)}
    kept_aside = tmp_path / "step-30-copy"
    shutil.copytree(ckpt_dir / names[30], kept_aside)
    # A fallback from 30 to 10 then committed 20, a later commit at an earlier step, and its
    # retention removed 30. Were 30 left behind (put back here), its commit is older than the
    # pointer's newest one: that timeline was abandoned, the pointer is not stale.
    ckpt.save(20, _state(20.0))
    ckpt.close()
    assert not (ckpt_dir / names[30]).exists()
    shutil.copytree(kept_aside, ckpt_dir / names[30])
    names.update({step_of(p.name): p.name for p in checkpoint_dirs(ckpt_dir)})
    assert json.loads((ckpt_dir / POINTER_FILE).read_text())["committed"] == [names[20], names[10]]
    state = commit_state(ckpt_dir)
    assert (state.source, state.committed) == ("pointer", [names[20], names[10]])
