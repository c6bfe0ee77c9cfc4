"""The checkpoint interval that maximizes goodput, and what a fault costs: the numbers `nvrx-eks plan`
prints, the job summary estimates a run from, and a default job's checkpoint interval.

Model (Young 1974, Daly 2006): checkpoints every tau seconds of training cost a stall delta each;
failures arrive with mean time between failures M for the whole job (per-node MTBF / nodes); each
failure costs the recovery time R plus, on average, half an interval of lost work. Then

    goodput(tau) = tau / (tau + delta) * (1 - (R + (tau + delta) / 2) / M)
    tau_young    = sqrt(2 delta M)
    tau_daly     = sqrt(2 delta M) * (1 + sqrt(delta / (2M)) / 3 + delta / (18 M)) - delta   (delta < 2M)

Two strategies are compared for a job: synchronous checkpoints with a Kubernetes pod restart after
every fault (the baseline), and the layered NVRx configuration (async checkpoints, in-process
restart). Stalls are estimated from the model's state size unless measured ones are given
(`nvrx-eks bench` measures them).

Plan.strategies charges every fault its strategy's restart. The fault model (fault_classes) splits
faults by kind and node class (node 0, the other nodes, the job's coordinator), each with its rate
and recovered by its layer; the tables at scale read it (Plan.goodput_by_layer, spares.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from infra.config import DeploymentConfig
from nvrx_eks.deploy.node_count import default_nodes, require_nodes
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.instances import NodePrice, node_price
from workloads.memory import CHECKPOINT_BYTES_PER_PARAM, MemoryEstimate, estimate_for, parameter_count
from workloads.presets import MODEL_PRESETS, ModelShape

#: Per-node MTBF: Llama 3 (Meta, 2024, "The Llama 3 Herd of Models", sec. 3.3.4) saw 419
#: unexpected interruptions in 54 days on 16,384 H100 GPUs (2,048 8-GPU nodes):
#: 54 * 24 * 2048 / 419 = 6,335 node-hours between failures.
DEFAULT_NODE_MTBF_HOURS = 54 * 24 * 2048 / 419
NODE_MTBF_SOURCE = "Llama 3: 419 interruptions in 54 days on 2,048 8-GPU nodes, arXiv 2407.21783 sec. 3.3.4"
#: Recovery time after a fault. A Kubernetes pod restart: ~270 s, the published NVRx/EKS figure
#: this project reproduces. An NVRx in-process restart: a fixed part (abort the process groups,
#: finalize, health check, regroup, a new NCCL communicator, rebuild the model: the published
#: ~10 s) plus reloading the checkpoint, modelled in inprocess_recovery_s.
POD_RESTART_RECOVERY_S = 270.0
INPROCESS_FIXED_S = 10.0
#: Host-side copy bandwidth per GPU for the async snapshot. NVRx's cpu_shm staging copies into
#: pageable shared memory (not a pinned DMA, filesystem_async.py), with a device sync every 8
#: tensors: a conservative 10 GB/s, half of the ~20 GB/s a pinned copy reaches in practice.
DEFAULT_D2H_GBPS = 10.0
#: The model FLOPs utilisation assumed where no step time is given: 40% of the GPU's dense bf16
#: peak. Llama 3 405B pre-training reached 43%, 41% and 38% BF16 MFU (430, 400 and 380 TFLOPs per
#: GPU) on 8,192 to 16,384 H100s ("The Llama 3 Herd of Models", https://arxiv.org/abs/2407.21783,
#: Table 4). torchtitan's Llama 3.1 8B with FSDP2 on 8 H100s reaches 5,762 tokens/s per GPU eager
#: (~33% MFU) and 6,667 with torch.compile (~39%), selective activation checkpointing
#: (https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 1): this eager
#: trainer with full activation checkpointing may step slower than assumed; give a measured
#: --step-time-s once one exists.
ASSUMED_MFU = 0.40
MFU_SOURCE = "Llama 3 405B pre-training: 38-43% BF16 MFU on H100s (arXiv 2407.21783, Table 4)"
#: Below this modelled step time the compute model (FLOPs at an assumed MFU) says little: launch,
#: communication and Python overheads it leaves out dominate such steps (the tiny preset).
MODELLED_STEP_S = 0.05

#: Interruptions by kind, as shares of all unexpected ones: Llama 3 (sec. 3.3.4, Table 5: 419 in
#: 54 days), this project's grouping of its categories by the layer that recovers them:
#:   soft      software bugs, NCCL watchdog timeouts, dependencies (54 + 7 + 2 of 419)
#:   network   network switch/cable and NIC failures (35 + 7): an NCCL/EFA error on every rank
#:   hardware  GPUs (faulty GPU 148, HBM3 72, SRAM 19, GPU system processor 17, silent data
#:             corruption 6, thermal 6) and hosts (unplanned maintenance 32, SSD, power supply,
#:             chassis, IO board, CPU, memory: 14): the node is gone
#: (The paper's own "~78% hardware" groups the categories differently.) Pass other shares where
#: a function takes a mix.
DEFAULT_FAULT_MIX = {"soft": 63 / 419, "network": 42 / 419, "hardware": 314 / 419}
FAULT_MIX_SOURCE = "Llama 3's interruptions by cause, arXiv 2407.21783 Table 5"
#: The coordinator's fault rate relative to a GPU node's. It is one CPU host (no GPU, no EFA), so
#: of Llama 3's categories only the host ones reach it: unplanned host maintenance (32) and the
#: other host parts (SSD, power supply, chassis, IO board, CPU, memory: 14) of the 419
#: interruptions. An assumption: a CPU host fails as often as a GPU node's host parts do.
COORDINATOR_FAULT_SHARE = (32 + 14) / 419
#: Share of faults that take a node with them (the hardware faults above), so that the node's
#: local checkpoint tier is gone and the restore falls back to FSx. Conservative for this
#: project's tier: a lost node's shards survive as replicas on a peer node (a spare restores from
#: them, tests/runs/trainer/test_trainer_spares.py), so only a fault that takes both copies forces FSx;
#: the two-tier planner charges every hardware fault to FSx.
DEFAULT_NODE_LOSS_SHARE = DEFAULT_FAULT_MIX["hardware"]
#: Read bandwidth of one node's instance-store RAID0 when every rank reloads its local shard. An
#: assumption (p5: 8 NVMe drives; not measured here), stated so it can be replaced.
DEFAULT_LOCAL_READ_GBPS_PER_NODE = 10.0


def inprocess_recovery_s(state_bytes: int, fsx_bytes_per_s: float) -> float:
    """In-process restart: the fixed part plus every rank reading its shard of the newest
    checkpoint, all ranks at once, bounded by the file system's throughput. Verification adds no
    reads: an in-process restart trusts the digests of the shards the same process wrote and
    verified at commit (Checkpointer.load_latest), so only the load reads the data. (Re-hashing
    another rank's shard first doubled the reads: ~20 s more for the 8b preset on the p5
    profile's 4.7 GB/s.)"""
    return INPROCESS_FIXED_S + state_bytes / fsx_bytes_per_s


def local_recovery_s(state_bytes: int, nodes: int) -> float:
    """In-process restart from the node-local tier: the fixed part plus each node reading its
    share of the state from its own instance store (DEFAULT_LOCAL_READ_GBPS_PER_NODE)."""
    return INPROCESS_FIXED_S + state_bytes / nodes / (DEFAULT_LOCAL_READ_GBPS_PER_NODE * 1e9)


def young_interval(delta: float, mtbf: float) -> float:
    return math.sqrt(2 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    if delta >= 2 * mtbf:
        return mtbf
    root = math.sqrt(delta / (2 * mtbf))
    return math.sqrt(2 * delta * mtbf) * (1 + root / 3 + delta / (18 * mtbf)) - delta


def expected_goodput(interval: float, delta: float, mtbf: float, recovery: float) -> float:
    """Fraction of wall time spent on productive training, first-order in 1/M."""
    return max(0.0, interval / (interval + delta) * (1 - (recovery + (interval + delta) / 2) / mtbf))


#: The layers that recover a fault, as the plan names them.
INPROCESS_FROM_FSX = "in process, from FSx"
INPROCESS_FROM_LOCAL = "in process, from the local tier"
SPARE_IN_PROCESS = "a spare, in process"
POD_RELAUNCH = "pod relaunch"


@dataclass(frozen=True)
class FaultClass:
    """One fault kind on one class of node, and the layer that recovers it without hot spares and
    with them (and the node-local tier)."""

    kind: str
    node_class: str
    #: How many of the job's nodes are of this class.
    nodes: int
    #: Mean hours between faults of this kind on one node of the class.
    node_mtbf_h: float
    layer: str
    recovery_s: float
    spare_layer: str
    spare_recovery_s: float
    #: The fault takes a GPU node, so a hot spare is used up (a pod relaunch restores them all).
    takes_a_spare: bool

    @property
    def rate_per_s(self) -> float:
        return self.nodes / (self.node_mtbf_h * 3600)


def fault_classes(
    nodes: int,
    node_mtbf_hours: float,
    inprocess_fsx_s: float,
    inprocess_local_s: float,
    mix: dict[str, float] = DEFAULT_FAULT_MIX,
) -> list[FaultClass]:
    """Every fault kind of `mix` on node 0 and on the other nodes, and the coordinator's host faults.
    Node 0 hosts nothing since the job has a coordinator (the rendezvous and in-process restart
    stores), so its rows are the other nodes' rows. Soft and network faults reach every rank as an
    exception: an in-process restart. A hardware fault takes its node: a pod relaunch, or a spare
    in process. The coordinator's loss ends every rank's store: JobSet recreates every pod."""
    rows = []
    for node_class, count in (("node 0", 1), ("other nodes", nodes - 1)):
        for kind, share in mix.items():
            if not count or not share:
                continue
            takes_node = kind == "hardware"
            rows.append(
                FaultClass(
                    kind=kind,
                    node_class=node_class,
                    nodes=count,
                    node_mtbf_h=node_mtbf_hours / share,
                    layer=POD_RELAUNCH if takes_node else INPROCESS_FROM_FSX,
                    recovery_s=POD_RESTART_RECOVERY_S if takes_node else inprocess_fsx_s,
                    spare_layer=SPARE_IN_PROCESS if takes_node else INPROCESS_FROM_LOCAL,
                    # A spare restores the lost node's shards from the replicas its peers hold:
                    # each node reads its share, as for a soft fault.
                    spare_recovery_s=inprocess_local_s,
                    takes_a_spare=takes_node,
                )
            )
    rows.append(
        FaultClass(
            kind="coordinator host",
            node_class="coordinator",
            nodes=1,
            node_mtbf_h=node_mtbf_hours / COORDINATOR_FAULT_SHARE,
            layer=POD_RELAUNCH,
            recovery_s=POD_RESTART_RECOVERY_S,
            spare_layer=POD_RELAUNCH,
            spare_recovery_s=POD_RESTART_RECOVERY_S,
            takes_a_spare=False,
        )
    )
    return rows


def goodput_by_layer(classes: list[FaultClass], stall_s: float, recovery_s: Callable[[FaultClass], float]) -> float:
    """Goodput at the optimal interval when faults of every class arrive at their summed rate and
    each costs `recovery_s(its class)`: the model's R is the rate-weighted mean recovery."""
    rate = sum(c.rate_per_s for c in classes)
    mtbf = 1 / rate
    recovery = sum(c.rate_per_s * recovery_s(c) for c in classes) / rate
    return expected_goodput(daly_interval(stall_s, mtbf), stall_s, mtbf, recovery)


@dataclass(frozen=True)
class Strategy:
    name: str
    stall_s: float
    recovery_s: float


@dataclass(frozen=True)
class StrategyPlan:
    strategy: Strategy
    optimal_interval_s: float
    goodput_at_optimal: float
    configured_interval_s: float
    goodput_at_configured: float


@dataclass(frozen=True)
class Plan:
    nodes: int
    gpus: int
    node_mtbf_h: float
    job_mtbf_s: float
    state_bytes: int
    step_time_s: float
    #: What the job's nodes cost per hour together, at node_price (None: no price known).
    usd_per_hour: float | None
    strategies: list[StrategyPlan]
    #: The MFU the step time assumes (None: the step time was given) and where that figure is from.
    assumed_mfu: float | None = None
    step_time_source: str = "given"
    #: Per-GPU training memory of the job (workloads.memory), when the job is known.
    memory: MemoryEstimate | None = None
    #: The FSx file system's throughput: how fast a checkpoint can be written at best.
    fsx_bytes_per_s: float = 0.0
    #: Each fault kind on each node class (the coordinator's included) and the layer recovering it.
    fault_classes: list[FaultClass] = field(default_factory=list)
    #: Each strategy's goodput at its optimal interval over fault_classes: the sync strategy pays a
    #: pod restart for every fault, the NVRx one recovers each by its layer (no spares).
    goodput_by_layer: dict[str, float] = field(default_factory=dict)
    #: One node's price and its terms: on demand, or a Capacity Block paid up front.
    node_price: NodePrice | None = None

    def lost_cost_per_day(self, plan: StrategyPlan, at_optimal: bool = True) -> float | None:
        if self.usd_per_hour is None:
            return None
        goodput = plan.goodput_at_optimal if at_optimal else plan.goodput_at_configured
        return (1 - goodput) * self.usd_per_hour * 24


def make_plan(
    config: DeploymentConfig,
    *,
    nodes: int | None = None,
    shape: ModelShape = MODEL_PRESETS["8b"],
    tokens_per_step: int,
    interval_steps: int,
    node_mtbf_hours: float = DEFAULT_NODE_MTBF_HOURS,
    sync_stall_s: float | None = None,
    async_stall_s: float | None = None,
    step_time_s: float | None = None,
    memory: MemoryEstimate | None = None,
) -> Plan:
    facts = config.gpu_nodes.facts
    nodes = default_nodes(config) if nodes is None else require_nodes(nodes, "--nodes")
    gpus = nodes * facts.gpus
    params = parameter_count(shape)
    state_bytes = params * CHECKPOINT_BYTES_PER_PARAM
    assumed_mfu = None if step_time_s is not None else ASSUMED_MFU
    if step_time_s is None:
        if facts.peak_bf16_tflops is None:
            raise ConfigError(
                f"{facts.instance_type}: the {facts.gpu_model} has no published dense bf16 peak "
                "(nvrx_eks/facts/instances.py), so no step time can be modelled; give --step-time-s with a "
                "measured one (the step_s of a run's step_end events)"
            )
        # 6 FLOPs per parameter per token (forward + backward), spread over every GPU.
        step_time_s = 6 * params * tokens_per_step / (gpus * ASSUMED_MFU * facts.peak_bf16_tflops * 1e12)
    if sync_stall_s is None:
        # Every rank writes its shard to Lustre and waits: bounded by the file system's throughput.
        sync_stall_s = state_bytes / (config.fsx.throughput_mbps * 1e6)
    if async_stall_s is None:
        # The loop waits only for the copy of this GPU's shard into host memory.
        async_stall_s = state_bytes / gpus / (DEFAULT_D2H_GBPS * 1e9)
    job_mtbf_s = node_mtbf_hours * 3600 / nodes
    configured_s = interval_steps * step_time_s
    sync = Strategy("sync + pod restart", sync_stall_s, POD_RESTART_RECOVERY_S)
    layered = Strategy(
        "NVRx async + in-process", async_stall_s, inprocess_recovery_s(state_bytes, config.fsx.throughput_mbps * 1e6)
    )
    strategies = [sync, layered]
    classes = fault_classes(nodes, node_mtbf_hours, layered.recovery_s, local_recovery_s(state_bytes, nodes))
    plans = []
    for s in strategies:
        tau = daly_interval(s.stall_s, job_mtbf_s)
        plans.append(
            StrategyPlan(
                strategy=s,
                optimal_interval_s=tau,
                goodput_at_optimal=expected_goodput(tau, s.stall_s, job_mtbf_s, s.recovery_s),
                configured_interval_s=configured_s,
                goodput_at_configured=expected_goodput(configured_s, s.stall_s, job_mtbf_s, s.recovery_s),
            )
        )
    price = node_price(facts, config.gpu_nodes.capacity_type)
    return Plan(
        nodes=nodes,
        gpus=gpus,
        node_mtbf_h=node_mtbf_hours,
        job_mtbf_s=job_mtbf_s,
        state_bytes=state_bytes,
        step_time_s=step_time_s,
        usd_per_hour=None if price is None else price.usd_per_hour * nodes,
        strategies=plans,
        assumed_mfu=assumed_mfu,
        step_time_source="given" if assumed_mfu is None else MFU_SOURCE,
        memory=memory,
        fsx_bytes_per_s=config.fsx.throughput_mbps * 1e6,
        fault_classes=classes,
        goodput_by_layer={
            sync.name: goodput_by_layer(classes, sync.stall_s, lambda _: POD_RESTART_RECOVERY_S),
            layered.name: goodput_by_layer(classes, layered.stall_s, lambda c: c.recovery_s),
        },
        node_price=price,
    )


def interval_steps(plan: Plan, strategy: StrategyPlan) -> int:
    """A strategy's optimal checkpoint interval in whole training steps."""
    return max(1, round(strategy.optimal_interval_s / plan.step_time_s))


def plan_for_job(config: DeploymentConfig, train, nodes: int, **assumptions) -> Plan:
    """The plan of a TrainConfig's job on `nodes` of the deployment (assumptions: make_plan's
    measured or assumed figures)."""
    gpus = require_nodes(nodes, "--nodes") * config.gpu_nodes.facts.gpus
    data = train.data
    micro_step = gpus * data.batch_size * data.seq_len
    try:
        tokens_per_step = micro_step * data.accumulation(gpus)
    except ConfigError:
        # A projection past what the job's fixed global batch divides (the scaling table's larger
        # rows): one micro-batch per GPU per step, the least such a job could take.
        tokens_per_step = micro_step
    return make_plan(
        config,
        nodes=nodes,
        shape=train.model.shape,
        tokens_per_step=tokens_per_step,
        interval_steps=train.checkpoint.interval_steps,
        memory=estimate_for(
            train,
            gpus,
            ranks_per_node=config.gpu_nodes.facts.gpus,
            gpu_memory_bytes=config.gpu_nodes.facts.gpu_cuda_memory_bytes,
        ),
        **assumptions,
    )


def optimal_interval_steps(config: DeploymentConfig, train, nodes: int) -> int:
    """checkpoint.interval_steps of a default job: the NVRx strategy's optimum under the default
    assumptions (the number `nvrx-eks plan` prints in its table)."""
    plan = plan_for_job(config, train, nodes)
    return interval_steps(plan, plan.strategies[-1])


def duration_text(seconds: float) -> str:
    """A duration as the plan and the job summary print it: seconds, minutes or hours."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
