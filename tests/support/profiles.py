"""Copies of the shipped profiles with a few fields changed, as a DeploymentConfig or as a file
for `--config`: what a user does to the examples before deploying."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from infra.config import PROFILES_DIR, DeploymentConfig


def profile_data(profile: str = "p5", **changes: Any) -> dict:
    """A shipped profile's YAML with dotted-path changes given with `__`
    (`gpu_nodes__max_size=16`); a value of None removes the field."""
    raw = copy.deepcopy(yaml.safe_load((PROFILES_DIR / f"{profile}.yaml").read_text()))
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = raw
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return raw


def config_with(profile: str = "p5", **changes: Any) -> DeploymentConfig:
    return DeploymentConfig.model_validate(profile_data(profile, **changes))


def profile_file(directory: Path, profile: str = "p5", **changes: Any) -> Path:
    """The changed profile written to `directory`/<profile>.yaml, for `--config`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{profile}.yaml"
    path.write_text(yaml.safe_dump(profile_data(profile, **changes), sort_keys=False))
    return path
