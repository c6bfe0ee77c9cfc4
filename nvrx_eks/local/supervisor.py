"""Watching a local run's launches until they end: what the survivors of a lost node need to
leave, a launch that lost what no layer inside it recovers, a stop this command was told to make,
and whether to launch again, as the JobSet recreates every pod of a failed job."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from nvrx_eks.facts.job_kinds import JOBSET_RESTART_ATTEMPT_ENV
from nvrx_eks.local.live import LiveView
from nvrx_eks.local.processes import (
    ProcessTracker,
    StopSignals,
    free_port_pair,
    kill_tree,
    port_pair_free,
    start_launch,
    stop_coordinator,
)
from workloads import do_not_requeue

if TYPE_CHECKING:
    from workloads.config import TrainConfig

#: How long the survivors' launchers may take to exit on their own after a run with a lost node
#: completed, before they are told to stop waiting for it.
EXIT_BARRIER_GRACE_S = 5.0


@dataclass(frozen=True)
class Launch:
    """A prepared run, as the supervisor starts it and starts it again (nvrx_eks.local.runner
    prepares it): its directory, node 0's config (the job's, for the coordinator), the launchers'
    argv for a rendezvous port, their environment, and when the run started."""

    run_dir: Path
    cfg: TrainConfig
    #: ft_launcher's --nnodes (nvrx_eks.local.runner.LocalNodes.nnodes).
    nnodes: int | str
    #: The active ranks, which train.
    world_size: int
    #: The nodes the run may lose and still complete without a relaunch.
    spares: int
    launcher_argvs: Callable[[int], list[list[str]]]
    env: dict[str, str]
    port: int
    #: The port was given (--port): a relaunch keeps it even when it is not free yet.
    port_fixed: bool
    steps: int
    max_relaunches: int
    #: This run's do-not-requeue attempt id, and the directory where a rank puts the record when
    #: the run dir refuses it (workloads.do_not_requeue).
    attempt: str
    records: Path
    started: float  # time.monotonic()
    started_at: float  # time.time(): events and summary.json newer than this belong to this run

    def completed(self) -> bool:
        """This run's summary.json (written at completion) shows the last step."""
        path = self.run_dir / "summary.json"
        try:
            return path.stat().st_mtime >= self.started_at and json.loads(path.read_text())["final_step"] == self.steps
        except (OSError, ValueError, KeyError):
            return False

    def do_not_requeue_record(self) -> dict[str, Any] | None:
        """What a rank wrote when it decided no restart can fix this run, if one did."""
        return do_not_requeue.read_record(self.run_dir, self.attempt, fallback=self.records)


def launch_lost(coordinator: subprocess.Popen, launchers: list[subprocess.Popen], spares: int) -> bool:
    """Whether the launch lost what no layer inside it recovers: its coordinator, or more nodes
    than it has spares. A node is lost when its launcher is killed (node-loss) or, with spares
    (where a launcher leaves as soon as one of its ranks died, --max-restarts 0), exits failed;
    without spares a launcher that exits by itself has given up under its own restart policy,
    which ends the run."""
    gone = [p for p in launchers if p.poll() not in (None, 0) and (spares or p.returncode < 0)]
    return coordinator.poll() is not None or len(gone) > spares


class Supervisor:
    """Starts a run's launches one after another and watches each until its launchers exit.
    Afterwards `coordinator` and `launchers` are the last launch's, `stop.received` the signal
    this command was stopped by, if any, and `released` the nodes lost when the survivors of a
    completed run were told to stop waiting for them."""

    def __init__(self, launch: Launch, console: Console):
        self.launch = launch
        self.console = console
        self.tracker = ProcessTracker(launch.run_dir)
        self.view = LiveView(console, launch.run_dir, launch.started_at)  # one for every launch: no line twice
        self.stop = StopSignals()
        self.port = launch.port
        self.relaunches = 0
        self.released = 0
        self.coordinator: subprocess.Popen
        self.launchers: list[subprocess.Popen] = []

    def supervise(self) -> None:
        """Launch, watch, and launch again while relaunch_due says so."""
        with self.stop:
            while True:
                self._start()
                lost_infrastructure = self.watch()
                stop_coordinator(self.coordinator)
                lost_infrastructure = lost_infrastructure or (
                    self.coordinator.returncode not in (0, None) or any(p.returncode < 0 for p in self.launchers)
                )
                if not self.relaunch_due(lost_infrastructure):
                    return
                self.tracker.reap(grace_s=EXIT_BARRIER_GRACE_S)
                self.relaunches += 1
                self.console.print(f"[yellow]the launch lost its coordinator or a node: relaunch {self.relaunches}[/]")

    def _start(self) -> None:
        env = self.launch.env
        if self.relaunches:
            # A new launch, as the JobSet recreates every pod: the next attempt's ranks resume
            # from the newest checkpoint and report a "kubernetes" restart.
            env = {**env, JOBSET_RESTART_ATTEMPT_ENV: str(self.relaunches)}
            if not self.launch.port_fixed and not port_pair_free(self.port):
                self.port = free_port_pair()
        launch = self.launch
        self.coordinator, self.launchers = start_launch(
            launch.cfg, launch.nnodes, launch.launcher_argvs(self.port), env, launch.run_dir, self.port, self.tracker
        )

    def watch(self) -> bool:
        """Poll the launch until every launcher has exited; returns whether it lost its
        coordinator or more nodes than it has spares (and was ended for it). A stop this command
        was told to make (Ctrl-C, SIGTERM, SIGHUP) stops the launchers as an eviction would."""
        spares, lost_infrastructure, completed_at = self.launch.spares, False, None
        try:
            with self.view:
                while any(p.poll() is None for p in self.launchers):
                    self._sample()
                    lost = [p for p in self.launchers if p.poll() not in (None, 0)]
                    if 0 < len(lost) <= spares and self.launch.completed():
                        # The survivors' launchers now wait in torch elastic's exit barrier for
                        # every node of the rendezvous, the lost one too, for 300 s (not
                        # configurable through ft_launcher, and deaf to SIGTERM there); their
                        # ranks have exited and the run is complete, so end the wait: SIGKILL
                        # the launchers' process trees.
                        completed_at = completed_at or time.monotonic()
                        if time.monotonic() - completed_at > EXIT_BARRIER_GRACE_S and not self.released:
                            for p in self.launchers:
                                if p.poll() is None:
                                    kill_tree(p.pid)
                            self.released = len(lost)
                    elif launch_lost(self.coordinator, self.launchers, spares):
                        # What no layer inside the job can recover: its coordinator, or more
                        # nodes than it has spares (the survivors would wait for the lost node in
                        # the next rendezvous). The job fails; as on EKS, where the JobSet
                        # recreates every pod, the launch starts again.
                        lost_infrastructure = True
                        for p in self.launchers:
                            kill_tree(p.pid)
                    self.view.poll()
                    time.sleep(0.5)
        except KeyboardInterrupt:
            self._stop_launchers()
            self.view.poll()  # the final checkpoint and the run's end
        return lost_infrastructure

    def _stop_launchers(self) -> None:
        """Ctrl-C, or SIGTERM/SIGHUP to this command (StopSignals). Like an eviction: SIGTERM lets
        the ranks finish their in-flight checkpoint. Further signals do not interrupt that
        (StopSignals raises once; Ctrl-C is ignored meanwhile)."""
        with self.stop.ignoring_interrupts():
            for p in self.launchers:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            while any(p.poll() is None for p in self.launchers):
                self._sample()
                time.sleep(0.2)

    def _sample(self) -> None:
        for p in self.launchers:
            self.tracker.sample(p.pid)

    def relaunch_due(self, lost_infrastructure: bool) -> bool:
        """Whether to launch again: the launch lost what no layer inside it recovers, a relaunch
        is left, this command was not told to stop, the survivors were not released from a
        completed run, the run did not complete, and no rank said no restart can fix it."""
        return (
            lost_infrastructure
            and self.relaunches < self.launch.max_relaunches
            and self.stop.received is None
            and not self.released
            and not self.launch.completed()
            and self.launch.do_not_requeue_record() is None
        )

    def reap(self) -> list[int]:
        """After the last launch: every process of the run gone, waiting first for those that
        leave on their own (NVRx's monitors, after their barrier timeout); the pids killed."""
        self._sample()
        return self.tracker.reap(grace_s=self.launch.cfg.inprocess.barrier_timeout_s + 10)
