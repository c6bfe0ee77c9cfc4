"""Release every rank blocked in a gloo collective at once: shut down the gloo pair sockets.

A rank blocked in a gloo collective is released only by gloo's own timeout or by the TCP
connection closing. `destroy_process_group()`, `_abort_process_group()` and the gloo backend's
`abort()`/`shutdown()` return at once but leave the sockets open, so a healthy peer of a faulting
rank sits out the whole collective timeout before the in-process restart can proceed (measured,
torch 2.13: the exception restart cost the timeout on top of the hang restart).
`shutdown(SHUT_RDWR)` on a pair socket wakes both ends: the local blocked call and the peer's
fail at once ("Connection closed by peer").

Which sockets: this process's established TCP connections, less every store connection (the
torchrun/ft_launcher rendezvous store at MASTER_PORT, the launcher's rendezvous endpoint and the
in-process store whose prefixes carry the per-iteration process groups: one port, see
workloads.launch). A store connection must survive: the in-process Wrapper coordinates the restart
through it. gloo keeps no other TCP connections, and the trainer opens none of its own. On an NCCL
run the release runs after NCCL's own abort, for the checkpoint's gloo groups
(workloads.checkpoint.groups); NVRx's abort is expected to have closed NCCL's own sockets by
then (not yet seen on a GPU).

The sockets are shut down, not closed: their file descriptors stay gloo's, which closes them when
the process group is destroyed, so no descriptor is ever reused under gloo's feet.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from pathlib import Path

#: /proc/net/tcp state of an established connection.
_ESTABLISHED = "01"


def _socket_inodes() -> dict[int, int]:
    """inode -> fd for this process's sockets."""
    inodes: dict[int, int] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed since listdir
            continue
        if target.startswith("socket:["):
            inodes[int(target[8:-1])] = int(name)
    return inodes


def _established_tcp() -> Iterable[tuple[int, int, int]]:
    """(inode, local port, peer port) of every established TCP connection in this network
    namespace (IPv4 and IPv6)."""
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != _ESTABLISHED:
                continue
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            peer_port = int(fields[2].rsplit(":", 1)[1], 16)
            yield int(fields[9]), local_port, peer_port


def gloo_pair_fds(store_ports: Iterable[int]) -> list[int]:
    """File descriptors of this process's TCP connections that are not store connections."""
    keep = set(store_ports)
    fds = _socket_inodes()
    return sorted(
        fds[inode]
        for inode, local, peer in _established_tcp()
        if inode in fds and local not in keep and peer not in keep
    )


def shutdown_gloo_pairs(store_ports: Iterable[int]) -> int:
    """Shut down (both directions) every gloo pair socket of this process; returns how many."""
    count = 0
    for fd in gloo_pair_fds(store_ports):
        try:
            # A duplicate, closed here; shutdown acts on the connection, so gloo's own fd sees it.
            with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.shutdown(socket.SHUT_RDWR)
            count += 1
        except OSError:  # closed by gloo meanwhile, or already shut down
            continue
    return count


def store_ports(store_port: int | None) -> set[int]:
    """The store ports of this rank: MASTER_PORT (the launcher's store) and, with the in-process
    Wrapper, its store port and the rendezvous endpoint's port below it (workloads.launch)."""
    from workloads.launch import rendezvous_port_of_store

    ports = {int(os.environ["MASTER_PORT"])} if os.environ.get("MASTER_PORT") else set()
    if store_port is not None:
        ports |= {store_port, rendezvous_port_of_store(store_port)}
    return ports
