"""ft_launcher's hang detection from inside a rank: RankMonitorClient heartbeats or sections.

Process-wide (one connection per process, kept across in-process restarts). With
`fault_tolerance.monitor: sections` the trainer reports three sections whose timeouts the launcher
enforces: `setup` (process group, model, checkpoint load), `step`, `checkpointing` (hand-off and
commit); everything else, including in-process restarts, is out-of-section time. With `heartbeat`
it sends one heartbeat per step and at setup milestones.

A rank started without ft_launcher (plain `python -m workloads.train`, torchrun) has no rank
monitor to talk to; the client then reports nothing and says so once in the log.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from workloads.config import FaultToleranceConfig

log = logging.getLogger(__name__)

SECTIONS = ("setup", "step", "checkpointing")


class FaultToleranceReporter:
    def __init__(self, cfg: FaultToleranceConfig):
        from nvidia_resiliency_ext.fault_tolerance.data import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR

        self.mode = cfg.monitor
        self.client = None
        self._open: set[str] = set()
        if os.environ.get(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR) is None:
            log.info("not started by ft_launcher: no rank monitor, heartbeats and sections are off")
            return
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        self.client = RankMonitorClient()
        self.client.init_workload_monitoring()

    @property
    def active(self) -> bool:
        return self.client is not None

    def heartbeat(self) -> None:
        if self.client is not None and self.mode == "heartbeat":
            self.client.send_heartbeat()

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        if self.client is None or self.mode != "sections":
            yield
            self.heartbeat()
            return
        self.client.start_section(name)
        self._open.add(name)
        try:
            yield
        finally:
            # NVRx may interrupt even this block with its asynchronous restart exception; the
            # restart path calls end_all_sections so a section left open here is closed anyway.
            if name in self._open:
                self.client.end_section(name)
                self._open.discard(name)

    def end_all_sections(self) -> None:
        """Called when an in-process restart begins: the restart is out-of-section time."""
        if self.client is not None and self.mode == "sections":
            self.client.end_all_sections()
            self._open.clear()

    def shutdown(self) -> None:
        if self.client is not None:
            self.client.shutdown_workload_monitoring()
            self.client = None
