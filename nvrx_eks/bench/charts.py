"""PNG charts of `nvrx-eks bench` results, one per scenario, drawn from the result dict alone
(so the same charts can be redrawn from a saved bench.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {
    "productive": "#4c9a2a",
    "stall": "#d62728",
    "replayed": "#b0b0b0",
    "other": "#9ecae1",
    "detect": "#ff9f40",
    "restart": "#9467bd",
    "first_step": "#4c9a2a",
    "respawn": "#1f77b4",
    "blocked": "#f4a6a6",
    "floor": "#333333",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _subtitle(result: dict[str, Any]) -> str:
    machine = result["machine"]
    return f"{machine['summary']} - {result['command']}"


def plot_p1(result: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    p1 = result["p1"]
    rows = p1["backends"]
    names = [r["backend"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    efficiency = [r["efficiency"] * 100 for r in rows]
    bars = left.bar(names, efficiency, color=["#888888", "#d62728", "#ff9f40", "#4c9a2a"][: len(names)])
    for bar, value in zip(bars, efficiency, strict=True):
        left.annotate(f"{value:.0f}%", (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom", fontsize=9)
    left.set_ylabel("throughput relative to no checkpoints (%)")
    left.set_ylim(0, max(110, max(efficiency) + 10))
    left.set_title(f"Training efficiency, checkpoint every {p1['interval']} steps")

    with_saves = [r for r in rows if r["backend"] != "none"]
    x = range(len(with_saves))
    width = 0.38
    stall = [r["handoff_s"] * 1000 for r in with_saves]
    blocked = [r["blocked_s"] * 1000 for r in with_saves]
    right.bar([i - width / 2 for i in x], stall, width, color=COLORS["stall"], label="stall (the save call)")
    right.bar(
        [i + width / 2 for i in x],
        blocked,
        width,
        color=COLORS["blocked"],
        label="loop blocked per save (+ wait, commit)",
    )
    floor_ms = p1["floor"]["copy_s"] * 1000
    right.axhline(floor_ms, color=COLORS["floor"], linestyle="--", linewidth=1)
    right.annotate(
        f"floor: one copy of the rank's shard {floor_ms:.0f} ms",
        (len(with_saves) - 0.5, floor_ms),
        ha="right",
        va="bottom",
        fontsize=8,
    )
    for i, r in enumerate(with_saves):
        right.annotate(
            f"{r['handoff_s'] / p1['floor']['copy_s']:.1f}x",
            (i - width / 2, stall[i]),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    right.set_xticks(list(x), [r["backend"] for r in with_saves])
    right.set_yscale("log")
    right.set_ylabel("ms per save (median, after the first save)")
    right.set_title("Stall per save and the in-memory copy floor")
    right.legend(fontsize=8, loc="upper right")
    fig.suptitle(
        f"P1 checkpoint efficiency - {p1['preset']} preset, "
        f"{p1['floor']['bytes_per_rank'] / 2**20:.0f} MiB per rank\n{_subtitle(result)}",
        fontsize=9,
    )
    return _save(fig, path)


def _stacked(ax, labels: list[str], parts: list[list[tuple[str, float, str]]]) -> None:
    """Horizontal stacked bars with the total after each, legend under the axes."""
    longest = max(sum(seconds for _, seconds, _ in segments) for segments in parts)
    ax.set_xlim(0, longest * 1.12)
    for row, segments in enumerate(parts):
        left = 0.0
        for name, seconds, color in segments:
            ax.barh(row, seconds, left=left, color=color, label=name if row == 0 else None)
            if seconds > 0.4:
                ax.annotate(
                    f"{seconds:.1f}", (left + seconds / 2, row), ha="center", va="center", fontsize=8, color="white"
                )
            left += seconds
        ax.annotate(f" {left:.1f} s", (left, row), va="center", fontsize=9)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds after the fault (median)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=4, frameon=False)


#: The color of a recovery's first phase, by the medians key that times it.
_FIRST_PHASE_COLOR = {"detect_s": COLORS["detect"], "respawn_s": COLORS["respawn"]}


def _recovery_segments(m: dict[str, Any], first: str, first_label: str, restart_label: str) -> list:
    """A recovery's medians (analysis.recovery_medians) as three segments from the fault: its
    first phase (`first`: detect_s in process, respawn_s for new processes), the rest of the
    restart, and the first step."""
    head = m[first] or 0.0
    return [
        (first_label, head, _FIRST_PHASE_COLOR[first]),
        (restart_label, m["restart_s"] - head, COLORS["restart"]),
        ("first step", m["first_step_s"] - m["restart_s"], COLORS["first_step"]),
    ]


def plot_p2(result: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    p2 = result["p2"]
    labels, parts = [], []
    for kind, m in p2["by_kind"].items():
        if not m["n"]:
            continue
        labels.append(f"{kind} (n={m['n']})")
        parts.append(_recovery_segments(m, "detect_s", "noticed by the first rank", "all ranks abort, rebuild, reload"))
    fig, ax = plt.subplots(figsize=(10, 3.2 + 0.4 * len(labels)))
    _stacked(ax, labels, parts)
    ax.set_title(f"P2 soft-fault recovery, in-process restart - {p2['preset']} preset\n{_subtitle(result)}", fontsize=9)
    return _save(fig, path)


def plot_p3(result: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    p3 = result["p3"]
    labels, parts = [], []
    for name, title in (("ft_launcher", "ft_launcher restart"), ("full_relaunch", "full relaunch")):
        m = p3[name]["medians"]
        labels.append(f"{title} (n={m['n']})")
        parts.append(
            _recovery_segments(
                m, "respawn_s", "detect, stop, start processes, import", "process group, model, checkpoint load"
            )
        )
    fig, ax = plt.subplots(figsize=(10, 3.6))
    _stacked(ax, labels, parts)
    ratio = f"{p3['ratio']:.2f}x" if p3["ratio"] else "n/a"
    ax.set_title(
        f"P3 hard-fault (sigkill) recovery: full relaunch / ft_launcher = {ratio} - "
        f"{p3['preset']} preset\n{_subtitle(result)}",
        fontsize=9,
    )
    return _save(fig, path)


def plot_p4(result: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    p4 = result["p4"]
    labels, parts = [], []
    for name, title in (
        ("layered", "layered: nvrx + in-process + ft_launcher"),
        ("baseline", "baseline: sync + full relaunch"),
    ):
        g = p4[name]
        labels.append(f"{title}\ngoodput {g['goodput']:.0%}, {g['lost_steps']} steps replayed")
        parts.append(
            [
                ("productive steps", g["productive_s"], COLORS["productive"]),
                ("checkpoint stalls", g["checkpoint_stall_s"], COLORS["stall"]),
                ("replayed steps", g["replayed_s"], COLORS["replayed"]),
                ("detection, restarts, start-up, commits", g["other_s"], COLORS["other"]),
            ]
        )
    fig, ax = plt.subplots(figsize=(11, 3.8))
    _stacked(ax, labels, parts)
    ax.set_xlabel("wall seconds")
    ax.set_title(
        f"P4 goodput under faults {p4['schedule']} (seed {p4['seed']}) - {p4['preset']} preset\n{_subtitle(result)}",
        fontsize=9,
    )
    return _save(fig, path)


PLOTS = {"p1": plot_p1, "p2": plot_p2, "p3": plot_p3, "p4": plot_p4}


def plot_all(result: dict[str, Any], out: Path) -> list[Path]:
    return [PLOTS[name](result, out / f"{name}.png") for name in PLOTS if name in result]
