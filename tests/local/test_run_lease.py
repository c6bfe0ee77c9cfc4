"""One writer per run directory (workloads/lease.py): a second run on a directory a live run holds
is refused, naming the holder, before it writes anything; the first run is untouched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.support.trainer_fixtures import exclusive_trainer_runs, port_pair, shared_local_run
from workloads.events import load_run
from workloads.lease import LEASE_FILE, RunDirectoryInUse, RunLease

CLI = [sys.executable, "-c", "from nvrx_eks.cli import main; main()"]


def test_a_held_lease_refuses_a_second_holder_and_is_free_once_released(tmp_path):
    with RunLease(tmp_path, "first"):
        with pytest.raises(RunDirectoryInUse, match=r"in use by another run \(first, pid \d+ on "):
            RunLease(tmp_path, "second").__enter__()
    with RunLease(tmp_path, "third"):
        assert json.loads((tmp_path / LEASE_FILE).read_text())["command"] == "third"


def test_a_process_that_died_leaves_no_lease_behind(tmp_path):
    holder = (
        "import sys, pathlib; from workloads.lease import RunLease; RunLease(pathlib.Path(sys.argv[1])).__enter__()"
    )
    subprocess.run([sys.executable, "-c", holder, str(tmp_path)], check=True)  # exits holding it
    with RunLease(tmp_path):
        pass


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")
def test_a_second_local_run_on_a_live_run_directory_is_refused(tmp_path, tmp_path_factory):
    clean = shared_local_run(tmp_path_factory, "clean", steps=30, interval=5)
    run_dir = tmp_path / "run"
    argv = [*CLI, "local", "--nproc", "2", "--steps", "30", "--checkpoint-interval", "5", "--run-dir", str(run_dir)]
    with exclusive_trainer_runs(tmp_path_factory):
        first = subprocess.Popen([*argv, "--port", str(port_pair())], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not load_run(run_dir).of("step_end"):
            time.sleep(0.2)
        second = subprocess.run([*argv, "--resume", "--port", str(port_pair())], capture_output=True, text=True)
        assert first.wait(timeout=420) == 0
    assert second.returncode == 2
    assert "is in use by another run (nvrx-eks local, pid" in second.stderr and "Traceback" not in second.stderr
    final = json.loads((run_dir / "summary.json").read_text())
    assert final["state_sha256"] == json.loads((clean / "summary.json").read_text())["state_sha256"]
    assert len(load_run(run_dir).of("run_start")) == 2  # the first run's two ranks, nothing of a second


# --- On EKS: rank 0 holds the lease by heartbeat ------------------------------------------------

HOLDER = """
import pathlib, sys, time
import workloads.lease as lease
lease.BEAT_S = 0.2
lease.HeartbeatLease(pathlib.Path(sys.argv[1]), "other-job-0", "workloads.train rank 0").take()
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def live_holder(tmp_path):
    """Another job's rank 0, beating on tmp_path/run's lease."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    yield holder
    holder.kill()
    holder.wait()


def test_a_live_heartbeat_lease_refuses_another_rank_0_naming_it(tmp_path, live_holder, monkeypatch):
    import workloads.lease as lease

    monkeypatch.setattr(lease, "BEAT_S", 0.2)
    with pytest.raises(RunDirectoryInUse, match=r"^run_dir: .* in use by another run \(workloads.train rank 0, pid"):
        lease.HeartbeatLease(tmp_path / "run", "this-job-0", "workloads.train rank 0").take()


def test_a_heartbeat_lease_that_stopped_beating_is_taken_over(tmp_path, monkeypatch):
    """A holder on another host (its node lost) is known gone only once its lease stops changing."""
    import workloads.lease as lease

    monkeypatch.setattr(lease, "BEAT_S", 0.2)
    monkeypatch.setattr(lease, "STALE_S", 1.0)
    (tmp_path / LEASE_FILE).write_text(json.dumps({"pid": 1, "host": "lost-node", "command": "x", "since": 0}))
    begin = time.monotonic()
    taken = lease.HeartbeatLease(tmp_path, "this-job-1", "workloads.train rank 0")
    taken.take()
    assert time.monotonic() - begin >= 1.0
    assert json.loads((tmp_path / LEASE_FILE).read_text())["attempt"] == "this-job-1"
    taken.release()


def test_this_hosts_earlier_rank_0_is_known_gone_at_once(tmp_path):
    """ft_launcher restarted rank 0 (or the JobSet recreated the pod, which keeps its host name)."""
    import socket

    import workloads.lease as lease

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holder = {"pid": int(dead.stdout), "host": socket.gethostname(), "command": "x", "since": 0}
    (tmp_path / LEASE_FILE).write_text(json.dumps(holder))
    begin = time.monotonic()
    lease.HeartbeatLease(tmp_path, "job-0", "workloads.train rank 0").take()
    assert time.monotonic() - begin < lease.BEAT_S


def test_a_trainer_on_a_run_directory_another_job_writes_exits_93_and_writes_nothing(tmp_path, live_holder):
    run_dir = tmp_path / "run"
    config = tmp_path / "train.yaml"
    config.write_text(f"run_dir: {run_dir}\nsteps: 2\ninprocess:\n  enabled: false\n")
    trainer = subprocess.run(
        [sys.executable, "-m", "workloads.train", "--config", str(config)],
        env={**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port_pair()),
             "NVRX_EKS_ATTEMPT_ID": "this-job-0"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert trainer.returncode == 93, trainer.stderr[-3000:]
    assert "run_dir: " in trainer.stderr and "is in use by another run (workloads.train rank 0, pid" in trainer.stderr
    assert not (run_dir / "events").exists() and not (run_dir / "checkpoints").exists()
    assert json.loads((run_dir / LEASE_FILE).read_text())["attempt"] == "other-job-0"
