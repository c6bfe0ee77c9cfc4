"""Two checkpoint tiers: the node-local tier every few steps, FSx less often, and the pair of
intervals that maximizes goodput when a share of the faults takes the local copies with its node."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nvrx_eks.planning.model import DEFAULT_NODE_LOSS_SHARE, Plan, local_recovery_s


@dataclass(frozen=True)
class TwoTierPlan:
    """Local tier every local_interval_s, FSx every fsx_interval_s. A fault keeps the local tier
    with probability 1 - node_loss_share (recovery local_recovery_s, half a local interval lost)
    and otherwise falls back to FSx (fsx_recovery_s, half an FSx interval lost). Waste per second,
    first order in 1/M:

        W = dL/tL + dF/tF + ((1-q)(RL + tL/2) + q(RF + tF/2)) / M

    minimized per tier: tL = sqrt(2 dL M / (1-q)), tF = sqrt(2 dF M / q)."""

    node_loss_share: float
    local_stall_s: float
    fsx_stall_s: float
    local_recovery_s: float
    fsx_recovery_s: float
    local_interval_s: float
    fsx_interval_s: float
    goodput: float
    #: The single-tier NVRx strategy at its own optimum, for comparison.
    single_tier_goodput: float

    @property
    def pays_off(self) -> bool:
        """A local tier saved less often than FSx, or one that gains nothing, is not worth its stalls."""
        return self.local_interval_s < self.fsx_interval_s and self.goodput > self.single_tier_goodput


def two_tier_goodput(
    local_interval: float, fsx_interval: float, *, dl: float, df: float, rl: float, rf: float, q: float, mtbf: float
) -> float:
    overhead = dl / local_interval + df / fsx_interval
    lost = (1 - q) * (rl + local_interval / 2) + q * (rf + fsx_interval / 2)
    return max(0.0, (1 - overhead) * (1 - lost / mtbf))


def two_tier_plan(plan: Plan, node_loss_share: float = DEFAULT_NODE_LOSS_SHARE) -> TwoTierPlan:
    """The optimal pair of intervals for the layered strategy of `plan` (its async stall and
    FSx-reading in-process recovery) with a local tier added. The local save stalls for the same
    host copy as the FSx one (the copy floor); its recovery reads the shard from local NVMe."""
    if not 0 < node_loss_share < 1:
        raise ValueError("node loss share must be between 0 and 1 (exclusive)")
    layered = plan.strategies[1]
    q, mtbf = node_loss_share, plan.job_mtbf_s
    dl = df = layered.strategy.stall_s
    rf = layered.strategy.recovery_s
    rl = local_recovery_s(plan.state_bytes, plan.nodes)
    tl = math.sqrt(2 * dl * mtbf / (1 - q))
    # One FSx save in flight at a time: the next cannot start before the previous one is written.
    tf = max(math.sqrt(2 * df * mtbf / q), plan.state_bytes / plan.fsx_bytes_per_s)
    return TwoTierPlan(
        node_loss_share=q,
        local_stall_s=dl,
        fsx_stall_s=df,
        local_recovery_s=rl,
        fsx_recovery_s=rf,
        local_interval_s=tl,
        fsx_interval_s=tf,
        goodput=two_tier_goodput(tl, tf, dl=dl, df=df, rl=rl, rf=rf, q=q, mtbf=mtbf),
        single_tier_goodput=layered.goodput_at_optimal,
    )
