"""The loss (training, and held-out where the run evaluated) and throughput PNG `nvrx-eks report`
writes next to the timeline, each injected fault marked at its step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.events import RunEvents, fault_label
from workloads.metrics import format_mfu

#: The colour of the fault markers: no curve of the chart is red.
FAULT_COLOUR = "#d62728"


def draw_throughput(run: RunEvents, rank: int = 0) -> Any | None:
    """The figure of `plot_throughput`, or None when the run has no throughput fields (older runs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.transforms import blended_transform_factory

    last = {e["step"]: e for e in run.of("step_end", rank=rank) if "tokens_per_s" in e}
    if not last:
        return None
    steps = sorted(last)
    fig, (loss_ax, speed_ax) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    loss_ax.plot(steps, [last[s]["loss"] for s in steps], color="#1f77b4", label="training")
    # The last evaluation of each step, as for the steps: an earlier one was replayed.
    evals = {e["step"]: e["loss"] for e in run.of("eval_end", rank=rank)}
    if evals:
        eval_steps = sorted(evals)
        loss_ax.plot(eval_steps, [evals[s] for s in eval_steps], color="#8c564b", marker="o", label="held-out")
    loss_ax.set_ylabel("loss")
    speed_ax.plot(steps, [last[s]["tokens_per_s"] for s in steps], color="#4c9a2a", label="total")
    speed_ax.plot(steps, [last[s]["tokens_per_s_per_gpu"] for s in steps], color="#ff9f40", label="per rank (GPU)")
    speed_ax.set_ylabel("tokens/s")
    speed_ax.set_xlabel("step")
    # A fault injected on several ranks at once (a node's ranks) is one fault: one line.
    faults = {fault_label(f): f["step"] for f in run.of("fault_injected")}
    for ax in (loss_ax, speed_ax):
        # x in steps, y in the panel's height: the labels sit at its top whatever the curve's scale.
        top = blended_transform_factory(ax.transData, ax.transAxes)
        for i, (label, step) in enumerate(faults.items()):
            key = "fault injected" if i == 0 else None  # one legend entry for all of them
            ax.axvline(step, color=FAULT_COLOUR, linestyle="--", linewidth=1, label=key)
            ax.text(step, 0.97, f" {label}", transform=top, rotation=90, va="top", ha="right", fontsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    mfus = [last[s]["mfu"] for s in steps if last[s].get("mfu") is not None]
    mfu = format_mfu(sorted(mfus)[len(mfus) // 2] if mfus else None)
    fig.suptitle(f"loss and throughput (rank {rank}), median MFU {mfu}")
    fig.tight_layout()
    return fig


def plot_throughput(run: RunEvents, path: Path, rank: int = 0) -> bool:
    """Loss and tokens/s per step (the last execution of each step: replayed ones are lost work),
    each injected fault a dashed line at its step, MFU in the title, saved to `path`. False, and
    no file, when the run has no throughput fields (older runs)."""
    import matplotlib.pyplot as plt

    fig = draw_throughput(run, rank)
    if fig is None:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
