"""`nvrx-eks bench`: the resilience benchmark suite, P1-P4, side by side in one invocation.

    nvrx-eks bench --quick                      # about 9 minutes on 2 CPU cores
    nvrx-eks bench --out benchmarks/cpu        # fuller: more repetitions and steps, ~21 min
    nvrx-eks bench --scenarios p1,p3 --repeats 5

Every figure is a ratio or a side-by-side of runs made by the same invocation on the same
machine, so it does not depend on how fast this machine is, only on what each resilience layer
costs on it. The scenarios and what each compares are described in `nvrx_eks.bench.scenarios`,
the derived numbers in `nvrx_eks.bench.analysis`, the in-memory copy floor in
`nvrx_eks.bench.floor`. Writes `bench.json`, one PNG per scenario and the trainer runs' event
logs (`runs/<scenario>/events`, readable by `nvrx-eks report`) under --out.

On a machine with GPUs the same command runs the trainer on CUDA with NCCL (distributed backend
`auto`); pick a model and batch that fill the GPUs, e.g.
`nvrx-eks bench --nproc 8 --preset 1b --set data.batch_size=4 --set data.seq_len=2048`.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from nvrx_eks.bench.scenarios import (
    SCENARIOS,
    BenchRunFailed,
    BenchSettings,
    Launcher,
    measure_floor,
    run_p1,
    run_p2,
    run_p3,
    run_p4,
    run_p5,
    run_p6,
    run_p7,
    settings_for,
)
from nvrx_eks.facts.errors import ConfigError
from workloads.presets import MODEL_PRESETS


def parse_scenarios(text: str) -> list[str]:
    chosen = [s.strip().lower() for s in text.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown or not chosen:
        raise ConfigError(
            f"--scenarios: {', '.join(unknown) or 'nothing'} is not a scenario; "
            f"give a comma-separated list of {', '.join(SCENARIOS)}"
        )
    return [s for s in SCENARIOS if s in chosen]


def _check_inputs(settings: BenchSettings, out: Path) -> None:
    for option, preset in (("--preset", settings.preset), ("--recovery-preset", settings.recovery_preset)):
        if preset not in MODEL_PRESETS:
            raise ConfigError(f"{option}: unknown model preset {preset!r}; choose one of {', '.join(MODEL_PRESETS)}")
    if (out / "bench.json").exists():
        raise ConfigError(f"--out: {out} already holds a benchmark (bench.json); choose another directory")
    # Trainer overrides are checked now rather than when the first run that uses them starts.
    from nvrx_eks.local.runner import local_config

    try:
        local_config(
            run_dir=out / "runs" / "check",
            steps=settings.p4_steps,
            faults="",
            preset=settings.preset,
            checkpoint_interval=settings.interval,
            backend="nvrx",
            overrides=[f"distributed.backend={settings.dist_backend}", *settings.overrides],
        )
    except ConfigError as err:
        raise ConfigError(f"--set: {err}") from None


def describe_machine(dist_backend: str) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    resolved = dist_backend if dist_backend != "auto" else ("nccl" if cuda else "gloo")
    gpus = torch.cuda.device_count() if cuda else 0
    gpu = torch.cuda.get_device_name(0) if cuda else None
    if resolved == "nccl" and not cuda:
        raise ConfigError("--dist-backend: nccl needs CUDA GPUs and none are visible; use auto or gloo")
    cpus = os.cpu_count()
    summary = f"{gpus}x {gpu}, {resolved}" if cuda else f"{cpus}-core CPU, no GPU, {resolved}"
    return {
        "summary": summary,
        "cpus": cpus,
        "memory_gib": round(psutil.virtual_memory().total / 2**30),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "nvidia_resiliency_ext": importlib.metadata.version("nvidia-resiliency-ext"),
        "cuda": cuda,
        "gpus": gpus,
        "gpu": gpu,
        "dist_backend": resolved,
    }


def _check(condition: str, ok: bool, measured: str) -> dict[str, Any]:
    return {"condition": condition, "ok": bool(ok), "measured": measured}


def acceptance_checks(result: dict[str, Any]) -> list[dict[str, Any]]:
    checks = []
    if "p1" in result:
        by = {b["backend"]: b for b in result["p1"]["backends"]}
        nvrx, sync, dcp = (by[b]["handoff_s"] for b in ("nvrx", "sync", "dcp-async"))
        checks.append(
            _check(
                "P1: nvrx median stall at least 5x smaller than sync",
                sync >= 5 * nvrx,
                f"sync {sync * 1000:.0f} ms / nvrx {nvrx * 1000:.0f} ms = {sync / nvrx:.1f}x",
            )
        )
        checks.append(
            _check(
                "P1: nvrx median stall no larger than dcp-async",
                nvrx <= dcp,
                f"nvrx {nvrx * 1000:.0f} ms, dcp-async {dcp * 1000:.0f} ms",
            )
        )
    if "p3" in result:
        p3 = result["p3"]
        ft, full = p3["ft_launcher"]["medians"]["first_step_s"], p3["full_relaunch"]["medians"]["first_step_s"]
        checks.append(
            _check(
                "P3: ft_launcher recovery faster than a full relaunch",
                full > ft,
                f"first step after the fault: {ft:.1f} s vs {full:.1f} s (ratio {full / ft:.2f}x)",
            )
        )
    if "p4" in result:
        layered, baseline = result["p4"]["layered"]["goodput"], result["p4"]["baseline"]["goodput"]
        checks.append(
            _check("P4: layered goodput beats the baseline", layered > baseline, f"{layered:.1%} vs {baseline:.1%}")
        )
    if "p5" in result:
        p5 = result["p5"]
        tiers, fsx = p5["tiers"], p5["fsx_only"]
        checks.append(
            _check(
                "P5: fewer steps replayed with the local tier",
                tiers["lost_steps"] < fsx["lost_steps"],
                f"{tiers['lost_steps']} vs {fsx['lost_steps']} at FSx every {p5['fsx_interval']} steps",
            )
        )
        checks.append(
            _check(
                "P5: goodput with the local tier beats FSx alone",
                tiers["goodput"] > fsx["goodput"],
                f"{tiers['goodput']:.1%} vs {fsx['goodput']:.1%}",
            )
        )
        ratio = p5["local_stall_floor_ratio"]
        checks.append(
            _check(
                "P5: local-tier stall per save within 2x the copy floor",
                ratio is not None and ratio <= 2,
                f"{_ms(tiers['local_stall_s'])} vs floor {_ms(p5['floor']['copy_s'])}"
                + (f" = {ratio:.2f}x" if ratio else ""),
            )
        )
        checks.append(
            _check(
                "P5: both sides end bit-identical",
                p5["bit_identical"],
                f"state_sha256 {tiers['state_sha256'][:12]}… vs {fsx['state_sha256'][:12]}…",
            )
        )
    if "p6" in result:
        p6 = result["p6"]
        a, b = p6["spare_inprocess"]["recovery"]["first_step_s"], p6["ft_launcher"]["recovery"]["first_step_s"]
        checks.append(
            _check(
                "P6: a spare in process at least 3x faster to the first step than ft_launcher",
                b >= 3 * a,
                f"{a:.1f} s vs {b:.1f} s ({b / a:.1f}x)",
            )
        )
        checks.append(_check("P6: every side ends bit-identical", p6["bit_identical"], "state_sha256 compared"))
    if "p7" in result:
        after = result["p7"]["release"]["after_detect_s"]
        checks.append(
            _check(
                "P7: exception recovered within 3 s of detection with the gloo release",
                after is not None and after <= 3,
                f"{after:.1f} s vs {result['p7']['no_release']['after_detect_s']:.1f} s without",
            )
        )
    left = result["processes"]
    checks.append(
        _check(
            "no process left behind",
            not left["alive_after"] and not left["killed_after_exit"],
            "none"
            if not left["alive_after"] and not left["killed_after_exit"]
            else f"alive {left['alive_after']}, had to be killed {left['killed_after_exit']}",
        )
    )
    return checks


def _processes_mentioning(text: str) -> list[int]:
    """Processes whose command line names `text`, other than this one and its ancestors (the
    bench's own command line names its --out directory)."""
    ours = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.pid not in ours and proc.info["cmdline"] and text in " ".join(proc.info["cmdline"]):
                found.append(proc.pid)
        except psutil.NoSuchProcess:
            continue
    return found


def run_bench(
    *,
    quick: bool,
    out: Path | None,
    scenarios: str,
    command: str,
    console: Console,
    ports: Callable[[], int] | None = None,
    **changes: Any,
) -> dict[str, Any]:
    """Run the chosen scenarios, write bench.json and the PNGs under `out`, print the tables.
    `changes` override the quick or full settings (None = keep); `ports` hands out rendezvous
    ports (default: any free pair)."""
    chosen = parse_scenarios(scenarios)
    overrides = changes.pop("overrides", None)
    settings = settings_for(quick, overrides=tuple(overrides) if overrides else None, **changes)
    out = (out or Path("runs") / time.strftime("bench-%Y%m%d-%H%M%S")).resolve()
    # `auto` is decided once, here, by this machine: every run of the bench then configures the
    # backend it really uses, and the trainer's timeout rules are checked for that backend.
    machine = describe_machine(settings.dist_backend)
    settings = dataclasses.replace(settings, dist_backend=machine["dist_backend"])
    _check_inputs(settings, out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def progress(message: str) -> None:
        console.print(f"[dim]{time.monotonic() - started:6.0f}s[/] {message}", highlight=False, soft_wrap=True)

    progress(f"nvrx-eks bench ({'quick' if quick else 'full'}): {', '.join(chosen)}; results in {out}")
    result: dict[str, Any] = {
        "version": 1,
        "command": command,
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "settings": {**settings.__dict__, "overrides": list(settings.overrides)},
    }
    launcher = Launcher(out / "runs", settings, progress, ports)
    runners = {
        "p1": lambda: run_p1(launcher, settings, lambda: measure_floor(settings, out)),
        "p2": lambda: run_p2(launcher, settings),
        "p3": lambda: run_p3(launcher, settings),
        "p4": lambda: run_p4(launcher, settings),
        "p5": lambda: run_p5(launcher, settings, lambda: measure_floor(settings, out)),
        "p6": lambda: run_p6(launcher, settings),
        "p7": lambda: run_p7(launcher, settings),
    }
    errors = {}
    for name in chosen:
        try:
            result[name] = runners[name]()
        except (BenchRunFailed, ValueError) as err:
            errors[name] = str(err)
            progress(f"[red]{name.upper()} failed:[/] {err}")
    result["errors"] = errors
    result["processes"] = {
        "alive_after": _processes_mentioning(str(out)),
        "killed_after_exit": [pid for launch in launcher.launches for pid in launch.killed_after_exit],
        "trainer_launches": len(launcher.launches),
    }
    result["wall_s"] = time.monotonic() - started
    result["checks"] = acceptance_checks(result)
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    from nvrx_eks.bench.charts import plot_all

    charts = plot_all(result, out)
    print_result(result, console)
    console.print(f"results: {out / 'bench.json'}; charts: {', '.join(p.name for p in charts)}")
    return result


# ----- terminal output -------------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
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
    console.print(
        f"[bold]nvrx-eks bench[/] on {result['machine']['summary']}: `{result['command']}`, "
        f"{result['wall_s'] / 60:.1f} min",
        highlight=False,
    )
    if "p1" in result:
        p1 = result["p1"]
        floor = p1["floor"]
        table = _table(
            f"P1 checkpoint efficiency: {p1['preset']} preset, "
            f"{floor['bytes_per_rank'] / 2**20:.0f} MiB of state per rank, a save every "
            f"{p1['interval']} steps ({p1['runs_per_backend']} run x {p1['cycles']} saves "
            f"per backend). Floor: one copy of the shard to {floor['destination']}, "
            f"{_ms(floor['copy_s'])}. Medians after the first save.",
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
                _ms(b["handoff_s"]) if saves else "-",
                f"{b['floor_ratio']:.1f}x" if saves else "-",
                _ms(b["first_handoff_s"]) if saves else "-",
                _ms(b["blocked_s"]),
                f"{b['step_slowdown']:.2f}x",
            )
        console.print(table)
    if "p2" in result:
        p2 = result["p2"]
        table = _table(
            f"P2 soft faults, in-process restart ({p2['preset']} preset). Medians, seconds after the fault.",
            ["fault", "n", "detected", "ready again", "first step", "lost steps"],
        )
        for kind, m in p2["by_kind"].items():
            table.add_row(kind, str(m["n"]), _s(m["detect_s"]), _s(m["restart_s"]), _s(m["first_step_s"]), _lost(m))
        console.print(table)
    if "p3" in result:
        p3 = result["p3"]
        ratio = f"{p3['ratio']:.2f}x" if p3["ratio"] else "-"
        table = _table(
            f"P3 sigkill ({p3['preset']} preset). Medians, seconds after the fault. "
            f"Full relaunch / ft_launcher = {ratio}",
            ["recovered by", "n", "processes up", "ready again", "first step", "lost steps"],
        )
        for name, label in (("ft_launcher", "ft_launcher"), ("full_relaunch", "full relaunch")):
            m = p3[name]["medians"]
            table.add_row(label, str(m["n"]), _s(m["respawn_s"]), _s(m["restart_s"]), _s(m["first_step_s"]), _lost(m))
        console.print(table)
    if "p4" in result:
        p4 = result["p4"]
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
    if "p5" in result:
        p5 = result["p5"]
        table = _table(
            f"P5 checkpoint tiers: {p5['steps']} steps of the {p5['preset']} preset on {p5['nodes']} "
            f"simulated nodes, FSx every {p5['fsx_interval']} steps, faults {p5['schedule']}",
            [
                "config",
                "goodput",
                "wall",
                "replayed steps",
                "first step after fault",
                "local stall/save",
                "restores: own / replica / FSx",
            ],
            caption=f"local tier every {p5['local_interval']} steps, replicated to the other node; "
            f"copy floor {_ms(p5['floor']['copy_s'])} per save",
        )
        for name, label in (("tiers", "local + FSx"), ("fsx_only", "FSx only")):
            g = p5[name]
            restores = g["local_restores"]
            table.add_row(
                label,
                f"{g['goodput']:.1%}",
                _s(g["wall_s"]),
                str(g["lost_steps"]),
                _s(g["medians"]["first_step_s"]),
                _ms(g["local_stall_s"]),
                f"{restores['local']} / {restores['replica']} / {g['fsx_loads']}",
            )
        console.print(table)
    if "p6" in result:
        p6 = result["p6"]
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
        ):
            r = p6[name]["recovery"]
            table.add_row(label, r["fault"], r["path"], _s(r["first_step_s"]), str(r["lost_steps"]))
        console.print(table)
    if "p7" in result:
        p7 = result["p7"]
        table = _table(
            f"P7 gloo release on abort: {p7['schedule']} ({p7['preset']} preset), medians",
            ["abort", "detect", "first step after fault", "after detection"],
        )
        for name, label in (("release", "gloo sockets shut down"), ("no_release", "without")):
            m = p7[name]["medians"]
            table.add_row(label, _s(m["detect_s"]), _s(m["first_step_s"]), _s(p7[name]["after_detect_s"]))
        console.print(table)
    checks = Table(title="Acceptance", title_justify="left", show_header=False, pad_edge=False)
    checks.add_column(no_wrap=True)
    checks.add_column()
    checks.add_column()
    for c in result["checks"]:
        checks.add_row("[green]pass[/]" if c["ok"] else "[red]FAIL[/]", c["condition"], c["measured"])
    for name, error in result["errors"].items():
        checks.add_row("[red]error[/]", name.upper(), error)
    console.print(checks)
