"""The narrow compatibility layer that lets NVRx run without CUDA. Active only for the gloo backend.

Whether to install it follows the resolved backend (workloads.device.resolved_backend), never
the mere absence of CUDA: a GPU pod that lost its GPUs must fail (backend nccl, exit 93), not
have these shims quietly make NVRx CPU-only and drop its GPU health checks.

Two NVRx 0.7.0 behaviours break CPU-only runs, and nothing else is touched:

1. nvidia_resiliency_ext.checkpointing.async_ckpt calls `torch.cuda.current_device()` (to place
   the tiny tensors of its finalize all-reduces) and `torch.cuda.synchronize()` (after staging)
   unconditionally; both raise on a CPU-only torch. `install_cpu_checkpoint_shim` gives those
   three modules (core, state_dict_saver, filesystem_async) a `torch` whose `cuda.current_device()`
   is the CPU device and whose `cuda.synchronize()` does nothing, which is exactly right when no
   CUDA work can be pending. The rest of torch, and every other module, is untouched.

2. inprocess.Wrapper adds GPU/NVLink/NIC health checks when LOCAL_RANK is set at construction
   time (ft_launcher always sets it); without NVML they fail and end the job on the first restart.
   `local_rank_hidden_on_cpu` hides LOCAL_RANK only while the Wrapper is constructed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

_SHIMMED_MODULES = (
    "nvidia_resiliency_ext.checkpointing.async_ckpt.core",
    "nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver",
    "nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async",
)


class _CpuCuda:
    """torch.cuda as NVRx's checkpoint code sees it on a CPU-only machine."""

    def __getattr__(self, name: str):
        return getattr(torch.cuda, name)

    @staticmethod
    def current_device() -> torch.device:
        return torch.device("cpu")

    @staticmethod
    def synchronize(device=None) -> None:
        return None


class _TorchWithCpuCuda:
    cuda = _CpuCuda()

    def __getattr__(self, name: str):
        return getattr(torch, name)


def install_cpu_checkpoint_shim(backend: str) -> bool:
    """Make NVRx async checkpointing CUDA-free for a gloo run. Returns True if installed."""
    if backend != "gloo":
        return False
    import importlib

    for name in _SHIMMED_MODULES:
        module: Any = importlib.import_module(name)  # a module whose global `torch` is replaced
        if not isinstance(module.torch, _TorchWithCpuCuda):
            module.torch = _TorchWithCpuCuda()
    return True


@contextlib.contextmanager
def local_rank_hidden_on_cpu(backend: str) -> Iterator[None]:
    if backend != "gloo" or "LOCAL_RANK" not in os.environ:
        yield
        return
    saved = os.environ.pop("LOCAL_RANK")
    try:
        yield
    finally:
        os.environ["LOCAL_RANK"] = saved
