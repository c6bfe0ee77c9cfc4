"""`nvrx-eks bench`: the resilience benchmark suite, P1-P7, side by side in one invocation.

    nvrx-eks bench --quick                      # about 9 minutes on 2 CPU cores
    nvrx-eks bench --out benchmarks/cpu        # fuller: more repetitions and steps, ~21 min
    nvrx-eks bench --scenarios p1,p3 --repeats 5

Every figure is a ratio or a side-by-side of runs made by the same invocation on the same
machine, so it does not depend on how fast this machine is, only on what each resilience layer
costs on it. The scenarios and what each compares are described in `nvrx_eks.bench.scenarios`,
the derived numbers in `nvrx_eks.bench.analysis`, the in-memory copy floor in
`nvrx_eks.bench.floor`, the acceptance checks in `nvrx_eks.bench.checks`, the tables in
`nvrx_eks.bench.tables` and the charts in `nvrx_eks.bench.charts`. Writes `bench.json`, one PNG
per scenario and the trainer runs' event logs (`runs/<scenario>/events`, readable by
`nvrx-eks report`) under --out.

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

from nvrx_eks.bench.checks import acceptance_checks
from nvrx_eks.bench.launcher import BenchRunFailed, Launcher, measure_floor
from nvrx_eks.bench.scenarios import run_p1, run_p2, run_p3, run_p4, run_p5, run_p6, run_p7
from nvrx_eks.bench.settings import SCENARIOS, BenchSettings, settings_for
from nvrx_eks.bench.tables import print_result
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
