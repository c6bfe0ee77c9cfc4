"""The deployment config: a profile YAML loaded into a validated DeploymentConfig (the names below)."""

from infra.config.deployment import STACK_ROLES, DeploymentConfig
from infra.config.placeholders import Placeholder, documentation_placeholders
from infra.config.profiles import DEFAULT_PROFILE, PROFILES_DIR, load_config, profile_path, resolve_config

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES_DIR",
    "STACK_ROLES",
    "DeploymentConfig",
    "Placeholder",
    "documentation_placeholders",
    "load_config",
    "profile_path",
    "resolve_config",
]
