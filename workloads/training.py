"""build_training(cfg): the model, optimizer, learning-rate schedule, data and training progress
of one run, built the same way for the trainer and the benchmarks (nvrx_eks.bench.stall/floor)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from workloads.checkpoint.train_state import (
    ModelState,
    OptimizerState,
    RngState,
    Stateful,
    TrainState,
    rng_key,
    seed_everything,
)
from workloads.config import TrainConfig
from workloads.data import TokenBatches, build_batches
from workloads.device import Runtime
from workloads.memory import estimate_for
from workloads.model import Transformer, build_model


@dataclass
class Training:
    """What one rank trains with; `states` is what a checkpoint holds of it."""

    model: Transformer
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    batches: TokenBatches
    progress: TrainState
    states: dict[str, Stateful]
    #: Blocks recomputed in backward: model.activation_checkpointing, "auto" resolved for this GPU.
    checkpointed_blocks: int


def lr_lambda(cfg: TrainConfig) -> Callable[[int], float]:
    """The learning-rate factor per step: linear warm-up, then constant or cosine to min_lr_ratio."""
    opt = cfg.optimizer

    def factor(step: int) -> float:
        if step < opt.warmup_steps:
            return (step + 1) / opt.warmup_steps
        if opt.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - opt.warmup_steps) / max(1, cfg.steps - opt.warmup_steps))
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return opt.min_lr_ratio + (1 - opt.min_lr_ratio) * cosine

    return factor


def device_mesh(cfg: TrainConfig, runtime: Runtime, world: int) -> DeviceMesh:
    """The FSDP2 mesh: 1-D over every rank, or with distributed.shard=hybrid (HSDP) sharded along
    "shard" (the ranks of one node) and replicated along "replicate"; fully_shard takes the 2-D
    mesh as is (workloads.model)."""
    if cfg.distributed.shard == "hybrid":
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        return init_device_mesh(runtime.device.type, (world // local, local), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(runtime.device.type, (world,))


def resolve_checkpointed_blocks(cfg: TrainConfig, runtime: Runtime, world: int) -> int:
    """The blocks this run recomputes in backward. "auto" asks the memory model for the fewest
    that fit this GPU at this world size; every rank computes the same count from the same
    inputs (the ranks of a job run on one GPU type), so no collective is needed."""
    gpu_memory = torch.cuda.get_device_properties(runtime.device).total_memory if runtime.is_cuda else None
    ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return estimate_for(
        cfg, world, bf16=runtime.bf16, ranks_per_node=ranks_per_node, gpu_memory_bytes=gpu_memory
    ).checkpointed_blocks


def build_training(cfg: TrainConfig, runtime: Runtime, rank: int, world: int) -> Training:
    """Everything a rank trains with, freshly initialized: a restore then loads into it, or, when
    there is nothing to restore, load_initial_weights. Collective: the process group must be up
    (FSDP2 shards over it)."""
    seed_everything(cfg.seed + rank)
    checkpointed_blocks = resolve_checkpointed_blocks(cfg, runtime, world)
    model = build_model(
        cfg.model.shape,
        runtime,
        device_mesh(cfg, runtime, world),
        cfg.seed,
        checkpointed_blocks=checkpointed_blocks,
        loss_chunk_tokens=cfg.model.loss_chunk_tokens,
        rope_scaling=cfg.model.rope_scaling_settings,
    )
    opt = cfg.optimizer
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps, weight_decay=opt.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    batches = build_batches(cfg.data, rank, world, cfg.model.shape.vocab_size, cfg.seed)
    progress = TrainState(scheduler)
    # The keys are the checkpoint format: renaming one makes every older checkpoint unloadable.
    states: dict[str, Stateful] = {
        "model": ModelState(model),
        "optim": OptimizerState(model, optimizer),
        "train": progress,
        "data": batches,
        rng_key(rank): RngState(runtime.is_cuda),
    }
    return Training(model, optimizer, scheduler, batches, progress, states, checkpointed_blocks)


def load_initial_weights(cfg: TrainConfig, model: Transformer) -> None:
    """model.init_from's weights into `model`, each rank reading only its shards' rows: the
    initial state of a run that restored no checkpoint, never a random initialization. Nothing
    when model.init_from is unset."""
    if cfg.model.init_from is None:
        return
    from workloads.hf_import import load_hf_weights

    load_hf_weights(model, cfg.model.init_from, cfg.model.noun, cfg.model.rope_scaling_settings)
