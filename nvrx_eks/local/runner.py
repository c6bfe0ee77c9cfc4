"""`nvrx-eks local`: the trainer under ft_launcher on this machine (CPU ranks, gloo).

The same launcher command the Kubernetes manifests render (workloads.launch), after the same
preflight the pod runs first (a resume the checkpoints cannot take ends there, before any rank
starts), with a CPU profile of short timeouts so faults recover in seconds. Afterwards it prints what happened, from the
run's event log (`nvrx_eks.local.outcome`), and makes sure no process of the run is left: the
launcher's process group (ranks, checkpoint workers) and the NVRx in-process monitor daemons
(their own sessions, found through the pidfiles the trainer asks NVRx to write).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.markup import escape

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from nvrx_eks.facts.job_kinds import JOBSET_RESTART_ATTEMPT_ENV
from nvrx_eks.facts.run_layout import coordinator_pidfile
from nvrx_eks.local.launcher_command import ft_launcher_command
from nvrx_eks.local.live import LiveView
from nvrx_eks.local.outcome import print_report, stop_reason
from workloads import do_not_requeue
from workloads.config import TrainConfig
from workloads.events import load_run
from workloads.faults import parse_fault_spec, target_limit
from workloads.launch import (
    MULTI_LAUNCHER_ENV,
    build_coordinator_argv,
    build_ft_launcher_argv,
    build_preflight_argv,
    inprocess_store_port_above,
)
from workloads.lease import LEASE_FILE, RunLease
from workloads.process_env import NCCL_RESTART_ENV

# Short timeouts for CPU runs: a hang is noticed in seconds, gloo (which cannot be aborted) gives
# up on a dead peer at the soft timeout, and ft_launcher's timeouts stay above what the
# in-process layer may spend (hard + barrier), as TrainConfig enforces.
LOCAL_CPU_PROFILE: dict[str, Any] = {
    "data": {"seq_len": 64, "batch_size": 8},
    "optimizer": {"lr": 3e-3, "warmup_steps": 5},
    "checkpoint": {"keep": 2, "finalize_timeout_s": 60},
    "distributed": {"backend": "gloo"},
    "inprocess": {
        "soft_timeout_s": 5,
        "hard_timeout_s": 12,
        "barrier_timeout_s": 30,
        "completion_timeout_s": 30,
        "heartbeat_interval_s": 0.5,
        "heartbeat_timeout_s": 10,
        "monitor_interval_s": 0.5,
        # A hot spare waits in NVRx's reserve loop in store waits of this length and notices a
        # restart only when one returns; every rank's restart first waits last_call_wait for
        # concurrent faults (a simulated node's processes die within milliseconds of each other,
        # and a node's later stragglers are discarded with it: workloads.spares). Both are on the
        # restart's critical path. Measured in bench P6 (small preset): with 0.5 s and 0.3 s the
        # spare noticed the restart 0.59 s after the fault and the faulting side 0.36 s after;
        # with 0.1 s, 0.40 s and 0.17 s.
        "progress_watchdog_interval_s": 0.1,
        "last_call_wait_s": 0.1,
        "termination_grace_s": 2,
    },
    "fault_tolerance": {
        "max_restarts": 5,
        "monitor": "sections",
        "section_timeouts_s": {"setup": 120, "step": 30},
        "out_of_section_timeout_s": 60,
        "workers_stop_timeout_s": 5,
        "workload_check_interval_s": 1,
    },
}


def local_config(
    *,
    run_dir: Path,
    steps: int,
    faults: str,
    preset: str,
    checkpoint_interval: int,
    backend: str,
    overrides: list[str] | tuple[str, ...] = (),
    local_interval: int | None = None,
    local_dir: Path | None = None,
) -> TrainConfig:
    data = {**LOCAL_CPU_PROFILE, "run_dir": str(run_dir), "steps": steps, "faults": faults, "model": {"preset": preset}}
    data["checkpoint"] = {**LOCAL_CPU_PROFILE["checkpoint"], "backend": backend, "interval_steps": checkpoint_interval}
    if local_interval is not None:
        data["checkpoint"]["local"] = {"interval_steps": local_interval, "dir": str(local_dir) if local_dir else None}
    return TrainConfig.from_dict(data, source="nvrx-eks local", overrides=overrides)


#: Ranks per CPU core this command starts without --force. Each rank is several processes (the
#: rank, its checkpoint worker, NVRx's monitors), so the tests' and the demo's few ranks per core
#: fit well within it, and a mistyped --nproc 100000 does not fork thousands of processes.
RANKS_PER_CORE = 8


@dataclass(frozen=True)
class LocalNodes:
    """The simulated nodes of a local run, counted as the cluster commands count a job's
    (nvrx_eks.jobs.spec.JobSpec): `active` nodes of `nproc` ranks train, and the hot spares are
    launched beyond them, so adding spares changes neither the training world nor the global
    batch. `spares` wait in process (workloads.spares); `launcher_spares` are instead
    ft_launcher's own hot spares (`--nnodes MIN:MAX`: they wait in the rendezvous without
    workers and join at the next worker-group restart), for comparing the two."""

    active: int
    nproc: int
    spares: int = 0
    launcher_spares: int = 0

    def __post_init__(self) -> None:
        if self.nproc < 1:
            raise ConfigError("--nproc: must be at least 1")
        if self.active < 1:
            raise ConfigError("--nodes: must be at least 1 (the active nodes; --spare-nodes are launched beyond them)")
        if self.spares < 0:
            raise ConfigError(f"--spare-nodes {self.spares}: give 0 or more hot spare nodes")
        if self.launcher_spares < 0:
            raise ConfigError(f"launcher spare nodes {self.launcher_spares}: give 0 or more")
        if self.spares and self.launcher_spares:
            raise ConfigError("spare nodes: in process or ft_launcher's, not both")

    @property
    def all_spares(self) -> int:
        """The nodes the run may lose and still complete without a relaunch."""
        return self.spares + self.launcher_spares

    @property
    def launched(self) -> int:
        """Simulated nodes started: one ft_launcher each, with its own local checkpoint root."""
        return self.active + self.all_spares

    @property
    def world_size(self) -> int:
        """The active ranks, which train: faults name one of these."""
        return self.active * self.nproc

    @property
    def nnodes(self) -> int | str:
        """ft_launcher's --nnodes: with its own spares, MIN:MAX (the world stays MIN nodes)."""
        return f"{self.active}:{self.launched}" if self.launcher_spares else self.launched


def check_rank_count(nodes: LocalNodes, *, force: bool) -> None:
    cores = os.cpu_count() or 1
    limit = RANKS_PER_CORE * cores
    ranks = nodes.launched * nodes.nproc
    if ranks > limit and not force:
        launched = f"--nodes {nodes.active}" + (f" + --spare-nodes {nodes.spares}" if nodes.spares else "")
        raise ConfigError(
            f"{launched} x --nproc {nodes.nproc} = {ranks} ranks, more than {limit} "
            f"({RANKS_PER_CORE} per CPU core, {cores} here); lower --nproc, --nodes or --spare-nodes, or pass "
            "--force to start them anyway"
        )


def node_local_dir(run_dir: Path, node: int) -> Path:
    """A simulated node's own local checkpoint root: no other node can read it, as on EKS."""
    return run_dir / f"local-node{node}"


def _port_pair_free(port: int) -> bool:
    for p in (port, inprocess_store_port_above(port)):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                return False
    return True


#: How long the survivors' launchers may take to exit on their own after a run with a lost node
#: completed, before they are told to stop waiting for it.
EXIT_BARRIER_GRACE_S = 5.0


def free_port_pair(low: int = 20000, high: int = 32000) -> int:
    """A port P with P and P+1 free, below Linux's ephemeral range (where ft_launcher picks
    MASTER_PORT), so it cannot collide with a port the launcher picks."""
    for _ in range(200):
        port = random.randrange(low, high - 1)
        if _port_pair_free(port):
            return port
    raise RuntimeError("no free port pair found")


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


def run_local(
    *,
    nproc: int,
    steps: int,
    faults: str,
    run_dir: Path | None,
    preset: str,
    checkpoint_interval: int,
    backend: str,
    resume: bool = False,
    overrides: list[str] | tuple[str, ...] = (),
    port: int | None = None,
    console: Console | None = None,
    print_summary: bool = True,
    nodes: int = 1,
    local_interval: int | None = None,
    spare_nodes: int = 0,
    launcher_spare_nodes: int = 0,
    force: bool = False,
    max_relaunches: int = 2,
) -> int:
    """`nodes` active simulated nodes of `nproc` ranks each, plus `spare_nodes` hot spares in
    process or `launcher_spare_nodes` of ft_launcher's (LocalNodes): one launcher per node, one
    rendezvous, each node with its own local checkpoint root. `force` starts more ranks than
    RANKS_PER_CORE per CPU core. A launch that loses its coordinator, or more nodes than it has
    spares, is started again up to `max_relaunches` times (the JobSet's recreation of every pod,
    here), resuming from the newest checkpoint."""
    console = console or Console()
    plan = LocalNodes(active=nodes, nproc=nproc, spares=spare_nodes, launcher_spares=launcher_spare_nodes)
    check_rank_count(plan, force=force)
    if spare_nodes:
        overrides = [*overrides, f"distributed.spare_nodes={spare_nodes}"]
    run_dir = (run_dir or Path("runs") / time.strftime("local-%Y%m%d-%H%M%S")).resolve()
    if run_dir.exists() and any(p.name != LEASE_FILE for p in run_dir.iterdir()) and not resume:
        raise ConfigError(
            f"--run-dir: {run_dir} already holds a run; pass --resume to continue it or choose another directory"
        )
    configs = [
        local_config(
            run_dir=run_dir,
            steps=steps,
            faults=faults,
            preset=preset,
            checkpoint_interval=checkpoint_interval,
            backend=backend,
            overrides=overrides,
            local_interval=local_interval,
            local_dir=node_local_dir(run_dir, n) if plan.launched > 1 else None,
        )
        for n in range(plan.launched)
    ]
    cfg = configs[0]
    spares, world = plan.all_spares, plan.world_size
    for fault in parse_fault_spec(cfg.faults):
        unit, limit = target_limit(fault, nodes=plan.active, world_size=world)
        if fault.rank >= limit:
            raise ConfigError(
                f"--faults: {fault.label} targets {unit} {fault.rank}; with --nodes {nodes} --nproc {nproc} "
                f"--spare-nodes {spares} use an active {unit} below {limit}"
            )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=run_dir).close()
    except OSError as err:
        raise ConfigError(
            f"--run-dir: cannot write in {run_dir} ({err.strerror or err}); give a writable directory"
        ) from None
    # Before anything of the run is written: a second run on this directory is refused.
    # The do-not-requeue record's fallback (workloads.do_not_requeue): where a rank puts it when the
    # run dir refuses it, as the pod's /dev/shm is.
    with RunLease(run_dir), tempfile.TemporaryDirectory(prefix="nvrx-eks-local-records-") as records:
        fixed_port = port
        port = port or free_port_pair()
        for n, node_cfg in enumerate(configs):
            (run_dir / ("config.yaml" if n == 0 else f"config-node{n}.yaml")).write_text(node_cfg.to_yaml())

        def launcher_argvs(port: int) -> list[list[str]]:
            """One launcher argv per node, for a launch on rendezvous port `port`."""
            rendezvous = local_rendezvous(port)
            # argv[0], the launcher's name, becomes how this interpreter starts it (a script or
            # `python -m`): the ranks then run in this interpreter's environment.
            return [
                [
                    *ft_launcher_command(),
                    *build_ft_launcher_argv(
                        node_cfg,
                        config_path=str(run_dir / ("config.yaml" if n == 0 else f"config-node{n}.yaml")),
                        nnodes=plan.nnodes,
                        nproc_per_node=nproc,
                        **rendezvous,
                    )[1:],
                ]
                for n, node_cfg in enumerate(configs)
            ]

        # A fresh attempt id per run: a do-not-requeue record left by an earlier run in a resumed
        # directory is not this run's.
        attempt = f"local-{uuid.uuid4().hex}"
        env = {
            **os.environ,
            # As in the pod (nvrx_eks.jobs.render trainer_env): without it ft_launcher sets
            # TORCH_NCCL_ASYNC_ERROR_HANDLING=1, and NVLS stays on where NVSwitch has it.
            **NCCL_RESTART_ENV,
            "TORCH_CPP_LOG_LEVEL": "ERROR",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            do_not_requeue.ATTEMPT_ID_ENV: attempt,
            do_not_requeue.FALLBACK_DIR_ENV: records,
        }
        if plan.launched > 1:
            # ft_launcher's barrier rendezvous closes itself when two launchers share a host, unless
            # told the nodes are simulated.
            env[MULTI_LAUNCHER_ENV] = "1"
        log_path = run_dir / "launcher.log"
        console.print(f"run dir {run_dir}\nlauncher log {log_path}")
        started = time.monotonic()
        started_at = time.time()  # events and summary.json newer than this belong to this run
        problems = preflight(run_dir / "config.yaml", world, env, console)
        if problems:
            for problem in problems:
                console.print(f"[bold red]error:[/] {escape(problem)}", highlight=False, soft_wrap=True)
            console.print("[red]preflight refused the run: no rank was started[/]")
            _write_run_record(
                run_dir,
                console,
                exit_code=EXIT_DO_NOT_REQUEUE,
                wall_s=time.monotonic() - started,
                started_at=started_at,
                processes_seen=0,
                killed_after_exit=[],
                launcher_exit_code=None,
                lost_nodes=0,
                launcher_ended_at=None,
                stopped_by=problems[0],
            )
            return EXIT_DO_NOT_REQUEUE
        tracker = ProcessTracker(run_dir)
        completed_at = None  # with a lost node: when the survivors completed the run
        released = 0  # with a lost node: how many nodes were lost when the survivors were released
        relaunch = 0
        view = LiveView(console, run_dir, started_at)  # one for every launch: no line twice
        stop = StopSignals()
        with stop:
            while True:
                if relaunch:
                    # A new launch, as the JobSet recreates every pod: the next attempt's ranks
                    # resume from the newest checkpoint and report a "kubernetes" restart.
                    env[JOBSET_RESTART_ATTEMPT_ENV] = str(relaunch)
                    if fixed_port is None and not _port_pair_free(port):
                        port = free_port_pair()
                coordinator, launchers = start_launch(
                    cfg, plan.nnodes, launcher_argvs(port), env, run_dir, port, tracker
                )
                lost_infrastructure = False
                try:
                    with view:
                        while any(p.poll() is None for p in launchers):
                            for p in launchers:
                                tracker.sample(p.pid)
                            lost = [p for p in launchers if p.poll() not in (None, 0)]
                            if 0 < len(lost) <= spares and _completed(run_dir, started_at, steps):
                                # The survivors' launchers now wait in torch elastic's exit barrier for
                                # every node of the rendezvous, the lost one too, for 300 s (not
                                # configurable through ft_launcher, and deaf to SIGTERM there); their
                                # ranks have exited and the run is complete, so end the wait: SIGKILL
                                # the launchers' process trees.
                                completed_at = completed_at or time.monotonic()
                                if time.monotonic() - completed_at > EXIT_BARRIER_GRACE_S and not released:
                                    for p in launchers:
                                        if p.poll() is None:
                                            _kill_tree(p.pid)
                                    released = len(lost)
                            elif launch_lost(coordinator, launchers, spares):
                                # What no layer inside the job can recover: its coordinator, or
                                # more nodes than it has spares (the survivors would wait for the
                                # lost node in the next rendezvous). The job fails; as on EKS,
                                # where the JobSet recreates every pod, the launch starts again.
                                lost_infrastructure = True
                                for p in launchers:
                                    _kill_tree(p.pid)
                            view.poll()
                            time.sleep(0.5)
                except KeyboardInterrupt:
                    # Ctrl-C, or SIGTERM/SIGHUP to this command (StopSignals). Like an eviction:
                    # SIGTERM lets the ranks finish their in-flight checkpoint. Further signals do
                    # not interrupt that (StopSignals raises once; Ctrl-C is ignored meanwhile).
                    with stop.ignoring_interrupts():
                        for p in launchers:
                            if p.poll() is None:
                                p.send_signal(signal.SIGTERM)
                        while any(p.poll() is None for p in launchers):
                            for p in launchers:
                                tracker.sample(p.pid)
                            time.sleep(0.2)
                    view.poll()  # the final checkpoint and the run's end
                stop_coordinator(coordinator)
                lost_infrastructure = lost_infrastructure or (
                    coordinator.returncode not in (0, None) or any(p.returncode < 0 for p in launchers)
                )
                if (
                    lost_infrastructure
                    and relaunch < max_relaunches
                    and stop.received is None
                    and not released
                    and not _completed(run_dir, started_at, steps)
                    and do_not_requeue.read_record(run_dir, attempt, fallback=Path(records)) is None
                ):
                    tracker.reap(grace_s=EXIT_BARRIER_GRACE_S)
                    relaunch += 1
                    console.print(f"[yellow]the launch lost its coordinator or a node: relaunch {relaunch}[/]")
                    continue
                break
        codes = [p.returncode for p in launchers]
        code, lost_nodes = run_code(codes, spares, completed=_completed(run_dir, started_at, steps))
        if stop.received is not None:
            code = 128 + stop.received  # the run stopped because this command was told to stop
        elif code == 0 and coordinator.returncode not in (0, None) and not _completed(run_dir, started_at, steps):
            code = 1  # the coordinator was lost and no relaunch was left
        launcher_code = code
        if released:  # the survivors completed the run; their launchers' end was ours
            lost_nodes, code = released, 0
        ended_at = time.time()  # the launchers' end; reaping what they left comes after
        # A rank decided that no restart can fix this run and shut the workload down: a launcher
        # exits 1 (or 0 on a node whose ranks did not fail), the run's result is 93
        # (workloads.do_not_requeue).
        record = do_not_requeue.read_record(run_dir, attempt, fallback=Path(records))
        if record is not None:
            code = EXIT_DO_NOT_REQUEUE
        for p in launchers:
            tracker.sample(p.pid)
        killed = tracker.reap(grace_s=cfg.inprocess.barrier_timeout_s + 10)
        wall_s = time.monotonic() - started
        _write_run_record(
            run_dir,
            console,
            exit_code=code,
            wall_s=wall_s,
            started_at=started_at,
            processes_seen=len(tracker.seen),
            killed_after_exit=killed,
            launcher_exit_code=launcher_code,
            lost_nodes=lost_nodes,
            launcher_ended_at=ended_at,
            stopped_by=record["reason"] if record else stop_reason(load_run(run_dir), started_at),
        )
        if print_summary:
            print_report(
                console,
                run_dir,
                code,
                wall_s,
                killed,
                started_at,
                stopped=do_not_requeue.describe(record) if record else None,
            )
            console.print(
                f"where the time went: nvrx-eks report {shlex.quote(str(run_dir))}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        elif killed:
            console.print(f"[red]processes had to be killed after the launcher exited: {killed}[/]")
        return code


def preflight(config_path: Path, world_size: int, env: dict[str, str], console: Console) -> list[str]:
    """The pod's preflight (`python -m workloads.train --preflight`, run by its entrypoint before
    ft_launcher) on this run's config: returns the problems it found, one line each, after
    printing its warnings."""
    argv = build_preflight_argv(config_path=str(config_path), world_size=world_size, python=sys.executable)
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    lines = result.stderr.strip().splitlines()
    for line in lines:
        if line.startswith("warning: "):
            console.print(f"[yellow]{escape(line)}[/]", highlight=False, soft_wrap=True)
    if result.returncode == 0:
        return []
    problems = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    return problems or [f"the preflight ({' '.join(argv)}) exited {result.returncode}: {' / '.join(lines[-3:])}"]


def _write_run_record(run_dir: Path, console: Console, **record: Any) -> None:
    """local_run.json: how the run ended, for the tests, the bench and a later look. A run dir that
    refuses it (read-only, full: the very reason a run may have stopped) costs the record, said
    in one line, never the run's exit code."""
    path = run_dir / "local_run.json"
    try:
        path.write_text(json.dumps(record, indent=1))
    except OSError as err:
        console.print(
            f"[yellow]could not write {escape(str(path))} ({escape(err.strerror or str(err))}); the run "
            f"ended with exit {record['exit_code']} all the same[/]",
            highlight=False,
            soft_wrap=True,
        )


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


def run_code(launcher_codes: list[int], spare_nodes: int, *, completed: bool) -> tuple[int, int]:
    """(the run's exit code, nodes lost while the run completed) from the launchers' exit codes.

    The run's code is the first node's that is not 0 (every launcher ends the same rendezvous).
    With spare nodes, up to spare_nodes launchers may end on a lost node (killed, or leaving after
    its rank died) while the rest complete the run: the run's code is theirs. Lost nodes the
    survivors could not go on without (more than the spares) leave the run incomplete: the first
    failed node's code is the run's."""
    failed = [c for c in launcher_codes if c != 0]
    if failed and len(failed) <= spare_nodes and completed:
        return 0, len(failed)
    code = failed[0] if failed else 0
    # A launcher killed by a signal reports -N; a shell reports 128+N (SIGKILL: 137).
    return (128 - code if code < 0 else code), 0


def _wait_for_listener(port: int, launcher: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and launcher.poll() is None:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)


def local_rendezvous(port: int) -> dict[str, str]:
    """The rendezvous of a local launch on port `port`: its endpoint and id."""
    return {"rdzv_endpoint": f"127.0.0.1:{port}", "rdzv_id": f"local-{port}"}


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


def launch_lost(coordinator: subprocess.Popen, launchers: list[subprocess.Popen], spares: int) -> bool:
    """Whether the launch lost what no layer inside it recovers: its coordinator, or more nodes
    than it has spares. A node is lost when its launcher is killed (node-loss) or, with spares
    (where a launcher leaves as soon as one of its ranks died, --max-restarts 0), exits failed;
    without spares a launcher that exits by itself has given up under its own restart policy,
    which ends the run."""
    gone = [p for p in launchers if p.poll() not in (None, 0) and (spares or p.returncode < 0)]
    return coordinator.poll() is not None or len(gone) > spares


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


def _kill_tree(pid: int) -> None:
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


def _completed(run_dir: Path, since: float, steps: int) -> bool:
    """This run's summary.json (written at completion) shows the last step."""
    path = run_dir / "summary.json"
    try:
        return path.stat().st_mtime >= since and json.loads(path.read_text())["final_step"] == steps
    except (OSError, ValueError, KeyError):
        return False
