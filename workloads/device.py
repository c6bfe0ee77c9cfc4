"""Device, backend and precision: decided here and nowhere else.

CUDA present and backend nccl (or auto): one GPU per rank (LOCAL_RANK), NCCL, bf16 compute with
fp32 master weights and fp32 gradient reduction. Otherwise: CPU, gloo, fp32.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from workloads.config import TrainConfig
from workloads.errors import ConfigError


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    backend: str  # "gloo" | "nccl"
    bf16: bool
    pg_timeout_s: float

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def resolve_runtime(cfg: TrainConfig) -> Runtime:
    cuda = torch.cuda.is_available()
    backend = cfg.distributed.backend
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    if backend == "nccl" and not cuda:
        raise ConfigError("distributed.backend: nccl needs CUDA GPUs and none are visible; "
                          "use gloo or auto")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return Runtime(device=device, backend=backend, bf16=device.type == "cuda",
                   pg_timeout_s=cfg.resolved_pg_timeout_s(backend))
