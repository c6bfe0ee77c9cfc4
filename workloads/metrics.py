"""Throughput of a training step: tokens/s, model FLOPs and MFU. No torch.

Model FLOPs per token (the convention of the PaLM paper, appendix B, and torchtitan):

    6 N + 12 L a d s

* 6 N: a multiply-add (2 FLOPs) per weight per token in forward, twice that in backward, for
  the N parameters that multiply activations: every block's weights and the output projection.
  The embedding table is a lookup, not a product, and is left out.
* 12 L a d s: attention scores QK^T and their product with V, 2 x 2 a d s FLOPs per token per
  layer in forward (a heads of dimension d, over s = seq_len positions), times 3 with backward.
  Counted over the full s x s square although causal attention needs half of it, as torchtitan
  and the PaLM paper count it; MFU figures stay comparable with theirs.

Recomputation (activation checkpointing) is not model FLOPs: MFU measures useful work, so a run
that recomputes shows a lower MFU than the hardware's real utilisation.

MFU = tokens/s per GPU x FLOPs per token / peak dense bf16 FLOP/s of the GPU. The peak comes from
nvrx_eks/facts/instances.py through the rendered TrainConfig (`peak_tflops_per_gpu`); on CPU, or a
GPU without a published figure, MFU is None (reported as n/a).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from workloads.memory import block_parameters
from workloads.presets import ModelShape


def flops_per_token(shape: ModelShape, seq_len: int) -> float:
    """Model FLOPs (forward + backward) per trained token (module docstring)."""
    dense = shape.n_layers * block_parameters(shape) + shape.vocab_size * shape.dim + shape.dim
    attention = 12 * shape.n_layers * shape.n_heads * (shape.dim // shape.n_heads) * seq_len
    return 6 * dense + attention


@dataclass(frozen=True)
class StepThroughput:
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float | None

    def fields(self) -> dict[str, Any]:
        return {"tokens_per_s": self.tokens_per_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu}


def step_throughput(
    *, tokens: int, world_size: int, step_s: float, flops_token: float, peak_tflops: float | None
) -> StepThroughput:
    per_s = tokens / step_s if step_s > 0 else 0.0
    per_gpu = per_s / world_size
    mfu = per_gpu * flops_token / (peak_tflops * 1e12) if peak_tflops else None
    return StepThroughput(per_s, per_gpu, mfu)


def format_mfu(mfu: float | None) -> str:
    return "n/a" if mfu is None else f"{mfu:.1%}"


def summarize_throughput(step_ends: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the steps that carry throughput fields (the first step, which includes
    warm-up, is left out when there are others): what summary.json and `nvrx-eks report` show."""
    rows = [e for e in step_ends if "tokens_per_s" in e]
    steady = rows[1:] if len(rows) > 1 else rows
    if not steady:
        return {
            "tokens_per_s": None,
            "tokens_per_s_per_gpu": None,
            "step_time_s": None,
            "mfu": None,
            "first_loss": None,
            "last_loss": None,
        }
    mfus = [e["mfu"] for e in steady if e.get("mfu") is not None]
    return {
        "tokens_per_s": statistics.median(e["tokens_per_s"] for e in steady),
        "tokens_per_s_per_gpu": statistics.median(e["tokens_per_s_per_gpu"] for e in steady),
        "step_time_s": statistics.median(e["step_s"] for e in steady),
        "mfu": statistics.median(mfus) if mfus else None,
        "first_loss": rows[0]["loss"],
        "last_loss": rows[-1]["loss"],
    }
