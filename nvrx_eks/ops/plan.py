"""`nvrx-eks plan`: the checkpoint interval that maximizes goodput, and what lost time costs.

The numbers are nvrx_eks.planning's (its model.py states the model); this module checks the
figures given on the command line and prints the tables, every assumption next to its result.
The first table charges every fault its strategy's restart; the tables at scale recover each
fault by its layer (Plan.goodput_by_layer, the fault table, hot spares).
"""

from __future__ import annotations

import dataclasses
import math

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from infra.config import DeploymentConfig, resolve_config
from nvrx_eks.deploy.node_count import default_nodes, require_nodes
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.jobs.options import check_step_time
from nvrx_eks.jobs.spec import load_train_config
from nvrx_eks.ops.plan_cost import cost_line, lost_column_title, lost_value_line
from nvrx_eks.ops.still_billed import kept_after_run_line
from nvrx_eks.planning.model import (
    COORDINATOR_FAULT_SHARE,
    DEFAULT_D2H_GBPS,
    DEFAULT_FAULT_MIX,
    DEFAULT_LOCAL_READ_GBPS_PER_NODE,
    DEFAULT_NODE_LOSS_SHARE,
    DEFAULT_NODE_MTBF_HOURS,
    FAULT_MIX_SOURCE,
    INPROCESS_FIXED_S,
    MODELLED_STEP_S,
    NODE_MTBF_SOURCE,
    Plan,
    duration_text,
    interval_steps,
    plan_for_job,
)
from nvrx_eks.planning.spares import SparesRow, spares_table
from nvrx_eks.planning.two_tier import TwoTierPlan, two_tier_plan
from workloads.memory import GIB, MemoryEstimate, describe_checkpointing

#: The largest per-node MTBF `plan` takes: over a thousand years. Beyond it a figure is a typo,
#: and `inf` or 1e308 overflow the interval arithmetic.
MAX_NODE_MTBF_HOURS = 1e7
#: The longest stall of one save `plan` takes (--sync-stall-s, --async-stall-s): a day.
MAX_SAVE_STALL_S = 24 * 3600.0
#: Where the layer each fault on each node class reaches is measured end to end (on CPU, in
#: simulated nodes): `python -m nvrx_eks.bench.fault_matrix`.
FAULT_MATRIX_SOURCE = 'BENCHMARKS.md, "Fault x node: every fault recovered"'


def print_table(console: Console, table: Table) -> None:
    """The table as is where the terminal is wide enough for it; otherwise one block per row, the
    first cell then `header: value` lines, so that no header is cut at 80 columns."""
    # Measured unbounded: a table measured within the terminal never reports needing more.
    if Measurement.get(console, console.options.update_width(10_000), table).maximum <= console.width:
        console.print(table)
        return
    if table.title:
        console.print(f"[bold]{table.title}[/]")
    headers = [str(column.header) for column in table.columns]
    for row in zip(*(list(column.cells) for column in table.columns), strict=True):
        console.print(f"  [bold]{headers[0]}: {row[0]}[/]")
        for header, cell in zip(headers[1:], row[1:], strict=True):
            console.print(f"    {header}: {cell}")


def plan_as_data(plan: Plan) -> dict:
    """The plan for `plan -o json`: every figure of the tables, in seconds, bytes and dollars."""
    return dataclasses.asdict(plan)


def print_plan(plan: Plan, config: DeploymentConfig, model: str, console: Console) -> None:
    facts = config.gpu_nodes.facts
    console.print(
        f"[bold]{config.name}[/]: {plan.nodes}x {facts.instance_type} ({plan.gpus} GPUs), model {model}: "
        f"{plan.state_bytes / 1e9:.0f} GB of checkpointed state, ~{plan.step_time_s:.2f} s per step"
    )
    if plan.assumed_mfu is not None:
        console.print(
            f"Step time: 6 FLOPs per parameter per token at an assumed {plan.assumed_mfu:.0%} MFU of the "
            f"{facts.gpu_model}'s {facts.peak_bf16_tflops:g} TFLOP/s dense bf16 peak. Source: "
            f"{plan.step_time_source}. Give a measured one with --step-time-s"
        )
    console.print(
        f"Failures: node MTBF {plan.node_mtbf_h:,.0f} h -> job MTBF {duration_text(plan.job_mtbf_s)} "
        f"over {plan.nodes} nodes"
    )
    mtbf_source = NODE_MTBF_SOURCE if plan.node_mtbf_h == DEFAULT_NODE_MTBF_HOURS else "given"
    mix = ", ".join(f"{kind} {share:.0%}" for kind, share in DEFAULT_FAULT_MIX.items())
    mfu = "given step time" if plan.assumed_mfu is None else f"MFU {plan.assumed_mfu:.0%} (above)"
    console.print(
        f"Assumptions: node MTBF {plan.node_mtbf_h:,.0f} h ({mtbf_source}; --node-mtbf-hours); faults {mix} "
        f"({FAULT_MIX_SOURCE}); {mfu}"
    )
    table = Table(title="Checkpoint interval plan (Young/Daly)")
    for column in (
        "strategy",
        "stall/save",
        "recovery",
        "optimal interval",
        "goodput at optimal",
        "configured interval",
        "goodput at configured",
    ):
        table.add_column(column, justify="right" if column != "strategy" else "left")
    if plan.node_price is not None:
        table.add_column(lost_column_title(plan.node_price), justify="right")
    for p in plan.strategies:
        steps = interval_steps(plan, p)
        row = [
            p.strategy.name,
            duration_text(p.strategy.stall_s),
            duration_text(p.strategy.recovery_s),
            f"{duration_text(p.optimal_interval_s)} (~{steps} steps)",
            f"{p.goodput_at_optimal:.2%}",
            duration_text(p.configured_interval_s),
            f"{p.goodput_at_configured:.2%}",
        ]
        if plan.node_price is not None:
            row.append(f"{plan.lost_cost_per_day(p):,.0f}")
        table.add_row(*row)
    print_table(console, table)
    if plan.node_price is not None:
        for p in plan.strategies:
            at_configured, at_optimal = plan.lost_cost_per_day(p, at_optimal=False), plan.lost_cost_per_day(p)
            assert at_configured is not None and at_optimal is not None  # priced: node_price is set
            console.print(lost_value_line(plan.node_price, p.strategy.name, at_configured, at_optimal))
    console.print(cost_line(plan.node_price, plan.nodes, config))
    console.print(kept_after_run_line(config))
    console.print(
        "[dim]Stalls are estimates (sync: state / FSx throughput; async: shard / "
        f"{DEFAULT_D2H_GBPS:g} GB/s host copy) unless "
        "given with --sync-stall-s/--async-stall-s; recoveries are the published ~270 s pod restart and "
        f"an in-process restart of ~{INPROCESS_FIXED_S:g} s plus reading the checkpoint from FSx. Measure yours "
        "with `nvrx-eks bench`. This table charges every fault its strategy's restart; the tables at scale "
        "below recover each fault by its layer.[/]"
    )


def print_memory(memory: MemoryEstimate, config: DeploymentConfig, train, world_size: int, console: Console) -> None:
    facts = config.gpu_nodes.facts
    verdict = "fits" if memory.total <= facts.gpu_cuda_memory_bytes else "does NOT fit"
    accumulation = train.data.accumulation(world_size)
    console.print(
        f"Memory per GPU ({train.model.name}, {train.data.batch_size} x {train.data.seq_len} tokens per "
        f"micro-batch, {accumulation} per step: global batch "
        f"{world_size * train.data.batch_size * train.data.seq_len * accumulation:,} tokens, "
        f"{describe_checkpointing(train, memory)}, "
        f"world {world_size}): {memory.total / GIB:.1f} GiB of {facts.gpu_cuda_memory_bytes / GIB:.1f} GiB "
        f"({facts.gpu_model}): {verdict}"
    )
    for name, nbytes in memory.components():
        console.print(f"  {name:<44} {nbytes / GIB:6.1f} GiB")
    console.print(f"  [dim]host memory for checkpoint staging: {memory.host_staging / GIB:.1f} GiB per rank[/]")
    if train.checkpoint.local.enabled:
        console.print(
            f"  [dim]host memory of the node-local tier's copy: {memory.local_tier_copy / GIB:.1f} GiB per rank "
            "(pinned: each tensor rounded up to a power of two)[/]"
        )


def print_scaling(config: DeploymentConfig, plan_for_nodes, node_counts: list[int], console: Console) -> None:
    """Goodput at each strategy's optimal interval as the job grows: failures scale with nodes, each
    fault kind recovered by its layer (Plan.goodput_by_layer)."""
    table = Table(title="The same job at scale (optimal interval per strategy)")
    table.add_column("nodes", justify="right")
    table.add_column("job MTBF", justify="right")
    plans = [plan_for_nodes(n) for n in node_counts]
    for name in plans[0].goodput_by_layer:
        table.add_column(name, justify="right")
    for n, plan in zip(node_counts, plans, strict=True):
        table.add_row(
            str(n), duration_text(plan.job_mtbf_s), *[f"{goodput:.2%}" for goodput in plan.goodput_by_layer.values()]
        )
    print_table(console, table)
    console.print(
        "[dim]  Each fault recovered by its layer (the fault table above): the sync column pays a pod restart "
        "for every fault, the NVRx one restarts soft and network faults in process and a hardware fault (its "
        "node gone) by a pod restart; both count the coordinator's host faults, recovered by a relaunch (job "
        "MTBF: the GPU nodes'). Where a fixed global batch (data.global_batch_tokens) has fewer micro-batches "
        "than GPUs, a row takes one micro-batch per GPU per step.[/]"
    )


def print_two_tier(plan: Plan, tiers: TwoTierPlan, console: Console) -> None:
    def steps(seconds: float) -> int:
        return max(1, round(seconds / plan.step_time_s))

    console.print(
        f"Two tiers (NVRx async + in-process, local tier replicated to a peer node), optimal pair: local every "
        f"{duration_text(tiers.local_interval_s)} (~{steps(tiers.local_interval_s)} steps, "
        f"checkpoint.local.interval_steps), FSx every {duration_text(tiers.fsx_interval_s)} "
        f"(~{steps(tiers.fsx_interval_s)} steps, checkpoint.interval_steps): goodput {tiers.goodput:.2%} "
        f"vs {tiers.single_tier_goodput:.2%} with FSx alone"
    )
    if not tiers.pays_off:
        console.print(
            "  The local tier does not pay off at this node loss share: a local save stalls as long as an "
            "FSx one (the host copy), and too few faults leave it usable. It pays off when most faults "
            "are soft (exceptions, hangs, killed ranks) or when FSx saves stall longer than the copy."
        )
    console.print(
        f"[dim]  {tiers.node_loss_share:.0%} of faults assumed to destroy the local tier (node loss share, "
        f"--node-loss-share); local recovery ~{duration_text(tiers.local_recovery_s)} "
        f"({DEFAULT_LOCAL_READ_GBPS_PER_NODE:g} GB/s per node local read, assumed), FSx recovery "
        f"~{duration_text(tiers.fsx_recovery_s)}.[/]"
    )


def print_fault_classes(plan: Plan, console) -> None:
    """The plan's fault model: each fault kind on each node class, its rate and the layer that
    recovers it, with its cost, without spares and with them."""
    table = Table(title=f"Each fault kind on each node class ({plan.nodes} GPU nodes and the coordinator)")
    for column in (
        "fault",
        "node class",
        "nodes",
        "MTBF per node",
        "no spares",
        "cost",
        "with spares + tiers",
        "cost with spares",
    ):
        table.add_column(column, justify="left" if column in ("fault", "node class") else "right")
    for c in plan.fault_classes:
        table.add_row(
            c.kind,
            c.node_class,
            str(c.nodes),
            f"{c.node_mtbf_h:,.0f} h",
            c.layer,
            duration_text(c.recovery_s),
            c.spare_layer,
            duration_text(c.spare_recovery_s),
        )
    print_table(console, table)
    console.print(
        "[dim]  Node 0 hosts nothing since the coordinator (the rendezvous and in-process restart stores), so "
        "its faults are the other nodes' (the default JobSet; with --api pytorchjob the stores ride the master "
        "pod and node 0's hardware faults also take the coordinator). A hardware fault on a GPU node uses up a "
        "spare; once none is left, a pod relaunch (which restores them). The coordinator is one CPU host: its "
        "MTBF assumes it fails as often as a GPU node's host parts "
        f"({COORDINATOR_FAULT_SHARE:.1%} of a node's faults: Llama 3 Table 5, unplanned maintenance 32 + other "
        "host parts 14 of 419); its loss ends every rank's store and JobSet recreates every pod. Costs are "
        "EKS-scale: the published pod restart and in-process restart plus the checkpoint read; which layer "
        f"recovers each fault on each node class is measured end to end on CPU: {FAULT_MATRIX_SOURCE}, which "
        "also times ft_launcher restarting a killed rank on its node (no EKS-scale figure is published for it, "
        "so no kind here is charged it).[/]"
    )


def print_spares(rows: list[SparesRow], console) -> None:
    table = Table(
        title="Faults by kind, each recovered by its layer (Llama 3 mix: "
        + ", ".join(f"{k} {v:.0%}" for k, v in DEFAULT_FAULT_MIX.items())
        + ", and the coordinator's host faults); goodput at each one's optimal interval",
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


def check_measured(
    node_mtbf_hours: float | None, sync_stall_s: float | None, async_stall_s: float | None, step_time_s: float | None
) -> None:
    """The figures given on the command line (None: not given), each finite and within what a
    real system measures (ConfigError naming the flag)."""
    if node_mtbf_hours is not None and not (
        math.isfinite(node_mtbf_hours) and 0 < node_mtbf_hours <= MAX_NODE_MTBF_HOURS
    ):
        raise ConfigError(
            f"--node-mtbf-hours {node_mtbf_hours:g}: give the mean hours between failures of one node, "
            f"at most {MAX_NODE_MTBF_HOURS:g} (default: {DEFAULT_NODE_MTBF_HOURS:,.0f}, Llama 3's)"
        )
    for flag, stall in (("--sync-stall-s", sync_stall_s), ("--async-stall-s", async_stall_s)):
        if stall is not None and not (math.isfinite(stall) and 0 < stall <= MAX_SAVE_STALL_S):
            raise ConfigError(
                f"{flag} {stall:g}: give the measured seconds one save stalls training, above 0 and at most "
                f"{MAX_SAVE_STALL_S:g} (a day)"
            )
    check_step_time("--step-time-s", step_time_s)


def run(
    profile: str | None,
    config_path: str | None,
    train_config_path: str | None,
    nodes: int | None,
    node_mtbf_hours: float | None,
    sync_stall_s: float | None,
    async_stall_s: float | None,
    step_time_s: float | None,
    console: Console,
    node_loss_share: float = DEFAULT_NODE_LOSS_SHARE,
    overrides: list[str] | tuple[str, ...] = (),
) -> Plan:
    """Without a trainer config: the profile's default job (what `render` trains), sized for
    the same number of nodes; `overrides` (--set) on top of either, as `render` applies them."""
    check_measured(node_mtbf_hours, sync_stall_s, async_stall_s, step_time_s)
    config = resolve_config(profile, config_path)
    job_nodes = default_nodes(config) if nodes is None else require_nodes(nodes, "--nodes")
    train = load_train_config(train_config_path, list(overrides), None, config=config, nodes=job_nodes)

    def plan_for(n: int) -> Plan:
        return plan_for_job(
            config,
            train,
            n,
            node_mtbf_hours=node_mtbf_hours or DEFAULT_NODE_MTBF_HOURS,
            sync_stall_s=sync_stall_s,
            async_stall_s=async_stall_s,
            step_time_s=step_time_s,
        )

    result = plan_for(job_nodes)
    if result.assumed_mfu is not None and result.step_time_s < MODELLED_STEP_S:
        raise ConfigError(
            f"model {train.model.name}: its modelled step ({result.step_time_s:.1e} s) is too short for the "
            f"plan's compute model (below {MODELLED_STEP_S} s, launch, communication and Python overheads it "
            "leaves out dominate); give --step-time-s with a measured one (the step_s of a run's step_end events)"
        )
    print_plan(result, config, train.model.name, console)
    print_two_tier(result, two_tier_plan(result, node_loss_share), console)
    assert result.memory is not None  # plan_for_job always estimates the job's memory
    print_memory(result.memory, config, train, result.gpus, console)
    print_fault_classes(result, console)
    print_scaling(config, plan_for, sorted({result.nodes, 16, 128, 1024, 2048}), console)
    print_spares(spares_table(plan_for, [2, 8, 32, 128, 512, 1024]), console)
    return result
