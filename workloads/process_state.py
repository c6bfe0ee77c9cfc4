"""What a rank keeps across in-process restarts: identity, event log, ft_launcher connection,
fault injector, the stop flag and the store client (torch-free to import: the NVRx checkpoint
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
    """What outlives in-process restarts: identity, event log, ft connection, stop flag."""

    def __init__(self, cfg: TrainConfig, rank: int, world_size: int, store: tuple[str, int] | None):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        # (host, port) of the coordinator's in-process store (workloads.coordinator), or None: the
        # process group then comes from the launcher's environment.
        self.store = store
        self.events = EventLog(cfg.run_dir, rank)
        self.ft = FaultToleranceReporter(cfg.fault_tolerance, on_monitor_lost=self.monitor_lost)
        self.faults = FaultInjector(
            parse_fault_spec(cfg.faults),
            rank,
            Path(cfg.run_dir) / "faults",
            self.events.emit,
            nproc_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        )
        # Set by SIGTERM (workloads.train) or by the loss of ft_launcher's rank monitor: every rank
        # votes on it each step, and the run stops after a checkpoint of that step.
        self.stop_requested = False
        self.restart_begin_t: float | None = None
        self.iteration_objects: dict[str, Any] = {}
        self.wrapper_store: Any = None  # a CoordinatorStore client once the first iteration made it
        # The step whose loss was not finite on every rank, in an earlier iteration: the same step
        # again after the restart is the run diverging, not a fault (workloads.nonfinite).
        self.non_finite_loss_step: int | None = None

    def monitor_lost(self, err: BaseException) -> None:
        """ft_launcher's rank monitor is a fork of the launcher: it goes away when the launcher
        does (a SIGTERM sent to the launcher's process group, a node shutdown), before the
        launcher's forwarded SIGTERM may reach this rank. Stop as SIGTERM would, with a checkpoint,
        instead of failing on the lost connection and losing the stop-save."""
        if not self.stop_requested:
            self.events.emit("monitor_lost", reason=str(err)[:500])
        self.stop_requested = True

    def drop_iteration_state(self) -> None:
        """The in-process finalize: the failed iteration's objects go, the restart's clock starts."""
        self.restart_begin_t = time.time()
        self.iteration_objects.clear()
