"""`nvrx-eks plan`: faults split by kind and hot spares at scale (nvrx_eks/planning/spares.py)."""

from __future__ import annotations

import pytest

from infra.config import resolve_config
from nvrx_eks.jobs.spec import default_job
from nvrx_eks.planning.model import plan_for_job
from nvrx_eks.planning.spares import spares_table


def _plan_for(n: int):
    config = resolve_config("p5")
    return plan_for_job(config, default_job(config, n, []), n)


def test_each_layer_adds_goodput_at_scale_and_spares_pay_off_only_on_large_jobs():
    rows = {r.nodes: r for r in spares_table(_plan_for, [2, 1024])}
    big = rows[1024]
    assert big.k8s_only < big.layered < big.with_spares
    assert big.best_spares >= 1 and big.per_dollar_gain > 0
    # On 2 nodes a spare costs half the job's price for faults that come once in months.
    assert rows[2].best_spares == 0


def test_hardware_faults_cost_a_pod_restart_without_spares():
    """Not every fault is recovered in process: the old plan credited all with the ~10 s restart."""
    only_soft = spares_table(_plan_for, [1024], {"soft": 1.0, "network": 0.0, "hardware": 0.0})[0]
    mixed = spares_table(_plan_for, [1024])[0]
    assert mixed.layered < only_soft.layered


def test_the_fault_mix_must_add_up():
    with pytest.raises(ValueError, match="add up to 1"):
        spares_table(_plan_for, [2], {"soft": 0.5, "network": 0.0, "hardware": 0.0})
