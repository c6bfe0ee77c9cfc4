"""The checkpoint backends by name (`checkpoint.backend`), without torch: the trainer config
validates against them and `nvrx-eks local --help` lists them. One writer class per backend is in
workloads/checkpoint/writers.py."""

from __future__ import annotations

from typing import Literal, get_args

CheckpointBackend = Literal["nvrx", "dcp-async", "sync", "none"]
CHECKPOINT_BACKENDS: tuple[str, ...] = get_args(CheckpointBackend)
