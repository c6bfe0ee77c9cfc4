"""Training runs on this machine: `local` (the trainer under ft_launcher), `rehearse` (the rendered
pods in podman), `bench`, `gpu-smoke` and the offline `demo`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from nvrx_eks.cli.options import Config, Profile
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.jobs.options import JOB_FLAGS, data_overrides
from workloads.checkpoint.backends import CHECKPOINT_BACKENDS
from workloads.presets import MODEL_PRESETS

#: The highest TCP port is 65535; `local` uses --port and --port + 1.
MAX_TCP_PORT = 65535

# Options of both local and rehearse.
TrainOverrides = Annotated[list[str] | None, typer.Option("--set", help="TrainConfig override key=value (repeatable).")]
CheckpointInterval = Annotated[int, typer.Option("--checkpoint-interval", help="Steps between FSx-tier saves.")]
Steps = Annotated[int, typer.Option(help="Training steps.")]

#: The cluster commands' --spare-nodes (nvrx_eks.jobs.options): one meaning.
SPARE_NODES = JOB_FLAGS["spare_nodes"][1]


def local(
    nproc: Annotated[int, typer.Option("--nproc", help="CPU ranks (gloo) per simulated node.")] = 2,
    nodes: Annotated[
        int, typer.Option("--nodes", help="Active simulated nodes: one ft_launcher each, own local checkpoint root.")
    ] = 1,
    spare_nodes: int = SPARE_NODES,
    local_interval: Annotated[
        int | None,
        typer.Option(
            "--local-interval",
            min=1,
            help="Steps between node-local checkpoints, replicated to another node (default off).",
        ),
    ] = None,
    steps: Steps = 60,
    faults: Annotated[str, typer.Option(help='Faults to inject, e.g. "exception@20:1,sigkill@40:0".')] = "",
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Default: runs/local-<time>.")] = None,
    preset: Annotated[str, typer.Option(help=f"Model preset: {', '.join(MODEL_PRESETS)}.")] = "tiny",
    checkpoint_interval: CheckpointInterval = 10,
    backend: Annotated[str, typer.Option(help=f"Checkpoint backend: {', '.join(CHECKPOINT_BACKENDS)}.")] = "nvrx",
    resume: Annotated[bool, typer.Option(help="Continue the run already in --run-dir.")] = False,
    overrides: TrainOverrides = None,
    port: Annotated[int | None, typer.Option(help="Rendezvous port (P and P+1 are used). Default: a free one.")] = None,
    data: Annotated[
        Path | None, typer.Option("--data", help="Train on the token shards of a `data prepare` directory.")
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Start more ranks ((--nodes + --spare-nodes) x --nproc) than this machine's CPU cores are allowed.",
        ),
    ] = False,
    relaunches: Annotated[
        int,
        typer.Option(
            "--relaunches",
            min=0,
            help="Times a launch that lost its coordinator or more nodes than it has spares starts again "
            "(as the JobSet recreates its pods).",
        ),
    ] = 2,
) -> None:
    """Run the trainer under ft_launcher on this machine, inject faults, print how it recovered."""
    from nvrx_eks.local.runner import LocalRun, run_local

    if run_dir is not None and run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir} is a file; give a directory (new, or a run's with --resume)")
    if data is not None and not data.is_dir():
        raise ConfigError(f"--data {data} is not a directory; give the --out directory of `nvrx-eks data prepare`")
    if port is not None and not 1 <= port < MAX_TCP_PORT:
        raise ConfigError(f"--port {port}: give a TCP port from 1 to {MAX_TCP_PORT - 1} (the run also uses port + 1)")

    run = LocalRun(
        nproc=nproc,
        steps=steps,
        faults=faults,
        run_dir=run_dir,
        preset=preset,
        checkpoint_interval=checkpoint_interval,
        backend=backend,
        resume=resume,
        overrides=(*(overrides or []), *data_overrides(str(data.resolve()) if data else None)),
        port=port,
        nodes=nodes,
        local_interval=local_interval,
        spare_nodes=spare_nodes,
        force=force,
        max_relaunches=relaunches,
    )
    raise typer.Exit(run_local(run, console=Console()))


def rehearse(
    profile: Profile = None,
    config: Config = None,
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="Active nodes: one pod each.")] = 2,
    nproc: Annotated[int, typer.Option("--nproc", min=1, help="CPU ranks (gloo) per pod, in place of its GPUs.")] = 1,
    spare_nodes: int = SPARE_NODES,
    local_interval: Annotated[
        int | None,
        typer.Option(
            "--local-interval", min=1, help="Steps between node-local checkpoints (default: the profile's job)."
        ),
    ] = None,
    steps: Steps = 30,
    faults: Annotated[
        str,
        typer.Option(
            help='Trainer and pod faults (pod-kill@STEP:NODE, pod-stop@STEP:NODE), e.g. "exception@9:1,pod-stop@17:1".'
        ),
    ] = "",
    checkpoint_interval: CheckpointInterval = 10,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Default: runs/rehearse-<time>.")] = None,
    overrides: TrainOverrides = None,
) -> None:
    """Run the profile's rendered training pods in podman, under their own security context."""
    from nvrx_eks.rehearse.runner import rehearse as run_rehearsal

    code = run_rehearsal(
        profile=profile,
        config_path=config,
        nodes=nodes,
        nproc=nproc,
        spare_nodes=spare_nodes,
        steps=steps,
        faults=faults,
        run_dir=run_dir,
        checkpoint_interval=checkpoint_interval,
        local_interval=local_interval,
        overrides=list(overrides or []),
        console=Console(),
    )
    raise typer.Exit(code)


def bench(
    quick: Annotated[
        bool, typer.Option("--quick", help="Fewer repetitions and steps: ~9 min on 2 CPU cores (full: ~21)")
    ] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Results directory (default: runs/bench-<time>).")] = None,
    scenarios: Annotated[
        str,
        typer.Option(
            "--scenarios",
            help="Comma-separated subset of p1,p2,p3,p4,p5,p6,p7 (p5: checkpoint tiers, p6: hot spares, "
            "p7: gloo release).",
        ),
    ] = "p1,p2,p3,p4",
    repeats: Annotated[
        int | None,
        typer.Option("--repeats", min=1, help="P1 runs per backend, P2 faults per kind, P3 faults per recovery path."),
    ] = None,
    preset: Annotated[str | None, typer.Option("--preset", help="Model for P1 and P4 (default: small).")] = None,
    recovery_preset: Annotated[str | None, typer.Option("--recovery-preset", help="Model for P2 and P3.")] = None,
    interval: Annotated[
        int | None, typer.Option("--interval", min=1, help="Checkpoint every N steps (default: 2).")
    ] = None,
    nproc: Annotated[
        int | None, typer.Option("--nproc", min=1, help="Ranks: CPU processes, or GPUs on a GPU node.")
    ] = None,
    p4_steps: Annotated[int | None, typer.Option("--p4-steps", min=1, help="Steps of each P4 run.")] = None,
    p4_faults: Annotated[int | None, typer.Option("--p4-faults", min=1, help="Faults in the P4 schedule.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of the P4 fault schedule.")] = None,
    dist_backend: Annotated[
        str | None,
        typer.Option("--dist-backend", help="auto (NCCL when GPUs are visible, else gloo), gloo or nccl."),
    ] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", help="Trainer config override key=value, every run (repeatable)."),
    ] = None,
) -> None:
    """Benchmark the resilience layers side by side: checkpoint efficiency, soft- and hard-fault recovery, goodput."""
    import shlex

    from nvrx_eks.bench.suite import run_bench

    result = run_bench(
        quick=quick,
        out=out,
        scenarios=scenarios,
        command=shlex.join(["nvrx-eks", *sys.argv[1:]]),
        console=Console(),
        repeats=repeats,
        preset=preset,
        recovery_preset=recovery_preset,
        interval=interval,
        nproc=nproc,
        p4_steps=p4_steps,
        p4_faults=p4_faults,
        seed=seed,
        dist_backend=dist_backend,
        overrides=list(overrides or []),
    )
    if result["errors"]:
        raise typer.Exit(1)


def gpu_smoke(
    out: Annotated[Path, typer.Option("--out", help="A new directory for the runs and gpu_smoke.json.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="CPU, gloo, tiny preset: the same code path.")] = False,
    preset: Annotated[str | None, typer.Option("--preset", help="Model preset (default: 1b on GPU, tiny dry).")] = None,
    nproc: Annotated[int | None, typer.Option("--nproc", min=1, help="Ranks (default: one per visible GPU).")] = None,
    budget_s: Annotated[
        float | None,
        typer.Option(
            "--budget-s",
            help="Seconds the smoke may take (default: under 8 minutes); a phase that would not fit is skipped.",
        ),
    ] = None,
) -> None:
    """On one GPU machine: NCCL, bf16, async checkpoints, faults recovered in process, resume, stall, memory."""
    from nvrx_eks.ops.gpu_smoke import smoke

    result = smoke(out_dir=out, dry_run=dry_run, preset=preset, nproc=nproc, console=Console(), budget_s=budget_s)
    raise typer.Exit(0 if result["ok"] else 1)


def demo(
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", help="Where the training run goes (default: runs/demo-<time>).")
    ] = None,
) -> None:
    """The offline demo: synthesize the default profile, render and validate its full-size job, train on CPU
    through an exception, a hang and a SIGKILL, and report how each was recovered."""
    from nvrx_eks.cli.demo import run

    raise typer.Exit(run(run_dir, Console()))
