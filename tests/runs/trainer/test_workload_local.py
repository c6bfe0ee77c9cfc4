"""End to end on this machine: text shipped with Python -> `data prepare` (interrupted, resumed
from the CLI); a shard set the model cannot use ends the ranks with exit 93 naming the field;
gradient accumulation keeps exact resume; hybrid sharding on one node trains like full sharding.
(Training on prepared shards, its throughput and `nvrx-eks report` are checked on the held-out
split's runs, tests/runs/trainer/test_evaluation.py.)"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from nvrx_eks.data.prepare import prepare
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from tests.support.named_runs import RUNS, named_run
from tests.support.trainer_fixtures import exclusive_trainer_runs, local_run
from tests.unit.local.test_data_prep import stdlib_text
from workloads.events import load_run
from workloads.shards import MANIFEST_NAME


def trainer_run(test):
    """A test that runs the trainer (or reads a shared run): one trainer run at a time."""
    return pytest.mark.slow(pytest.mark.xdist_group("trainer_runs")(test))


@trainer_run
def test_vocab_mismatch_ends_the_ranks_with_93_naming_the_field(tmp_path, tmp_path_factory):
    shards = tmp_path / "shards"
    prepare(stdlib_text(300_000), shards, "byte", shard_tokens=100_000)
    manifest = json.loads((shards / MANIFEST_NAME).read_text())
    manifest["vocab_size"] = 300  # e.g. prepared with a tokenizer whose vocabulary the model lacks
    # Written once the launcher started (its log appears), seconds before a rank reads it: before
    # that, the preflight `nvrx-eks local` runs as the pod does refuses the run already.
    run_dir = tmp_path / "run"

    def write_once_launched() -> None:
        deadline = time.monotonic() + 120
        while not (run_dir / "launcher.log").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        (shards / MANIFEST_NAME).write_text(json.dumps(manifest))

    writer = threading.Thread(target=write_once_launched)
    with exclusive_trainer_runs(tmp_path_factory):
        writer.start()
        record = local_run(run_dir, steps=5, overrides=("data.source=memmap", f"data.path={shards}"))
        writer.join()
    reasons = [e["reason"] for e in load_run(tmp_path / "run").of("unrecoverable")]
    assert reasons and all("manifest.json has vocab_size 300" in r and "vocabulary is 256" in r for r in reasons)
    # The ranks exit with the do-not-requeue code and the run ends with it, after one launcher cycle.
    # Both ranks exit 93; the launcher reports the one it saw end first (seen: 0, and 1 in a
    # fresh-clone run), so the assertion is on the code, not on which rank.
    log = (tmp_path / "run" / "launcher.log").read_text()
    assert re.search(rf"failed \(exitcode: {EXIT_DO_NOT_REQUEUE}\) local_rank: [01] ", log)
    assert record["exit_code"] == EXIT_DO_NOT_REQUEUE
    assert "manifest.json has vocab_size 300" in record["stopped_by"]


def _final_state(run_dir: Path) -> str:
    return json.loads((run_dir / "summary.json").read_text())["state_sha256"]


@trainer_run
def test_gradient_accumulation_resumes_exactly(tmp_path, tmp_path_factory):
    accum = ("data.grad_accum_steps=2",)
    with exclusive_trainer_runs(tmp_path_factory):
        local_run(tmp_path / "clean", steps=12, interval=4, overrides=accum)
        record = local_run(tmp_path / "faulty", steps=12, interval=4, faults="exception@7:1", overrides=accum)
    assert record["exit_code"] == 0
    assert load_run(tmp_path / "faulty").of("fault_injected")
    assert _final_state(tmp_path / "faulty") == _final_state(tmp_path / "clean")
    # 2 micro-batches per step: the step's fingerprint covers both, so it differs from the first alone.
    ends = load_run(tmp_path / "clean").of("step_end", rank=0)
    assert ends[0]["tokens_per_s"] == pytest.approx(2 * 2 * 8 * 64 / ends[0]["step_s"])


@trainer_run
def test_hybrid_shard_on_one_node_trains_exactly_like_full_shard(tmp_path_factory):
    """The 2-D mesh path (1 node x 2 ranks: replication degree 1) must reproduce full sharding
    bit for bit; replication across nodes needs more than one node and is not exercised here.
    The hybrid run's other settings (variants-2x12) change no numerics."""
    assert {"distributed.shard=hybrid"} < set(RUNS["variants-2x12"].overrides)
    hybrid, full = (named_run(tmp_path_factory, name) for name in ("variants-2x12", "reliability-base"))
    assert json.loads((hybrid / "local_run.json").read_text())["exit_code"] == 0
    assert "shard: hybrid" in (hybrid / "config.yaml").read_text()
    assert _final_state(hybrid) == _final_state(full)
