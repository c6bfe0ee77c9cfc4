"""Named presets: the model shapes (`model.preset`) and the whole default jobs a deployment
profile names (`default_job`). No torch: the CLI, the planner and the renderer read them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """Dimensions of a decoder-only transformer (Llama-like: RMSNorm, RoPE, SwiGLU, GQA)."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    max_seq_len: int
    rope_theta: float = 10000.0
    dropout: float = 0.0
    norm_eps: float = 1e-5


MODEL_PRESETS: dict[str, ModelShape] = {
    # Tests and laptops: learns the synthetic stream in tens of steps. Dropout is on so that
    # resuming must restore the RNG to reproduce the uninterrupted run.
    "tiny": ModelShape(
        vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=256, dropout=0.1
    ),
    # ~34M parameters: big enough that checkpoint stalls are measurable on a CPU.
    "small": ModelShape(vocab_size=8192, dim=512, n_layers=8, n_heads=8, n_kv_heads=8, ffn_dim=1408, max_seq_len=1024),
    # ~1.1B, TinyLlama-shaped.
    "1b": ModelShape(vocab_size=32000, dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, ffn_dim=5632, max_seq_len=2048),
    # Llama-3-8B-shaped, for p5 nodes.
    "8b": ModelShape(
        vocab_size=128256,
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim=14336,
        max_seq_len=8192,
        rope_theta=500000.0,
    ),
}


@dataclass(frozen=True)
class JobPreset:
    """A whole default job: what `render`/`submit` train without --train-config on a profile that
    names it (DeploymentConfig.default_job). `train` is TrainConfig data; --set overrides apply on
    top. With `global_batch_tokens`, data.grad_accum_steps is derived at render time for the
    job's world size (nvrx_eks/jobs/spec.py), and checkpoint.interval_steps comes from the
    checkpoint-interval plan (nvrx_eks/ops/plan.py), never typed here."""

    description: str
    train: dict[str, Any]
    global_batch_tokens: int | None = None


JOB_PRESETS: dict[str, JobPreset] = {
    # Llama-3-8B shape in bf16 (the trainer computes in bf16 on GPUs), FSDP2 full shard over all
    # ranks, every block recomputed in backward. Per H100 80 GB at 16 GPUs (2 p5 nodes),
    # workloads.memory: sharded fp32 params + grads + AdamW 16 B x 8.03 B / 16 = 7.5 GiB;
    # unsharded largest group (the 525 M-parameter output projection, bf16 x 3 + fp32 grad) =
    # 4.9 GiB; activations 2 x 8192 tokens x (32 blocks x 8 KiB kept inputs + 2 recomputed
    # blocks of 176 KB, + the final norm) = 9.6 GiB; one 2048-token loss chunk = 4.9 GiB; + 5%
    # fragmentation (1.3) and 3 GiB CUDA/NCCL: 31.2 GiB, less at more nodes. Without
    # recomputation: 114.6 GiB, which does not fit. 2 x 8192-token sequences per GPU per
    # micro-batch; 1 Mi tokens per optimizer step (4 micro-batches at 16 GPUs).
    "llama3-8b": JobPreset(
        description="8b preset, seq 8192, micro-batch 2, activation checkpointing, 1 Mi-token global batch",
        train={
            "steps": 5000,
            "model": {"preset": "8b", "activation_checkpointing": True},
            "data": {"seq_len": 8192, "batch_size": 2},
            # Llama 3's peak learning rate for the 8B model; a warm-up of 2% of the steps.
            "optimizer": {"lr": 3e-4, "warmup_steps": 100},
        },
        global_batch_tokens=1 << 20,
    ),
    # The trainer's own defaults (the tiny preset): proves the plumbing on small GPUs.
    "smoke": JobPreset(description="tiny preset, the trainer's defaults", train={}),
}
