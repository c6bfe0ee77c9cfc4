"""Each rank on the CPUs of its GPU's NUMA node, without numactl.

NVRx's ft_launcher can bind ranks itself (NVRX_GPUS_PER_NUMA), but it does so by starting every
rank as `numactl --cpunodebind N --membind N`, and the pods run under containerd's RuntimeDefault
seccomp profile, which allows get_mempolicy, mbind and set_mempolicy only with CAP_SYS_NICE
(containerd contrib/seccomp/seccomp_default.go, since 2022-07): numactl exits 1 and no rank ever
starts. `--cpunodebind` alone fails the same way (numactl's numa_available() calls get_mempolicy).
sched_setaffinity needs no capability, and with every thread of the rank on the node's CPUs,
Linux's first-touch policy places the rank's host memory (checkpoint staging, data) on that node.

The pod sets GPUS_PER_NUMA_ENV on instance types with more than one NUMA node; local rank r goes
to node r // GPUS_PER_NUMA (the GPUs of p5 and p5en are numbered by socket: 0-3, then 4-7).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: GPUs per NUMA node, set by the rendered pod where the instance has several NUMA nodes.
GPUS_PER_NUMA_ENV = "NVRX_EKS_GPUS_PER_NUMA"
#: The kernel's list of a NUMA node's CPUs.
NODE_CPULIST = "/sys/devices/system/node/node{node}/cpulist"


def parse_cpulist(text: str) -> set[int]:
    """CPUs of a kernel cpulist such as `0-47,96-143`."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def bind_rank_to_numa_node(env: Mapping[str, str] = os.environ, cpulist: str = NODE_CPULIST) -> str | None:
    """Pin every thread of this process to the CPUs of the local rank's NUMA node (threads
    started later inherit it). Returns a line saying what was done, None when not asked to."""
    per_node = env.get(GPUS_PER_NUMA_ENV)
    if not per_node:
        return None
    local_rank = int(env.get("LOCAL_RANK", "0"))
    node = local_rank // int(per_node)
    path = Path(cpulist.format(node=node))
    try:
        node_cpus = parse_cpulist(path.read_text())
    except OSError as err:
        return f"numa: local rank {local_rank} not bound: NUMA node {node}'s CPUs unknown ({err})"
    cpus = node_cpus & os.sched_getaffinity(0)
    if not cpus:
        return f"numa: local rank {local_rank} not bound: none of NUMA node {node}'s CPUs is allowed to this process"
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    return f"numa: local rank {local_rank} bound to NUMA node {node} ({len(cpus)} CPUs)"
