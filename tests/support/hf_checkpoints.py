"""Committed checkpoints for the Hugging Face export and import tests, laid out as the trainer's
Checkpointer lays them out (nvrx_eks.facts.checkpoint_layout), and our model read back from one."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from nvrx_eks.facts import checkpoint_layout as layout
from workloads.checkpoint.files import file_digest
from workloads.checkpoint.safe_load import SafeFileSystemReader, TensorsOnlyLoadPlanner
from workloads.model import Transformer
from workloads.presets import MODEL_PRESETS


def step_dir(run: Path, step: int) -> Path:
    return run / "checkpoints" / layout.step_dir_name(step, "test")


def commit(path: Path, *, preset: str, world_size: int) -> None:
    """The commit record (every file's size and SHA-256) and the pointer naming `path`."""
    files = {p.name: file_digest(p, with_sha=True) for p in sorted(path.iterdir()) if p.is_file()}
    record = {"step": layout.step_of(path.name), "files": files, "preset": preset, "world_size": world_size}
    (path / layout.COMMIT_FILE).write_text(json.dumps(record))
    (path.parent / layout.POINTER_FILE).write_text(layout.pointer_text([path.name]))


def write_checkpoint(run: Path, state: dict[str, Any], *, preset: str, step: int) -> Path:
    """`state` saved by one process as a committed checkpoint of `run`; returns `run`."""
    path = step_dir(run, step)
    with warnings.catch_warnings():  # one process on purpose; DCP warns that no group is up
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)
    commit(path, preset=preset, world_size=1)
    return run


def our_model(path: Path, preset: str) -> Transformer:
    """Our (unsharded) model with the parameters of the checkpoint in `path`, in eval mode."""
    model = Transformer(MODEL_PRESETS[preset])
    model.init_weights(0, torch.device("cpu"))  # materializes the RoPE tables; loaded over below
    state = {f"model.{name}": tensor for name, tensor in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(state, storage_reader=SafeFileSystemReader(str(path)), planner=TensorsOnlyLoadPlanner(), no_dist=True)
    return model.eval()
