"""Faults a restart does not fix, and a slow end that is no fault, end to end under the real
ft_launcher (`nvrx-eks local`):

  nan@21:1 (2 nodes)           a GPU computing NaN on one node: that node leaves, the launch is
                               started again (the JobSet's recreation of every pod), and the run
                               ends bit-identical to a clean one
  nan@15:0,nan@15:1            NaN on every rank, again after the restart: divergence, exit 93
  oom@3:1                      the same error at the same step twice before any checkpoint:
                               exit 93 in the first launcher cycle, not ~176 restarts
  slow-close@40 (both ranks)   the checkpoint worker's close at the end takes longer than the
                               in-process soft timeout: no restart after the final commit

The NaN on one node and the slow close share one run (the `nan-and-slow-close` fixture): the
close is slowed only once the final step is saved, long after the relaunch the NaN caused, and
neither changes the trained state.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from nvrx_eks.local.runner import LOCAL_CPU_PROFILE
from tests.support.named_runs import named_summary
from tests.support.trainer_fixtures import (
    assert_nothing_left,
    exclusive_trainer_runs,
    local_run,
)
from workloads.events import load_run
from workloads.faults import SLOW_CLOSE_SECONDS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]


def _run(tmp_path_factory, name: str, **kwargs) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp(name) / "run"
    with exclusive_trainer_runs(tmp_path_factory):
        record = local_run(run_dir, **kwargs)
    return run_dir, record


#: The steps of the shared run, as "clean-2x1-40": 40 steps, a checkpoint every 10.
SHARED_STEPS = 40


@pytest.fixture(scope="module")
def nan_and_slow_close(tmp_path_factory) -> tuple[Path, dict]:
    # Step 21: the step after a save was handed off, when the one before it has committed for sure
    # (one save in flight at most), so the relaunch resumes from a checkpoint. The slow closes
    # fire where the final step was saved, on whichever process holds each rank by then.
    faults = f"nan@21:1,slow-close@{SHARED_STEPS}:0,slow-close@{SHARED_STEPS}:1"
    return _run(
        tmp_path_factory, "nan-and-slow-close", steps=SHARED_STEPS, interval=10, nproc=1, nodes=2, faults=faults
    )


def test_nan_on_one_node_replaces_that_node_and_the_run_ends_as_a_clean_one(nan_and_slow_close, tmp_path_factory):
    clean = named_summary(tmp_path_factory, "clean-2x1-40")  # 40 steps, a checkpoint every 10
    run_dir, record = nan_and_slow_close
    assert record["exit_code"] == 0, record
    run = load_run(run_dir)
    assert run.of("unrecoverable") == []
    (left,) = run.of("nonfinite_rank")
    assert (left["rank"], left["step"], left["node"], left["nonfinite_ranks"]) == (1, 21, 1, 1)
    # The launch started again (the JobSet's recreation of every pod), on a healthy "GPU".
    resumed = [e for e in run.of("restart_end") if e["layer"] == "kubernetes"]
    assert sorted(e["rank"] for e in resumed) == [0, 1]
    assert len({e["resumed_from_step"] for e in resumed}) == 1 and resumed[0]["resumed_from_step"] in (10, 20)
    assert len([e for e in run.of("fault_injected") if e["kind"] == "nan"]) == 1  # the replaced node computes no NaN
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state_sha256"] == clean["state_sha256"]
    assert summary["final_loss"] == clean["final_loss"]
    assert_nothing_left(run_dir, record)


def test_nan_on_every_rank_again_after_the_restart_ends_in_93_as_divergence(tmp_path_factory):
    run_dir, record = _run(
        tmp_path_factory, "nan-every-rank", steps=20, interval=10, nproc=1, nodes=2, faults="nan@15:0,nan@15:1"
    )
    assert record["exit_code"] == EXIT_DO_NOT_REQUEUE, record
    assert "training diverged" in record["stopped_by"] and "step 15 again, on every rank" in record["stopped_by"]
    run = load_run(run_dir)
    assert run.of("nonfinite_rank") == []
    assert {e.get("attempt", 0) for e in run.events} == {0}  # no relaunch
    assert_nothing_left(run_dir, record)


def test_a_deterministic_failure_before_the_first_checkpoint_ends_in_93_in_the_first_cycle(tmp_path_factory):
    run_dir, record = _run(tmp_path_factory, "oom", steps=10, interval=5, nproc=2, faults="oom@3:1")
    assert record["exit_code"] == EXIT_DO_NOT_REQUEUE, record
    stopped = record["stopped_by"]
    assert stopped.startswith("OutOfMemoryError: CUDA out of memory.") and "at step 3, the second time" in stopped
    run = load_run(run_dir)
    # Seen twice: the first time and the in-process restart's replay; nothing started after.
    assert [e["iteration"] for e in run.of("fault_injected")] == [0, 1]
    assert {e["cycle"] for e in run.events} == {0}
    assert_nothing_left(run_dir, record)


def test_a_close_slower_than_the_soft_timeout_restarts_nothing_after_the_final_commit(nan_and_slow_close):
    assert SLOW_CLOSE_SECONDS > 2 * LOCAL_CPU_PROFILE["inprocess"]["soft_timeout_s"]
    run_dir, record = nan_and_slow_close
    assert record["exit_code"] == 0, record
    run = load_run(run_dir)
    assert len([e for e in run.of("fault_injected") if e["kind"] == "slow-close"]) == 2
    final_commit = [e for e in run.of("checkpoint_commit") if e["step"] == SHARED_STEPS][-1]
    assert [e for e in run.of("restart_begin") if e["t"] > final_commit["t"]] == []
    ends = run.of("run_end")
    assert sorted(e["rank"] for e in ends) == [0, 1] and all(e["status"] == "completed" for e in ends)
    assert_nothing_left(run_dir, record)
