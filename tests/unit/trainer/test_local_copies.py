"""The node-local tier's parts that one process holds (workloads.checkpoint.local_copies,
copy_format, local_tier's reporting, the local-tier faults): a rank's state split into tensors and
a JSON header and filled back, the copy format against crafted headers, a copy's record and
SHA-256, the fault that fills a node's disk, and saves failing in a row reported once. The two
gloo ranks exchanging copies are tests/runs/trainer/test_local_tier.py's."""

from __future__ import annotations

import io
import json

import pytest
import torch

from workloads.checkpoint import copy_format
from workloads.checkpoint.local_copies import (
    copy_paths,
    copy_record,
    fill_state,
    open_copy,
    split_state,
    write_own_copy,
)
from workloads.config import TrainConfig
from workloads.events import watch_line
from workloads.faults import FaultInjector, local_disk_full, parse_fault_spec, target_limit


def rank_state(rank: int, value: float) -> dict:
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
    return rank_state(rank, 0.0)


def test_split_then_fill_restores_every_leaf_without_pickle():
    tensors, meta = split_state(rank_state(1, 7.0))
    written = io.BytesIO()
    copy_format.write(written, tensors, meta)
    # The copy is a JSON header and raw tensor bytes: read back as views, nothing to unpickle.
    tensors2, meta2 = copy_format.read(bytearray(written.getvalue()))
    restored = fill_state(_blank(1), tensors2, meta2)
    want = rank_state(1, 7.0)
    assert torch.equal(restored["model"]["w"], want["model"]["w"])
    assert torch.equal(restored["optim"]["state"]["w"]["exp_avg"], want["optim"]["state"]["w"]["exp_avg"])
    assert restored["optim"]["param_groups"][0]["betas"] == (0.9, 0.95)
    assert restored["train"]["step"] == 7 and restored["data"]["cursor"] == 56
    assert restored["train"]["scheduler"] == {"last_epoch": 7, "lr_lambdas": [None]}


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
