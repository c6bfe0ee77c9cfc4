"""What `nvrx-eks plan`'s cost lines say: which price the plan used, what lost time is worth at
it, and what stays billed after a run. No torch, no AWS call.

On-demand nodes are billed by the hour they run, so lost time is money: the lost $/day a faster
recovery saves. A Capacity Block is paid up front, at purchase, for its whole duration, used or
not: a lost hour of it is paid work not done, and no strategy gets that money back. The lines say
which of the two the figures are.
"""

from __future__ import annotations

from infra.config import DeploymentConfig
from nvrx_eks.facts.instances import NodePrice


def lost_column_title(price: NodePrice) -> str:
    return "block hours lost $/day" if price.paid_up_front else "lost $/day"


def lost_value_line(price: NodePrice, strategy: str, at_configured: float, at_optimal: float) -> str:
    """One strategy's lost time at the configured and the optimal interval, in dollars a day."""
    if price.paid_up_front:
        return (
            f"  {strategy}: ${at_configured:,.0f}/day of the block's paid hours lost at the configured interval, "
            f"${at_optimal:,.0f}/day at the optimal one"
        )
    return (
        f"  {strategy}: lost ${at_configured:,.0f}/day at the configured interval, "
        f"${at_optimal:,.0f}/day at the optimal one"
    )


def cost_line(price: NodePrice | None, nodes: int, config: DeploymentConfig) -> str:
    """The price the plan used, per hour and per day for the job's nodes, and on what terms."""
    facts = config.gpu_nodes.facts
    if price is None:
        sold = "as Capacity Blocks" if config.gpu_nodes.capacity_type == "capacity-block" else "on demand"
        return f"Cost: {facts.instance_type} is not sold {sold}, so no figure here is in dollars"
    hourly = price.usd_per_hour * nodes
    if price.paid_up_front:
        return (
            f"Cost: a Capacity Block of {nodes}x {facts.instance_type} at ~${price.usd_per_hour:,.2f} per node-hour: "
            f"${hourly:,.2f}/h, ${hourly * 24:,.0f} per day of the block, paid up front at purchase for the block's "
            f"whole duration, used or not; lost hours above are paid work not done, not money saved by stopping "
            f"({price.source}; nvrx_eks/facts/instances.py)"
        )
    return (
        f"Cost: ${hourly:,.2f}/h, ${hourly * 24:,.0f}/day at {price.source} (nvrx_eks/facts/instances.py); "
        "billed while the nodes run: `nvrx-eks capacity down` stops it"
    )
