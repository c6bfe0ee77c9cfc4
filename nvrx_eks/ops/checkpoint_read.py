"""A committed checkpoint read on a CPU, outside the job (`nvrx-eks export`, `nvrx-eks eval`): find
it from a run directory, check every file against its commit record, and read one full tensor at a
time from the rank shards holding its pieces.

The checkpoint is untrusted input (FSx is writable by every pod): its metadata is read by the
restricted unpickler of workloads.checkpoint.safe_load and its tensors by torch.load with
weights_only, and each file is checked against the commit record first.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from pydantic import ValidationError
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from nvrx_eks.facts import checkpoint_layout as layout
from nvrx_eks.facts.errors import ConfigError
from workloads.checkpoint.files import file_digest
from workloads.checkpoint.safe_load import SafeFileSystemReader, TensorsOnlyLoadPlanner
from workloads.config import TrainConfig
from workloads.hf_format import parameter_shapes
from workloads.model_config import SHAPE_FIELDS, ModelConfig
from workloads.presets import MODEL_PRESETS, ModelShape

#: The config.yaml a run directory holds (written by `nvrx-eks local` and the rehearsals).
RUN_CONFIG_FILE = "config.yaml"
#: Where the model's tensors sit in a checkpoint (workloads.training's state keys).
MODEL_KEY = "model"


@dataclass(frozen=True)
class RunCheckpoints:
    checkpoint_dir: Path
    config: TrainConfig | None


def find_run(run: Path) -> RunCheckpoints:
    """RUN is a run directory (its config.yaml says where the checkpoints are, else
    RUN/checkpoints) or a checkpoint directory itself (it holds the pointer or step directories)."""
    if not run.is_dir():
        raise ConfigError(f"RUN: {run} is not a directory; give a run directory or its checkpoint directory")
    if (run / layout.POINTER_FILE).exists() or layout.checkpoint_dirs(run):
        return RunCheckpoints(run, None)
    config = TrainConfig.from_yaml(run / RUN_CONFIG_FILE) if (run / RUN_CONFIG_FILE).is_file() else None
    # An explicit checkpoint.dir is where the run wrote; the default one is relative to the run
    # directory, which may since have been copied or moved (run_dir in the config is its old place).
    explicit = config.checkpoint.dir if config is not None else None
    return RunCheckpoints(Path(explicit) if explicit else run / "checkpoints", config)


def committed_step(ckpt_dir: Path, step: int | None) -> Path:
    state = layout.commit_state(ckpt_dir)
    if state.source == "lost":
        raise ConfigError(f"RUN: {state.warning}")
    if not state.committed:
        raise ConfigError(f"RUN: no committed checkpoint under {ckpt_dir}; give a run that saved one")
    if step is None:
        return ckpt_dir / state.committed[0]
    for name in state.committed:
        if layout.step_of(name) == step:
            return ckpt_dir / name
    steps = ", ".join(str(layout.step_of(n)) for n in state.committed)
    raise ConfigError(f"--step {step}: no committed checkpoint of that step under {ckpt_dir}; committed: {steps}")


def verified_commit(path: Path) -> dict[str, Any]:
    """The commit record, after checking every file it lists (sizes, and the SHA-256 recorded)."""
    manifest = layout.verified_commit(path)
    if manifest is None:
        raise ConfigError(f"RUN: {path} has no valid {layout.COMMIT_FILE} or a file is missing or truncated")
    for name, (size, sha) in manifest["files"].items():
        if sha is not None and file_digest(path / name, with_sha=True) != [size, sha]:
            raise ConfigError(f"RUN: {path / name} does not match its commit record (damaged); give another --step")
    return manifest


class OneMetadataReader(SafeFileSystemReader):
    """SafeFileSystemReader that unpickles the metadata once for the many one-tensor loads."""

    _metadata: Metadata | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._metadata is None:
            self._metadata = super().read_metadata(*args, **kwargs)
        return self._metadata


def recorded_model(path: Path, manifest: dict[str, Any]) -> ModelConfig:
    """The model a commit record names: its preset and the shape fields set over it (the record
    is read back from storage: a field that is not a shape field, or a shape the model cannot
    take, is refused naming the record)."""
    record = path / layout.COMMIT_FILE
    preset, changes = manifest.get("preset"), layout.recorded_model_shape(manifest)
    if preset not in MODEL_PRESETS:
        raise ConfigError(f"RUN: {record} names model preset {preset!r}, which this version lacks")
    if not isinstance(changes, dict) or not set(changes) <= set(SHAPE_FIELDS):
        raise ConfigError(f"RUN: {record} records a model shape this version does not know: {changes!r}")
    try:
        return ModelConfig.model_validate({"preset": preset, **changes})
    except ValidationError as err:
        reason = err.errors()[0]["msg"].removeprefix("Value error, ").split("\n")[0]
        raise ConfigError(f"RUN: {record} records a model shape the model cannot take: {reason}") from None


def model_tensors(metadata: Metadata, shape: ModelShape, noun: str, path: Path) -> dict[str, torch.dtype]:
    """Our parameter name -> its dtype in the checkpoint, after checking every shape against the
    model's (`noun` in messages: ModelConfig.noun)."""
    stored = metadata.state_dict_metadata
    dtypes = {}
    for name, size in parameter_shapes(shape).items():
        entry = stored.get(f"{MODEL_KEY}.{name}")
        if not isinstance(entry, TensorStorageMetadata):
            raise ConfigError(f"RUN: {path} holds no tensor {MODEL_KEY}.{name}; not a checkpoint of {noun}")
        if tuple(entry.size) != size:
            raise ConfigError(
                f"RUN: {path}: tensor {MODEL_KEY}.{name} has shape {list(entry.size)}, {noun} has {list(size)}"
            )
        dtypes[name] = entry.properties.dtype
    return dtypes


def read_tensor(reader: OneMetadataReader, name: str, size: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """One full parameter, assembled from the rank shards that hold its pieces."""
    tensor = torch.empty(size, dtype=dtype)
    with warnings.catch_warnings():
        # no_dist is the intent: one process reads what every rank wrote; DCP warns about it.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load({f"{MODEL_KEY}.{name}": tensor}, storage_reader=reader, planner=TensorsOnlyLoadPlanner(), no_dist=True)
    return tensor
