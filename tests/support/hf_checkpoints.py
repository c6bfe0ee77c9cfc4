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
from workloads.presets import MODEL_PRESETS, ModelShape


def step_dir(run: Path, step: int) -> Path:
    return run / "checkpoints" / layout.step_dir_name(step, "test")


def commit(path: Path, *, preset: str, world_size: int, model_shape: dict[str, Any] | None = None) -> None:
    """The commit record (every file's size and SHA-256) and the pointer naming `path`; without
    `model_shape`, a record as written before custom shapes (no model_shape field)."""
    files = {p.name: file_digest(p, with_sha=True) for p in sorted(path.iterdir()) if p.is_file()}
    record = {"step": layout.step_of(path.name), "files": files, "preset": preset, "world_size": world_size}
    if model_shape is not None:
        record["model_shape"] = model_shape
    (path / layout.COMMIT_FILE).write_text(json.dumps(record))
    (path.parent / layout.POINTER_FILE).write_text(layout.pointer_text([path.name]))


def write_checkpoint(
    run: Path, state: dict[str, Any], *, preset: str, step: int, model_shape: dict[str, Any] | None = None
) -> Path:
    """`state` saved by one process as a committed checkpoint of `run`; returns `run`."""
    path = step_dir(run, step)
    with warnings.catch_warnings():  # one process on purpose; DCP warns that no group is up
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)
    commit(path, preset=preset, world_size=1, model_shape=model_shape)
    return run


def our_model(path: Path, shape: str | ModelShape) -> Transformer:
    """Our (unsharded) model of `shape` (or a preset's) with the parameters of the checkpoint in
    `path`, in eval mode."""
    model = Transformer(MODEL_PRESETS[shape] if isinstance(shape, str) else shape)
    model.init_weights(0, torch.device("cpu"))  # materializes the RoPE tables; loaded over below
    state = {f"model.{name}": tensor for name, tensor in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(state, storage_reader=SafeFileSystemReader(str(path)), planner=TensorsOnlyLoadPlanner(), no_dist=True)
    return model.eval()


#: config.json of Meta's Llama 3.1 8B as published (the fields a loader reads).
LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
