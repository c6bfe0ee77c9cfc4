"""The NVRx in-process restart Wrapper, composed from TrainConfig.

On a soft fault (an exception in any rank, or a rank that stops pinging for soft_timeout_s) NVRx
aborts the process groups and the async checkpoint worker, raises an asynchronous exception in every
rank's training function, runs `finalize` and the health check, and calls the function again in the
same processes; the function rebuilds everything and reloads the newest committed checkpoint.

Composition:
  rank_assignment  with distributed.spare_nodes, workloads.spares (spare nodes wait outside the
               process group and replace lost ranks); otherwise NVRx's default.
  initialize   RetryController: the active world may not shrink (without a spare to take its place,
               a terminated rank makes every rank leave the wrapper, so ft_launcher restarts the
               whole group; the checkpoint's data position and RNG are per rank), optional cap on
               in-process restarts; and a check that turns a pending SIGTERM into termination
               instead of another restart.
  abort        with gloo, ReleaseGlooPeers first (shuts down the gloo pair sockets, so every rank
               blocked in a collective, here and on the peers, is released at once instead of at
               gloo's timeout; workloads.gloo_sockets), then AbortTorchDistributed (destroys the
               process groups). With NCCL, AbortTorchDistributed first (NVRx aborts the
               communicators, which closes their sockets), then ReleaseGlooPeers for the gloo
               groups of the checkpoint components (workloads.checkpoint.groups). Compose runs
               right to left. Not NVRx's AbortPersistentCheckpointProcesses: the checkpoint
               worker outlives the restart, and the next iteration reuses it once it finished
               what the failed one handed it, or replaces it (workloads.checkpoint.nvrx_worker).
  finalize     RestartFinalize: records restart_begin, closes ft sections, drops the failed
               iteration's objects, the finalize functions of its saves still in flight and the
               frames its exception holds (each would keep its model and optimizer allocated into
               the next iteration), and on CUDA
               drains the rank's own GPU in a thread with a timeout (NVRx's ThreadedFinalize
               refuses to run without CUDA).
  health_check CudaHealthCheck with the nccl backend only; the GPU/NVLink/NIC checks NVRx adds when
               LOCAL_RANK is set are kept with nccl and suppressed with gloo (see cuda_compat).
               NVRx's NIC check reads /sys/class/infiniband/<nic>/ports/1/counters/link_downed
               (shared_utils/health_check.py) and, when the file is missing, logs a warning and
               reports healthy. EFA devices register with ib_core without the IB port counters,
               so on p5 it checks nothing; EFA link loss reaches the trainer as an NCCL error,
               which the in-process layer handles as any other fault. ft_launcher's own NIC check
               (--ft-enable-nic-healthcheck, rendezvous time) reads ports/1/state instead, which
               every ib_core device has; whether NVRx maps each GPU to its EFA device on p5 is
               unverified, so it stays at its default until a p5 run shows it.

The CUDA timeouts (drain and health check, inprocess.cuda_timeout_s) are short, like Megatron's
10 s: a GPU that cannot drain in that time is broken, and the health check runs twice per restart
(at the restart and at the next iteration's start), so the bound adds up (see
TrainConfig._timeout_problems).
"""

from __future__ import annotations

import datetime
import gc
import os
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from nvidia_resiliency_ext import inprocess
from nvidia_resiliency_ext.inprocess.abort import AbortTorchDistributed

from workloads.checkpoint.writers import abandon_in_flight_saves
from workloads.config import InProcessConfig
from workloads.coordinator import CoordinatorStore
from workloads.cuda_compat import local_rank_hidden_on_cpu
from workloads.events import EventLog
from workloads.ft_integration import FaultToleranceReporter
from workloads.gloo_sockets import shutdown_gloo_pairs, store_ports
from workloads.spares import active_world_size, rank_assignment


class TerminationRequested(inprocess.exception.RestartAbort):
    """The rank was asked to stop (SIGTERM, or ft_launcher's monitor gone): leave the wrapper
    instead of restarting in place."""


class StopWhenAsked(inprocess.initialize.Initialize):
    def __init__(self, stop_requested: Callable[[], bool]):
        self.stop_requested = stop_requested

    def __call__(self, state):
        if state.iteration > 0 and self.stop_requested():
            raise TerminationRequested("asked to stop (SIGTERM or launcher gone); not restarting in process")
        return state


class ReleaseGlooPeers(inprocess.abort.Abort):
    """Shut down this rank's gloo pair sockets, never its store connections. Every rank's
    monitor thread runs it on a fault, so the faulting rank's peers fail their collective within
    milliseconds, and a rank blocked in one (its main thread stuck in C, where NVRx's
    asynchronous exception cannot reach it) is released by its own call as well."""

    def __init__(self, store_port: int | None):
        self.store_port = store_port

    def __call__(self, state):
        shutdown_gloo_pairs(store_ports(self.store_port))
        return state


class RestartFinalize(inprocess.finalize.Finalize):
    def __init__(
        self,
        events: EventLog,
        ft: FaultToleranceReporter,
        drop_iteration_state: Callable[[], None],
        cuda_timeout_s: float,
    ):
        self.events, self.ft = events, ft
        self.drop_iteration_state = drop_iteration_state
        self.cuda_timeout_s = cuda_timeout_s

    def __call__(self, state):
        reason = repr(state.fn_exception) if state.fn_exception is not None else "peer fault"
        self.events.emit("restart_begin", layer="inprocess", reason=reason[:500])
        self.ft.end_all_sections()
        self.drop_iteration_state()
        abandon_in_flight_saves()  # an NVRx save in flight would hold the model and optimizer
        release_exception_frames(state.fn_exception)
        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            # The current device is per thread and a new thread starts on GPU 0: without this,
            # every local rank would create a context on GPU 0 (~0.5 GB each) and drain GPU 0
            # instead of its own (NVRx's ThreadedFinalize sets the device for the same reason).
            device = torch.cuda.current_device()
            done = threading.Event()

            def drain() -> None:
                torch.cuda.set_device(device)
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
                done.set()

            threading.Thread(target=drain, daemon=True, name="RestartFinalizeCuda").start()
            if not done.wait(self.cuda_timeout_s):
                raise inprocess.exception.TimeoutError("CUDA did not drain during finalize")
        return state


def release_exception_frames(err: BaseException | None) -> None:
    """Clear the local variables of the finished frames that `err` and the exceptions chained to
    it hold. NVRx keeps the failed iteration's exception through finalize (state.fn_exception,
    and the __cause__ of its restart exception); its traceback reaches the Trainer's frames, and
    through `self` the model, optimizer and Checkpointer, which the finalize's collection and
    CUDA drain could then not free: on a GPU their blocks stayed cached until the Wrapper's own
    collection, after the drain. Frames still running (NVRx's own) are skipped by
    traceback.clear_frames."""
    pending, seen = [err], set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        pending += [current.__cause__, current.__context__]


def abort_chain(cfg: InProcessConfig, backend: str, store_port: int | None) -> list[inprocess.abort.Abort]:
    """The Compose arguments (run right to left) of the in-process abort for `backend`."""
    chain: list[inprocess.abort.Abort] = [AbortTorchDistributed()]
    if not cfg.release_gloo_sockets:
        return chain
    if backend == "gloo":
        chain.append(ReleaseGlooPeers(store_port))  # first: every group is gloo
    else:
        # NCCL runs have gloo groups too (workloads.checkpoint.groups): released after NCCL's
        # abort, which closes NCCL's own TCP connections, so only gloo pairs and stores remain.
        chain.insert(0, ReleaseGlooPeers(store_port))
    return chain


def build_wrapper(
    cfg: InProcessConfig,
    *,
    backend: str,
    store: tuple[str, int],
    world_size: int,
    run_dir: Path,
    spare_nodes: int = 0,
    nproc_per_node: int = 1,
    events: EventLog,
    ft: FaultToleranceReporter,
    drop_iteration_state: Callable[[], None],
    stop_requested: Callable[[], bool],
) -> inprocess.Wrapper:
    seconds = lambda s: datetime.timedelta(seconds=s)  # noqa: E731
    pid_dir = (run_dir / "pids").resolve()
    pid_dir.mkdir(parents=True, exist_ok=True)
    tag = f"c{events.cycle}-p{os.getpid()}"
    health_check = (
        inprocess.health_check.CudaHealthCheck(timeout=seconds(cfg.cuda_timeout_s)) if backend == "nccl" else None
    )
    # With spare nodes the world may shrink to the active world, never below it (workloads.spares).
    active = active_world_size(world_size, spare_nodes, nproc_per_node)
    assignment = {}
    if spare_nodes:
        assignment["rank_assignment"] = rank_assignment(
            world_size=world_size, spare_nodes=spare_nodes, nproc_per_node=nproc_per_node
        )
    with local_rank_hidden_on_cpu(backend):
        return inprocess.Wrapper(
            # Every rank and monitor process a client of the coordinator's store: no rank hosts it.
            store_factory=CoordinatorStore,
            store_kwargs={"host_name": store[0], "port": store[1], "timeout": seconds(cfg.barrier_timeout_s)},
            initialize=inprocess.Compose(
                StopWhenAsked(stop_requested),
                inprocess.initialize.RetryController(
                    max_iterations=None if cfg.max_restarts is None else cfg.max_restarts + 1,
                    min_world_size=active,
                    min_active_world_size=active,
                ),
            ),
            abort=inprocess.Compose(*abort_chain(cfg, backend, store[1])),
            finalize=RestartFinalize(events, ft, drop_iteration_state, cfg.cuda_timeout_s),
            health_check=health_check,
            monitor_thread_interval=seconds(cfg.monitor_interval_s),
            monitor_process_interval=seconds(cfg.monitor_interval_s),
            heartbeat_interval=seconds(cfg.heartbeat_interval_s),
            progress_watchdog_interval=seconds(cfg.progress_watchdog_interval_s),
            soft_timeout=seconds(cfg.soft_timeout_s),
            hard_timeout=seconds(cfg.hard_timeout_s),
            heartbeat_timeout=seconds(cfg.heartbeat_timeout_s),
            barrier_timeout=seconds(cfg.barrier_timeout_s),
            completion_timeout=seconds(cfg.completion_timeout_s),
            last_call_wait=seconds(cfg.last_call_wait_s),
            termination_grace_time=seconds(cfg.termination_grace_s),
            monitor_process_logfile=str(pid_dir / f"inprocess-monitor-r{{rank}}-{tag}.log"),
            monitor_process_pidfile=str(pid_dir / f"inprocess-monitor-r{{rank}}-{tag}.pid"),
            enabled=True,
            **assignment,
        )
