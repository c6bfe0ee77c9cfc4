"""The loss (training, and held-out where the run evaluated) and throughput PNG `nvrx-eks report`
writes next to the timeline."""

from __future__ import annotations

from pathlib import Path

from workloads.events import RunEvents
from workloads.metrics import format_mfu


def plot_throughput(run: RunEvents, path: Path, rank: int = 0) -> bool:
    """Loss and tokens/s per step (the last execution of each step: replayed ones are lost work),
    MFU in the title. False, and no file, when the run has no throughput fields (older runs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = {e["step"]: e for e in run.of("step_end", rank=rank) if "tokens_per_s" in e}
    if not last:
        return False
    steps = sorted(last)
    fig, (loss_ax, speed_ax) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    loss_ax.plot(steps, [last[s]["loss"] for s in steps], color="#1f77b4", label="training")
    # The last evaluation of each step, as for the steps: an earlier one was replayed.
    evals = {e["step"]: e["loss"] for e in run.of("eval_end", rank=rank)}
    if evals:
        eval_steps = sorted(evals)
        loss_ax.plot(eval_steps, [evals[s] for s in eval_steps], color="#8c564b", marker="o", label="held-out")
        loss_ax.legend(fontsize=8)
    loss_ax.set_ylabel("loss")
    loss_ax.grid(alpha=0.3)
    speed_ax.plot(steps, [last[s]["tokens_per_s"] for s in steps], color="#4c9a2a", label="total")
    speed_ax.plot(steps, [last[s]["tokens_per_s_per_gpu"] for s in steps], color="#ff9f40", label="per rank (GPU)")
    speed_ax.set_ylabel("tokens/s")
    speed_ax.set_xlabel("step")
    speed_ax.grid(alpha=0.3)
    speed_ax.legend(fontsize=8)
    mfus = [last[s]["mfu"] for s in steps if last[s].get("mfu") is not None]
    mfu = format_mfu(sorted(mfus)[len(mfus) // 2] if mfus else None)
    fig.suptitle(f"loss and throughput (rank {rank}), median MFU {mfu}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
