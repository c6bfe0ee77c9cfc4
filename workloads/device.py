"""Device, backend and precision: decided here and nowhere else.

Backend nccl: one GPU per rank (LOCAL_RANK), NCCL. Backend gloo: CPU. `auto` picks nccl when CUDA
is visible, else gloo; it serves laptops and CI. The precision is distributed.precision resolved
against that backend (DistributedConfig.resolved_precision): auto is bf16 compute with fp32 master
weights and fp32 gradient reduction on nccl, fp32 on gloo. Manifests for GPU nodes always say nccl
and bf16 (nvrx_eks/jobs/spec.py), so a pod that cannot see its GPUs fails at start-up with exit 93
instead of training on CPU: the CPU shims (workloads.cuda_compat) follow the resolved backend,
never the mere absence of CUDA.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch

from nvrx_eks.facts.errors import ConfigError
from workloads.config import TrainConfig
from workloads.process_env import CUDA_ALLOC_CONF


class GpusMissing(ConfigError):
    """Backend nccl but fewer visible GPUs than local ranks: no restart can fix that."""


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    backend: str  # "gloo" | "nccl"
    bf16: bool  # distributed.precision resolved against the backend
    pg_timeout_s: float

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def resolved_backend(cfg: TrainConfig) -> str:
    """ "gloo" or "nccl": the configured backend, with auto decided by CUDA's presence."""
    backend = cfg.distributed.backend
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return backend


def check_gpus_visible(local_rank: int, local_world_size: int) -> None:
    """Raise GpusMissing unless every local rank has its own visible GPU."""
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < local_world_size or local_rank >= visible:
        raise GpusMissing(
            f"distributed.backend: nccl needs one GPU per local rank, but this process sees "
            f"{visible} GPU(s) for {local_world_size} local rank(s) (LOCAL_RANK={local_rank}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); check the "
            "pod's nvidia.com/gpu request, the NVIDIA device plugin and the driver, or run "
            "with distributed.backend=gloo on a machine without GPUs"
        )


def resolve_runtime(cfg: TrainConfig) -> Runtime:
    backend = resolved_backend(cfg)
    # Before any device set-up: a precision the backend cannot run is a config error, not a restart.
    precision = cfg.distributed.resolved_precision(backend)
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        check_gpus_visible(local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        # Pods and the image have it in the environment from the start (workloads.process_env);
        # a run started another way gets it here, before the trainer's first CUDA allocation
        # (unless the environment sets its own).
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", CUDA_ALLOC_CONF)
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return Runtime(
        device=device, backend=backend, bf16=precision == "bf16", pg_timeout_s=cfg.resolved_pg_timeout_s(backend)
    )


def to_device(batch: torch.Tensor, runtime: Runtime) -> torch.Tensor:
    """A host tensor on the runtime's device. On CUDA through pinned memory and without waiting:
    a pageable host-to-device copy stages through a driver buffer and blocks the host until the
    GPU has drained its queue, so the host could not enqueue the next forward (and FSDP's first
    all-gather) under the tail of the previous backward. The pinned block stays reserved until
    the copy is done (torch's caching host allocator records the copy's stream)."""
    if not runtime.is_cuda:
        return batch
    return batch.pin_memory().to(runtime.device, non_blocking=True)


def reset_peak_memory(runtime: Runtime) -> None:
    """Start the GPU memory high-water mark afresh (CUDA only): at each in-process iteration's
    setup, so the peak run_end reports is that iteration's, not the process's since start (a
    failed iteration's memory would otherwise be counted against the next one's estimate)."""
    if runtime.is_cuda:
        torch.cuda.reset_peak_memory_stats(runtime.device)


def allocator_counters(runtime: Runtime) -> dict[str, int | None]:
    """The caching allocator's state for the events (None off CUDA): the bytes it holds from the
    device now (at an iteration's start: what earlier iterations left cached) and how often an
    allocation found no cached block that fit, freed the cache and tried again (num_alloc_retries:
    each one a device-wide synchronization; any at all means the reserved peak met the GPU's
    limit, whatever the estimate said)."""
    if not runtime.is_cuda:
        return {"gpu_reserved_bytes": None, "gpu_alloc_retries": None}
    stats = torch.cuda.memory_stats(runtime.device)
    return {
        "gpu_reserved_bytes": stats.get("reserved_bytes.all.current"),
        "gpu_alloc_retries": stats.get("num_alloc_retries"),
    }


def peak_memory_reserved(runtime: Runtime) -> int | None:
    """Bytes the caching allocator held at most since reset_peak_memory (None off CUDA): what
    must fit, and what workloads.memory's `allocator_reserved` estimates."""
    return torch.cuda.max_memory_reserved(runtime.device) if runtime.is_cuda else None


def release_cached_memory(runtime: Runtime) -> None:
    """Collect what nothing references any more and give the caching allocator's free blocks back
    to the device (CUDA only): at an in-process restart, the failed iteration's. Blocks cached on
    its FSDP streams could not serve the new model's streams, and would start the next
    iteration's high-water mark from the failed one's footprint."""
    gc.collect()
    if runtime.is_cuda:
        torch.cuda.empty_cache()
