"""The deployment a command works on: the validated DeploymentConfig plus how it was chosen, so
that messages can print the exact `cdk` command for the same profile."""

from __future__ import annotations

from dataclasses import dataclass

from infra.config import DEFAULT_PROFILE, DeploymentConfig, resolve_config


@dataclass(frozen=True)
class Deployment:
    config: DeploymentConfig
    profile: str | None = None
    config_path: str | None = None

    @property
    def cdk_context_args(self) -> list[str]:
        """The `-c` arguments that make the CDK app load this same deployment config."""
        if self.config_path:
            return ["-c", f"config={self.config_path}"]
        return ["-c", f"profile={self.profile or DEFAULT_PROFILE}"]

    @property
    def source(self) -> str:
        """Where the config came from, as a user would name it: "profile p5" or "config PATH"."""
        return f"config {self.config_path}" if self.config_path else f"profile {self.profile or DEFAULT_PROFILE}"

    @property
    def cli_flags(self) -> str:
        """The flags that make another nvrx-eks command use this deployment ("" for the default)."""
        if self.config_path is not None:
            return f"-c {self.config_path}"
        return f"-p {self.profile}" if self.profile else ""

    @property
    def deploy_command(self) -> str:
        """How to deploy it: `nvrx-eks deploy`, which says first what a deploy does to running GPU nodes."""
        return f"nvrx-eks deploy {self.cli_flags}".rstrip()


def load_deployment(profile: str | None = None, config_path: str | None = None) -> Deployment:
    """Resolve `--profile`/`--config` (default: the p5 profile); ConfigError names the mistake."""
    return Deployment(resolve_config(profile, config_path), profile, config_path)
