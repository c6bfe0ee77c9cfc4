"""How often a process that used gloo aborts in the interpreter's teardown, against ending with
workloads.process_exit. Each round is three gloo ranks (processes) that shard the tiny model over
a device mesh, save it with DCP, meet at a barrier and destroy the process group: all the work is
done and written when the process ends. The two endings alternate round by round, so the machine's
load drifts over both alike. Prints one line per ending: rounds, rounds with a rank that exited
non-zero, and the signals seen.

Usage: .venv/bin/python scripts/gloo_teardown_aborts.py [ROUNDS]   (default 50 per ending)
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORLD = 3


def _rank(rank: int, port: int, out: str, ending: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from workloads.device import Runtime
    from workloads.model import build_model
    from workloads.presets import MODEL_PRESETS
    from workloads.process_exit import exit_without_finalizing

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    runtime = Runtime(device=torch.device("cpu"), backend="gloo", bf16=False, pg_timeout_s=60)
    mesh = init_device_mesh("cpu", (WORLD,))
    model = build_model(MODEL_PRESETS["tiny"], runtime, mesh, seed=0, checkpointed_blocks=2)
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=out)
    dist.barrier()
    dist.destroy_process_group()
    if ending == "exit_without_finalizing":
        exit_without_finalizing(0)


def main() -> None:
    from nvrx_eks.local.processes import free_port_pair

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    endings = ("finalizing", "exit_without_finalizing")
    failed = collections.Counter()
    signals: dict[str, collections.Counter] = {e: collections.Counter() for e in endings}
    for _ in range(rounds):
        for ending in endings:
            with tempfile.TemporaryDirectory() as out:
                try:
                    mp.start_processes(_rank, args=(free_port_pair(), out, ending), nprocs=WORLD)
                except mp.ProcessExitedException as err:
                    failed[ending] += 1
                    signals[ending][err.signal_name or f"exit {err.exit_code}"] += 1
    for ending in endings:
        seen = ", ".join(f"{name} x{n}" for name, n in signals[ending].items()) or "none"
        print(f"{ending}: {rounds} rounds, {failed[ending]} with a rank that did not exit 0 ({seen})")


if __name__ == "__main__":
    main()
