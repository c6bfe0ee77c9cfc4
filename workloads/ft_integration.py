"""ft_launcher's hang detection from inside a rank: RankMonitorClient heartbeats or sections.

Process-wide (one connection per process, kept across in-process restarts). With
`fault_tolerance.monitor: sections` the trainer reports three sections whose timeouts the launcher
enforces: `setup` (process group, model, checkpoint load), `step`, `checkpointing` (hand-off and
commit); everything else, including in-process restarts, is out-of-section time. With `heartbeat`
it sends one heartbeat per step and at setup milestones.

A rank started without ft_launcher (plain `python -m workloads.train`, torchrun) has no rank
monitor to talk to; the client then reports nothing and says so once in the log.

Each message to the rank monitor is a length prefix and a pickle written with two sends on one
socket. NVRx's in-process restart raises its exception asynchronously in the training thread;
landing between the two sends it would leave half a message on the socket, the monitor would read
the next message as garbage and drop the connection, and every later section update would fail
(each one another in-process restart, until the restart cap hands over to ft_launcher). So every
message is sent inside `atomic`, the iteration's CallWrapper.atomic, which the restart waits for.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from workloads.config import FaultToleranceConfig

log = logging.getLogger(__name__)


class FaultToleranceReporter:
    def __init__(self, cfg: FaultToleranceConfig, on_monitor_lost: Callable[[BaseException], None] = lambda err: None):
        from nvidia_resiliency_ext.fault_tolerance.data import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR

        self.mode = cfg.monitor
        self.client = None
        self.on_monitor_lost = on_monitor_lost
        # Set by the trainer at the start of each in-process iteration.
        self.atomic: Callable[[], Any] = contextlib.nullcontext
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
            with self.atomic(), self._monitor_may_be_gone():
                self.client.send_heartbeat()

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        if self.client is None or self.mode != "sections":
            yield
            self.heartbeat()
            return
        with self.atomic(), self._monitor_may_be_gone():
            self.client.start_section(name)
            self._open.add(name)
        # No `finally`: on an exception (NVRx's restart exception among them) the section stays
        # open and the restart path's end_all_sections closes it. Closing it here would mean
        # entering `atomic` while the restart holds it, i.e. waiting until NVRx raises again.
        yield
        if self.client is None:  # the monitor went away inside the section
            return
        with self.atomic(), self._monitor_may_be_gone():
            self.client.end_section(name)
            self._open.discard(name)

    @contextlib.contextmanager
    def _monitor_may_be_gone(self) -> Iterator[None]:
        """A message the rank monitor can no longer receive means ft_launcher is going away (the
        monitor is its fork). Raising would turn that into an in-process restart and lose the
        stop-save; instead stop talking to it and let on_monitor_lost ask the rank to stop."""
        from nvidia_resiliency_ext.fault_tolerance.rank_monitor_client import RankMonitorClientError

        try:
            yield
        except RankMonitorClientError as err:
            log.warning("ft_launcher's rank monitor is gone (%s): stopping with a checkpoint", err)
            self.client = None
            self._open.clear()
            self.on_monitor_lost(err)

    def request_shutdown(self, reason: str) -> None:
        """Ask ft_launcher not to restart the workload: its next rendezvous closes for every node
        and each launcher exits instead of restarting ranks. Exiting 93 alone does not do it
        (ft_launcher 0.7.0 restarts ranks whatever code they exit with); see
        workloads.do_not_requeue for how the launcher's wrapper then exits 93."""
        if self.client is None:
            return
        from nvidia_resiliency_ext.fault_tolerance.data import WorkloadAction, WorkloadControlRequest

        with self.atomic():
            self.client.send_workload_control_request(WorkloadControlRequest(WorkloadAction.ShutdownWorkload, reason))

    def end_all_sections(self) -> None:
        """Called when an in-process restart begins (NVRx has stopped raising into this thread
        by then): the restart is out-of-section time. Each open section is closed by name:
        RankMonitorClient.end_all_sections sends nothing in NVRx 0.7.0 (its filter for
        unmonitored sections drops the section-less close-all message)."""
        if self.client is not None and self.mode == "sections":
            with self._monitor_may_be_gone():
                for name in sorted(self._open):
                    self.client.end_section(name)
            self._open.clear()

    def shutdown(self) -> None:
        if self.client is not None:
            self.client.shutdown_workload_monitoring()
            self.client = None
