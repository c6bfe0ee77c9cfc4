"""The processes of a local run: a free rendezvous port, the job's coordinator and one launcher
per simulated node started and stopped, every process the run started tracked by pid and start
time and reaped at the end, and SIGTERM/SIGHUP to this command turned into an orderly stop."""

from __future__ import annotations

import contextlib
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from nvrx_eks.facts.run_layout import coordinator_pidfile
from workloads.launch import build_coordinator_argv, inprocess_store_port_above

if TYPE_CHECKING:
    from workloads.config import TrainConfig


def port_pair_free(port: int) -> bool:
    for p in (port, inprocess_store_port_above(port)):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                return False
    return True


def free_port_pair(low: int = 20000, high: int = 32000) -> int:
    """A port P with P and P+1 free, below Linux's ephemeral range (where ft_launcher picks
    MASTER_PORT), so it cannot collide with a port the launcher picks."""
    for _ in range(200):
        port = random.randrange(low, high - 1)
        if port_pair_free(port):
            return port
    raise RuntimeError("no free port pair found")


def local_rendezvous(port: int) -> dict[str, str]:
    """The rendezvous of a local launch on port `port`: its endpoint and id."""
    return {"rdzv_endpoint": f"127.0.0.1:{port}", "rdzv_id": f"local-{port}"}


class ProcessTracker:
    """Every process of a run, by pid and start time (so a recycled pid is never mistaken for
    ours): the launcher's descendants, sampled while it runs (ft_launcher starts each rank in its
    own session, so a process group does not cover them), and the NVRx monitor daemons, which
    detach on purpose and are found through the pidfiles the trainer asks NVRx to write."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.seen: dict[int, float] = {}

    def _remember(self, proc: psutil.Process) -> None:
        try:
            self.seen.setdefault(proc.pid, proc.create_time())
        except psutil.NoSuchProcess:
            pass

    def sample(self, launcher_pid: int) -> None:
        try:
            launcher = psutil.Process(launcher_pid)
            self._remember(launcher)
            for child in launcher.children(recursive=True):
                self._remember(child)
        except psutil.NoSuchProcess:
            pass
        for pidfile in sorted((self.run_dir / "pids").glob("*.pid")):
            try:
                self._remember(psutil.Process(int(pidfile.read_text().strip())))
            except (ValueError, psutil.NoSuchProcess, FileNotFoundError):
                continue

    def alive(self) -> list[psutil.Process]:
        procs = []
        for pid, created in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    procs.append(proc)
            except psutil.NoSuchProcess:
                continue
        return procs

    def reap(self, grace_s: float) -> list[int]:
        """Wait up to grace_s for the run's processes to exit on their own (NVRx monitor daemons
        leave after their barrier timeout), then SIGKILL the rest by pid. Returns killed pids."""
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.alive():
            time.sleep(0.25)
        killed = []
        for proc in self.alive():
            try:
                proc.kill()
                killed.append(proc.pid)
            except psutil.NoSuchProcess:
                continue
        return killed


class StopSignals:
    """SIGTERM and SIGHUP to `nvrx-eks local` (a CI timeout, `kill`, a closed terminal) stop the
    run as Ctrl-C does, by raising KeyboardInterrupt once, instead of killing this command and
    leaving its launchers training unattended."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: int | None = None
        self._saved: dict[int, Any] = {}

    def _raise(self, signum: int, _frame: Any) -> None:
        if self.received is None:
            self.received = signum
            raise KeyboardInterrupt

    def __enter__(self) -> StopSignals:
        self._saved = {s: signal.signal(s, self._raise) for s in self.SIGNALS}
        return self

    def __exit__(self, *_exc: Any) -> None:
        for s, handler in self._saved.items():
            signal.signal(s, handler)

    @staticmethod
    @contextlib.contextmanager
    def ignoring_interrupts() -> Iterator[None]:
        """Ctrl-C ignored for the duration: the stop in progress must finish."""
        saved = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, saved)


def _wait_for_listener(port: int, launcher: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and launcher.poll() is None:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)


def start_coordinator(
    cfg: TrainConfig, nnodes: int | str, port: int, env: dict[str, str], log: Any, rdzv_id: str | None = None
) -> subprocess.Popen:
    """The job's coordinator (workloads.coordinator) of a job of `cfg`, for `nnodes` launchers on 127.0.0.1:port
    (rendezvous `rdzv_id`, default a local launch's), once it serves both stores; `log` is its
    stdout (a file, or subprocess.DEVNULL)."""
    rendezvous = local_rendezvous(port)
    if rdzv_id is not None:
        rendezvous["rdzv_id"] = rdzv_id
    argv = build_coordinator_argv(cfg, nnodes=nnodes, python=sys.executable, **rendezvous)
    coordinator = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    _wait_for_listener(port, coordinator)
    _wait_for_listener(inprocess_store_port_above(port), coordinator)
    return coordinator


def start_launch(
    cfg: TrainConfig,
    nnodes: int | str,
    launcher_argvs: list[list[str]],
    env: dict[str, str],
    run_dir: Path,
    port: int,
    tracker: ProcessTracker,
) -> tuple[subprocess.Popen, list[subprocess.Popen]]:
    """The coordinator of a job of `cfg`, then one launcher per simulated node (node 0 logs to
    launcher.log, node N to launcher-nodeN.log)."""
    with open(run_dir / "coordinator.log", "ab") as log_file:
        coordinator = start_coordinator(cfg, nnodes, port, env, log_file)
    pidfile = coordinator_pidfile(run_dir)
    pidfile.parent.mkdir(exist_ok=True)
    pidfile.write_text(str(coordinator.pid))
    tracker.sample(coordinator.pid)
    launchers = []
    for n, argv in enumerate(launcher_argvs):
        with open(run_dir / ("launcher.log" if n == 0 else f"launcher-node{n}.log"), "ab") as log_file:
            launchers.append(
                subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            )
    return coordinator, launchers


def stop_coordinator(coordinator: subprocess.Popen, grace_s: float = 10.0) -> None:
    """End the coordinator once every launcher has: SIGTERM (with no client left it exits within
    a second), SIGKILL past `grace_s`."""
    if coordinator.poll() is None:
        coordinator.send_signal(signal.SIGTERM)
        try:
            coordinator.wait(grace_s)
        except subprocess.TimeoutExpired:
            coordinator.kill()
            coordinator.wait()


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
