"""Goodput at scale with faults split by kind and node class, each recovered by the layer that
really handles it, and the number of hot spare nodes that maximizes goodput per dollar.

Fault kinds, node classes and their rates: model.fault_classes (Llama 3's Table 5,
grouped by the layer that recovers them: soft, network, hardware on node 0 and the other nodes,
and the coordinator's host faults); pass other shares to `spares_table`.

Recovery per kind and configuration:
    k8s-restart only             every fault: a pod restart of the whole job (POD_RESTART_RECOVERY_S)
    layered, no spares           soft and network faults: in-process restart reading FSx (an NCCL/EFA
                                 error reaches every rank as an exception); hardware: the node is
                                 gone, a pod restart
    layered + S spares + tiers   soft and network: in-process restart reading the node-local tier;
                                 hardware: a spare takes the node's place in process, its shards
                                 from the replicas the surviving nodes hold (the node-local tier:
                                 each node reads its share, as for a soft fault), except when no
                                 spare is left: after S such faults the next one takes a pod
                                 restart, which restores the spares, so a share 1/(S+1) of the
                                 hardware faults still pays the pod restart
    every configuration          the coordinator's loss: JobSet recreates every pod, a pod restart
Goodput per dollar counts the spares' price: goodput x N / (N + S).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nvrx_eks.planning.model import (
    DEFAULT_FAULT_MIX,
    POD_RESTART_RECOVERY_S,
    FaultClass,
    Plan,
    fault_classes,
    goodput_by_layer,
    local_recovery_s,
)

SPARE_CHOICES = range(0, 9)


@dataclass(frozen=True)
class SparesRow:
    nodes: int
    k8s_only: float
    layered: float
    best_spares: int
    with_spares: float  # goodput with best_spares spare nodes and tiered checkpoints
    per_dollar_gain: float  # goodput per dollar with best_spares over layered without spares


def spares_row(plan: Plan, mix: dict[str, float] = DEFAULT_FAULT_MIX) -> SparesRow:
    """Goodput of each configuration for `plan`'s job (its nodes, stalls and recovery times)."""
    nodes = plan.nodes
    sync, layered_strategy = plan.strategies[0].strategy, plan.strategies[1].strategy
    classes = fault_classes(
        nodes, plan.node_mtbf_h, layered_strategy.recovery_s, local_recovery_s(plan.state_bytes, nodes), mix
    )
    k8s_only = goodput_by_layer(classes, sync.stall_s, lambda _: POD_RESTART_RECOVERY_S)
    layered = goodput_by_layer(classes, layered_strategy.stall_s, lambda c: c.recovery_s)
    best = (0, layered, layered)
    for spares in SPARE_CHOICES:
        to_pod = 1 / (spares + 1)

        def with_spares(c: FaultClass, to_pod: float = to_pod) -> float:
            if not c.takes_a_spare:
                return c.spare_recovery_s
            return to_pod * POD_RESTART_RECOVERY_S + (1 - to_pod) * c.spare_recovery_s

        goodput = goodput_by_layer(classes, layered_strategy.stall_s, with_spares)
        per_dollar = goodput * nodes / (nodes + spares)
        if per_dollar > best[2]:
            best = (spares, goodput, per_dollar)
    return SparesRow(
        nodes=nodes,
        k8s_only=k8s_only,
        layered=layered,
        best_spares=best[0],
        with_spares=best[1],
        per_dollar_gain=best[2] / layered - 1 if layered else 0.0,
    )


def spares_table(
    plan_for_nodes: Callable[[int], Plan], node_counts: list[int], mix: dict[str, float] = DEFAULT_FAULT_MIX
) -> list[SparesRow]:
    if abs(sum(mix.values()) - 1) > 1e-9:
        raise ValueError("fault mix shares must add up to 1")
    return [spares_row(plan_for_nodes(n), mix) for n in node_counts]
