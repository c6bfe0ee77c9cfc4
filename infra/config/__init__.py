"""The deployment config: profile YAML -> DeploymentConfig, validated before any construct is built.

deployment.py holds the model, sections.py its sections, profiles.py the loading; the names
below are what the stacks, the CLI and the tests use.
"""

from infra.config.deployment import STACK_ROLES, DeploymentConfig
from infra.config.profiles import DEFAULT_PROFILE, PROFILES_DIR, load_config, profile_path, resolve_config

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES_DIR",
    "STACK_ROLES",
    "DeploymentConfig",
    "load_config",
    "profile_path",
    "resolve_config",
]
