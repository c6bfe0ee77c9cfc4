"""The shared run variants-2x12 (tests/support/named_runs.py) sets what changes no number: a
slow end-of-run digest on both ranks, require_efa on gloo, hybrid sharding on one node and a local
tier whose root cannot be made. Here: the digest slower than the soft timeout restarts nothing,
and require_efa on gloo trains as before. (The hybrid and local-root checks on the same run:
test_workload_local.py, test_local_tier_refusals.py.) The one-process checks of the digest and the
EFA check: tests/unit/trainer/test_trainer_gpu_path.py, tests/unit/trainer/test_transport.py."""

from __future__ import annotations

import hashlib
import json

import pytest

from nvrx_eks.local.runner import LOCAL_CPU_PROFILE
from tests.support.named_runs import RUNS, named_run
from workloads.events import load_run
from workloads.faults import SLOW_DIGEST_SECONDS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]


def test_a_digest_slower_than_the_soft_timeout_does_not_restart(tmp_path_factory):
    """Both ranks' end-of-run digest is delayed past the in-process soft timeout."""
    steps = RUNS["variants-2x12"].steps
    assert RUNS["variants-2x12"].faults == f"slow-digest@{steps}:0,slow-digest@{steps}:1"
    run_dir = named_run(tmp_path_factory, "variants-2x12")
    record = json.loads((run_dir / "local_run.json").read_text())
    assert record["exit_code"] == 0
    run = load_run(run_dir)
    assert SLOW_DIGEST_SECONDS > 2 * LOCAL_CPU_PROFILE["inprocess"]["soft_timeout_s"]
    assert len(run.of("fault_injected")) == 2
    assert run.of("restart_begin") == []
    ends = run.of("run_end")
    assert {e["rank"] for e in ends} == {0, 1} and all(e["status"] == "completed" for e in ends)
    ranks = [e["rank_state_sha256"] for e in sorted(ends, key=lambda e: e["rank"])]
    assert ranks[0] != ranks[1]  # each rank hashed its own shards
    combined = hashlib.sha256(b"".join(bytes.fromhex(r) for r in ranks)).hexdigest()
    assert all(e["state_sha256"] == combined for e in ends)
    assert json.loads((run_dir / "summary.json").read_text())["state_sha256"] == combined


def test_trainer_run_on_gloo_skips_the_efa_check(tmp_path_factory):
    """The wiring in the trainer: with require_efa set, a gloo run trains as before."""
    assert "distributed.require_efa=true" in RUNS["variants-2x12"].overrides
    run_dir = named_run(tmp_path_factory, "variants-2x12")
    result = json.loads((run_dir / "local_run.json").read_text())
    assert result["exit_code"] == 0, (run_dir / "launcher.log").read_text()[-3000:]
    assert not (run_dir / "nccl").exists()
    assert "require_efa: true" in (run_dir / "config.yaml").read_text()
