"""The node-local checkpoint tier (workloads.checkpoint.local_tier): two gloo ranks on two simulated nodes
(separate roots), a save replicated across them, and the restore choices: own copy, replica after
the own copy is damaged, FSx when no step is complete for every rank or FSx is newer; a full disk
on one node stalls no peer. (The copy format, records and reporting: tests/unit/trainer/test_local_copies.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from tests.support.trainer_fixtures import port_pair
from tests.unit.trainer.test_local_copies import rank_state
from workloads.checkpoint.local_copies import DATA_SUFFIX, RECORD_SUFFIX, copies_in
from workloads.checkpoint.local_tier import drop_host_copy
from workloads.config import TrainConfig
from workloads.events import watch_line
from workloads.faults import FaultInjector, marker_dir, parse_fault_spec
from workloads.process_exit import exit_without_finalizing


def _blank(rank: int) -> dict:
    return rank_state(rank, 0.0)


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
        tier.save(step, rank_state(rank, float(step)))
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
    exit_without_finalizing(0)


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
