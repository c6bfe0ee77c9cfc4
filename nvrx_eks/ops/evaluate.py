"""`nvrx-eks eval RUN [--step N]`: the held-out loss of a committed checkpoint, on CPU.

The checkpoint is found, verified and read as `nvrx-eks export` reads it (nvrx_eks.ops.hf_export:
the commit record checked, the metadata through the restricted unpickler, each parameter
assembled from the rank shards holding it, no process group); the model is the trainer's
Transformer, unsharded; the loss is the trainer's own evaluation (workloads.evaluation) over the
same held-out sequences, so it matches the run's `eval_end` at that step up to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from nvrx_eks.facts import checkpoint_layout as layout
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.ops.checkpoint_read import (
    RUN_CONFIG_FILE,
    OneMetadataReader,
    committed_step,
    find_run,
    model_tensors,
    read_tensor,
    recorded_model,
    verified_commit,
)
from workloads.config import TrainConfig
from workloads.evaluation import HeldOutShare
from workloads.hf_format import parameter_shapes
from workloads.model import Transformer


@dataclass(frozen=True)
class Evaluation:
    step: int
    checkpoint: Path
    loss: float
    sequences: int
    tokens: int


def evaluate_checkpoint(run: Path, *, step: int | None = None, train_config: Path | None = None) -> Evaluation:
    found = find_run(run)
    if train_config is not None:
        cfg = TrainConfig.from_yaml(train_config)
    elif found.config is not None:
        cfg = found.config
    else:
        raise ConfigError(
            f"RUN: no {RUN_CONFIG_FILE} in {run} to say what data and model the run used; give --train-config"
        )
    path = committed_step(found.checkpoint_dir, step)
    manifest = verified_commit(path)
    recorded = recorded_model(path, manifest)
    if recorded.shape != cfg.model.shape:
        raise ConfigError(
            f"RUN: {path / layout.COMMIT_FILE} is a checkpoint of {recorded.noun}, the config says "
            f"{cfg.model.noun}; give the run's own --train-config"
        )
    shape = cfg.model.shape
    reader = OneMetadataReader(str(path))
    dtypes = model_tensors(reader.read_metadata(), shape, cfg.model.noun, path)
    model = Transformer(shape, cfg.model.rope_scaling_settings)
    # Initialization computes the RoPE tables; every parameter is then replaced by the checkpoint's.
    model.init_weights(cfg.seed, torch.device("cpu"))
    tensors = {name: read_tensor(reader, name, size, dtypes[name]) for name, size in parameter_shapes(shape).items()}
    model.load_state_dict(tensors)
    share = HeldOutShare(cfg, rank=0, world=1)
    loss = share.mean_loss(model, torch.device("cpu"), ping=lambda: None)
    return Evaluation(layout.step_of(path.name), path, loss, share.sequences, share.tokens)
