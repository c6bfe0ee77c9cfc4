"""The default node count and the price `plan` uses: a Capacity Block profile (desired_size 0)
plans and renders without --nodes at the block's price, paid up front; a node count of 0 is one
line with exit 2 wherever it comes from; every plan says what stays billed after the run."""

from __future__ import annotations

import pytest

from infra.config import resolve_config
from nvrx_eks.deploy.node_count import default_nodes
from nvrx_eks.deploy.stack_outputs import StackOutputs
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.instances import INSTANCE_FACTS, node_price
from nvrx_eks.facts.stack_outputs import OutputKey
from nvrx_eks.jobs.spec import default_job
from nvrx_eks.planning.model import make_plan, plan_for_job
from tests.support.cli_harness import run_cli
from tests.support.profiles import profile_file

BLOCK = INSTANCE_FACTS["p5.48xlarge"].capacity_block_usd_per_hour


def flat(text: str) -> str:
    return " ".join(text.split())


def test_plan_of_the_capacity_block_profile_without_nodes_uses_the_block_and_its_price():
    """(newcomer 3.1, mistake 32) desired_size 0 was taken as the node count: ZeroDivisionError."""
    result = run_cli("plan", "-p", "p5-capacity-block")
    assert result.code == 0, result.output
    out = flat(result.stdout)
    assert "nvrx-eks-cb: 2x p5.48xlarge (16 GPUs)" in out  # max_size: the block's size
    assert f"Cost: a Capacity Block of 2x p5.48xlarge at ~${BLOCK:,.2f} per node-hour: ${2 * BLOCK:,.2f}/h" in out
    assert "paid up front at purchase for the block's whole duration, used or not" in out
    assert "the Capacity Block reservation fee: an ESTIMATE read 2026-12-02" in out
    assert "of the block's paid hours lost at the configured interval" in out
    assert "on-demand" not in out


def test_render_of_the_capacity_block_profile_without_nodes_renders_the_blocks_nodes():
    result = run_cli("render", "-p", "p5-capacity-block")
    assert result.code == 0, result.output
    assert "ft_launcher --nnodes 2 --nproc-per-node 8" in result.stdout
    summary = flat(result.stderr)
    assert summary.startswith("job train: 2 x p5.48xlarge, world 16")
    assert "~$" in summary and "of the block's paid hours" in summary and "on demand" not in summary


def test_an_on_demand_plan_names_its_price_and_what_stays_billed_after_the_run():
    result = run_cli("plan")
    assert result.code == 0, result.output
    out = flat(result.stdout)
    assert "Cost: $110.08/h, $2,642/day at the on-demand price, us-east-1 Linux, read 2026-11" in out
    assert "lost $/day" in out
    assert (
        "After the run: `nvrx-eks teardown` keeps the data, billed until `teardown --delete-data`: FSx 4800 GiB "
        "at 1000 MB/s/TiB ~$2,880/month, the NAT gateway and its address ~$36/month"
    ) in out
    days = resolve_config("p5").fsx.runs_copy_days
    assert f"deleted checkpoints included for fsx.runs_copy_days ({days} days)" in out


def test_desired_size_is_the_default_where_it_is_set(tmp_path):
    config = resolve_config(config=str(profile_file(tmp_path, gpu_nodes__max_size=4, gpu_nodes__desired_size=3)))
    assert default_nodes(config) == 3
    assert default_nodes(resolve_config("p5-capacity-block")) == 2


def _outputs(node_count: str) -> StackOutputs:
    return StackOutputs("nvrx-eks-cluster", {OutputKey.GPU_NODE_COUNT: node_count})


def test_a_zero_node_count_is_a_config_error_wherever_it_comes_from():
    config = resolve_config("p5-capacity-block")
    with pytest.raises(ConfigError, match=r"^the stack output GpuNodeCount is 0: a job needs at least one GPU node"):
        default_nodes(config, _outputs("0"))
    with pytest.raises(ConfigError, match=r"^--nodes is 0: a job needs at least one GPU node; give --nodes N"):
        make_plan(config, nodes=0, tokens_per_step=1, interval_steps=1, step_time_s=1.0)
    train = default_job(config, 2, [])
    with pytest.raises(ConfigError, match=r"^--nodes is 0"):
        plan_for_job(config, train, 0)


def test_the_price_follows_the_capacity_type():
    facts = INSTANCE_FACTS["p5.48xlarge"]
    on_demand, block = node_price(facts, "on-demand"), node_price(facts, "capacity-block")
    assert on_demand is not None and block is not None
    assert (on_demand.usd_per_hour, on_demand.paid_up_front) == (facts.on_demand_usd_per_hour, False)
    assert (block.usd_per_hour, block.paid_up_front) == (facts.capacity_block_usd_per_hour, True)
    # p5e is sold as Capacity Blocks only; g5 is not sold as blocks.
    assert node_price(INSTANCE_FACTS["p5e.48xlarge"], "on-demand") is None
    assert node_price(INSTANCE_FACTS["p5e.48xlarge"], "capacity-block") is not None
    assert node_price(INSTANCE_FACTS["g5.12xlarge"], "capacity-block") is None
