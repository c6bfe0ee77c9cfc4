"""`model.init_from`: a run starts from Hugging Face Llama weights instead of a random
initialization, each rank reading only the rows its FSDP2 shards hold.

A parameter of the sharded model is a DTensor; its placements (Shard(0) over the mesh, or
Replicate x Shard(0) with distributed.shard=hybrid) say which rows of the full tensor this rank
keeps. Those rows, widened to whole heads for wq and wk (whose rows change places within a head
between the two layouts, workloads.hf_format), are read from the safetensors file with
`safe_open(...).get_slice`, which reads that byte range only: no rank ever holds a full copy of a
tensor, let alone of the model. Shapes, names and config.json are checked before anything is read
(hf_format.open_checkpoint), so a mismatch is refused naming the tensor.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from workloads.hf_format import HfCheckpoint, from_hf, hf_name, open_checkpoint, rows_per_block
from workloads.model import Transformer

log = logging.getLogger(__name__)


def local_rows(param: torch.Tensor) -> tuple[int, int]:
    """The rows [start, stop) of the full parameter this rank holds (all of them when unsharded)."""
    if not isinstance(param, DTensor):
        return 0, param.shape[0]
    local_shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    if any(offset[1:]) or tuple(local_shape[1:]) != tuple(param.shape[1:]):
        raise ValueError(f"a parameter sharded along a dimension other than 0 ({param.placements}); not supported")
    return offset[0], offset[0] + local_shape[0]


def read_rows(source: HfCheckpoint, name: str, start: int, stop: int, model: Transformer) -> torch.Tensor:
    """Rows [start, stop) of our parameter `name`, in our layout, read from the checkpoint."""
    stored = source.tensors[hf_name(name)]
    block = rows_per_block(name, model.shape)
    first, last = start // block * block, -(-stop // block) * block
    with safe_open(str(stored.file), framework="pt", device="cpu") as f:
        rows = f.get_slice(hf_name(name))[first:last]
    return from_hf(name, rows, model.shape)[start - first : stop - first]


@torch.no_grad()
def load_hf_weights(model: Transformer, root: str | Path, noun: str, rope_scaling: dict[str, Any] | None) -> None:
    """Overwrite `model`'s parameters (sharded or not) with the checkpoint in `root`. Raises
    ConfigError naming the field or tensor that does not match the model (`noun` in messages:
    ModelConfig.noun)."""
    source = open_checkpoint(root, model.shape, noun, rope_scaling)
    for name, param in model.named_parameters():
        name = name.replace(_CHECKPOINT_PREFIX, "")  # the same name with activation checkpointing
        start, stop = local_rows(param)
        local = param.to_local() if isinstance(param, DTensor) else param
        if stop > start:
            local.copy_(read_rows(source, name, start, stop, model))
    log.info("model initialized from %s", root)
