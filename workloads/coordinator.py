"""The job's coordinator: the two stores every rank depends on, in a process no training node owns.

Without it, both stores live on node 0: ft_launcher's rendezvous store in node 0's launcher, and
the in-process restart store (NVRx's Wrapper store, which also carries each restart's process-group
keys) in rank 0. Losing rank 0's process, or node 0, then takes the stores with it, and no layer
can recover: the survivors' Wrappers cannot agree on a restart, their launchers cannot rendezvous.
One hard fault in N lands on node 0, so at 128 nodes that is not rare.

The coordinator hosts both, on the rendezvous endpoint's two ports (workloads.launch):

    P    ft_launcher's rendezvous store; NVRx's own control-node loop (`nvrx-control`, NVRx 0.7.0
         fault_tolerance/control_plane.py) closes each rendezvous round on it as host without
         taking part in it; every launcher joins as a client (`is_host=false`).
    P+1  the in-process restart store: a plain TCPStore server; every rank and every NVRx monitor
         process is a client of it (`CoordinatorStore`), none of them is critical to it.

It holds no training state: it runs on a CPU (system) node, and its loss costs one relaunch of the
job from the newest checkpoint (on EKS, the JobSet recreates every pod; `nvrx-eks local`
relaunches the same way), never the run.

Unlike `nvrx-control`, whose store goes when its loop ends, the stores stay up until the job
ends: a launcher that leaves on a lost rank (with spare nodes, --max-restarts 0) closes the
rendezvous for good, which ends the loop, while the survivors train on with a spare and still need
both stores.

SIGTERM (a pod deletion, a node drain, a kill of every process of the job, the job's end) does
not drop the stores at once: ranks that are saving the step they stop at still read them (their
NVRx monitors poll the in-process store), and losing them turns each stop-save into a
broken-pipe restart attempt that hangs until SIGKILL. The coordinator serves on while any other
process holds a connection to either store, for --stop-grace-s at most (the ranks' own stop
bound), and exits as soon as none does: at the job's end that is at once.

Run as `python -m workloads.coordinator --nnodes MIN:MAX --rdzv-endpoint HOST:P --rdzv-id ID
[--stop-grace-s S]`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import threading
import time

import psutil
import torch.distributed as dist
from nvidia_resiliency_ext.inprocess.store import StoreMixin

from workloads.launch import inprocess_store_port, split_endpoint


class CoordinatorStore(dist.PrefixStore, StoreMixin):
    """NVRx's Wrapper store as a client of the coordinator's in-process store (the Wrapper's
    `store_factory`; the trainer's process groups use it too). NVRx's own TCPStore has rank 0 host
    it and names rank 0 critical (it then waits forever at the end for every other rank, to keep
    the store up for them); here no rank hosts it, so none is critical, and rank 0 may be lost like
    any other.

    The coordinator outlives the workers ft_launcher restarts, so its keys would outlive them too
    (NVRx's barriers would count the previous workers' arrivals: BarrierOverflow). Each
    rendezvous round therefore gets keys of its own, under the round's MASTER_ADDR:MASTER_PORT,
    which ft_launcher picks anew for every round and gives to every worker of it alike (its
    restart count is per launcher: a launcher's hot spare joining a later round counts from 0)."""

    def __init__(self, host_name: str, port: int, timeout: datetime.timedelta):
        client = dist.TCPStore(host_name, port, is_master=False, timeout=timeout, use_libuv=True)
        super().__init__(f"round-{round_key()}/", client)

    @property
    def critical_ranks(self) -> tuple[int, ...]:
        return ()


def round_key() -> str:
    """The rendezvous round this worker belongs to (see CoordinatorStore)."""
    return f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"


def serve_store(port: int) -> dist.TCPStore:
    """A store server listening on every address of this host. The returned object must be kept
    alive: the server stops with it. (Its own client connects over the loopback.)"""
    return dist.TCPStore(
        "127.0.0.1",
        port,
        is_master=True,
        wait_for_workers=False,
        multi_tenant=True,
        timeout=datetime.timedelta(seconds=60),
    )


def connected_clients(ports: tuple[int, ...]) -> int:
    """Connections to the stores on `ports` from other processes (each store server also holds a
    client of its own, over the loopback: not counted)."""
    sockets = psutil.Process().net_connections(kind="tcp")
    own_clients = {s.laddr.port for s in sockets if s.raddr and s.raddr.port in ports}
    return sum(
        1
        for s in sockets
        if s.status == psutil.CONN_ESTABLISHED and s.laddr.port in ports and s.raddr and s.raddr.port not in own_clients
    )


#: How often the stop grace looks for connected clients, and how many looks in a row must find
#: none (a rank between two store calls holds its connection; this is a margin, not a need).
CLIENT_POLL_S = 0.5
IDLE_POLLS_TO_STOP = 2


def serve_while_connected(ports: tuple[int, ...], grace_s: float) -> None:
    """Return once no other process has been connected to the stores for IDLE_POLLS_TO_STOP
    polls, or after grace_s."""
    deadline = time.monotonic() + grace_s
    idle = 0
    while time.monotonic() < deadline and idle < IDLE_POLLS_TO_STOP:
        idle = idle + 1 if connected_clients(ports) == 0 else 0
        time.sleep(CLIENT_POLL_S)


def nvrx_control_argv(args: argparse.Namespace) -> list[str]:
    """nvrx-control's arguments: the rendezvous the launchers join, with no log funnel (each
    launcher writes its own log) and no attribution service."""
    return [
        "--nnodes",
        args.nnodes,
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        args.rdzv_endpoint,
        "--rdzv-id",
        args.rdzv_id,
        "--ft-enable-log-server",
        "false",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workloads.coordinator", description=__doc__.split("\n")[0])
    parser.add_argument("--nnodes", required=True, help="MIN[:MAX] launched nodes, as ft_launcher is given")
    parser.add_argument("--rdzv-endpoint", required=True, help="HOST:PORT this coordinator serves")
    parser.add_argument("--rdzv-id", required=True)
    parser.add_argument(
        "--stop-grace-s", type=float, default=0.0, help="how long the stores stay up after SIGTERM (see the module doc)"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from nvidia_resiliency_ext.fault_tolerance import control_plane
    from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig
    from nvidia_resiliency_ext.shared_utils.log_manager import setup_logger

    control_args = control_plane.parse_args(nvrx_control_argv(args))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    ports = (split_endpoint(args.rdzv_endpoint)[1], inprocess_store_port(args.rdzv_endpoint))
    stores = [serve_store(port) for port in ports]
    setup_logger(node_local_tmp_prefix="nvrxcontrol")
    try:
        # NVRx's control-node loop on our rendezvous store (private in NVRx 0.7.0: the public
        # `nvrx-control` owns its store and drops it when the loop ends).
        control_plane._run_control_rendezvous_loop(
            control_args, FaultToleranceConfig.from_args(control_args), stores[0], control_plane.ControlServices(), stop
        )
        print("coordinator: the rendezvous is closed; serving the stores until stopped", flush=True)
        stop.wait()
        print("coordinator: stopping once no rank or launcher is connected", flush=True)
        serve_while_connected(ports, args.stop_grace_s)
    finally:
        del stores
    return 0


if __name__ == "__main__":
    sys.exit(main())
