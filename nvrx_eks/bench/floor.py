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
from pathlib import Path


def _timed(fn, synchronize) -> float:
    started = time.perf_counter()
    fn()
    synchronize()
    return time.perf_counter() - started


def _worker(rank: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(args.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank)
    )
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

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

    model_sd, optim_sd = training.states["model"].state_dict(), training.states["optim"].state_dict()
    sources: list[torch.Tensor] = []

    def collect(value) -> None:
        if isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                collect(item)
        elif isinstance(value, torch.Tensor):
            sources.append(value.to_local() if isinstance(value, DTensor) else value)

    collect({"model": model_sd, "optim": optim_sd})
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
    for index in range(args.repeats + 1):
        dist.barrier()
        copy_s = _timed(copy_into_staging, synchronize)
        dist.barrier()
        clone_s = _timed(clone_to_host, synchronize)
        if index > 0:  # the first round faults the staging pages in
            copies.append(copy_s)
            clones.append(clone_s)
    mine = {
        "rank": rank,
        "bytes": sum(t.numel() * t.element_size() for t in sources),
        "tensors": len(sources),
        "copy_s": copies,
        "clone_s": clones,
    }
    gathered: list[dict | None] = [None] * args.nproc
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        per_rank = [
            {**g, "copy_median_s": statistics.median(g["copy_s"]), "clone_median_s": statistics.median(g["clone_s"])}
            for g in gathered
            if g is not None  # all_gather_object fills every slot
        ]
        slowest = max(per_rank, key=lambda g: g["copy_median_s"])
        result = {
            "preset": args.preset,
            "nproc": args.nproc,
            "device": runtime.device.type,
            "dist_backend": runtime.backend,
            "repeats": args.repeats,
            "bytes_per_rank": max(g["bytes"] for g in per_rank),
            "copy_s": slowest["copy_median_s"],
            "clone_s": max(g["clone_median_s"] for g in per_rank),
            "copy_gbps": slowest["bytes"] / slowest["copy_median_s"] / 1e9,
            "destination": "pinned host memory" if pin else "host memory",
            "per_rank": per_rank,
        }
        Path(args.json).write_text(json.dumps(result, indent=1))
    # Both ranks leave together: a rank tearing gloo down while its peer is still in the last
    # collective's aftermath has aborted here ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


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
