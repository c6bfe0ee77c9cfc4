"""What a rank keeps across in-process restarts: identity, event log, ft_launcher connection,
fault injector, the SIGTERM flag and the store client (torch-free to import: the NVRx checkpoint
worker re-imports the entry point that imports this)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from workloads.config import TrainConfig
from workloads.events import EventLog
from workloads.faults import FaultInjector, parse_fault_spec
from workloads.ft_integration import FaultToleranceReporter


class ProcessState:
    """What outlives in-process restarts: identity, event log, ft connection, SIGTERM flag."""

    def __init__(self, cfg: TrainConfig, rank: int, world_size: int, store_port: int | None):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.store_port = store_port
        self.events = EventLog(cfg.run_dir, rank)
        self.ft = FaultToleranceReporter(cfg.fault_tolerance)
        self.faults = FaultInjector(
            parse_fault_spec(cfg.faults),
            rank,
            Path(cfg.run_dir) / "faults",
            self.events.emit,
            nproc_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        )
        self.sigterm_received = False
        self.restart_begin_t: float | None = None
        self.iteration_objects: dict[str, Any] = {}
        self.wrapper_store: Any = None  # a torch.distributed.TCPStore once the first iteration made it

    def drop_iteration_state(self) -> None:
        """The in-process finalize: the failed iteration's objects go, the restart's clock starts."""
        self.restart_begin_t = time.time()
        self.iteration_objects.clear()
