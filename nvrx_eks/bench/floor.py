"""The floor for a consistent checkpoint snapshot: one in-memory copy of every rank's shard.

    python -m nvrx_eks.bench.floor --preset small --nproc 2 --repeats 5 --json OUT.json

Any checkpoint that is consistent (taken between two optimizer steps) and lets training go on
must at least copy the rank's state once before the next step can change it. This measures that
copy on the trainer's own state: each rank builds the model exactly as the trainer does (FSDP2
over `nproc` ranks, AdamW, one training step so the optimizer moments exist), takes the state
dict the trainer checkpoints (its model and optimizer states: sharded parameters and both AdamW
moments), and
times copying every local tensor of it into destination buffers that were allocated and touched
beforehand, as a persistent staging area is:

* CPU: plain host memory (a memcpy);
* CUDA: pinned host memory, followed by a device synchronize (the device-to-host transfer every
  snapshot of GPU state has to make).

All ranks copy at the same moment (after a barrier), as they do when they save, so they share the
memory bandwidth the same way. The first copy also faults the destination pages in and is not
counted; the result is the median of `repeats` later copies, per rank, and the slowest rank's
median (a snapshot is complete when the slowest rank is). A fresh `clone()` of the same tensors
(allocating each time) is timed alongside for reference: it is what a snapshot without a
persistent staging area pays.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workloads.process_exit import exit_without_finalizing

if TYPE_CHECKING:
    import torch

    from workloads.device import Runtime


def _timed(fn: Callable[[], None], synchronize: Callable[[], None]) -> float:
    started = time.perf_counter()
    fn()
    synchronize()
    return time.perf_counter() - started


def _worker(rank: int, args: argparse.Namespace, port: int) -> None:
    """One rank: the trainer's state, its copies timed, rank 0 writing every rank's timings."""
    runtime, sources = _trainer_state(rank, args, port)
    import torch.distributed as dist

    mine = {"rank": rank, **_time_copies(sources, runtime, args.repeats)}
    gathered: list[dict | None] = [None] * args.nproc
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        # all_gather_object fills every slot
        result = _floor_result([g for g in gathered if g is not None], args, runtime)
        Path(args.json).write_text(json.dumps(result, indent=1))
    # Both ranks leave together, and without finalizing: a process that used gloo can abort
    # while its interpreter is torn down (workloads.process_exit).
    dist.barrier()
    dist.destroy_process_group()
    exit_without_finalizing(0)


def _trainer_state(rank: int, args: argparse.Namespace, port: int) -> tuple[Runtime, list[torch.Tensor]]:
    """This rank in the process group, and the local tensors of the state the trainer
    checkpoints, built exactly as the trainer builds it, after one training step."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(args.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank)
    )
    import torch.distributed as dist

    from workloads.config import TrainConfig
    from workloads.device import resolve_runtime
    from workloads.training import build_training

    cfg = TrainConfig.from_dict(
        {},
        "bench floor",
        [
            f"model.preset={args.preset}",
            f"distributed.backend={args.dist_backend}",
            "data.seq_len=32",
            "data.batch_size=1",
        ],
    )
    runtime = resolve_runtime(cfg)
    dist.init_process_group(
        runtime.backend, rank=rank, world_size=args.nproc, device_id=runtime.device if runtime.is_cuda else None
    )
    training = build_training(cfg, runtime, rank, args.nproc)  # exactly as the trainer builds it
    inputs, targets = training.batches.next_batch()
    training.model(inputs.to(runtime.device), targets.to(runtime.device)).backward()
    training.optimizer.step()  # creates the AdamW moments, which are two thirds of the checkpoint
    state = {"model": training.states["model"].state_dict(), "optim": training.states["optim"].state_dict()}
    return runtime, _local_tensors(state)


def _local_tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in a nested state dict, a DTensor as this rank's shard of it."""
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(value, dict):
        return [t for item in value.values() for t in _local_tensors(item)]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _local_tensors(item)]
    if isinstance(value, torch.Tensor):
        return [value.to_local() if isinstance(value, DTensor) else value]
    return []


def _time_copies(sources: list[torch.Tensor], runtime: Runtime, repeats: int) -> dict[str, Any]:
    """This rank's state size and, for each of `repeats` rounds after a first one, the time to
    copy it into staging buffers allocated beforehand and to clone it to the host."""
    import torch
    import torch.distributed as dist

    pin = runtime.is_cuda
    staging = [torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin) for t in sources]
    synchronize = torch.cuda.synchronize if runtime.is_cuda else (lambda: None)

    def copy_into_staging() -> None:
        for dst, src in zip(staging, sources, strict=True):
            dst.copy_(src, non_blocking=pin)

    def clone_to_host() -> None:
        # Kept until every tensor is copied: a snapshot holds all of them at once.
        snapshot = [src.detach().to("cpu", copy=True) for src in sources]
        del snapshot

    copies, clones = [], []
    for index in range(repeats + 1):
        dist.barrier()
        copy_s = _timed(copy_into_staging, synchronize)
        dist.barrier()
        clone_s = _timed(clone_to_host, synchronize)
        if index > 0:  # the first round faults the staging pages in
            copies.append(copy_s)
            clones.append(clone_s)
    return {
        "bytes": sum(t.numel() * t.element_size() for t in sources),
        "tensors": len(sources),
        "copy_s": copies,
        "clone_s": clones,
    }


def _floor_result(gathered: list[dict], args: argparse.Namespace, runtime: Runtime) -> dict[str, Any]:
    """The floor: each rank's medians, and the slowest rank's, since a snapshot is complete
    when the slowest rank's copy is."""
    per_rank = [
        {**g, "copy_median_s": statistics.median(g["copy_s"]), "clone_median_s": statistics.median(g["clone_s"])}
        for g in gathered
    ]
    slowest = max(per_rank, key=lambda g: g["copy_median_s"])
    return {
        "preset": args.preset,
        "nproc": args.nproc,
        "device": runtime.device.type,
        "dist_backend": runtime.backend,
        "repeats": args.repeats,
        "bytes_per_rank": max(g["bytes"] for g in per_rank),
        "copy_s": slowest["copy_median_s"],
        "clone_s": max(g["clone_median_s"] for g in per_rank),
        "copy_gbps": slowest["bytes"] / slowest["copy_median_s"] / 1e9,
        "destination": "pinned host memory" if runtime.is_cuda else "host memory",
        "per_rank": per_rank,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dist-backend", default="auto", choices=("auto", "gloo", "nccl"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--json", required=True, help="where rank 0 writes the result")
    args = parser.parse_args(argv)
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(args, args.port), nprocs=args.nproc)


if __name__ == "__main__":
    main()
