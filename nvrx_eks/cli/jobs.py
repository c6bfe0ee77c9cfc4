"""The training job's commands: plan its checkpoint interval, render and validate it offline,
submit it, follow it (status, logs) and delete it. The job's own flags are declared once, in
nvrx_eks.jobs.options (@job_flags)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from nvrx_eks.cli.options import Config, Profile, deployment, err_console
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.jobs.options import FROM_JOB_FLAGS, JobOptions, job_flags
from nvrx_eks.jobs.output_format import (
    ManifestFormat,
    OutputFormat,
    check_format,
    check_manifest_format,
    table_console,
    write_data,
)

Live = Annotated[
    bool, typer.Option("--live", help="Take namespace, claim, image and versions from the deployed stack.")
]


def plan(
    profile: Profile = None,
    config: Config = None,
    train_config: Annotated[
        str | None,
        typer.Option(
            "--train-config", help="Trainer config YAML: preset, batch, sequence length and checkpoint interval."
        ),
    ] = None,
    nodes: Annotated[
        int | None, typer.Option(min=1, help="GPU nodes (default: desired_size, or max_size if 0).")
    ] = None,
    node_mtbf_hours: Annotated[
        float | None, typer.Option(min=1, help="Mean time between failures of one node.")
    ] = None,
    sync_stall_s: Annotated[float | None, typer.Option(min=0, help="Measured stall of a synchronous save.")] = None,
    async_stall_s: Annotated[float | None, typer.Option(min=0, help="Measured stall of an NVRx async save.")] = None,
    step_time_s: Annotated[float | None, typer.Option(min=0, help="Measured time of one training step.")] = None,
    node_loss_share: Annotated[
        float | None,
        typer.Option(
            help="Share of faults that lose a node and its local checkpoints (default: Llama 3's hardware, 0.75)."
        ),
    ] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Trainer config override KEY=VALUE (repeatable), as render takes it: model.shape_from=...",
        ),
    ] = None,
    output: OutputFormat = "table",
) -> None:
    """Optimal checkpoint interval (Young/Daly), expected goodput and the cost of lost time."""
    from nvrx_eks.ops.plan import DEFAULT_NODE_LOSS_SHARE, plan_as_data, run

    check_format(output)

    if step_time_s == 0:
        raise ConfigError("--step-time-s must be above 0; give the measured seconds of one training step")
    if node_loss_share is not None and not 0 < node_loss_share < 1:
        raise ConfigError(f"--node-loss-share {node_loss_share:g}: give a fraction above 0 and below 1, e.g. 0.5")

    result = run(
        profile,
        config,
        train_config,
        nodes,
        node_mtbf_hours,
        sync_stall_s,
        async_stall_s,
        step_time_s,
        table_console(output),
        node_loss_share=DEFAULT_NODE_LOSS_SHARE if node_loss_share is None else node_loss_share,
        overrides=list(overrides or []),
    )
    write_data(plan_as_data(result), output)


@job_flags()
def render(
    profile: Profile = None,
    config: Config = None,
    options: JobOptions = FROM_JOB_FLAGS,
    live: Live = False,
    output: ManifestFormat = "yaml",
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Write one file per object into this directory instead of stdout (-o: their format)."
        ),
    ] = None,
) -> None:
    """Render the training job (JobSet or PyTorchJob + trainer ConfigMap + NetworkPolicy) to stdout or a directory."""
    from nvrx_eks.jobs import commands as job_commands

    output = check_manifest_format(output)
    job_commands.render(
        deployment(profile, config), options, live=live, output=output, out_dir=out_dir, err=err_console
    )


@job_flags(without=("data",))
def validate(
    path: Annotated[
        str | None, typer.Argument(help="Manifest file, or - for stdin (default: render with the flags).")
    ] = None,
    profile: Profile = None,
    config: Config = None,
    options: JobOptions = FROM_JOB_FLAGS,
    live: Live = False,
    output: OutputFormat = "table",
) -> None:
    """Validate manifests offline: strict Kubernetes schemas, the JobSet/PyTorchJob CRDs, project rules."""
    from nvrx_eks.jobs import commands as job_commands

    console = table_console(check_format(output))
    job_commands.validate(deployment(profile, config), options, path=path, live=live, console=console, output=output)


@job_flags()
def submit(
    profile: Profile = None,
    config: Config = None,
    options: JobOptions = FROM_JOB_FLAGS,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Render and validate offline and print; no cluster needed.")
    ] = False,
) -> None:
    """Render, validate, server-side dry-run, then create the job on the deployed cluster."""
    from nvrx_eks.jobs import commands as job_commands

    job_commands.submit(deployment(profile, config), options, dry_run=dry_run, out=Console(), err=err_console)


def status(
    name: Annotated[str | None, typer.Argument(help="Job name (default: list this project's jobs).")] = None,
    profile: Profile = None,
    config: Config = None,
    output: OutputFormat = "table",
) -> None:
    """Job phase, pods, restarts per resilience layer."""
    from nvrx_eks.jobs import commands as job_commands

    deployed, console = deployment(profile, config), table_console(check_format(output))
    if job_commands.status(deployed, name, console, output) is not None and name is not None:
        from nvrx_eks.jobs.logs import last_metrics

        for line in last_metrics(job_commands.job_client(deployed, console), name):
            console.print(f"last metrics: {escape(line)}", highlight=False, soft_wrap=True)


JobName = Annotated[str, typer.Argument(help="Job name.")]


def logs(
    name: JobName,
    profile: Profile = None,
    config: Config = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream until the pods end.")] = False,
    node: Annotated[int | None, typer.Option("--node", min=0, help="Only this node's pod.")] = None,
    rank: Annotated[int | None, typer.Option("--rank", min=0, help="Only this global rank's lines.")] = None,
    tail: Annotated[int | None, typer.Option("--tail", min=0, help="Only the last N lines of each pod.")] = None,
    events: Annotated[
        bool,
        typer.Option("--events", help="Only the event lines: faults, restarts, checkpoint commits and the run's end."),
    ] = False,
) -> None:
    """Logs of all pods (prefixed by node), one node, or one rank; with -f as they happen."""
    from nvrx_eks.jobs import commands as job_commands

    job_commands.logs(
        deployment(profile, config),
        name,
        node=node,
        rank=rank,
        follow=follow,
        tail=tail,
        events=events,
        console=Console(),
    )


def delete(
    name: JobName,
    profile: Profile = None,
    config: Config = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the job's pods are gone.")] = False,
) -> None:
    """Delete a training job and its ConfigMap (checkpoints on FSx stay)."""
    from nvrx_eks.jobs import commands as job_commands

    job_commands.delete(deployment(profile, config), name, wait=wait, console=Console())
