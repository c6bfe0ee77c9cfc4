"""Each rank binds itself to its GPU's NUMA node with sched_setaffinity (workloads/numa.py),
which the pods' seccomp profile allows, instead of ft_launcher's numactl, which it refuses."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import REPO_ROOT
from workloads.numa import GPUS_PER_NUMA_ENV, bind_rank_to_numa_node, parse_cpulist


def test_cpulist_parsing():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("5") == {5}
    assert parse_cpulist("") == set()


def test_not_asked_means_not_bound():
    assert bind_rank_to_numa_node({"LOCAL_RANK": "3"}) is None


def test_every_thread_of_the_rank_lands_on_its_node(tmp_path):
    """Local rank 5 with 4 GPUs per node goes to node 1; a thread started before the binding is
    moved too, one started after inherits it. Run in a child process: affinity is sticky."""
    allowed = sorted(os.sched_getaffinity(0))
    node1 = allowed[-1:]  # one CPU this machine allows
    (tmp_path / "node1").mkdir()
    (tmp_path / "node1" / "cpulist").write_text(",".join(map(str, node1)) + "\n")
    script = f"""
import os, threading, time
from workloads.numa import bind_rank_to_numa_node
seen = {{}}
gate = threading.Event()
def early():
    gate.wait()
    seen['early'] = os.sched_getaffinity(0)
t = threading.Thread(target=early); t.start()
env = {{'{GPUS_PER_NUMA_ENV}': '4', 'LOCAL_RANK': '5'}}
print(bind_rank_to_numa_node(env, {str(tmp_path)!r} + '/node{{node}}/cpulist'))
gate.set(); t.join()
late = threading.Thread(target=lambda: seen.__setitem__('late', os.sched_getaffinity(0))); late.start(); late.join()
print(sorted(os.sched_getaffinity(0)), sorted(seen['early']), sorted(seen['late']))
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    lines = result.stdout.splitlines()
    assert lines[0] == "numa: local rank 5 bound to NUMA node 1 (1 CPUs)"
    assert lines[1] == f"{node1} {node1} {node1}"


def test_a_node_it_cannot_read_leaves_the_rank_unbound(tmp_path):
    line = bind_rank_to_numa_node({GPUS_PER_NUMA_ENV: "4", "LOCAL_RANK": "0"}, str(tmp_path / "node{node}"))
    assert line is not None and line.startswith("numa: local rank 0 not bound: NUMA node 0's CPUs unknown")
