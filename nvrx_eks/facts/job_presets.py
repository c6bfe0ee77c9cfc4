"""The default jobs a profile can name (DeploymentConfig.default_job), by name.

Read by the deployment config's validation, the job renderer and the checkpoint-interval
planner; plain TrainConfig data, so the CDK app can check a profile's default job without
importing the trainer package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JobPreset:
    """A whole default job: what `render`/`submit` train without --train-config on a profile that
    names it (DeploymentConfig.default_job). `train` is TrainConfig data; --set overrides apply on
    top. A preset sized for the cluster fixes data.global_batch_tokens (the trainer derives its
    accumulation for the world size) and, with `plan_interval`, takes checkpoint.interval_steps
    from the checkpoint-interval plan (nvrx_eks/planning/model.py), never typed here."""

    description: str
    train: dict[str, Any]
    plan_interval: bool = False
    #: The GPUs (InstanceFacts.gpu_model) the job is sized for. A config on one of them that names
    #: no default_job is refused rather than given the smoke job (nvrx_eks.jobs.spec.default_job_name).
    gpu_models: frozenset[str] = frozenset()


JOB_PRESETS: dict[str, JobPreset] = {
    # Llama-3-8B shape in bf16 (the trainer computes in bf16 on GPUs), FSDP2 full shard over all
    # ranks, as few blocks recomputed in backward as the GPU's memory allows ("auto"). Per H100
    # 80 GB at 16 GPUs (2 p5 nodes), workloads.memory: sharded fp32 params + grads + AdamW 16 B x
    # 8.03 B / 16 = 7.5 GiB; unsharded largest group (the 525 M-parameter output projection,
    # bf16 x 3 + fp32 grad) = 4.9 GiB; one 2048-token loss chunk = 4.9 GiB; + 5% fragmentation
    # and 3 GiB CUDA/NCCL. Activations, 2 x 8192 tokens: every block recomputed (8 KiB kept
    # inputs each + 2 blocks of 176 KB in backward) 9.6 GiB, 31.2 GiB in all; none recomputed
    # 114.6 GiB in all, which does not fit; auto recomputes 17 of the 32 blocks: 71.6 GiB (it plans
    # to fill 90% of the GPU, workloads.memory.AUTO_FILL_SHARE). 2 x
    # 8192-token sequences per GPU per micro-batch; 2 Mi tokens per optimizer step whatever the
    # node count: 8 micro-batches at 16 GPUs (2 nodes), 1 at 128 (16 nodes); every power-of-two
    # node count from 1 to 16 divides it.
    "llama3-8b": JobPreset(
        description="8b preset, seq 8192, micro-batch 2, activation checkpointing where memory requires it, "
        "2 Mi-token global batch",
        train={
            "steps": 5000,
            "model": {"preset": "8b", "activation_checkpointing": "auto"},
            "data": {"seq_len": 8192, "batch_size": 2, "global_batch_tokens": 1 << 21},
            # Llama 3's peak learning rate for the 8B model; a warm-up of 2% of the steps.
            "optimizer": {"lr": 3e-4, "warmup_steps": 100},
        },
        plan_interval=True,
        # Sized for an 80 GB H100 (above); the 141 GB H200 holds it with room to spare.
        gpu_models=frozenset({"H100", "H200"}),
    ),
    # The trainer's own defaults (the tiny preset): proves the plumbing on small GPUs.
    "smoke": JobPreset(description="tiny preset, the trainer's defaults", train={}),
}
#: The default job of a config that names none, on GPUs no job preset is sized for.
FALLBACK_JOB = "smoke"
