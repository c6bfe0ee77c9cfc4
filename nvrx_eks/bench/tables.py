"""The terminal tables `nvrx-eks bench` prints from its result dict, one per scenario, then the
acceptance checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table


def format_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def _table(title: str, columns: list[str], caption: str | None = None) -> Table:
    """Short headers and values: fits an 80-column terminal."""
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left", pad_edge=False)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    return table


def _lost(m: dict[str, Any]) -> str:
    return f"{m['lost_steps']:g}" if m["lost_steps"] is not None else "-"


def _paths(recoveries: list[dict[str, Any]], new_processes: str) -> str:
    names = {"inprocess": "in-process", "new processes": new_processes}
    return ", ".join(f"{r['kind']}: {names[r['path']]}" for r in recoveries)


def print_result(result: dict[str, Any], console: Console) -> None:
    """The run's header, each scenario's tables in order, then the acceptance checks."""
    console.print(
        f"[bold]nvrx-eks bench[/] on {result['machine']['summary']}: `{result['command']}`, "
        f"{result['wall_s'] / 60:.1f} min",
        highlight=False,
    )
    for scenario, print_tables in SCENARIO_TABLES.items():
        if scenario in result:
            print_tables(result[scenario], console)
    console.print(_acceptance(result))


def _checkpoint_efficiency(p1: dict[str, Any], console: Console) -> None:
    floor = p1["floor"]
    table = _table(
        f"P1 checkpoint efficiency: {p1['preset']} preset, "
        f"{floor['bytes_per_rank'] / 2**20:.0f} MiB of state per rank, a save every "
        f"{p1['interval']} steps ({p1['runs_per_backend']} run x {p1['cycles']} saves "
        f"per backend). Floor: one copy of the shard to {floor['destination']}, "
        f"{format_ms(floor['copy_s'])}. Medians after the first save.",
        ["backend", "effic.", "stall", "/floor", "1st save", "blocked", "step x"],
        caption="effic. = throughput vs none; stall = the save call; /floor = "
        "stall / floor; blocked = loop time per save outside step compute "
        "(+ waiting for the previous save, its commit); step x = step time "
        "vs none",
    )
    for b in p1["backends"]:
        saves = b["backend"] != "none"
        table.add_row(
            b["backend"],
            f"{b['efficiency']:.0%}",
            format_ms(b["handoff_s"]) if saves else "-",
            f"{b['floor_ratio']:.1f}x" if saves else "-",
            format_ms(b["first_handoff_s"]) if saves else "-",
            format_ms(b["blocked_s"]),
            f"{b['step_slowdown']:.2f}x",
        )
    console.print(table)


def _soft_faults(p2: dict[str, Any], console: Console) -> None:
    table = _table(
        f"P2 soft faults, in-process restart ({p2['preset']} preset). Medians, seconds after the fault.",
        ["fault", "n", "detected", "ready again", "first step", "lost steps"],
    )
    for kind, m in p2["by_kind"].items():
        table.add_row(kind, str(m["n"]), _s(m["detect_s"]), _s(m["restart_s"]), _s(m["first_step_s"]), _lost(m))
    console.print(table)


def _sigkill(p3: dict[str, Any], console: Console) -> None:
    ratio = f"{p3['ratio']:.2f}x" if p3["ratio"] else "-"
    table = _table(
        f"P3 sigkill ({p3['preset']} preset). Medians, seconds after the fault. Full relaunch / ft_launcher = {ratio}",
        ["recovered by", "n", "processes up", "ready again", "first step", "lost steps"],
    )
    for name, label in (("ft_launcher", "ft_launcher"), ("full_relaunch", "full relaunch")):
        m = p3[name]["medians"]
        table.add_row(label, str(m["n"]), _s(m["respawn_s"]), _s(m["restart_s"]), _s(m["first_step_s"]), _lost(m))
    console.print(table)


def _goodput(p4: dict[str, Any], console: Console) -> None:
    table = _table(
        f"P4 goodput: {p4['steps']} steps of the {p4['preset']} preset, faults "
        f"{p4['schedule']} (seed {p4['seed']}). Layered / baseline = "
        f"{p4['goodput_ratio']:.2f}x",
        ["config", "goodput", "wall", "steps", "stalls", "replay", "other", "lost"],
        caption="seconds: kept steps, checkpoint stalls, replayed steps, the rest "
        "(detection, restarts, start-up, commits); lost = steps replayed",
    )
    for name in ("layered", "baseline"):
        g = p4[name]
        table.add_row(
            name,
            f"{g['goodput']:.1%}",
            _s(g["wall_s"]),
            _s(g["productive_s"]),
            _s(g["checkpoint_stall_s"]),
            _s(g["replayed_s"]),
            _s(g["other_s"]),
            str(g["lost_steps"]),
        )
    console.print(table)
    console.print(
        f"  layered recovered {_paths(p4['layered']['recoveries'], 'ft_launcher')}; "
        f"baseline: {p4['baseline']['relaunches']} relaunches",
        highlight=False,
    )


#: P5's two sides: (the result's key, the row's label, the restore source the side reads from).
_TIER_SIDES = (("tiers", "local + FSx", "local"), ("fsx_only", "FSx only", "fsx"))


def _checkpoint_tiers(p5: dict[str, Any], console: Console) -> None:
    table = _table(
        f"P5 checkpoint tiers: {p5['steps']} steps of the {p5['preset']} preset on {p5['nodes']} "
        f"simulated nodes, FSx every {p5['fsx_interval']} steps, faults {p5['schedule']}",
        ["config", "goodput", "wall", "replayed steps", "first step after fault", "restores"],
        caption=f"local tier every {p5['local_interval']} steps, replicated to the other node; "
        "restores = by rank: own copy / replica / FSx",
    )
    for name, label, _ in _TIER_SIDES:
        g = p5[name]
        restores = g["local_restores"]
        table.add_row(
            label,
            f"{g['goodput']:.1%}",
            _s(g["wall_s"]),
            str(g["lost_steps"]),
            _s(g["medians"]["first_step_s"]),
            f"{restores['local']} / {restores['replica']} / {g['fsx_loads']}",
        )
    console.print(table)
    _tier_restores_and_saves(p5, console)


def _tier_restores_and_saves(p5: dict[str, Any], console: Console) -> None:
    table = _table(
        f"P5 restores and saves, medians: the local tier's restores ({p5['tiers']['from_memory']} "
        "from host memory) against FSx's",
        ["config", "restores", "read", "restore", "setup", "stall/save", "/floor"],
        caption="restore = the slowest rank's load of the state, read = its part reading the tier "
        "(restore less building the empty state, the same on both sides); setup = the restarted "
        f"iteration's whole setup; stall/save = the local tier's copy, floor {format_ms(p5['floor']['copy_s'])}",
    )
    for name, label, source in _TIER_SIDES:
        g = p5[name]
        floor_ratio = p5["local_stall_floor_ratio"] if name == "tiers" else None
        table.add_row(
            label,
            str(len([r for r in g["restores"] if r["source"] == source])),
            format_ms(g["restore_read_s"][source]),
            format_ms(g["restore_s"][source]),
            _s(g["restore_setup_s"][source]),
            format_ms(g["local_stall_s"]),
            f"{floor_ratio:.2f}x" if floor_ratio else "-",
        )
    console.print(table)


def _hot_spares(p6: dict[str, Any], console: Console) -> None:
    table = _table(
        f"P6 hot spares: {p6['steps']} steps of the {p6['preset']} preset, 2 active nodes of one rank, "
        f"node 1's rank lost at step {p6['fault_step']}",
        ["recovered by", "fault", "path", "first step after fault", "steps replayed"],
    )
    for name, label in (
        ("spare_inprocess", "(a) spare node, in process"),
        ("ft_launcher", "(b) ft_launcher"),
        ("full_relaunch", "(c) full relaunch"),
        ("spare_node_loss", "(a) spare node, in process"),
        ("ft_hot_spare_node_loss", "(d) ft_launcher hot-spare node"),
    ):
        r = p6[name]["recovery"]
        table.add_row(label, r["fault"], r["path"], _s(r["first_step_s"]), str(r["lost_steps"]))
    console.print(table)


def _gloo_release(p7: dict[str, Any], console: Console) -> None:
    table = _table(
        f"P7 gloo release on abort: {p7['schedule']} ({p7['preset']} preset), medians",
        ["abort", "detect", "first step after fault", "after detection"],
    )
    for name, label in (("release", "gloo sockets shut down"), ("no_release", "without")):
        m = p7[name]["medians"]
        table.add_row(label, _s(m["detect_s"]), _s(m["first_step_s"]), _s(p7[name]["after_detect_s"]))
    console.print(table)


#: Each scenario's tables, in the order they are printed.
SCENARIO_TABLES: dict[str, Callable[[dict[str, Any], Console], None]] = {
    "p1": _checkpoint_efficiency,
    "p2": _soft_faults,
    "p3": _sigkill,
    "p4": _goodput,
    "p5": _checkpoint_tiers,
    "p6": _hot_spares,
    "p7": _gloo_release,
}


def _acceptance(result: dict[str, Any]) -> Table:
    """Each check (pass or FAIL, the claim, the numbers), then each scenario that failed to run."""
    checks = Table(title="Acceptance", title_justify="left", show_header=False, pad_edge=False)
    checks.add_column(no_wrap=True)
    checks.add_column()
    checks.add_column()
    for c in result["checks"]:
        checks.add_row("[green]pass[/]" if c["ok"] else "[red]FAIL[/]", c["condition"], c["measured"])
    for name, error in result["errors"].items():
        checks.add_row("[red]error[/]", name.upper(), error)
    return checks
