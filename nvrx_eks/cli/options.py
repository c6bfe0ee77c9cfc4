"""What the command groups share: --profile and --config as `Annotated` aliases (a command sets
the default with `=`, None here), the deployment they name, and stderr."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:
    from nvrx_eks.deploy.deployment import Deployment

#: The profile every command uses when neither --profile nor --config is given.
PROFILE_ENV = "NVRX_EKS_PROFILE"

Profile = Annotated[
    str | None,
    typer.Option("--profile", "-p", envvar=PROFILE_ENV, help="Profile name in infra/profiles (default: p5)."),
]
Config = Annotated[
    str | None, typer.Option("--config", "-c", help="Path to a deployment config YAML instead of a profile.")
]
err_console = Console(stderr=True)


def deployment(profile: str | None, config: str | None) -> Deployment:
    """The deployment --profile or --config names."""
    from nvrx_eks.deploy.deployment import load_deployment

    return load_deployment(profile, config)
