"""`nvrx-eks plan`'s fault model: each fault kind on each node class (node 0, the other nodes, the
coordinator), the layer recovering it, and what the coordinator's own faults cost the job."""

from __future__ import annotations

import dataclasses

import pytest
from rich.console import Console

from infra.config import resolve_config
from nvrx_eks.jobs.spec import default_job
from nvrx_eks.ops.plan import print_fault_classes, print_scaling
from nvrx_eks.planning.model import (
    COORDINATOR_FAULT_SHARE,
    DEFAULT_FAULT_MIX,
    DEFAULT_NODE_MTBF_HOURS,
    INPROCESS_FROM_FSX,
    INPROCESS_FROM_LOCAL,
    POD_RELAUNCH,
    POD_RESTART_RECOVERY_S,
    SPARE_IN_PROCESS,
    daly_interval,
    local_recovery_s,
    plan_for_job,
)
from nvrx_eks.planning.spares import spares_row

CONFIG = resolve_config("p5")


def _plan_for(n: int):
    return plan_for_job(CONFIG, default_job(CONFIG, n, []), n)


def test_node_0_has_the_other_nodes_rows_and_the_coordinator_is_relaunched():
    plan = _plan_for(4)
    inprocess_fsx = plan.strategies[1].strategy.recovery_s
    by_class: dict[str, list] = {}
    for row in plan.fault_classes:
        by_class.setdefault(row.node_class, []).append(row)
    assert set(by_class) == {"node 0", "other nodes", "coordinator"}
    assert [r.nodes for r in by_class["node 0"]] == [1, 1, 1]
    assert [r.nodes for r in by_class["other nodes"]] == [3, 3, 3]
    # Node 0 hosts no store any more: every fault on it is recovered as on any other node.
    same = [dataclasses.replace(r, node_class="", nodes=0) for r in by_class["node 0"]]
    assert same == [dataclasses.replace(r, node_class="", nodes=0) for r in by_class["other nodes"]]
    layers = {r.kind: (r.layer, r.recovery_s, r.spare_layer, r.takes_a_spare) for r in by_class["node 0"]}
    assert layers == {
        "soft": (INPROCESS_FROM_FSX, inprocess_fsx, INPROCESS_FROM_LOCAL, False),
        "network": (INPROCESS_FROM_FSX, inprocess_fsx, INPROCESS_FROM_LOCAL, False),
        "hardware": (POD_RELAUNCH, POD_RESTART_RECOVERY_S, SPARE_IN_PROCESS, True),
    }
    assert {r.spare_recovery_s for r in by_class["node 0"]} == {local_recovery_s(plan.state_bytes, 4)}
    (coordinator,) = by_class["coordinator"]
    assert (coordinator.kind, coordinator.nodes) == ("coordinator host", 1)
    # Its loss ends every rank's store: a relaunch of the job, spares or not.
    assert (coordinator.layer, coordinator.recovery_s) == (POD_RELAUNCH, POD_RESTART_RECOVERY_S)
    assert (coordinator.spare_layer, coordinator.spare_recovery_s) == (POD_RELAUNCH, POD_RESTART_RECOVERY_S)
    assert not coordinator.takes_a_spare
    # One CPU host: Llama 3's host categories (32 + 14 of 419) of one node's faults.
    assert coordinator.node_mtbf_h == pytest.approx(DEFAULT_NODE_MTBF_HOURS * 419 / 46)
    # The GPU nodes' kinds add up to the node MTBF the plan was given.
    node_rate = sum(1 / r.node_mtbf_h for r in by_class["node 0"])
    assert node_rate == pytest.approx(1 / plan.node_mtbf_h)


def test_the_coordinator_lowers_goodput_by_its_relaunches():
    """By hand: without the coordinator the layered job sees N faults per node MTBF Mn, each costing
    R0 = (soft + network) x in-process + hardware x pod restart; the coordinator adds c = 46/419 of
    one node's rate, each fault a relaunch P. Goodput at the optimal interval tau of the fault rate:
        g = tau / (tau + d) x (1 - (R + (tau + d) / 2) x rate)"""
    plan = _plan_for(2)
    row = spares_row(plan)
    layered = plan.strategies[1].strategy
    d, n, mn, c, p = layered.stall_s, plan.nodes, plan.node_mtbf_h * 3600, 46 / 419, POD_RESTART_RECOVERY_S
    r0 = (DEFAULT_FAULT_MIX["soft"] + DEFAULT_FAULT_MIX["network"]) * layered.recovery_s
    r0 += DEFAULT_FAULT_MIX["hardware"] * p

    def goodput(rate: float, recovery: float) -> float:
        tau = daly_interval(d, 1 / rate)
        return tau / (tau + d) * (1 - (recovery + (tau + d) / 2) * rate)

    without = goodput(n / mn, r0)
    with_coordinator = goodput((n + c) / mn, (n * r0 + c * p) / (n + c))
    assert COORDINATOR_FAULT_SHARE == pytest.approx(c)
    assert row.layered == pytest.approx(with_coordinator, abs=1e-12)
    assert plan.goodput_by_layer[layered.name] == pytest.approx(with_coordinator, abs=1e-12)
    # The drop, first order: c / Mn relaunches per second, each losing P and half an interval.
    tau = daly_interval(d, mn / n)
    drop = c / mn * (p + (tau + d) / 2) * tau / (tau + d)
    assert without - row.layered == pytest.approx(drop, rel=0.05)
    assert drop > 1e-5  # large enough for the comparison above to mean something


def test_the_scaling_table_recovers_each_fault_by_its_layer():
    plans = {n: _plan_for(n) for n in (2, 1024, 2048)}
    for n, plan in plans.items():
        sync, layered = plan.strategies
        row = spares_row(plan)
        by_layer = plan.goodput_by_layer
        assert by_layer[layered.strategy.name] == pytest.approx(row.layered, abs=1e-12)
        assert by_layer[sync.strategy.name] == pytest.approx(row.k8s_only, abs=1e-12)
        # The old column credited every fault with an in-process restart: an upper bound.
        assert by_layer[layered.strategy.name] < layered.goodput_at_optimal, n
    # At 2,048 nodes a hardware fault's pod restart costs the job more than a point of goodput.
    big = plans[2048]
    assert big.strategies[1].goodput_at_optimal - big.goodput_by_layer["NVRx async + in-process"] > 0.01
    console = Console(record=True, width=200)
    print_scaling(CONFIG, plans.__getitem__, list(plans), console)
    text = " ".join(console.export_text().split())
    assert "upper bound" not in text
    by_layer = big.goodput_by_layer
    row = f"│ 2048 │ 3.1 h │ {by_layer['sync + pod restart']:.2%} │ {by_layer['NVRx async + in-process']:.2%} │"
    assert row in text


def test_the_fault_table_prints_each_class_and_its_assumption():
    console = Console(record=True, width=200)
    print_fault_classes(_plan_for(2), console)
    text = " ".join(console.export_text().split())
    assert "coordinator host │ coordinator │ 1 │ 57,700 h │ pod relaunch │ 4.5 min │ pod relaunch │ 4.5 min" in text
    assert "hardware │ node 0 │ 1 │ 8,453 h │ pod relaunch │ 4.5 min │ a spare, in process │ 14.8 s" in text
    assert "Node 0 hosts nothing since the coordinator" in text
    assert "unplanned maintenance 32 + other host parts 14 of 419" in text
    assert 'BENCHMARKS.md, "Fault x node: every fault recovered"' in text
