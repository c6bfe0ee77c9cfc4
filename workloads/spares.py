"""Hot spare nodes in process: N active + S spare nodes, the active world fixed at N x nproc.

The in-process Wrapper runs every rank of all N+S nodes; NVRx's rank assignment makes the first
N x nproc ranks active (they call the training function and form the process group) and keeps the
rest in NVRx's reserve loop, outside every process group, until a restart needs them:

    LoseWholeNodes(nproc)           a node that lost a rank is lost whole: its other ranks are
                                    discarded (they leave the Wrapper and exit 1)
    ShiftRanks                      the survivors keep their order and the ranks past a lost one
                                    shift down to fill the gap
    MaxActiveWorldSize(N x nproc)   the active world never grows past N x nproc

so the active nodes are always the first N surviving nodes in launch order, and a lost node's
place is taken by the first spare node moving up at the end (`node_roles` states this rule for
whoever reports it, e.g. `nvrx-eks status`).

(Compose runs right to left.) Nodes must stay whole: a spare node's ranks take a lost node's
place together, and each node's ranks stay one node's local ranks. A rank's death does not end its
node-mates at once: they join the restart, and their launcher (--max-restarts 0, below) stops them
only later; an assignment that kept them would make them active ranks of the next process group,
which then waits for ranks that are gone, restart after restart (seen with --nproc 2: 11 in-process
restarts, then exit 1). NVRx's FilterCountGroupedByKey groups ranks this way but in NVRx 0.7.0
calls `store.barrier(ranks=..., group_name=...)`, which fails with torch 2.13's own
`Store.barrier(key, world_size)` (TypeError at the Wrapper's first rank assignment);
LoseWholeNodes needs no barrier: every rank computes the same set from the terminated ranks NVRx
gathered. It relies on ranks being laid out node by node (local rank = rank % nproc), which
ft_launcher does and whole-node shifts preserve.

The active world, the global batch, each active rank's data shard and so the numerics do not change
when a spare takes over: the spare loads the lost ranks' shards from the newest checkpoint as that
rank. The RetryController's minimum world is the active world: once the spares are used up, the
next lost rank makes every rank leave the Wrapper and the fault goes to the next layer (a relaunch
restores the spares).

A rank lost under ft_launcher: its NVRx monitor process records it terminated, so the survivors
restart in process without it. Its node's launcher must not restart its workers (they would
re-enter the rendezvous, and ft_launcher then restarts every node's workers: any-failed), so
with spares the launcher runs with --max-restarts 0 (workloads.launch): a node that loses a rank
leaves the job, the rest continue in process.

"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeRole:
    """What a launched node is doing: "active" (holding ranks first_rank..first_rank+nproc-1),
    "spare" (waiting outside the process group) or "lost"."""

    node: int
    role: str
    first_rank: int | None = None


def node_roles(*, launched_nodes: int, spare_nodes: int, lost: set[int], nproc_per_node: int) -> list[NodeRole]:
    """Each launched node's role once the nodes in `lost` are gone, as the rank assignment below
    decides it: the first launched - spare surviving nodes, in launch order, hold the active ranks
    in that order; the other survivors are spares. With more nodes lost than there are spares,
    fewer nodes are active than the job needs: the next layer restarts it."""
    active = launched_nodes - spare_nodes
    survivors = [n for n in range(launched_nodes) if n not in lost]
    roles = []
    for node in range(launched_nodes):
        if node in lost:
            roles.append(NodeRole(node, "lost"))
            continue
        position = survivors.index(node)
        if position < active:
            roles.append(NodeRole(node, "active", position * nproc_per_node))
        else:
            roles.append(NodeRole(node, "spare"))
    return roles


def whole_nodes(ranks: set[int], nproc_per_node: int) -> set[int]:
    """Every rank of each node that has a rank in `ranks`."""
    nodes = {rank // nproc_per_node for rank in ranks}
    return {node * nproc_per_node + local for node in nodes for local in range(nproc_per_node)}


def active_world_size(world_size: int, spare_nodes: int, nproc_per_node: int) -> int:
    return world_size - spare_nodes * nproc_per_node


def rank_assignment(*, world_size: int, spare_nodes: int, nproc_per_node: int):
    """NVRx rank assignment for `spare_nodes` spare nodes out of world_size / nproc_per_node."""
    from nvidia_resiliency_ext import inprocess
    from nvidia_resiliency_ext.inprocess.rank_assignment import MaxActiveWorldSize, RankAssignment, ShiftRanks

    class LoseWholeNodes(RankAssignment):
        """A node that lost a rank is lost whole (see the module docstring)."""

        def __call__(self, ctx):
            ctx.terminated_ranks = whole_nodes(ctx.terminated_ranks, nproc_per_node) & set(range(ctx.state.world_size))
            return ctx

    return inprocess.Compose(
        MaxActiveWorldSize(active_world_size(world_size, spare_nodes, nproc_per_node)),
        ShiftRanks(),
        LoseWholeNodes(),
    )
