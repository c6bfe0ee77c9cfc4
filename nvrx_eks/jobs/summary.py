"""The few lines `render` and `submit` print about the training job they built (on stderr, beside
the manifests): its world, the tokens each step trains on and whether a node count changes them,
its memory per GPU and how many blocks recompute in backward, how often it checkpoints, its data,
and roughly how long and how much the run takes. A change of node count or config shows its
consequences here, before anything runs.
"""

from __future__ import annotations

from infra.config import DeploymentConfig
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.instances import NodePrice
from nvrx_eks.jobs.spec import JobSpec
from nvrx_eks.planning.model import MODELLED_STEP_S, duration_text, plan_for_job
from workloads.memory import GIB, describe_checkpointing, estimate_for


def job_summary(spec: JobSpec, config: DeploymentConfig) -> list[str]:
    """Rich-markup lines; none for the fabric test."""
    if spec.workload != "train":
        return []
    train, world = spec.train, spec.world_size
    data = train.data
    accumulation = data.accumulation(world)
    tokens = world * data.batch_size * data.seq_len * accumulation
    spares = f" + {spec.spare_nodes} spare" if spec.spare_nodes else ""
    fixed = (
        "data.global_batch_tokens: the same on any node count"
        if data.global_batch_tokens
        else "grows with the node count; set data.global_batch_tokens to fix it"
    )
    lines = [
        f"job {spec.name}: {spec.nodes}{spares} x {spec.instance_type}, world {world}, model {train.model.name}, "
        f"precision {train.distributed.precision}",
        f"batch: {world} ranks x {data.batch_size} x {data.seq_len} tokens x {accumulation} "
        f"micro-batch{'' if accumulation == 1 else 'es'} = {tokens:,} tokens per step ({fixed})",
    ]
    facts = spec.facts
    memory = estimate_for(
        train, world, ranks_per_node=spec.nproc_per_node, gpu_memory_bytes=facts.gpu_cuda_memory_bytes
    )
    lines.append(
        f"memory: ~{memory.total / GIB:.1f} of {facts.gpu_cuda_memory_bytes / GIB:.1f} GiB per {facts.gpu_model}, "
        f"{describe_checkpointing(train, memory)} (`nvrx-eks plan` shows the parts)"
    )
    no_estimate = f"{facts.gpu_model}: no published bf16 peak to model its steps on"
    try:
        plan = plan_for_job(config, train, spec.nodes)
    except ConfigError:
        plan = None
    if plan is not None and plan.step_time_s < MODELLED_STEP_S:
        plan, no_estimate = None, "its steps are too short for the plan's model"
    every = f"every {train.checkpoint.interval_steps} steps"
    if plan is not None:
        every += f" (~{duration_text(train.checkpoint.interval_steps * plan.step_time_s)})"
    local = train.checkpoint.local
    node_local = f", node-local every {local.interval_steps} steps" if local.enabled else ""
    lines.append(f"checkpoints: {every} to FSx{node_local}")
    if data.source == "synthetic":
        lines.append(
            "[bold yellow]data: synthetic tokens[/] (no data.path): this job proves the cluster, it trains no "
            "model worth keeping; give --data with the FSx path of your shards (nvrx-eks data prepare)"
        )
    else:
        lines.append(f"data: {data.path}")
    if plan is None:
        lines.append(f"estimate: n/a for model {train.model.name} ({no_estimate})")
    else:
        run_s = train.steps * plan.step_time_s
        cost = run_cost_text(plan.node_price, plan.usd_per_hour, run_s)
        lines.append(
            f"estimate: {train.steps:,} steps x ~{plan.step_time_s:.2f} s = {duration_text(run_s)}{cost} "
            "(assumed MFU; `nvrx-eks plan` says which)"
        )
    return lines


def run_cost_text(price: NodePrice | None, usd_per_hour: float | None, run_s: float) -> str:
    """A run's cost (`usd_per_hour`: all its nodes'): ', ~$N on demand' or ', ~$N of the block's
    paid hours' (a Capacity Block is paid up front: nvrx_eks/ops/plan_cost.py says why the words differ)."""
    if price is None or usd_per_hour is None:
        return ""
    usd = usd_per_hour * run_s / 3600
    return f", ~${usd:,.0f} of the block's paid hours" if price.paid_up_front else f", ~${usd:,.0f} on demand"
