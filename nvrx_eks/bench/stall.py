"""Side-by-side checkpoint stall: NVRx async vs a synchronous save of the same state, one run
(torch's dcp.async_save measured alongside for comparison).

    python -m nvrx_eks.bench.stall [--preset small] [--nproc 2] [--saves 8]
        [--steps-between 2] [--warmup 2] [--dir DIR]

Each round trains a few steps, then saves the live FSDP2 model + AdamW state twice, through the
same Checkpointer code the trainer uses: once with checkpoint.backend=nvrx (blocking time = the
hand-off: planning and the copy into shared memory; the write then overlaps the next steps) and
once with checkpoint.backend=sync (blocking time = the whole write plus the commit), and once
with checkpoint.backend=dcp-async (staging copy on the calling thread, write in a thread). The first
`--warmup` rounds are excluded from the medians: NVRx's first save plans, allocates the shared
memory and ships it to the worker. Prints per-save numbers and the medians; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from nvrx_eks.facts.checkpoint_layout import run_identity


def _worker(rank: int, args: argparse.Namespace, port: int, results: dict) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(args.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank)
    )
    from workloads.checkpoint.checkpointer import Checkpointer
    from workloads.config import TrainConfig
    from workloads.device import resolve_runtime
    from workloads.events import EventLog
    from workloads.faults import FaultInjector
    from workloads.training import build_training

    run_dir = Path(args.dir)
    base = [
        f"run_dir={run_dir}",
        f"model.preset={args.preset}",
        "data.seq_len=128",
        "data.batch_size=2",
        "checkpoint.keep=2",
        "checkpoint.verify=size",
    ]
    cfg = {
        b: TrainConfig.from_dict({}, "measure", [*base, f"checkpoint.backend={b}", f"checkpoint.dir={run_dir}/{b}"])
        for b in ("nvrx", "sync", "dcp-async")
    }
    runtime = resolve_runtime(cfg["nvrx"])
    dist.init_process_group(runtime.backend, rank=rank, world_size=args.nproc)
    training = build_training(cfg["nvrx"], runtime, rank, args.nproc)  # exactly as the trainer builds it
    model, optimizer, batches = training.model, training.optimizer, training.batches
    events = EventLog(run_dir, rank)
    no_faults = FaultInjector((), rank, run_dir / "faults", events.emit)
    identity = run_identity(args.nproc, args.preset)
    savers = {
        b: Checkpointer(
            c, events=events, faults=no_faults, identity=identity, device=runtime.device, states=training.states
        )
        for b, c in cfg.items()
    }

    def train_step() -> float:
        started = time.monotonic()
        inputs, targets = batches.next_batch()
        loss = model(inputs.to(runtime.device), targets.to(runtime.device))  # as the trainer
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        savers["nvrx"].poll()  # the trainer polls for the async commit once per step
        return time.monotonic() - started

    def state(step: int) -> dict:
        training.progress.step = step
        return savers["nvrx"].state_dict()

    rows, step_times = [], []
    for round_index in range(args.saves):
        for _ in range(args.steps_between):
            step_times.append(train_step())
        step = (round_index + 1) * args.steps_between
        waited = time.monotonic()
        savers["nvrx"].wait()  # previous async save; normally committed during the steps above
        waited = time.monotonic() - waited
        dist.barrier()
        t = time.monotonic()
        savers["nvrx"].save(step, state(step))
        nvrx_stall = time.monotonic() - t
        dist.barrier()
        savers["nvrx"].wait()  # keep the two measurements from overlapping
        dist.barrier()
        t = time.monotonic()
        savers["sync"].save(step, state(step))
        sync_stall = time.monotonic() - t
        dist.barrier()
        t = time.monotonic()
        savers["dcp-async"].save(step, state(step))
        dcp_async_stall = time.monotonic() - t
        savers["dcp-async"].wait()
        rows.append((round_index, nvrx_stall, sync_stall, dcp_async_stall, waited))
    for saver in savers.values():
        saver.close()
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        from workloads.checkpoint.files import committed_checkpoints

        latest = run_dir / "sync" / committed_checkpoints(run_dir / "sync")[0]
        results.update(
            rows=rows,
            step_s=statistics.median(step_times),
            params=params,
            shard_mb=sum(f.stat().st_size for f in latest.glob("*.distcp")) / 2**20 / args.nproc,
        )
    dist.destroy_process_group()
    # Ends by finalizing, not by workloads.process_exit: NVRx's write-results queue lives in a
    # Manager process of this rank's that only finalizing stops (under the trainer it dies with its
    # rank: workloads.helper_processes). The rare abort while finalizing comes after the results
    # are in `results`.


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--saves", type=int, default=8)
    parser.add_argument("--steps-between", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    args.dir = args.dir or tempfile.mkdtemp(prefix="stall-")
    port = 29000 + os.getpid() % 1000
    with mp.Manager() as manager:
        shared = manager.dict()
        mp.spawn(_worker, args=(args, port, shared), nprocs=args.nproc)
        results = dict(shared)
    rows = results["rows"]
    print(
        f"preset {args.preset}: {results['params'] / 1e6:.1f}M params, {args.nproc} ranks, "
        f"~{results['shard_mb']:.0f} MiB written per rank per save, median step "
        f"{results['step_s']:.3f}s"
    )
    print(
        f"{'save':>4} {'nvrx stall s':>13} {'sync save s':>12} {'dcp-async stall s':>18} "
        f"{'nvrx prev-commit wait s':>24}"
    )
    for index, nvrx, sync, dcp_async, waited in rows:
        tag = "  (warm-up)" if index < args.warmup else ""
        print(f"{index:>4} {nvrx:>13.3f} {sync:>12.3f} {dcp_async:>18.3f} {waited:>24.3f}{tag}")
    steady = rows[args.warmup :]
    nvrx_median = statistics.median(r[1] for r in steady)
    sync_median = statistics.median(r[2] for r in steady)
    dcp_async_median = statistics.median(r[3] for r in steady)
    print(
        f"median after warm-up: nvrx {nvrx_median:.3f}s, sync {sync_median:.3f}s "
        f"({sync_median / nvrx_median:.0f}x less blocking with nvrx); "
        f"dcp-async {dcp_async_median:.3f}s"
    )


if __name__ == "__main__":
    main()
