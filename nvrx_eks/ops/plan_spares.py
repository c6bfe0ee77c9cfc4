"""Goodput at scale with faults split by kind, each recovered by the layer that really handles it,
and the number of hot spare nodes that maximizes goodput per dollar. No torch.

Fault kinds and their shares: nvrx_eks.ops.plan.DEFAULT_FAULT_MIX (Llama 3's Table 5, grouped by
the layer that recovers them: soft, network, hardware); pass other shares to `spares_table`.

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
Goodput per dollar counts the spares' price: goodput x N / (N + S).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nvrx_eks.ops.plan import (
    DEFAULT_FAULT_MIX,
    POD_RESTART_RECOVERY_S,
    Plan,
    daly_interval,
    expected_goodput,
    local_recovery_s,
    print_table,
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


def _goodput(stall_s: float, job_mtbf_s: float, recovery_s: float) -> float:
    tau = daly_interval(stall_s, job_mtbf_s)
    return expected_goodput(tau, stall_s, job_mtbf_s, recovery_s)


def spares_row(plan: Plan, mix: dict[str, float] = DEFAULT_FAULT_MIX) -> SparesRow:
    """Goodput of each configuration for `plan`'s job (its nodes, stalls and recovery times)."""
    nodes, job_mtbf_s = plan.nodes, plan.job_mtbf_s
    sync, layered_strategy = plan.strategies[0].strategy, plan.strategies[1].strategy
    soft_net = mix["soft"] + mix["network"]
    inprocess_fsx = layered_strategy.recovery_s
    inprocess_local = local_recovery_s(plan.state_bytes, nodes)
    k8s_only = _goodput(sync.stall_s, job_mtbf_s, POD_RESTART_RECOVERY_S)
    layered = _goodput(
        layered_strategy.stall_s, job_mtbf_s, soft_net * inprocess_fsx + mix["hardware"] * POD_RESTART_RECOVERY_S
    )
    best = (0, layered, layered)
    for spares in SPARE_CHOICES:
        to_pod = 1 / (spares + 1)
        hardware = to_pod * POD_RESTART_RECOVERY_S + (1 - to_pod) * inprocess_local
        goodput = _goodput(
            layered_strategy.stall_s, job_mtbf_s, soft_net * inprocess_local + mix["hardware"] * hardware
        )
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


def print_spares(rows: list[SparesRow], console) -> None:
    from rich.table import Table

    table = Table(
        title="Faults by kind, each recovered by its layer (Llama 3 mix: "
        + ", ".join(f"{k} {v:.0%}" for k, v in DEFAULT_FAULT_MIX.items())
        + "); goodput at each one's optimal interval",
        title_justify="left",
    )
    for column in (
        "nodes",
        "k8s restart only",
        "layered, no spares",
        "spares for best goodput/$",
        "layered + spares + tiers",
        "goodput/$ vs no spares",
    ):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            str(r.nodes),
            f"{r.k8s_only:.2%}",
            f"{r.layered:.2%}",
            str(r.best_spares),
            f"{r.with_spares:.2%}",
            f"{r.per_dollar_gain:+.2%}",
        )
    print_table(console, table)
