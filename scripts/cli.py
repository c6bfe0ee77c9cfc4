"""`nvrx-eks`: the operator CLI.

Each command is a thin wrapper that imports its module lazily, so `nvrx-eks render` does not pay
for importing torch and `nvrx-eks local` does not pay for importing aws-cdk-lib. User mistakes
raise ConfigError and end here as one message with exit code 2, never a traceback.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from workloads.errors import ConfigError

app = typer.Typer(
    name="nvrx-eks",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Fault-tolerant multi-node GPU training on AWS: EKS + p5/EFA + FSx, trained with NVIDIA Resiliency Extension.",
)
err_console = Console(stderr=True)

ProfileOption = typer.Option(None, "--profile", "-p", help="Profile name in infra/profiles (default: p5).")
ConfigOption = typer.Option(None, "--config", "-c", help="Path to a deployment config YAML instead of a profile.")


@app.command()
def synth(profile: str | None = ProfileOption, config: str | None = ConfigOption) -> None:
    """Synthesize a profile offline (with cdk-nag) and summarize what `cdk deploy` would create."""
    from scripts.synth_summary import run

    run(profile, config, Console())


@app.command()
def plan(
    profile: str | None = ProfileOption,
    config: str | None = ConfigOption,
    train_config: str | None = typer.Option(
        None, "--train-config", help="Trainer config YAML: preset, batch, sequence length and checkpoint interval."
    ),
    nodes: int | None = typer.Option(None, min=1, help="GPU nodes (default: the profile's desired_size)."),
    node_mtbf_hours: float | None = typer.Option(None, min=1, help="Mean time between failures of one node."),
    sync_stall_s: float | None = typer.Option(None, min=0, help="Measured stall of a synchronous save."),
    async_stall_s: float | None = typer.Option(None, min=0, help="Measured stall of an NVRx async save."),
    step_time_s: float | None = typer.Option(None, min=0, help="Measured time of one training step."),
) -> None:
    """Optimal checkpoint interval (Young/Daly), expected goodput and the cost of lost time."""
    from scripts.plan import run

    run(profile, config, train_config, nodes, node_mtbf_hours, sync_stall_s, async_stall_s, step_time_s, Console())


@app.command()
def demo() -> None:
    """The offline demo: synthesize the default profile and summarize the deployment."""
    from scripts.synth_summary import run

    run(None, None, Console())


def main() -> None:
    try:
        app()
    except ConfigError as e:
        err_console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
