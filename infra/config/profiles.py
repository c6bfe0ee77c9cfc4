"""Loading a deployment config: a named profile (infra/profiles/NAME.yaml) or a YAML file."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import yaml
from pydantic import ValidationError

from infra.config.deployment import DeploymentConfig
from nvrx_eks.facts.errors import ConfigError, describe_validation_error
from nvrx_eks.facts.user_yaml import load_user_yaml, read_user_text

#: The profiles that ship with the package (package data of `infra`).
PROFILES_DIR = Path(str(files("infra") / "profiles"))
DEFAULT_PROFILE = "p5"


def profile_path(profile: str) -> Path:
    path = PROFILES_DIR / f"{profile}.yaml"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.yaml")))
        raise ConfigError(
            f"unknown profile '{profile}': choose one of {names}, or give a deployment config file "
            "(nvrx-eks: --config PATH; cdk: -c config=PATH)"
        )
    return path


def load_config(path: str | Path) -> DeploymentConfig:
    """Load and validate a profile file. Raises ConfigError naming the field and the fix."""
    path = Path(path)
    try:
        raw = load_user_yaml(read_user_text(path), str(path))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory; give the path of a deployment config YAML") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}; check the path and its permissions") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not a text file (not UTF-8); give a deployment config YAML") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must contain a mapping of settings at the top level")
    try:
        return DeploymentConfig.model_validate(raw)
    except ValidationError as e:
        raise describe_validation_error(e, str(path)) from None


def resolve_config(profile: str | None = None, config: str | None = None) -> DeploymentConfig:
    """The config chosen by `-c profile=NAME` or `-c config=PATH` (default: the p5 profile)."""
    if profile and config:
        raise ConfigError("give either profile or config, not both")
    return load_config(config if config else profile_path(profile or DEFAULT_PROFILE))
