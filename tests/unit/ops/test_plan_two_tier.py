"""`nvrx-eks plan`'s two-tier model: the optimal pair of intervals (local tier, FSx tier) and the
share of faults that destroy the local tier."""

from __future__ import annotations

import math

import pytest

from infra.config import resolve_config
from nvrx_eks.planning.model import make_plan
from nvrx_eks.planning.two_tier import two_tier_goodput, two_tier_plan
from tests.support.cli_process import cli_process


def _plan(nodes: int = 1024):
    return make_plan(resolve_config("p5"), nodes=nodes, tokens_per_step=nodes * 8 * 2 * 8192, interval_steps=50)


def test_each_tier_gets_its_own_optimum_and_the_pair_beats_neighbours():
    plan = _plan()
    tiers = two_tier_plan(plan, node_loss_share=0.2)
    mtbf = plan.job_mtbf_s
    assert tiers.local_interval_s == pytest.approx(math.sqrt(2 * tiers.local_stall_s * mtbf / 0.8))
    assert tiers.local_interval_s < tiers.fsx_interval_s
    args = dict(dl=tiers.local_stall_s, df=tiers.fsx_stall_s, rl=tiers.local_recovery_s,
                rf=tiers.fsx_recovery_s, q=0.2, mtbf=mtbf)  # fmt: skip
    best = two_tier_goodput(tiers.local_interval_s, tiers.fsx_interval_s, **args)
    for fl, ff in ((0.5, 1), (2, 1), (1, 0.5), (1, 2)):
        assert two_tier_goodput(tiers.local_interval_s * fl, tiers.fsx_interval_s * ff, **args) <= best
    assert tiers.pays_off and tiers.goodput > tiers.single_tier_goodput


def test_fsx_interval_never_shorter_than_one_fsx_write():
    plan = _plan()
    tiers = two_tier_plan(plan, node_loss_share=0.99)
    assert tiers.fsx_interval_s >= plan.state_bytes / plan.fsx_bytes_per_s


def test_a_high_node_loss_share_makes_the_local_tier_not_pay_off():
    assert not two_tier_plan(_plan(), node_loss_share=0.78).pays_off


def test_plan_prints_the_optimal_pair_and_rejects_a_bad_share():
    done = cli_process("plan", "--node-loss-share", "0.2")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    flat = " ".join(out.split())
    assert "optimal pair: local every" in flat and "checkpoint.local.interval_steps" in flat
    bad = cli_process("plan", "--node-loss-share", "1.5")
    assert bad.returncode == 2 and "--node-loss-share 1.5" in bad.stderr
