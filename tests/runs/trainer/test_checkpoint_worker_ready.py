"""Two ranks (two processes, gloo) get their NVRx checkpoint workers at very different speeds, as
after an in-process restart in which one rank reuses its worker and the other spawns a new one
(torch's import: 9-17 s on a loaded host). The fast rank must wait for the slow one within the
workers' own bound, not within the process group's timeout (on gloo, the in-process soft
timeout): a timeout there was a restart that hit the slow rank mid-spawn, and the next iteration
spawned again, restart after restart (workloads.checkpoint.nvrx_worker)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.support.trainer_fixtures import REPO, port_pair

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]

#: The process group's timeout here, and how much later the slow rank gets to its worker.
PG_TIMEOUT_S = 2.0
SLOW_BY_S = 3 * PG_TIMEOUT_S

RANK = textwrap.dedent(
    """
    import datetime, sys, time
    import torch.distributed as dist
    from workloads.checkpoint.nvrx_worker import checkpoint_worker
    from workloads.cuda_compat import install_cpu_checkpoint_shim
    from workloads.process_exit import exit_without_finalizing

    rank, port, pg_timeout_s, slow_by_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=pg_timeout_s))
    install_cpu_checkpoint_shim("gloo")
    if rank == 1:
        time.sleep(slow_by_s)  # this rank's worker is still starting
    started = time.monotonic()
    checkpoint_worker.queue_for(rank, "workers-ready", 120.0)
    waited = time.monotonic() - started
    dist.barrier()  # the first collective after it: every worker is up
    print(f"rank {rank} ready after {waited:.1f} s", flush=True)
    checkpoint_worker.close()
    dist.destroy_process_group()
    exit_without_finalizing(0)  # finalizing a process that used gloo can abort
    """
)


def test_a_rank_whose_worker_comes_late_is_waited_for_beyond_the_process_group_timeout(tmp_path):
    port = port_pair()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-c", RANK]
    ranks = [
        subprocess.Popen(
            [*argv, str(rank), str(port), str(PG_TIMEOUT_S), str(SLOW_BY_S)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp_path,
            env=env,
            start_new_session=True,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [rank.communicate(timeout=240)[0] for rank in ranks]
    finally:
        for rank in ranks:  # a rank that hangs (the old failure) and its worker must not outlive the test
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rank.pid, signal.SIGKILL)
    for rank, (proc, output) in enumerate(zip(ranks, outputs, strict=True)):
        assert proc.returncode == 0, f"rank {rank}:\n{output[-3000:]}"
        assert f"rank {rank} ready after" in output
    waited = float(outputs[0].split("rank 0 ready after ")[1].split()[0])
    assert waited > PG_TIMEOUT_S  # rank 0 did wait for rank 1, longer than a collective could
