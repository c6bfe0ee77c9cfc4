"""The rows of the fault x node table (nvrx_eks/bench/fault_matrix.py) that lose node 0 or the
coordinator, each recovered by the layer the table names and ending bit-identical to a clean run:
no fault on any node ends the job. The other rows (a non-zero node, exception and hang) are held
by tests/runs/trainer/test_trainer_faults.py and test_trainer_spares.py; BENCHMARKS.md has the whole
table.

The two rows without a spare share one run: both end the launch and are recovered by a relaunch,
and each fault fires once per run, so the schedule `node-loss@12:0,coordinator-loss@12:0` loses
node 0 at step 12, and the relaunch, replaying step 12, loses the coordinator there (the second
of the two relaunches a run may have). The two rows with a spare share another, with a spare for
each loss: `sigkill@12:0,node-loss@12:0` kills rank 0 at step 12, a spare takes its place in
process, replays step 12 and loses its node there, and the second spare takes that place."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from nvrx_eks.bench.fault_matrix import ACTIVE_NODES, CHECKPOINT_INTERVAL, STEPS, Case, run_case
from tests.support.trainer_fixtures import exclusive_trainer_runs, port_pair
from workloads.events import fault_outcomes, load_run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]

WITHOUT_SPARES = (Case("node-loss", 0, spares=0), Case("coordinator-loss", 0, spares=0))
WITH_A_SPARE = (Case("sigkill", 0, spares=1), Case("node-loss", 0, spares=1))


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> dict:
    with exclusive_trainer_runs(tmp_path_factory):
        row = run_case(tmp_path_factory.mktemp("matrix"), None, port=port_pair())
    assert row["exit_code"] == 0 and row["state_sha256"]
    return row


def _run(tmp_path_factory, name: str, cases: tuple[Case, ...], spare_nodes: int = 0) -> tuple[Path, int]:
    """One run of `cases`' faults, as run_case runs one (the same steps, interval and nodes), and
    its exit code."""
    from nvrx_eks.local.runner import LocalRun, run_local

    run_dir = tmp_path_factory.mktemp("matrix") / name
    run = LocalRun(
        nproc=1,
        steps=STEPS,
        faults=",".join(case.fault for case in cases),
        run_dir=run_dir,
        preset="tiny",
        checkpoint_interval=CHECKPOINT_INTERVAL,
        backend="nvrx",
        nodes=ACTIVE_NODES,
        spare_nodes=spare_nodes,
        port=port_pair(),
    )
    with exclusive_trainer_runs(tmp_path_factory):
        code = run_local(run, console=Console(file=io.StringIO()), print_summary=False)
    return run_dir, code


def _assert_recovered(run_dir: Path, code: int, case: Case, clean: dict) -> None:
    """Run_case's row of `case`, from a run that may hold other faults: exit 0, the expected
    layer, a step after the recovery, the clean run's state."""
    assert code == 0, (run_dir / "launcher.log").read_text()[-4000:]
    run = load_run(run_dir)
    (outcome,) = [o for o in fault_outcomes(run.of("fault_injected"), run.restarts(0)) if o["kind"] == case.kind]
    assert outcome["fault"] == case.fault, outcome
    assert outcome.get("layer") == case.expected_layer, outcome
    # A training step after the recovery (run_case's first_step_after_s is not None).
    ready = outcome["t"] + outcome["recovered_s"]
    assert [e for e in run.of("step_end", rank=0) if e["t"] > ready], outcome
    assert json.loads((run_dir / "summary.json").read_text())["state_sha256"] == clean["state_sha256"]


@pytest.fixture(scope="module")
def relaunched(tmp_path_factory) -> tuple[Path, int]:
    """The run of WITHOUT_SPARES' faults, and its exit code."""
    return _run(tmp_path_factory, "relaunched", WITHOUT_SPARES)


@pytest.mark.parametrize("case", WITHOUT_SPARES, ids=lambda case: f"{case.kind}-spares{case.spares}")
def test_losing_node_0_or_the_coordinator_without_a_spare_is_recovered_by_a_relaunch(clean, relaunched, case):
    run_dir, code = relaunched
    _assert_recovered(run_dir, code, case, clean)


@pytest.fixture(scope="module")
def replaced(tmp_path_factory) -> tuple[Path, int]:
    """The run of WITH_A_SPARE's faults, with one spare node for each, and its exit code."""
    return _run(tmp_path_factory, "replaced", WITH_A_SPARE, spare_nodes=len(WITH_A_SPARE))


@pytest.mark.parametrize("index", range(len(WITH_A_SPARE)), ids=[case.fault for case in WITH_A_SPARE])
def test_losing_node_0_with_a_spare_is_recovered_in_process(clean, replaced, index):
    case = WITH_A_SPARE[index]
    run_dir, code = replaced
    _assert_recovered(run_dir, code, case, clean)
    # The run directory's lease follows rank 0 (workloads.lease.RankZeroLease): the spare NVRx
    # made rank 0 holds it after node 0's loss. In a local run `nvrx-eks local` holds the lease
    # itself, and that is what the spare finds; on EKS it takes over the lost rank 0's.
    run = load_run(run_dir)
    lost = sorted(e["t"] for e in run.of("fault_injected"))
    holders = [
        (e["rank"], e["pid"], sum(t < e["t"] for t in lost), e["how"].split(" (")[0]) for e in run.of("run_lease")
    ]
    # One holder before each loss and one after it, each a new process, all rank 0.
    assert [(rank, faults_before) for rank, _, faults_before, _ in holders] == [(0, n) for n in range(len(lost) + 1)]
    before, after = holders[index], holders[index + 1]
    assert before[1] != after[1] and {how for *_, how in holders} == {"held by the command that started this run"}, (
        holders
    )
