"""The GPU smoke's verdicts (nvrx_eks.ops.smoke_verdicts) on recorded runs (tests/unit/ops/recorded/) and
on estimates: a fault recovered by ft_launcher instead of in process fails the faults check even
when the run completes with as many in-process restarts as faults; memory passes within its stated
tolerance and fails past it."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvrx_eks.ops.smoke_verdicts import MEMORY_TOLERANCE, faults_check, memory_check, unended_restarts
from workloads.config import TrainConfig
from workloads.events import load_run
from workloads.memory import FIXED_RESERVED_BYTES, GIB, estimate_for

RECORDED = Path(__file__).parent / "recorded"
#: The smoke's faults at its dry-run plan (gpu_smoke.SmokePlan.faults with interval 5, 2 ranks).
SMOKE_FAULTS = "exception@7:0,hang@12:1"


def test_an_exception_recovered_by_the_launcher_fails_though_the_run_completed_with_two_inprocess_restarts():
    run = load_run(RECORDED / "escalated")
    # What the smoke checked before: exit 0, two in-process restarts on rank 0, each in its own
    # process. This run meets all three.
    inprocess = [r for r in run.restarts(0) if r.layer == "inprocess"]
    assert len(inprocess) == 2 and all(r.pids[0] == r.pids[1] for r in inprocess)

    check = faults_check(run, SMOKE_FAULTS, exit_code=0)
    assert check["ok"] is False
    assert check["fault_outcomes"][0]["fault"] == "exception@7:0"
    assert check["fault_outcomes"][0]["layer"] == "launcher"
    assert check["fault_outcomes"][1]["layer"] == "inprocess"
    assert check["restarts_by_layer"] == {"inprocess": 2, "launcher": 1}
    assert check["restart_begins"] == 3 and check["unended_restarts"] == 1
    assert check["problems"] == [
        "exception@7:0 was recovered by ft_launcher, not in-process",
        "1 ft_launcher restart(s)",
        "1 in-process restart(s) began and never resumed training (no restart_end)",
    ]


def test_the_smokes_faults_each_recovered_in_process_pass():
    check = faults_check(load_run(RECORDED / "inprocess"), SMOKE_FAULTS, exit_code=0)
    assert check["ok"] is True and check["problems"] == []
    assert [o["layer"] for o in check["fault_outcomes"]] == ["inprocess", "inprocess"]
    assert all(o["recovered_s"] > 0 for o in check["fault_outcomes"])
    assert check["restarts_by_layer"] == {"inprocess": 2, "launcher": 0}
    assert check["restart_begins"] == 2 and check["unended_restarts"] == 0 and check["same_pids"]


def test_a_fault_never_injected_or_a_failed_launch_fails():
    run = load_run(RECORDED / "inprocess")
    check = faults_check(run, SMOKE_FAULTS + ",hang@30:0", exit_code=1)
    assert check["problems"] == [
        "the launch exited 1",
        "hang@30:0 was never injected",
        "2 in-process restart(s) for 3 fault(s)",
    ]


def test_restarts_that_failed_before_training_count_as_unended():
    from workloads.events import RunEvents

    def event(t, name, **fields):
        return {"t": t, "event": name, "rank": 0, "pid": 7, "cycle": 0, "iteration": 0, **fields}

    # Two iterations that died in setup, then one that resumed: two unended, one ended.
    run = RunEvents(
        [
            event(1, "restart_begin", layer="inprocess"),
            event(2, "restart_begin", layer="inprocess"),
            event(3, "restart_begin", layer="inprocess"),
            event(4, "restart_end", layer="inprocess", resumed_from_step=5),
        ]
    )
    assert unended_restarts(run) == 2


@pytest.fixture(scope="module")
def small_estimate():
    train = TrainConfig.from_dict({}, "x", ["model.preset=small", "data.seq_len=1024", "data.batch_size=2"])
    return estimate_for(train, 1, bf16=True, gpu_memory_bytes=140 * GIB)


def _run_end(peak: int, iteration: int = 0, retries: int = 0) -> dict:
    return {"event": "run_end", "iteration": iteration, "gpu_peak_reserved_bytes": peak, "gpu_alloc_retries": retries}


def test_memory_passes_within_the_stated_tolerance_and_fails_past_it(small_estimate):
    est = small_estimate
    assert est.fixed_reserved == FIXED_RESERVED_BYTES
    bound = MEMORY_TOLERANCE * (est.allocator_reserved - est.fixed_reserved) + est.fixed_reserved
    # The old check: nothing above the estimate passed, although its own allowances are guesses.
    just_over_estimate = est.allocator_reserved + (1 << 20)
    within = memory_check(est, [_run_end(just_over_estimate)], gpu=True)
    assert within["ok"] is True and within["ratio"] == round(just_over_estimate / est.allocator_reserved, 3)
    assert within["tolerance"] == MEMORY_TOLERANCE and within["bound_gib"] == round(int(bound) / GIB, 2)
    past = memory_check(est, [_run_end(int(bound) + (1 << 20), retries=3)], gpu=True)
    assert past["ok"] is False and past["alloc_retries"] == 3
    assert "cuBLAS workspaces" in past["compared"] and "CUDA context" in past["compared"]


def test_memory_judges_the_restart_free_iteration_and_shows_the_peak_after_restarts(small_estimate):
    est = small_estimate
    ends = [_run_end(2 * est.allocator_reserved, iteration=2), _run_end(est.allocator_reserved // 2, iteration=0)]
    setups = [{"event": "setup_end", "iteration": i, "gpu_reserved_bytes": i * GIB} for i in (0, 1, 2)]
    check = memory_check(est, ends, gpu=True, setup_ends=setups)
    assert check["reserved_at_restart_gib"] == 2.0
    assert check["ok"] is True and check["measured_in"] == "restart-free iteration" and check["iterations"] == [0]
    assert check["peak_after_restarts_gib"] == round(2 * est.allocator_reserved / GIB, 2)
    only_after = memory_check(est, ends[:1], gpu=True)
    assert only_after["ok"] is False and only_after["measured_in"] == "after restarts"


def test_on_cpu_nothing_stands_in_for_a_measurement(small_estimate):
    cpu_end = {"event": "run_end", "iteration": 0, "gpu_peak_reserved_bytes": None}
    check = memory_check(small_estimate, [cpu_end], gpu=False)
    assert check["ok"] is True and check["peak_reserved_gib"] is None and check["ratio"] is None
    assert memory_check(small_estimate, [cpu_end], gpu=True)["ok"] is False
