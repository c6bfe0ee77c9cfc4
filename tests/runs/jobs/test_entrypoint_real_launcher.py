"""The rendered JobSet entrypoint with the real ft_launcher and real ranks: SIGTERM delivered as
the image's tini delivers it leaves the rank-monitor server up until the rank has finished its
last checkpoint; a rank that stops the job makes the pod exit 93 after one cycle, on the other
node too; a failure without this attempt's record keeps its exit status. The entrypoint with
stand-ins for `python` and `ft_launcher`: tests/unit/jobs/test_manifests_entrypoint.py."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import REPO_ROOT
from tests.support.entrypoint_sandbox import (
    deliver_sigterm_like_tini,
    entrypoint,
    stale_records,
)

#: A rank that reports to ft_launcher's rank monitor like the trainer, and on SIGTERM keeps
#: reporting for two seconds (its final checkpoint) before it exits 143.
RANK = """\
import os, signal, sys, time
from pathlib import Path
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

work = Path(os.environ["WORK"])
terms = []
signal.signal(signal.SIGTERM, lambda *_: terms.append(time.monotonic()))
client = RankMonitorClient()
client.init_workload_monitoring()
(work / "rank-started").touch()
while not terms:
    client.send_heartbeat()
    time.sleep(0.1)
try:
    for _ in range(20):
        time.sleep(0.1)
        client.send_heartbeat()
    client.shutdown_workload_monitoring()
except Exception as err:
    (work / "rank-result").write_text(f"lost the rank monitor: {type(err).__name__}: {err}")
    sys.exit(1)
(work / "rank-result").write_text("finished")
sys.exit(143)
"""


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")  # real launchers: not beside a trainer run or rehearsal
def test_rank_finishes_its_last_checkpoint_when_the_pod_is_terminated(sandbox):
    """The rendered entrypoint with the real ft_launcher (local rendezvous, one CPU rank): SIGTERM
    delivered as the image's tini does must leave ft_launcher's rank-monitor server up while the
    rank finishes. Signalling the whole group (`tini -g`) stops the server first. The JobSet
    entrypoint stands for both (test_the_two_entrypoints_differ_only_in_their_exit_mapping_and_rendezvous_host)."""
    from tests.support.trainer_fixtures import coordinator_serving, port_pair
    from workloads.config import TrainConfig
    from workloads.launch import build_ft_launcher_argv

    work, env = sandbox
    (work / "rank.py").write_text(RANK)
    cfg = TrainConfig.from_dict(
        {"run_dir": str(work / "run"), "fault_tolerance": {"monitor": "heartbeat"}}, source="test"
    )
    port = port_pair()
    argv = build_ft_launcher_argv(
        cfg, config_path="unused", nnodes=1, nproc_per_node=1, rdzv_endpoint=f"127.0.0.1:{port}",
        launcher=str(Path(sys.executable).parent / "ft_launcher"),
    )  # fmt: skip
    argv = argv[: argv.index("-m")] + [str(work / "rank.py")]
    # The entrypoint's `ft_launcher ...` becomes the real launcher with this local command line.
    (work / "bin" / "ft_launcher").write_text(f"#!/bin/sh\nexec {shlex.join(argv)}\n")
    with coordinator_serving(port):
        process = subprocess.Popen(
            ["/bin/sh", "-c", entrypoint("jobset")],
            env={**env, "PATH": f"{work / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
            stdout=open(work / "launcher.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while not (work / "rank-started").exists():
                assert process.poll() is None, (work / "launcher.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the rank did not start"
                time.sleep(0.1)
            time.sleep(1.0)  # a few heartbeats in
            deliver_sigterm_like_tini(process)
            process.wait(timeout=120)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    result = (work / "rank-result").read_text() if (work / "rank-result").exists() else "(no result)"
    assert result == "finished", f"{result}\n{(work / 'launcher.log').read_text()[-3000:]}"
    assert process.returncode == 143, (work / "launcher.log").read_text()[-3000:]


# --- A rank's "do not requeue", with the real ft_launcher ----------------------------------------

#: A rank that, when told to, decides like the trainer that no restart can fix the job: it
#: records the decision for its attempt, asks its launcher to shut the workload down, exits 93.
#: Otherwise it fails with 1 (FAIL) or reports heartbeats until it is stopped.
STOPPING_RANK = """\
import os, sys, time
from pathlib import Path
from workloads import do_not_requeue
from workloads.config import FaultToleranceConfig
from workloads.ft_integration import FaultToleranceReporter

work = Path(os.environ["WORK"])
with open(work / "rank-starts", "a") as f:
    f.write(os.environ["GROUP_RANK"] + "\\n")
ft = FaultToleranceReporter(FaultToleranceConfig(monitor="heartbeat"))
if os.environ.get("FAIL") == "1":
    sys.exit(1)
if os.environ.get("STOP") == os.environ["GROUP_RANK"]:
    do_not_requeue.write_record(work / "run", do_not_requeue.attempt_id(), rank=int(os.environ["RANK"]),
                                reason="checkpoint.dir /x is read-only; make it writable")
    ft.request_shutdown("checkpoint.dir /x is read-only")
    os._exit(93)
while True:
    ft.heartbeat()
    time.sleep(0.2)
"""


def _real_launcher_sandbox(
    work: Path, env: dict, api: str, *, nnodes: int = 1, node: int = 0, port: int
) -> tuple[str, dict]:
    """The rendered entrypoint of `api` with the real ft_launcher (local rendezvous, one CPU rank
    per node, no restarts beyond one) running STOPPING_RANK, the run dir under `work`."""
    from workloads.config import TrainConfig
    from workloads.launch import build_ft_launcher_argv

    (work / "rank.py").write_text(STOPPING_RANK)
    cfg = TrainConfig.from_dict(
        {"run_dir": str(work / "run"), "fault_tolerance": {"monitor": "heartbeat", "max_restarts": 1}}, source="test"
    )
    argv = build_ft_launcher_argv(
        cfg, config_path="unused", nnodes=nnodes, nproc_per_node=1, rdzv_endpoint=f"127.0.0.1:{port}",
        launcher=str(Path(sys.executable).parent / "ft_launcher"),
    )  # fmt: skip
    argv = argv[: argv.index("-m")] + [str(work / "rank.py")]
    bin_dir = work / f"bin-{node}"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python",):
        (bin_dir / name).write_text((work / "bin" / name).read_text())
        (bin_dir / name).chmod(0o755)
    (bin_dir / "ft_launcher").write_text(f"#!/bin/sh\nexec {shlex.join(argv)}\n")
    (bin_dir / "ft_launcher").chmod(0o755)
    script = entrypoint(api)
    script = script.replace("--run-dir /fsx/runs/train", f"--run-dir {work / 'run'}")
    env = {**env, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO_ROOT), "NVRX_EKS_ATTEMPT_ID": "uid-1-0"}  # fmt: skip
    return script, env


def _run_logged(script: str, env: dict, log: Path, **extra) -> subprocess.Popen:
    return subprocess.Popen(["/bin/sh", "-c", script], env={**env, **extra}, stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def _finish(process: subprocess.Popen, timeout: float) -> int:
    try:
        return process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")  # real launchers: not beside a trainer run or rehearsal
def test_a_rank_that_stops_the_job_makes_the_pod_exit_93_after_one_cycle(sandbox):
    """The JobSet entrypoint stands for both; the PyTorchJob's mapping of the record is
    test_this_attempts_record_on_the_run_dir_makes_the_pod_exit_93."""
    from tests.support.trainer_fixtures import coordinator_serving, port_pair

    work, env = sandbox
    port = port_pair()
    script, env = _real_launcher_sandbox(work, env, "jobset", port=port)
    started = time.monotonic()
    with coordinator_serving(port):
        code = _finish(_run_logged(script, env, work / "log", STOP="0"), timeout=120)
    log = (work / "log").read_text(errors="replace")
    assert code == 93, log[-3000:]
    assert time.monotonic() - started < 60, log[-3000:]
    # One launcher cycle: the shutdown request closed the rendezvous instead of a restart.
    assert (work / "rank-starts").read_text().split() == ["0"], log[-3000:]
    lines = [line for line in log.splitlines() if line.startswith("nvrx-eks: do not requeue")]
    assert lines == ["nvrx-eks: do not requeue (rank 0): checkpoint.dir /x is read-only; make it writable"]


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")  # real launchers: not beside a trainer run or rehearsal
def test_a_failure_without_this_attempts_record_keeps_its_exit_status(sandbox):
    """A rank that fails with 1 until the launcher gives up: the JobSet pod exits with the real
    launcher's status, 1, as before. A record of another attempt, or of this attempt id but older
    than the pod (an earlier submission under the same name), changes nothing. The PyTorchJob's
    mapping of that status (138), and the same without records, are
    test_a_launcher_failure_without_this_attempts_record_keeps_its_exit_status."""
    from tests.support.trainer_fixtures import coordinator_serving, port_pair

    work, env = sandbox
    port = port_pair()
    script, env = _real_launcher_sandbox(work, env, "jobset", port=port)
    stale_records(work / "run", env["NVRX_EKS_ATTEMPT_ID"])
    with coordinator_serving(port):
        code = _finish(_run_logged(script, env, work / "log", FAIL="1"), timeout=120)
    log = (work / "log").read_text(errors="replace")
    assert code == 1, log[-3000:]
    assert "do not requeue" not in log


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")  # real launchers: not beside a trainer run or rehearsal
def test_the_node_whose_rank_did_not_fail_exits_93_too(sandbox):
    """Two JobSet pods on one rendezvous (nnodes 2, one rank each): node 1's rank stops the job;
    node 0's launcher sees the closed rendezvous and exits 0 (as a standby node would); its
    entrypoint finds the record on the shared run dir and exits 93 as well."""
    from tests.support.trainer_fixtures import coordinator_serving, port_pair

    work, env = sandbox
    port = port_pair()
    processes = []
    with coordinator_serving(port, nnodes=2):
        for node in (0, 1):
            script, node_env = _real_launcher_sandbox(work, env, "jobset", nnodes=2, node=node, port=port)
            # Two launchers on one host: NVRx closes such a rendezvous unless told it is a simulation.
            processes.append(
                _run_logged(script, node_env, work / f"log-{node}", STOP="1", NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE="1")
            )
        codes = [_finish(p, timeout=120) for p in processes]
    logs = [(work / f"log-{node}").read_text(errors="replace") for node in (0, 1)]
    assert codes == [93, 93], "\n=====\n".join(log[-3000:] for log in logs)
    for log in logs:
        assert "nvrx-eks: do not requeue (rank 1): checkpoint.dir /x is read-only" in log
    assert sorted((work / "rank-starts").read_text().split()) == ["0", "1"]
