"""Trainer pieces in one process (world size 1, gloo): data position, learning, checkpoint commit,
retention, verification, fallback and compatibility checks, event reader."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import workloads.checkpoint.files as files_module
from nvrx_eks.facts.checkpoint_layout import checkpoint_dirs, step_of
from nvrx_eks.facts.errors import ConfigError
from workloads.checkpoint.checkpointer import Checkpointer
from workloads.checkpoint.digest import state_sha256
from workloads.checkpoint.errors import CheckpointIncompatible
from workloads.checkpoint.files import committed_checkpoints
from workloads.config import DataConfig, TrainConfig
from workloads.data import build_batches
from workloads.events import EventLog, load_run, summarize
from workloads.faults import FaultInjector


@pytest.fixture
def single_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _tiny_model():
    from torch.distributed.device_mesh import init_device_mesh

    from workloads.device import resolve_runtime
    from workloads.model import build_model

    cfg = TrainConfig.from_dict({}, "x", ["distributed.backend=gloo"])
    runtime = resolve_runtime(cfg)
    model = build_model(cfg.model.shape, runtime, init_device_mesh("cpu", (1,)), seed=7)
    return cfg, model


def test_batches_resume_exactly_from_their_state():
    cfg = DataConfig(seq_len=16, batch_size=2)
    a = build_batches(cfg, rank=1, world_size=2, vocab_size=256, seed=3)
    for _ in range(3):
        a.next_batch()
    state = a.state_dict()
    expected = a.next_batch()
    b = build_batches(cfg, rank=1, world_size=2, vocab_size=256, seed=3)
    b.load_state_dict(state)
    assert torch.equal(b.next_batch()[0], expected[0])
    other_rank = build_batches(cfg, rank=0, world_size=2, vocab_size=256, seed=3)
    other_rank.load_state_dict(state)
    assert not torch.equal(other_rank.next_batch()[0], expected[0])


def test_memmap_shards_cover_every_window_once_per_epoch(tmp_path):
    tokens = np.arange(2 * 8 * 10 + 1, dtype=np.uint16)  # distinct first token per window
    tokens[: 8 * 10 + 1].tofile(tmp_path / "a.bin")
    tokens[8 * 10 :].tofile(tmp_path / "b.bin")
    cfg = DataConfig(source="memmap", path=str(tmp_path), dtype="uint16", seq_len=8, batch_size=2)
    batches = build_batches(cfg, rank=0, world_size=1, vocab_size=256, seed=1)
    firsts = [int(first) for _ in range(10) for first in batches.next_batch()[0][:, 0]]
    assert len(set(firsts)) == 20 and batches.epoch == 0
    batches.next_batch()
    assert batches.epoch == 1
    with pytest.raises(ConfigError, match="outside the model's vocabulary"):
        build_batches(cfg, rank=0, world_size=1, vocab_size=100, seed=1).next_batch()  # ids up to 160


def test_tiny_transformer_learns_the_synthetic_stream(single_rank):
    cfg, model = _tiny_model()
    batches = build_batches(cfg.data, 0, 1, cfg.model.shape.vocab_size, cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        inputs, targets = batches.next_batch()
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0


def _checkpointer(tmp_path: Path, **overrides) -> Checkpointer:
    settings = [
        f"run_dir={tmp_path}",
        "checkpoint.backend=sync",
        "checkpoint.keep=2",
        *[f"{k}={v}" for k, v in overrides.items()],
    ]
    cfg = TrainConfig.from_dict({}, "x", settings)
    events = EventLog(tmp_path, 0)
    faults = FaultInjector((), 0, tmp_path / "faults", events.emit)
    return Checkpointer(
        cfg,
        events=events,
        faults=faults,
        device=torch.device("cpu"),
        identity={"world_size": 1, "preset": cfg.model.preset},
    )


def _state(value: float) -> dict:
    return {"weights": torch.full((64,), value), "train": {"step": int(value)}}


def test_commit_retention_and_verified_fallback(single_rank, tmp_path, caplog):
    ckpt = _checkpointer(tmp_path)
    for step in (5, 10, 15):
        ckpt.save(step, _state(float(step)))
    ckpt.close()
    committed = committed_checkpoints(tmp_path / "checkpoints")
    assert [step_of(n) for n in committed] == [15, 10]
    assert len(checkpoint_dirs(tmp_path / "checkpoints")) == 2  # 5 removed after 15 committed
    assert (tmp_path / "checkpoints" / "latest_step").read_text().strip() == "15"

    loaded = ckpt.load_latest(lambda: _state(0.0))
    assert loaded.step == 15 and torch.equal(loaded.state["weights"], torch.full((64,), 15.0))

    damaged = ckpt.corrupt_latest()
    assert damaged is not None and Path(damaged).parent.name == committed[0]
    with caplog.at_level(logging.WARNING):
        loaded = ckpt.load_latest(lambda: _state(0.0))
    assert loaded.step == 10 and torch.equal(loaded.state["weights"], torch.full((64,), 10.0))
    assert "does not match its recorded SHA-256" in caplog.text
    fallbacks = load_run(tmp_path).of("checkpoint_fallback")
    assert fallbacks and Path(fallbacks[-1]["path"]).name == committed[0]

    # A new commit at the damaged checkpoint's step supersedes it; nothing else is touched.
    ckpt.save(15, _state(15.0))
    ckpt.close()
    assert [step_of(n) for n in committed_checkpoints(tmp_path / "checkpoints")] == [15, 10]
    assert committed_checkpoints(tmp_path / "checkpoints")[0] != committed[0]


def test_uncommitted_saves_are_never_loaded(single_rank, tmp_path):
    ckpt = _checkpointer(tmp_path)
    ckpt.save(5, _state(5.0))
    ckpt.close()
    # A save whose data is complete (DCP .metadata written) but whose commit never happened,
    # as after a kill between the write and the commit.
    abandoned = tmp_path / "checkpoints" / "step_00000010-dead"
    torch.distributed.checkpoint.save(_state(10.0), checkpoint_id=str(abandoned))
    assert (abandoned / ".metadata").is_file()
    assert ckpt.load_latest(lambda: _state(0.0)).step == 5
    ckpt.save(10, _state(10.0))
    ckpt.close()
    assert not abandoned.exists()  # removed only once a newer checkpoint committed


def test_incompatible_checkpoints_are_refused_with_a_clear_message(single_rank, tmp_path):
    _checkpointer(tmp_path).save(5, _state(5.0))
    other = _checkpointer(tmp_path, **{"model.preset": "small"})
    with pytest.raises(CheckpointIncompatible, match="preset='tiny', this run has preset='small'"):
        other.load_latest(lambda: _state(0.0))


def test_state_hash_is_independent_of_sharding(single_rank):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    _, model = _tiny_model()
    optimizer = torch.optim.AdamW(model.parameters())
    sharded = dict(zip(("model", "optim"), get_state_dict(model, optimizer), strict=True))
    plain = {"model": {k: v.full_tensor() for k, v in sharded["model"].items()}, "optim": sharded["optim"]}
    assert state_sha256(sharded) == state_sha256(plain)
    plain["model"]["norm.weight"] = plain["model"]["norm.weight"] + 1
    assert state_sha256(sharded) != state_sha256(plain)


def test_event_reader_pairs_restarts_and_reports_goodput(tmp_path):
    log = EventLog(tmp_path, 0)
    log.emit("run_start", world_size=1)
    for step in (1, 2):
        log.emit("step_end", step=step, loss=1.0, step_s=0.1)
    log.emit("restart_begin", layer="inprocess", reason="x")
    log.iteration = 1
    log.emit("restart_end", layer="inprocess", resumed_from_step=1, since_begin_s=0.5)
    log.emit("step_end", step=2, loss=1.0, step_s=0.2)
    log.emit("checkpoint_stall", step=2, backend="nvrx", stall_s=0.01)
    run = load_run(tmp_path)
    report = summarize(run)
    (restart,) = report.restarts
    assert restart.layer == "inprocess" and restart.resumed_from_step == 1
    assert report.lost_steps == 1 and report.final_step == 2
    assert report.productive_s == pytest.approx(0.3)
    assert report.restarts_by_layer() == {"inprocess": 1, "launcher": 0}
    # A line torn by a kill is skipped, not fatal.
    with open(tmp_path / "events" / "rank0.jsonl", "a") as f:
        f.write('{"v":1,"t":')
    assert len(load_run(tmp_path).events) == len(run.events)
    assert json.loads((tmp_path / "events" / "rank0.jsonl").read_text().splitlines()[0])["pid"]


@pytest.mark.parametrize("backend", ["nvrx", "dcp-async"])
def test_async_backends_save_the_state_as_of_the_hand_off(single_rank, tmp_path, backend, monkeypatch):
    """The staging copy is taken before save() returns: changing the weights afterwards (as the
    next optimizer step does) must not leak into the checkpoint. The shards are hashed by the
    writer (worker process or writer thread), never on the training thread at the commit."""
    hashed_on_training_thread = []
    rank_digests = files_module.rank_digests

    def tracking(*args):
        hashed_on_training_thread.append(threading.current_thread() is threading.main_thread())
        return rank_digests(*args)

    monkeypatch.setattr(files_module, "rank_digests", tracking)
    ckpt = _checkpointer(tmp_path, **{"checkpoint.backend": backend})
    state = _state(5.0)
    ckpt.save(5, state)
    state["weights"].add_(100.0)  # what the next optimizer step would do
    ckpt.close()
    loaded = ckpt.load_latest(lambda: _state(0.0))
    assert loaded.step == 5 and torch.equal(loaded.state["weights"], torch.full((64,), 5.0))
    manifest = json.loads((loaded.path / "commit.json").read_text())
    assert manifest["backend"] == backend and ".metadata" in manifest["files"]
    assert not any(hashed_on_training_thread)
    # The recorded digests, computed by the writer, are those of the files on disk.
    for name, (size, sha) in manifest["files"].items():
        data = (loaded.path / name).read_bytes()
        assert (size, sha) == (len(data), hashlib.sha256(data).hexdigest()), name


def test_result_of_an_abandoned_save_does_not_fail_the_next_iterations_save(single_rank, tmp_path):
    """An aborted NVRx writer reports its interrupted write on the process-wide results queue and
    nobody reads it; the Checkpointer of the next in-process iteration must not take it for the
    result of its own first save (that failed the save and turned the restart into a process
    restart)."""
    from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import get_write_results_queue

    get_write_results_queue().put(RuntimeError("unexpected pos 704 vs 598"))  # the aborted write
    ckpt = _checkpointer(tmp_path, **{"checkpoint.backend": "nvrx"})
    ckpt.save(3, _state(3.0))
    ckpt.close()
    assert committed_checkpoints(tmp_path / "checkpoints")
    assert ckpt.load_latest(lambda: _state(0.0)).step == 3


def test_messages_to_the_launcher_monitor_are_sent_inside_atomic():
    """A restart exception landing between the two sends of one message would tear the stream
    to ft_launcher's rank monitor; every message goes out inside the iteration's `atomic`. A
    section left by an exception stays open (the restart path closes all sections)."""
    import contextlib

    from workloads.config import FaultToleranceConfig
    from workloads.ft_integration import FaultToleranceReporter

    sent, inside = [], []

    class Client:
        def start_section(self, name):
            sent.append(("open", name, bool(inside)))

        def end_section(self, name):
            sent.append(("close", name, bool(inside)))

    @contextlib.contextmanager
    def atomic():
        inside.append(True)
        try:
            yield
        finally:
            inside.pop()

    ft = FaultToleranceReporter(FaultToleranceConfig())  # no ft_launcher here: no client yet
    ft.client, ft.atomic = Client(), atomic
    with ft.section("step"):
        pass
    with pytest.raises(RuntimeError), ft.section("checkpointing"):
        raise RuntimeError("restart")
    assert sent == [("open", "step", True), ("close", "step", True), ("open", "checkpointing", True)]
    ft.end_all_sections()  # the restart path, after NVRx stopped raising
    assert sent[-1] == ("close", "checkpointing", False) and not ft._open


def test_a_rank_monitor_gone_mid_run_asks_the_rank_to_stop_instead_of_raising():
    """ft_launcher's rank monitor is the launcher's fork: it goes when the launcher goes (a SIGTERM
    to the launcher's process group, a node shutdown), often before the launcher's forwarded
    SIGTERM reaches the rank. Raising on the lost connection made an in-process restart of it and
    lost the stop-save; now the rank stops as a SIGTERM would, with a checkpoint."""
    from nvidia_resiliency_ext.fault_tolerance.rank_monitor_client import RankMonitorClientError

    from workloads.config import FaultToleranceConfig
    from workloads.ft_integration import FaultToleranceReporter

    lost, sent = [], []

    class GoneClient:
        def start_section(self, name):
            sent.append(name)
            raise RankMonitorClientError("RankMonitorClient could not send section update. Exception: Broken pipe")

    ft = FaultToleranceReporter(FaultToleranceConfig(), on_monitor_lost=lost.append)
    ft.client = GoneClient()
    with ft.section("step"):
        ran = True
    assert ran and sent == ["step"] and not ft.active
    assert [str(err) for err in lost] == ["RankMonitorClient could not send section update. Exception: Broken pipe"]
    with ft.section("checkpointing"):  # the stop-save: nothing more is sent
        pass
    ft.end_all_sections()
    assert sent == ["step"] and len(lost) == 1
