"""`nvrx-eks report RUN_DIR`: where the wall time of a run went, and a timeline of it.

Reads the trainer's JSONL events (a local run directory, or the events copied from FSx) through
`workloads.events`, splits the wall time into productive steps, checkpoint stalls (the first
save of each process, its warm-up, apart from the steady ones), evaluations on the held-out
split, replayed (lost) steps, recovery from each fault and the rest (start-up, launcher
restarts), prints that breakdown with one line per injected fault and the layer that recovered
it, and draws a timeline PNG with steps, evaluations, checkpoints (stall, first save and
background write), faults and restarts per rank, and the throughput (tokens/s, step time, MFU)
with a loss (training and held-out)/throughput PNG, faults marked, next to the timeline.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.local.throughput_chart import plot_throughput
from workloads.events import (
    LAYER_NAMES,
    RunEvents,
    RunReport,
    events_dir,
    fault_label,
    load_run,
    split_first_saves,
    summarize,
)
from workloads.metrics import format_mfu, summarize_throughput


def format_restarts(restarts: dict[str, int]) -> str:
    """`in-process 2 / launcher 0`, plus JobSet restarts where a run had any."""
    parts = [f"in-process {restarts['inprocess']}", f"launcher {restarts['launcher']}"]
    if restarts.get("kubernetes"):
        parts.append(f"JobSet {restarts['kubernetes']}")
    return " / ".join(parts)


@dataclass(frozen=True)
class FaultRecovery:
    label: str  # KIND@STEP:RANK
    t: float  # seconds since the run started
    layer: str | None  # "inprocess" | "launcher" | "kubernetes" | None (not interrupting, or not recovered)
    detect_and_restart_s: float | None  # fault -> training process ready again
    first_step_after_s: float | None  # fault -> first completed step after it
    resumed_from_step: int | None
    lost_steps: int


@dataclass(frozen=True)
class Breakdown:
    """The run as `report` shows it: its goodput split as the rank saw it (the one split the
    trainer's summary.json and `nvrx-eks bench` read too), and what the report adds to it."""

    split: RunReport
    #: Of split.checkpoint_stall_s, the first save of each process (warm-up: workloads.events.split_first_saves)
    #: and how many such saves; the median of the other (steady) saves, None without one.
    first_save_stall_s: float
    first_saves: int
    steady_median_stall_s: float | None
    #: Each fault once (one injected on several ranks is one), with its recovery, oldest first.
    faults: list[FaultRecovery]
    #: workloads.metrics.summarize_throughput of the rank's steps (None fields on older runs).
    throughput: dict[str, Any]
    #: The last evaluation on the held-out split: (step, loss), None without one.
    last_eval: tuple[int, float] | None = None


def analyze(run: RunEvents, rank: int = 0) -> Breakdown:
    """The breakdown as seen by `rank` (rank 0 by default; every rank steps in lockstep): the
    wall-time split of `workloads.events.summarize`, and when each fault's first step came."""
    if not run.events:
        raise ConfigError("the run directory has no events (expected events/rank*.jsonl); is it a trainer run dir?")
    summary = summarize(run, rank)
    start = run.events[0]["t"]
    step_ends = run.of("step_end", rank=rank)
    evals = run.of("eval_end", rank=rank)
    faults = []
    for outcome in summary.fault_outcomes():
        recovered_s = outcome.get("recovered_s")
        first_step_after = None
        if recovered_s is not None:
            after = [e for e in step_ends if e["t"] > outcome["t"] + recovered_s]
            first_step_after = after[0]["t"] - outcome["t"] if after else None
        faults.append(
            FaultRecovery(
                label=outcome["fault"],
                t=outcome["t"] - start,
                layer=outcome.get("layer"),
                detect_and_restart_s=recovered_s,
                first_step_after_s=first_step_after,
                resumed_from_step=outcome.get("resumed_from_step"),
                lost_steps=outcome.get("lost_steps", 0),
            )
        )
    # Identical faults injected on several ranks are one event for the run (as in the split).
    unique = {f.label: f for f in faults}.values()
    first_saves, steady_saves = split_first_saves(run.of("checkpoint_stall", rank=rank))
    steady_stalls_s = [e["stall_s"] for e in steady_saves]
    return Breakdown(
        split=summary,
        first_save_stall_s=sum(e["stall_s"] for e in first_saves),
        first_saves=len(first_saves),
        steady_median_stall_s=statistics.median(steady_stalls_s) if steady_stalls_s else None,
        faults=sorted(unique, key=lambda f: f.t),
        throughput=summarize_throughput(step_ends),
        last_eval=(evals[-1]["step"], evals[-1]["loss"]) if evals else None,
    )


def print_breakdown(breakdown: Breakdown, run_dir: Path, console: Console) -> None:
    b, split = breakdown, breakdown.split
    table = Table(title=f"Where the time went: {escape(str(run_dir))}")
    table.add_column("")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for name, seconds in (
        ("productive steps", split.productive_s),
        # Apart, so that the warm-up's seconds are not read as what every save costs.
        ("checkpoint stalls: steady", split.checkpoint_stall_s - b.first_save_stall_s),
        ("checkpoint stalls: first saves (warm-up)", b.first_save_stall_s),
        ("evaluation (held-out split)", split.eval_s),
        ("replayed (lost) steps", split.replayed_s),
        ("fault detection + restart", split.recovery_s),
        ("start-up, launcher restarts, other", split.other_s),
    ):
        table.add_row(name, f"{seconds:.1f}", f"{seconds / split.wall_s:.1%}" if split.wall_s else "-")
    table.add_row("[bold]wall time[/]", f"[bold]{split.wall_s:.1f}[/]", "")
    console.print(table)
    console.print(
        f"final step {split.final_step}, goodput {split.goodput:.1%}, checkpoint stall {format_stalls(b)}, "
        f"restarts {format_restarts(split.restarts_by_layer())}"
    )
    print_throughput(b.throughput, console)
    if b.last_eval is not None:
        console.print(f"held-out loss {b.last_eval[1]:.4f} at step {b.last_eval[0]}")
    if b.faults:
        faults = Table(
            title="Faults and their recovery (restart: fault to training ready; 1st step: to the next completed step; "
            "resumed: checkpoint step loaded; lost: steps redone)"
        )
        for column in ("fault", "at", "recovered by", "restart", "1st step", "resumed", "lost"):
            left = column in ("fault", "recovered by")
            faults.add_column(column, justify="left" if left else "right", no_wrap=left)
        for f in b.faults:
            faults.add_row(
                f.label,
                f"{f.t:.1f} s",
                LAYER_NAMES.get(f.layer or "", "-"),
                f"{f.detect_and_restart_s:.1f} s" if f.detect_and_restart_s is not None else "-",
                f"{f.first_step_after_s:.1f} s" if f.first_step_after_s is not None else "-",
                str(f.resumed_from_step) if f.resumed_from_step is not None else "-",
                str(f.lost_steps),
            )
        console.print(faults)


def format_stalls(b: Breakdown) -> str:
    """`median 36 ms over 9 steady saves (first saves of 2 processes: 13.9 s of warm-up)`."""
    if not b.split.saves:
        return "none"
    steady_saves = b.split.saves - b.first_saves
    plural = "" if steady_saves == 1 else "s"
    steady = (
        f"median {b.steady_median_stall_s * 1000:.0f} ms over {steady_saves} steady save{plural}"
        if b.steady_median_stall_s is not None
        else "no steady save"
    )
    first = "first save of 1 process" if b.first_saves == 1 else f"first saves of {b.first_saves} processes"
    return f"{steady} ({first}: {b.first_save_stall_s:.1f} s of warm-up)"


def print_throughput(t: dict[str, Any], console: Console) -> None:
    if t["tokens_per_s"] is None:
        console.print("throughput: none recorded (the run's step events carry no throughput fields)")
        return
    table = Table(title="Throughput (median over steps after the first)")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_row("tokens/s (all ranks)", f"{t['tokens_per_s']:,.0f}")
    table.add_row("tokens/s per rank (GPU)", f"{t['tokens_per_s_per_gpu']:,.0f}")
    table.add_row("step time", f"{t['step_time_s']:.3f} s")
    table.add_row("MFU", format_mfu(t["mfu"]))
    table.add_row("loss first -> last", f"{t['first_loss']:.4f} -> {t['last_loss']:.4f}")
    console.print(table)


#: The most bars one colour of one lane is drawn with. A long run has 10^4-10^5 steps per rank,
#: far more than the image has pixels across (13 in x 120 dpi): neighbouring bars closer than
#: the lane's span / this many are drawn as one, so drawing stays linear in steps and the image
#: the same to the eye.
MAX_BARS_PER_LANE_COLOUR = 3000


def merged_bars(bars: list[tuple[float, float]], limit: int = MAX_BARS_PER_LANE_COLOUR) -> list[tuple[float, float]]:
    """(start, width) bars, those closer than span / limit to the previous one merged into it.
    At most 2 x limit + 1 bars remain: every gap left open is wider than span / limit, so there
    are fewer than `limit` of them."""
    if len(bars) <= limit:
        return bars
    ordered = sorted(bars)
    span = max(b + w for b, w in ordered) - ordered[0][0]
    join_below = span / limit
    out = [ordered[0]]
    for begin, width in ordered[1:]:
        last_begin, last_width = out[-1]
        if begin - (last_begin + last_width) <= join_below:
            out[-1] = (last_begin, max(last_begin + last_width, begin + width) - last_begin)
        else:
            out.append((begin, width))
    return out


#: Each part of the timeline's colour; the legend names them.
TIMELINE_COLOURS = {
    "kept": "#4c9a2a",
    "replayed": "#b0b0b0",
    "stall": "#d62728",
    # A lighter red: still a stall, but the warm-up of a new process, not what a save costs.
    "first_save": "#f5a3a3",
    "write": "#ff9f40",
    "inprocess": "#9467bd",
    "launcher": "#1f77b4",
    "kubernetes": "#17becf",
    "setup": "#c6dbef",
    "eval": "#8c564b",
}


def draw_timeline(run: RunEvents, breakdown: Breakdown) -> tuple[Any, list[str]]:
    """The timeline figure and the labels of the faults marked on it (plot_timeline saves it).
    Each lane draws one bar collection per colour, with every segment of that colour in it, so
    the number of artists does not grow with the steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = run.events[0]["t"]
    ranks = run.ranks
    by_rank: dict[int, list[dict[str, Any]]] = {rank: [] for rank in ranks}
    for e in run.events:
        by_rank[e["rank"]].append(e)
    fig, ax = plt.subplots(figsize=(13, 2.2 + 0.8 * len(ranks)))
    for y, rank in enumerate(ranks):
        _draw_lane(ax, y, by_rank[rank], start)
    _shade_restarts(ax, run, start)
    marked = _mark_faults(ax, run, start)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set_ylim(-0.7, len(ranks) - 0.2 + 0.5)
    ax.set_xlabel("seconds since start")
    ax.set_title(
        f"goodput {breakdown.split.goodput:.1%} - steps, checkpoints, faults and restarts "
        f"({format_restarts(breakdown.split.restarts_by_layer())})"
    )
    _legend(fig)
    fig.tight_layout(rect=(0, 0.17, 1, 1))
    return fig, marked


def _bars(ax: Any, segments: list[tuple[float, float]], lane: tuple[float, float], part: str, **kwargs: Any) -> None:
    """One bar collection of `part`'s colour holding every (start, width) segment, merged."""
    if segments:
        ax.broken_barh(merged_bars(segments), lane, facecolors=TIMELINE_COLOURS[part], **kwargs)


def _draw_lane(ax: Any, y: int, events: list[dict[str, Any]], start: float) -> None:
    """One rank's lane at height `y`: its steps (kept / replayed), setups, evaluations,
    checkpoint stalls (first saves apart) and, above them, the background writes."""
    ends = [e for e in events if e["event"] == "step_end"]
    last_index = {e["step"]: i for i, e in enumerate(ends)}
    kept: list[tuple[float, float]] = []
    replayed: list[tuple[float, float]] = []
    for i, e in enumerate(ends):
        (kept if last_index[e["step"]] == i else replayed).append((e["t"] - e["step_s"] - start, e["step_s"]))
    lane = (y - 0.3, 0.6)
    _bars(ax, kept, lane, "kept", linewidth=0)
    _bars(ax, replayed, lane, "replayed", linewidth=0)
    setups = [(e["t"] - e["setup_s"] - start, e["setup_s"]) for e in events if e["event"] == "setup_end"]
    _bars(ax, setups, lane, "setup")
    evals = [(e["t"] - e["eval_s"] - start, e["eval_s"]) for e in events if e["event"] == "eval_end"]
    _bars(ax, evals, lane, "eval", linewidth=0)
    # An in-process restart can save the same step again in the same process: key by iteration too.
    stalls = {(e["pid"], e["iteration"], e["step"]): e for e in events if e["event"] == "checkpoint_stall"}
    first_saves, steady_saves = split_first_saves(list(stalls.values()))
    _bars(ax, [(e["t"] - e["stall_s"] - start, e["stall_s"]) for e in first_saves], lane, "first_save")
    _bars(ax, [(e["t"] - e["stall_s"] - start, e["stall_s"]) for e in steady_saves], lane, "stall")
    writes = []
    for e in events:
        if e["event"] == "checkpoint_write_end":
            stall = stalls.get((e["pid"], e["iteration"], e["step"]))
            begin = stall["t"] if stall else e["t"] - e["write_s"]
            writes.append((begin - start, e["t"] - begin))
    _bars(ax, writes, (y + 0.32, 0.12), "write")


def _shade_restarts(ax: Any, run: RunEvents, start: float) -> None:
    """Each restart window across every lane, in the colour of the layer that recovered it."""
    # Every rank sees the same restart: shade each window once.
    windows = {(r.layer, r.begin_t, r.end_t) for rank in run.ranks for r in run.restarts(rank)}
    for layer, begin_t, end_t in sorted(windows):
        ax.axvspan(begin_t - start, end_t - start, ymin=0, ymax=1, color=TIMELINE_COLOURS[layer], alpha=0.12)


def _mark_faults(ax: Any, run: RunEvents, start: float) -> list[str]:
    """A cross on the lane of each injected fault's rank, labelled KIND@STEP; returns the labels."""
    ranks = run.ranks
    marked = []
    for f in run.of("fault_injected"):
        marked.append(fault_label(f))
        lane_of_fault = ranks.index(f["target_rank"]) if f["target_rank"] in ranks else 0
        ax.plot(f["t"] - start, lane_of_fault, marker="X", markersize=13, color="black", zorder=5)
        ax.annotate(
            f"{f['kind']}@{f['step']}",
            (f["t"] - start, lane_of_fault + 0.45),
            ha="center",
            fontsize=8,
            fontweight="bold",
        )
    return marked


def _legend(fig: Any) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    colours = TIMELINE_COLOURS
    fig.legend(
        handles=[
            Patch(color=colours["setup"], label="start-up / checkpoint load"),
            Patch(color=colours["kept"], label="step (kept)"),
            Patch(color=colours["replayed"], label="step (replayed after a fault)"),
            Patch(color=colours["eval"], label="evaluation (held-out split)"),
            Patch(color=colours["first_save"], label="first save of a process (warm-up)"),
            Patch(color=colours["stall"], label="checkpoint stall"),
            Patch(color=colours["write"], label="checkpoint background write"),
            Patch(color=colours["inprocess"], alpha=0.3, label="in-process restart"),
            Patch(color=colours["launcher"], alpha=0.3, label="ft_launcher restart"),
            Patch(color=colours["kubernetes"], alpha=0.3, label="JobSet restart (new pods)"),
            plt.Line2D([], [], marker="X", color="black", linestyle="", label="fault injected"),
        ],
        loc="lower center",
        ncol=4,
        fontsize=8,
        frameon=False,
    )


def plot_timeline(run: RunEvents, breakdown: Breakdown, path: Path) -> list[str]:
    """One lane per rank: steps (kept / replayed), checkpoint stalls (each process's first save,
    its warm-up, in a colour of its own) and background writes, faults, and restart windows
    shaded by the layer that recovered them, saved to `path`.
    Returns the labels of the faults marked on the plot."""
    import matplotlib.pyplot as plt

    fig, marked = draw_timeline(run, breakdown)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return marked


def run(run_dir: Path, png: Path | None, json_path: Path | None, console: Console) -> Breakdown:
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is a file; give a trainer run directory (the one holding events/rank*.jsonl)")
    if not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir} does not exist; give the --run-dir of a trainer run")
    events = load_run(run_dir)
    if not events.events and events.unreadable_lines:
        raise ConfigError(
            f"{events_dir(run_dir)} holds {events.unreadable_lines} line(s) but none is a readable event; "
            "the event files are damaged (a run writes one JSON object per line)"
        )
    breakdown = analyze(events)
    print_breakdown(breakdown, run_dir, console)
    if events.unreadable_lines:
        console.print(
            f"skipped {events.unreadable_lines} line(s) of {escape(str(events_dir(run_dir)))} that hold no usable "
            "event (cut short, damaged, or a field missing or of the wrong type)",
            soft_wrap=True,
        )
    png = png or run_dir / "timeline.png"
    plot_timeline(events, breakdown, png)
    console.print(f"timeline: {escape(str(png))}")
    throughput_png = png.with_name("throughput.png")
    if plot_throughput(events, throughput_png):
        console.print(f"loss and throughput: {escape(str(throughput_png))}")
    if json_path is not None:
        json_path.write_text(json.dumps(_jsonable(breakdown), indent=1))
    return breakdown


#: The split's parts `report --json` writes first, in this order.
_JSON_SPLIT_PARTS = (
    "wall_s",
    "productive_s",
    "checkpoint_stall_s",
    "eval_s",
    "replayed_s",
    "recovery_s",
    "other_s",
    "goodput",
    "final_step",
    "saves",
    "median_stall_s",
)


def _jsonable(breakdown: Breakdown) -> dict[str, Any]:
    b = breakdown
    return {
        **{part: getattr(b.split, part) for part in _JSON_SPLIT_PARTS},
        "first_save_stall_s": b.first_save_stall_s,
        "first_saves": b.first_saves,
        "steady_median_stall_s": b.steady_median_stall_s,
        "restarts": b.split.restarts_by_layer(),
        "faults": [asdict(f) for f in b.faults],
        "throughput": b.throughput,
        "last_eval": b.last_eval,
    }
