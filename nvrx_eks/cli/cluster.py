"""The deployment's commands: synthesize it, check an account before deploying, deploy and tear
it down, credentials for kubectl, and the GPU node group's size (`capacity`)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from nvrx_eks.cli.options import Config, Profile, deployment
from nvrx_eks.jobs.output_format import OutputFormat, check_format, table_console


def synth(profile: Profile = None, config: Config = None) -> None:
    """Synthesize a profile offline (with cdk-nag) and summarize what `cdk deploy` would create."""
    from nvrx_eks.deploy.synth import run

    run(profile, config, Console())


def token(profile: Profile = None, config: Config = None) -> None:
    """Print an EKS ExecCredential (as `aws eks get-token` does), for kubectl."""
    from nvrx_eks.jobs import commands as job_commands

    job_commands.token(deployment(profile, config))


def kubeconfig(profile: Profile = None, config: Config = None) -> None:
    """Print a kubeconfig for the deployed cluster that authenticates through `nvrx-eks token`."""
    from nvrx_eks.jobs import commands as job_commands

    job_commands.kubeconfig(deployment(profile, config))


def preflight(
    profile: Profile = None,
    config: Config = None,
    nodes: Annotated[
        int | None, typer.Option("--nodes", "-n", min=1, help="GPU nodes to plan for (default: max_size).")
    ] = None,
    output: OutputFormat = "table",
) -> None:
    """Before deploying: credentials, the admin principal (exists, is you), vCPU quota, instance offering,
    GPU capacity (a reservation or block; quota is not capacity), FSx quota, EKS version, no documentation
    placeholders in the profile, and API endpoint access from this machine. With a cluster: section, the
    existing cluster instead: its context, namespace, claim, job API and GPU nodes."""
    from nvrx_eks.ops import preflight as checks

    checks.run(deployment(profile, config), nodes, table_console(check_format(output)), output=output)


def deploy(
    profile: Profile = None,
    config: Config = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Deploy without asking, even when running GPU nodes change.")
    ] = False,
    no_rollback: Annotated[
        bool,
        typer.Option("--no-rollback", help="Keep what a failed deploy created, to fix and deploy again (cdk's flag)."),
    ] = False,
) -> None:
    """`cdk deploy --all` for the profile. First says what it would do to running GPU nodes (replace each
    one for a new launch template version, replace the node group, reset its size) and asks."""
    from nvrx_eks.deploy.deploy import deploy as run_deploy

    status = run_deploy(
        deployment(profile, config),
        yes=yes,
        no_rollback=no_rollback,
        console=Console(),
        confirm=lambda question: typer.confirm(question, default=False),
    )
    if status:
        raise typer.Exit(status)


def teardown(
    profile: Profile = None,
    config: Config = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before deleting.")] = False,
    delete_data: Annotated[
        bool,
        typer.Option(
            "--delete-data",
            help="Also delete the FSx file system (waiting until it is gone), its backups, the data bucket and "
            "the audit log groups, then the storage and network stacks.",
        ),
    ] = False,
    skip_kubernetes: Annotated[
        bool,
        typer.Option("--skip-kubernetes", help="Do not delete jobs and the FSx claim first (API unreachable)."),
    ] = False,
) -> None:
    """Delete jobs, the FSx claim and the cluster stack, then sweep leftovers. Keeps the data, and the network
    and storage stacks it needs, unless --delete-data."""
    from nvrx_eks.ops.teardown import teardown as run_teardown

    result = run_teardown(
        deployment(profile, config),
        yes=yes,
        delete_data=delete_data,
        skip_kubernetes=skip_kubernetes,
        console=Console(),
        confirm=lambda question: typer.confirm(question, default=False),
    )
    if result.aborted:
        raise typer.Exit(1)


capacity = typer.Typer(no_args_is_help=True, help="Scale the deployed GPU node group up to a job's nodes, or to 0.")
WaitMinutes = Annotated[
    int, typer.Option("--wait-minutes", min=1, help="How long to wait for the nodes before giving up.")
]
#: How long `capacity up` and `capacity down` wait for the nodes by default.
WAIT_MINUTES = 30


@capacity.command("up")
def capacity_up(
    profile: Profile = None,
    config: Config = None,
    nodes: Annotated[
        int | None, typer.Option("--nodes", "-n", min=1, help="GPU nodes (default: desired_size, or max).")
    ] = None,
    wait_minutes: WaitMinutes = WAIT_MINUTES,
) -> None:
    """Scale the GPU node group up (a Capacity Block: once it is active) and wait until the nodes are Ready;
    a shortfall is named with what to do."""
    from nvrx_eks.ops.gpu_capacity import capacity_up as scale_up

    scale_up(deployment(profile, config), nodes, Console(), timeout_s=wait_minutes * 60)


@capacity.command("down")
def capacity_down(
    profile: Profile = None,
    config: Config = None,
    force: Annotated[bool, typer.Option("--force", help="Scale down even while a training job is running.")] = False,
    wait_minutes: WaitMinutes = WAIT_MINUTES,
) -> None:
    """Scale the GPU node group to 0 (refused while a training job of this tool runs, unless --force)."""
    from nvrx_eks.ops.gpu_capacity import capacity_down as scale_down

    scale_down(deployment(profile, config), Console(), force=force, timeout_s=wait_minutes * 60)
