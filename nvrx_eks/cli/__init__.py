"""`nvrx-eks`: the operator CLI, composed here from one module per command group: cluster (the
deployment), jobs (the training job on it), runs (training on this machine), results (what a run
left) and data. `nvrx-eks = nvrx_eks.cli:main`; `python -m nvrx_eks.cli` runs the same.

Each command is a thin wrapper that imports its module lazily, so `nvrx-eks render` does not pay
for importing torch and `nvrx-eks local` does not pay for importing aws-cdk-lib. User mistakes
raise ConfigError and end here as one message with exit code 2, never a traceback.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.markup import escape

from nvrx_eks.cli import cluster, data, jobs, results, runs
from nvrx_eks.cli.options import err_console
from nvrx_eks.facts.errors import ConfigError, terminal_safe
from nvrx_eks.facts.exit_codes import EXIT_CONFIG_ERROR

app = typer.Typer(
    name="nvrx-eks",
    no_args_is_help=True,
    # `nvrx-eks --install-completion` installs shell completion (bash, zsh, fish).
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Fault-tolerant multi-node GPU training on AWS: EKS + p5/EFA + FSx, trained with NVIDIA Resiliency Extension.",
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"nvrx-eks {version('nvrx-eks')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    # Options of `nvrx-eks` itself; the help text is the app's.
    return None


# The commands, in the order `nvrx-eks --help` lists them; the two groups of subcommands follow.
app.command()(cluster.synth)
app.command()(jobs.plan)
app.command()(results.report)
app.command("eval")(results.evaluate)
app.command()(runs.demo)
app.command()(jobs.render)
app.command()(jobs.validate)
app.command()(jobs.submit)
app.command()(jobs.status)
app.command()(jobs.logs)
app.command()(jobs.delete)
app.command()(cluster.token)
app.command()(cluster.kubeconfig)
app.command()(cluster.preflight)
app.command()(cluster.deploy)
app.command()(cluster.teardown)
app.command()(runs.local)
app.command()(runs.rehearse)
app.command()(runs.bench)
app.command("gpu-smoke")(runs.gpu_smoke)
app.command()(results.export)
app.add_typer(cluster.capacity, name="capacity")
app.add_typer(data.app, name="data")


def main() -> None:
    try:
        app()
    except ConfigError as e:
        # Messages echo user input (paths, names, specs): escape it, or a '[' in it is read as
        # markup and an ESC in it as a terminal's escape sequence.
        err_console.print(f"[bold red]error:[/] {escape(terminal_safe(str(e)))}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_CONFIG_ERROR)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
