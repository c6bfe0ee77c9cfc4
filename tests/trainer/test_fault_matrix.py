"""The rows of the fault x node table (nvrx_eks/bench/fault_matrix.py) that lose node 0 or the
coordinator, each recovered by the layer the table names and ending bit-identical to a clean run:
no fault on any node ends the job. The other rows (a non-zero node, exception and hang) are held
by tests/trainer/test_trainer_faults.py and test_trainer_spares.py; BENCHMARKS.md has the whole
table."""

from __future__ import annotations

import pytest

from nvrx_eks.bench.fault_matrix import Case, run_case
from tests.support.trainer_fixtures import exclusive_trainer_runs, port_pair
from workloads.events import load_run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> dict:
    with exclusive_trainer_runs(tmp_path_factory):
        row = run_case(tmp_path_factory.mktemp("matrix"), None, port=port_pair())
    assert row["exit_code"] == 0 and row["state_sha256"]
    return row


@pytest.mark.parametrize(
    "case",
    [
        Case("sigkill", 0, spares=1),
        Case("node-loss", 0, spares=1),
        Case("node-loss", 0, spares=0),
        Case("coordinator-loss", 0, spares=0),
    ],
    ids=lambda case: f"{case.fault}-spares{case.spares}",
)
def test_losing_node_0_or_the_coordinator_is_recovered_by_the_fastest_layer(clean, tmp_path_factory, case):
    root = tmp_path_factory.mktemp("matrix")
    with exclusive_trainer_runs(tmp_path_factory):
        row = run_case(root, case, port=port_pair())
    assert row["exit_code"] == 0, row
    assert row["layer"] == case.expected_layer, row
    assert row["first_step_after_s"] is not None, row
    assert row["state_sha256"] == clean["state_sha256"], row
    if case.spares:
        # The run directory's lease follows rank 0 (workloads.lease.RankZeroLease): the spare NVRx
        # made rank 0 holds it after node 0's loss. In a local run `nvrx-eks local` holds the lease
        # itself, and that is what the spare finds; on EKS it takes over the lost rank 0's.
        run = load_run(root / row["case"])
        (lost,) = {e["t"] for e in run.of("fault_injected")}
        holders = [(e["rank"], e["pid"], e["t"] > lost, e["how"].split(" (")[0]) for e in run.of("run_lease")]
        assert [(rank, after) for rank, _, after, _ in holders] == [(0, False), (0, True)], holders
        assert holders[0][1] != holders[1][1] and {how for *_, how in holders} == {
            "held by the command that started this run"
        }, holders
