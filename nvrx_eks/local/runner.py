"""`nvrx-eks local`: the trainer under ft_launcher on this machine (CPU ranks, gloo).

A LocalRun in; `run_local` prepares it (checked, its directory leased, each node's config
written), runs the pod's preflight on it (a resume the checkpoints cannot take ends there, before
any rank starts), has a Supervisor (nvrx_eks.local.supervisor) start and watch the same launcher
command the Kubernetes manifests render (workloads.launch), with a CPU profile of short timeouts
so faults recover in seconds, and finishes: the exit code, local_run.json and, from the run's
event log, what happened (`nvrx_eks.local.outcome`), with no process of the run left
(nvrx_eks.local.processes).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from nvrx_eks.local.launcher_command import ft_launcher_command
from nvrx_eks.local.outcome import print_report, stop_reason
from nvrx_eks.local.processes import free_port_pair, local_rendezvous
from nvrx_eks.local.supervisor import Launch, Supervisor
from workloads import do_not_requeue
from workloads.config import TrainConfig
from workloads.events import load_run
from workloads.faults import parse_fault_spec, target_limit
from workloads.launch import MULTI_LAUNCHER_ENV, build_ft_launcher_argv, build_preflight_argv
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


@dataclass(frozen=True)
class LocalRun:
    """One local run, as its caller states it once (`nvrx-eks local`, the bench, the GPU smoke,
    the demo, the tests): `nodes` active simulated nodes of `nproc` ranks each, plus `spare_nodes`
    hot spares in process or `launcher_spare_nodes` of ft_launcher's (LocalNodes), each node with
    its own local checkpoint root. `force` starts more ranks than RANKS_PER_CORE per CPU core. A
    launch that loses its coordinator, or more nodes than it has spares, is started again up to
    `max_relaunches` times (the JobSet's recreation of every pod, here), resuming from the newest
    checkpoint. `port`: the rendezvous port P (P and P+1 are used), default a free pair."""

    nproc: int
    steps: int
    faults: str
    #: Default: runs/local-<time>.
    run_dir: Path | None
    preset: str
    checkpoint_interval: int
    backend: str
    resume: bool = False
    overrides: tuple[str, ...] = ()
    port: int | None = None
    nodes: int = 1
    local_interval: int | None = None
    spare_nodes: int = 0
    launcher_spare_nodes: int = 0
    force: bool = False
    max_relaunches: int = 2


def run_local(run: LocalRun, *, console: Console | None = None, print_summary: bool = True) -> int:
    """Run it: prepared (checked, its directory leased, its configs written), the pod's preflight,
    its launches supervised until they end, then its exit code and local_run.json, and (with
    `print_summary`) how it recovered. Returns the run's exit code."""
    console = console or Console()
    with prepare(run, console) as launch:
        problems = preflight(launch.run_dir / "config.yaml", launch.world_size, launch.env, console)
        if problems:
            return _refused(launch, problems, console)
        supervisor = Supervisor(launch, console)
        supervisor.supervise()
        return finish(launch, supervisor, console, print_summary=print_summary)


def _checked(run: LocalRun) -> tuple[LocalNodes, Path, list[TrainConfig]]:
    """The run's nodes, its directory (made, and writable) and each node's config, or a
    ConfigError naming the flag before anything of the run is written."""
    nodes = LocalNodes(
        active=run.nodes, nproc=run.nproc, spares=run.spare_nodes, launcher_spares=run.launcher_spare_nodes
    )
    check_rank_count(nodes, force=run.force)
    overrides = [*run.overrides, f"distributed.spare_nodes={run.spare_nodes}"] if run.spare_nodes else run.overrides
    run_dir = (run.run_dir or Path("runs") / time.strftime("local-%Y%m%d-%H%M%S")).resolve()
    if run_dir.exists() and any(p.name != LEASE_FILE for p in run_dir.iterdir()) and not run.resume:
        raise ConfigError(
            f"--run-dir: {run_dir} already holds a run; pass --resume to continue it or choose another directory"
        )
    configs = [
        local_config(
            run_dir=run_dir,
            steps=run.steps,
            faults=run.faults,
            preset=run.preset,
            checkpoint_interval=run.checkpoint_interval,
            backend=run.backend,
            overrides=overrides,
            local_interval=run.local_interval,
            local_dir=node_local_dir(run_dir, n) if nodes.launched > 1 else None,
        )
        for n in range(nodes.launched)
    ]
    for fault in parse_fault_spec(configs[0].faults):
        unit, limit = target_limit(fault, nodes=nodes.active, world_size=nodes.world_size)
        if fault.rank >= limit:
            raise ConfigError(
                f"--faults: {fault.label} targets {unit} {fault.rank}; with --nodes {run.nodes} --nproc {run.nproc} "
                f"--spare-nodes {nodes.all_spares} use an active {unit} below {limit}"
            )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=run_dir).close()
    except OSError as err:
        raise ConfigError(
            f"--run-dir: cannot write in {run_dir} ({err.strerror or err}); give a writable directory"
        ) from None
    return nodes, run_dir, configs


@contextlib.contextmanager
def prepare(run: LocalRun, console: Console) -> Iterator[Launch]:
    """The run checked and its directory leased for as long as it runs (a second run on it is
    refused), each node's config written, the launchers' environment and rendezvous port chosen:
    the Launch the supervisor starts."""
    nodes, run_dir, configs = _checked(run)
    # The do-not-requeue record's fallback (workloads.do_not_requeue): where a rank puts it when
    # the run dir refuses it, as the pod's /dev/shm is.
    with RunLease(run_dir), tempfile.TemporaryDirectory(prefix="nvrx-eks-local-records-") as records:
        config_paths = [run_dir / ("config.yaml" if n == 0 else f"config-node{n}.yaml") for n in range(len(configs))]
        port = run.port or free_port_pair()
        for path, node_cfg in zip(config_paths, configs, strict=True):
            path.write_text(node_cfg.to_yaml())

        def launcher_argvs(port: int) -> list[list[str]]:
            """One launcher argv per node, for a launch on rendezvous port `port`."""
            rendezvous = local_rendezvous(port)
            # argv[0], the launcher's name, becomes how this interpreter starts it (a script or
            # `python -m`): the ranks then run in this interpreter's environment.
            return [
                [
                    *ft_launcher_command(),
                    *build_ft_launcher_argv(
                        node_cfg, config_path=str(path), nnodes=nodes.nnodes, nproc_per_node=run.nproc, **rendezvous
                    )[1:],
                ]
                for path, node_cfg in zip(config_paths, configs, strict=True)
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
        if nodes.launched > 1:
            # ft_launcher's barrier rendezvous closes itself when two launchers share a host, unless
            # told the nodes are simulated.
            env[MULTI_LAUNCHER_ENV] = "1"
        console.print(f"run dir {run_dir}\nlauncher log {run_dir / 'launcher.log'}")
        yield Launch(
            run_dir=run_dir,
            cfg=configs[0],
            nnodes=nodes.nnodes,
            world_size=nodes.world_size,
            spares=nodes.all_spares,
            launcher_argvs=launcher_argvs,
            env=env,
            port=port,
            port_fixed=run.port is not None,
            steps=run.steps,
            max_relaunches=run.max_relaunches,
            attempt=attempt,
            records=Path(records),
            started=time.monotonic(),
            started_at=time.time(),
        )


def finish(launch: Launch, supervisor: Supervisor, console: Console, *, print_summary: bool) -> int:
    """Once the last launch ended: the run's exit code, every process of it gone, local_run.json,
    and (with `print_summary`) how it recovered. Returns the exit code."""
    completed = launch.completed()
    coordinator, launchers = supervisor.coordinator, supervisor.launchers
    code, lost_nodes = run_code([p.returncode for p in launchers], launch.spares, completed=completed)
    if supervisor.stop.received is not None:
        code = 128 + supervisor.stop.received  # the run stopped because this command was told to stop
    elif code == 0 and coordinator.returncode not in (0, None) and not completed:
        code = 1  # the coordinator was lost and no relaunch was left
    launcher_code = code
    if supervisor.released:  # the survivors completed the run; their launchers' end was ours
        lost_nodes, code = supervisor.released, 0
    ended_at = time.time()  # the launchers' end; reaping what they left comes after
    # A rank decided that no restart can fix this run and shut the workload down: a launcher
    # exits 1 (or 0 on a node whose ranks did not fail), the run's result is 93
    # (workloads.do_not_requeue).
    record = launch.do_not_requeue_record()
    if record is not None:
        code = EXIT_DO_NOT_REQUEUE
    killed = supervisor.reap()
    wall_s = time.monotonic() - launch.started
    _write_run_record(
        launch.run_dir,
        console,
        exit_code=code,
        wall_s=wall_s,
        started_at=launch.started_at,
        processes_seen=len(supervisor.tracker.seen),
        killed_after_exit=killed,
        launcher_exit_code=launcher_code,
        lost_nodes=lost_nodes,
        launcher_ended_at=ended_at,
        stopped_by=record["reason"] if record else stop_reason(load_run(launch.run_dir), launch.started_at),
    )
    if print_summary:
        print_report(
            console,
            launch.run_dir,
            code,
            wall_s,
            killed,
            launch.started_at,
            stopped=do_not_requeue.describe(record) if record else None,
        )
        console.print(
            f"where the time went: nvrx-eks report {shlex.quote(str(launch.run_dir))}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    elif killed:
        console.print(f"[red]processes had to be killed after the launcher exited: {killed}[/]")
    return code


def _refused(launch: Launch, problems: list[str], console: Console) -> int:
    """The preflight refused the run: each problem in one line, the record, exit 93."""
    for problem in problems:
        console.print(f"[bold red]error:[/] {escape(problem)}", highlight=False, soft_wrap=True)
    console.print("[red]preflight refused the run: no rank was started[/]")
    _write_run_record(
        launch.run_dir,
        console,
        exit_code=EXIT_DO_NOT_REQUEUE,
        wall_s=time.monotonic() - launch.started,
        started_at=launch.started_at,
        processes_seen=0,
        killed_after_exit=[],
        launcher_exit_code=None,
        lost_nodes=0,
        launcher_ended_at=None,
        stopped_by=problems[0],
    )
    return EXIT_DO_NOT_REQUEUE


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
