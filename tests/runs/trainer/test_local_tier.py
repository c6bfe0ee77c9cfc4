"""The node-local checkpoint tier (workloads.checkpoint.local_tier): two gloo ranks on two simulated nodes
(separate roots), a save replicated across them, and the restore choices: own copy, replica after
the own copy is damaged, FSx when no step is complete for every rank or FSx is newer."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.support.trainer_fixtures import port_pair
from workloads.checkpoint import copy_format
from workloads.checkpoint.local_copies import (
    DATA_SUFFIX,
    RECORD_SUFFIX,
    copies_in,
    copy_paths,
    copy_record,
    fill_state,
    open_copy,
    split_state,
    write_own_copy,
)
from workloads.checkpoint.local_tier import drop_host_copy
from workloads.config import TrainConfig
from workloads.events import watch_line
from workloads.faults import FaultInjector, local_disk_full, marker_dir, parse_fault_spec, target_limit


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
    written = io.BytesIO()
    copy_format.write(written, tensors, meta)
    # The copy is a JSON header and raw tensor bytes: read back as views, nothing to unpickle.
    tensors2, meta2 = copy_format.read(bytearray(written.getvalue()))
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
    settings: dict = {"run_dir": run_dir, "checkpoint": {"local": {"interval_steps": 2, "dir": str(root), "keep": 2}}}
    if plan.startswith("disk-full"):
        # Node 1's storage is full from step 4 on. A short group timeout: a rank left waiting
        # for a peer that never sends fails in seconds, not checkpoint.finalize_timeout_s's 300.
        settings.update(faults="local-disk-full@4:1")
        settings["checkpoint"]["finalize_timeout_s"] = 10
    cfg = TrainConfig.from_dict(settings)
    events = EventLog(Path(run_dir), rank)
    faults = FaultInjector(parse_fault_spec(cfg.faults), rank, marker_dir(run_dir), events.emit)
    tier = LocalTier(cfg, events=events, nproc_per_node=1)
    for step in (2, 4, 6):
        faults.at_step_start(step, corrupt_latest=lambda: None)
        tier.save(step, _state(rank, float(step)))
    tier.wait()
    dist.barrier()
    fsx_step = {"fsx-newer": 8}.get(plan, -1)
    if plan == "corrupt-own" and rank == 1:
        tier.corrupt_newest()  # the corrupt-local fault: the host copy goes, the file is damaged
    if plan in ("new-process", "disk-full-new-process"):
        drop_host_copy()  # as after ft_launcher's restart: only the files are left
    if plan == "incomplete" and rank == 1:
        # Rank 1's step-6 copy is gone on both nodes and from its memory; step 4 is still complete.
        drop_host_copy()
        for node in (0, 1):
            for suffix in (DATA_SUFFIX, RECORD_SUFFIX):
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


def _restores(events: list[dict]) -> dict[int, dict]:
    return {e["rank"]: e for e in events if e["event"] == "local_restore"}


def test_each_node_holds_its_rank_and_the_other_nodes_replica_with_retention(tmp_path):
    results, events = _run(tmp_path, "own")
    for rank in (0, 1):
        # keep=2: steps 4 and 6, the rank's own copy and the other node's replica.
        assert copies_in(tmp_path / f"node{rank}") == [(6, 1), (6, 0), (4, 1), (4, 0)]
        assert results[rank] == {"step": 6, "source": "local", "w": [6.0 + rank] * 4, "cursor": 48}
        # The same process restores: from the host copy of its last save, no file read.
        assert _restores(events)[rank]["from_memory"] is True


def test_a_new_process_restores_the_same_state_from_its_files(tmp_path):
    results, events = _run(tmp_path, "new-process")
    for rank in (0, 1):
        assert results[rank] == {"step": 6, "source": "local", "w": [6.0 + rank] * 4, "cursor": 48}
        assert _restores(events)[rank]["from_memory"] is False
    assert not [e for e in events if e["event"] == "local_copy_skipped"]


def test_a_damaged_own_copy_is_replaced_by_the_replica_on_the_other_node(tmp_path):
    results, events = _run(tmp_path, "corrupt-own")
    assert results[1] == {"step": 6, "source": "replica", "w": [7.0] * 4, "cursor": 48}
    assert results[0]["source"] == "local"
    skipped = [e for e in events if e["event"] == "local_copy_skipped"]
    assert [(e["rank"], e["step"], e["origin_rank"], e["reason"]) for e in skipped] == [
        (1, 6, 1, "does not match its recorded SHA-256")
    ]
    restores = _restores(events)
    assert restores[1]["source"] == "replica" and restores[1]["from_rank"] == 0
    assert restores[1]["from_memory"] is False and restores[0]["from_memory"] is True


def test_the_newest_step_complete_for_every_rank_wins_and_newer_partial_steps_go(tmp_path):
    results, _ = _run(tmp_path, "incomplete")
    assert results[0]["step"] == results[1]["step"] == 4
    assert all(step <= 4 for step, _ in copies_in(tmp_path / "node0"))


def test_a_newer_fsx_checkpoint_wins_with_the_reason_in_the_event_log(tmp_path):
    results, events = _run(tmp_path, "fsx-newer")
    assert results == {0: None, 1: None}
    reasons = {e["reason"] for e in events if e["event"] == "local_tier_skipped"}
    assert reasons == {"newest complete local step 6 is older than FSx step 8"}


@pytest.mark.parametrize("kind", ["corrupt-local", "local-disk-full"])
def test_local_tier_faults_need_the_local_tier(kind):
    assert parse_fault_spec(f"{kind}@5:1")[0].kind == kind
    with pytest.raises(ValueError, match="checkpoint.local.interval_steps"):
        TrainConfig.from_dict({"steps": 10, "faults": f"{kind}@5:1"})
    TrainConfig.from_dict({"steps": 10, "faults": f"{kind}@5:1", "checkpoint": {"local": {"interval_steps": 2}}})


def test_local_disk_full_names_a_node_fired_by_its_first_rank_and_fills_it_from_its_step_on(tmp_path):
    (fault,) = parse_fault_spec("local-disk-full@5:1")
    assert target_limit(fault, nodes=2, world_size=4) == ("node", 2)
    emitted: list[dict] = []
    second_rank = FaultInjector((fault,), 3, tmp_path, lambda *a, **k: None, nproc_per_node=2)
    first_rank = FaultInjector((fault,), 2, tmp_path, lambda event, **k: emitted.append(k), nproc_per_node=2)
    assert second_rank.mine == [] and first_rank.mine == [fault]
    full = local_disk_full((fault,), 1, tmp_path)
    first_rank.at_step_start(4, corrupt_latest=lambda: None)
    assert not full(4)
    first_rank.at_step_start(5, corrupt_latest=lambda: None)  # no exception: nothing restarts
    assert emitted == [{"kind": "local-disk-full", "step": 5, "target_rank": 2, "node": 1}]
    assert full(5) and full(6) and not full(4)  # a save of an earlier step still being written
    assert not local_disk_full((fault,), 0, tmp_path)(6)  # node 0's storage is not node 1's


def test_copy_record_names_an_incomplete_copy_one_of_another_run_and_a_torch_save_one(tmp_path):
    identity = {"world_size": 2, "preset": "tiny"}
    assert copy_record(tmp_path, 2, 0, "run-a", identity) == (None, "incomplete (no record)")
    write_own_copy(tmp_path, 2, 0, {"w": torch.ones(3)}, {"step": 2}, "run-a", identity)
    record, reason = copy_record(tmp_path, 2, 0, "run-a", identity)
    assert reason is None and record is not None and record["format"] == "flat-1"
    assert copy_record(tmp_path, 2, 0, "run-b", identity) == (
        None,
        "written by another run (run-a), not this one (run-b)",
    )
    data, record_path = copy_paths(tmp_path, 2, 0)
    record_path.write_text(json.dumps({k: v for k, v in record.items() if k != "format"}))
    assert copy_record(tmp_path, 2, 0, "run-a", identity) == (
        None,
        "written in another format (torch.save), this run reads flat-1",
    )
    record_path.write_text(json.dumps(record))
    data.write_bytes(data.read_bytes()[:-1])
    assert copy_record(tmp_path, 2, 0, "run-a", identity) == (
        None,
        f"has {record['bytes'] - 1} bytes, its record says {record['bytes']}",
    )


def test_open_copy_refuses_a_damaged_copy_by_its_sha256_and_reads_a_sound_one_as_views(tmp_path):
    identity = {"world_size": 1, "preset": "tiny"}
    path, sha256 = write_own_copy(tmp_path, 4, 0, {"w": torch.arange(6.0)}, {"step": 4}, "run", identity)
    record, _ = copy_record(tmp_path, 4, 0, "run", identity)
    assert record is not None and record["sha256"] == sha256
    data, reason = open_copy(path, record, hashed=True)
    assert reason is None and data is not None
    tensors, meta = copy_format.read(data)
    assert torch.equal(tensors["w"], torch.arange(6.0)) and meta == {"step": 4}
    raw = bytearray(path.read_bytes())
    raw[-4:] = b"\xde\xad\xbe\xef"  # inside w's bytes; the size stays
    path.write_bytes(raw)
    assert open_copy(path, record, hashed=True) == (None, "does not match its recorded SHA-256")


def _copy_bytes(tensors: dict, meta: dict) -> bytearray:
    written = io.BytesIO()
    copy_format.write(written, tensors, meta)
    return bytearray(written.getvalue())


def test_the_copy_format_round_trips_every_dtype_and_refuses_crafted_headers():
    tensors = {
        "f32": torch.randn(3, 4),
        "bf16": torch.ones(5, dtype=torch.bfloat16),
        "i64": torch.arange(7),
        "bool": torch.tensor([True, False]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }
    read, meta = copy_format.read(_copy_bytes(tensors, {"loss": 1.5}))
    assert meta == {"loss": 1.5}
    for key, tensor in tensors.items():
        assert read[key].dtype == tensor.dtype and torch.equal(read[key], tensor), key
    sound = _copy_bytes({"w": torch.ones(4)}, {})
    prefix = len(copy_format.MAGIC) + 8

    def crafted(entries: list) -> bytearray:
        header = json.dumps({"tensors": entries, "meta": {}}).encode()
        return bytearray(copy_format.MAGIC + len(header).to_bytes(8, "little") + header) + sound[prefix:]

    refusals = {
        "not a copy": bytearray(b"PK\x03\x04" + bytes(60)),
        "header past the end": bytearray(copy_format.MAGIC + (1 << 40).to_bytes(8, "little")),
        "not a dtype": crafted([["w", "system", [4], 64, 16]]),
        "beyond the data": crafted([["w", "float32", [4], 1 << 20, 16]]),
        "size against shape": crafted([["w", "float32", [400], 64, 16]]),
        "unaligned": crafted([["w", "float32", [4], 65, 16]]),
    }
    for name, data in refusals.items():
        with pytest.raises(copy_format.MalformedCopy):
            copy_format.read(data)
            pytest.fail(name)


def test_a_full_disk_on_one_node_fails_its_saves_once_and_stalls_no_peer(tmp_path):
    """S1: node 1's storage fills after step 2's save. Its rank still takes part in every
    exchange (saying it has no copy), so rank 0 never waits on it, keeps saving its own copies and
    stores no replica; the failure is one event, not one per save. An in-process restart then
    restores step 6 from both ranks' host copies: the newest state, nothing replayed."""
    results, events = _run(tmp_path, "disk-full")
    (failed,) = [e for e in events if e["event"] == "local_save_failed"]
    assert (failed["rank"], failed["step"]) == (1, 4)
    assert failed["reason"].startswith("own copy: OSError: [Errno 28] No space left on device: ")
    assert watch_line(failed).startswith(
        "local checkpoints failing on rank 1 from step 4: own copy: OSError: [Errno 28] No space left on device"
    )
    saved = {(e["rank"], e["step"]): e["replica_of"] for e in events if e["event"] == "local_saved"}
    assert saved == {(0, 2): 1, (1, 2): 0, (0, 4): None, (0, 6): None}
    assert [e["node"] for e in events if e["event"] == "fault_injected"] == [1]
    for rank in (0, 1):
        assert results[rank] == {"step": 6, "source": "local", "w": [6.0 + rank] * 4, "cursor": 48}
        assert _restores(events)[rank]["from_memory"] is True
    # Nothing of the failed writes is left on node 1: its copies are step 2's, its own and rank 0's.
    assert copies_in(tmp_path / "node1") == [(2, 1), (2, 0)]
    assert sorted(p.name for p in (tmp_path / "node1").rglob("*") if p.is_file()) == [
        "rank0.bin", "rank0.json", "rank1.bin", "rank1.json"
    ]  # fmt: skip


def test_after_a_full_disk_a_new_process_restores_the_newest_step_complete_for_every_rank(tmp_path):
    """Steps 4 and 6 lack rank 1's copy everywhere; step 2 is complete on node 1 alone (rank 1's
    own copy and rank 0's replica: node 0 dropped its step 2 by retention), so rank 0 gets its
    copy back from rank 1."""
    results, events = _run(tmp_path, "disk-full-new-process")
    assert results[0] == {"step": 2, "source": "replica", "w": [2.0] * 4, "cursor": 16}
    assert results[1] == {"step": 2, "source": "local", "w": [3.0] * 4, "cursor": 16}
    assert _restores(events)[0]["from_rank"] == 1


def test_saves_that_fail_in_a_row_are_reported_at_the_first_and_when_one_succeeds_again(tmp_path, monkeypatch):
    from workloads.checkpoint import local_tier
    from workloads.events import EventLog, load_run

    monkeypatch.setattr(local_tier, "_failing", None)
    events = EventLog(tmp_path, 1)
    for step, problem in [(2, None), (4, "own copy: full"), (6, "own copy: full"), (8, None), (10, "replica: full")]:
        local_tier._report(events, step, problem)
    reported = [(e["event"], e["step"]) for e in load_run(tmp_path).events]
    assert reported == [("local_save_failed", 4), ("local_save_recovered", 8), ("local_save_failed", 10)]
    (recovered,) = load_run(tmp_path).of("local_save_recovered")
    assert (recovered["failed_saves"], recovered["since_step"]) == (2, 4)
    assert watch_line(recovered) == "local checkpoints on rank 1 saved again at step 8 (2 failed)"
