"""The node-local checkpoint tier (workloads.checkpoint.local_tier): two gloo ranks on two simulated nodes
(separate roots), a save replicated across them, and the restore choices: own copy, replica after
the own copy is damaged, FSx when no step is complete for every rank or FSx is newer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.support.trainer_fixtures import port_pair
from workloads.checkpoint.local_tier import (
    copies_in,
    corrupt_newest_copy,
    decode_copy,
    encode_copy,
    fill_state,
    read_copy,
    split_state,
    write_copy,
)
from workloads.config import TrainConfig
from workloads.faults import parse_fault_spec


def _state(rank: int, value: float) -> dict:
    return {
        "model": {"w": torch.full((4,), value + rank)},
        "optim": {
            "state": {"w": {"step": torch.tensor(float(value)), "exp_avg": torch.full((4,), -value)}},
            "param_groups": [{"lr": 0.1 * value, "betas": (0.9, 0.95), "params": ["w"]}],
        },
        "train": {
            "step": int(value),
            "last_loss": float("nan"),
            "scheduler": {"last_epoch": int(value), "lr_lambdas": [None]},
        },
        "data": {"epoch": 0, "cursor": int(value) * 8, "epoch_length": 0},
    }


def _blank(rank: int) -> dict:
    return _state(rank, 0.0)


def test_split_then_fill_restores_every_leaf_without_pickle():
    tensors, meta = split_state(_state(1, 7.0))
    data = encode_copy(tensors, meta)
    # weights_only load: the copy holds tensors and one JSON string, nothing to unpickle.
    tensors2, meta2 = decode_copy(data)
    restored = fill_state(_blank(1), tensors2, meta2)
    want = _state(1, 7.0)
    assert torch.equal(restored["model"]["w"], want["model"]["w"])
    assert torch.equal(restored["optim"]["state"]["w"]["exp_avg"], want["optim"]["state"]["w"]["exp_avg"])
    assert restored["optim"]["param_groups"][0]["betas"] == (0.9, 0.95)
    assert restored["train"]["step"] == 7 and restored["data"]["cursor"] == 56
    assert restored["train"]["scheduler"] == {"last_epoch": 7, "lr_lambdas": [None]}


def _worker(rank: int, port: int, run_dir: str, plan: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from workloads.checkpoint.local_tier import LocalTier
    from workloads.events import EventLog

    root = Path(run_dir) / f"node{rank}"
    cfg = TrainConfig.from_dict(
        {"run_dir": run_dir, "checkpoint": {"local": {"interval_steps": 2, "dir": str(root), "keep": 2}}}
    )
    events = EventLog(Path(run_dir), rank)
    tier = LocalTier(cfg, events=events, nproc_per_node=1)
    for step in (2, 4, 6):
        tier.save(step, _state(rank, float(step)))
    tier.wait()
    dist.barrier()
    fsx_step = {"fsx-newer": 8}.get(plan, -1)
    if plan == "corrupt-own" and rank == 1:
        corrupt_newest_copy(root, 1)
    if plan == "incomplete" and rank == 1:
        # Rank 1's step-6 copy is gone on both nodes; step 4 is still complete.
        for node in (0, 1):
            for suffix in (".json", ".pt"):
                (Path(run_dir) / f"node{node}" / "step_00000006" / f"rank1{suffix}").unlink()
    dist.barrier()
    restored = tier.restore(lambda: _blank(rank), fsx_step)
    result = (
        None
        if restored is None
        else {
            "step": restored.step,
            "source": restored.source,
            "w": restored.state["model"]["w"].tolist(),
            "cursor": restored.state["data"]["cursor"],
        }
    )
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    events.close()
    dist.destroy_process_group()


def _run(tmp_path: Path, plan: str) -> tuple[dict, list[dict]]:
    out = tmp_path / "out"
    out.mkdir()
    mp.start_processes(_worker, args=(port_pair(), str(tmp_path), plan, str(out)), nprocs=2, start_method="spawn")
    results = {r: json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)}
    events = [
        json.loads(line) for f in sorted((tmp_path / "events").glob("*.jsonl")) for line in f.read_text().splitlines()
    ]
    return results, events


def test_each_node_holds_its_rank_and_the_other_nodes_replica_with_retention(tmp_path):
    results, _ = _run(tmp_path, "own")
    for rank in (0, 1):
        # keep=2: steps 4 and 6, the rank's own copy and the other node's replica.
        assert copies_in(tmp_path / f"node{rank}") == [(6, 1), (6, 0), (4, 1), (4, 0)]
        assert results[rank] == {"step": 6, "source": "local", "w": [6.0 + rank] * 4, "cursor": 48}


def test_a_damaged_own_copy_is_replaced_by_the_replica_on_the_other_node(tmp_path):
    results, events = _run(tmp_path, "corrupt-own")
    assert results[1] == {"step": 6, "source": "replica", "w": [7.0] * 4, "cursor": 48}
    assert results[0]["source"] == "local"
    skipped = [e for e in events if e["event"] == "local_copy_skipped"]
    assert [(e["rank"], e["step"], e["origin_rank"], e["reason"]) for e in skipped] == [
        (1, 6, 1, "does not match its recorded SHA-256")
    ]
    restore = [e for e in events if e["event"] == "local_restore" and e["rank"] == 1]
    assert restore[0]["source"] == "replica" and restore[0]["from_rank"] == 0


def test_the_newest_step_complete_for_every_rank_wins_and_newer_partial_steps_go(tmp_path):
    results, _ = _run(tmp_path, "incomplete")
    assert results[0]["step"] == results[1]["step"] == 4
    assert all(step <= 4 for step, _ in copies_in(tmp_path / "node0"))


def test_a_newer_fsx_checkpoint_wins_with_the_reason_in_the_event_log(tmp_path):
    results, events = _run(tmp_path, "fsx-newer")
    assert results == {0: None, 1: None}
    reasons = {e["reason"] for e in events if e["event"] == "local_tier_skipped"}
    assert reasons == {"newest complete local step 6 is older than FSx step 8"}


def test_corrupt_local_needs_the_local_tier():
    assert parse_fault_spec("corrupt-local@5:1")[0].kind == "corrupt-local"
    with pytest.raises(ValueError, match="checkpoint.local.interval_steps"):
        TrainConfig.from_dict({"steps": 10, "faults": "corrupt-local@5:1"})
    TrainConfig.from_dict({"steps": 10, "faults": "corrupt-local@5:1", "checkpoint": {"local": {"interval_steps": 2}}})


def test_read_copy_names_an_incomplete_copy_and_one_of_another_run(tmp_path):
    identity = {"world_size": 2, "preset": "tiny"}
    assert read_copy(tmp_path, 2, 0, "run-a", identity) == (None, "incomplete (no record)")
    write_copy(tmp_path, 2, 0, b"x", "run-a", identity)
    assert read_copy(tmp_path, 2, 0, "run-a", identity) == (bytearray(b"x"), None)
    assert read_copy(tmp_path, 2, 0, "run-b", identity) == (
        None,
        "written by another run (run-a), not this one (run-b)",
    )
