"""The rows of the fault x node table (nvrx_eks/bench/fault_matrix.py) that lose node 0 or the
coordinator, each recovered by the layer the table names and ending bit-identical to a clean run:
no fault on any node ends the job. The other rows (a non-zero node, exception and hang) are held
by tests/trainer/test_trainer_faults.py and test_trainer_spares.py; BENCHMARKS.md has the whole
table."""

from __future__ import annotations

import pytest

from nvrx_eks.bench.fault_matrix import Case, run_case
from tests.support.trainer_fixtures import exclusive_trainer_runs, port_pair

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
    with exclusive_trainer_runs(tmp_path_factory):
        row = run_case(tmp_path_factory.mktemp("matrix"), case, port=port_pair())
    assert row["exit_code"] == 0, row
    assert row["layer"] == case.expected_layer, row
    assert row["first_step_after_s"] is not None, row
    assert row["state_sha256"] == clean["state_sha256"], row
