"""One writer per run directory (workloads/lease.py): a second run on a directory a live run holds
is refused, naming the holder, before it writes anything; the first run is untouched."""

from __future__ import annotations

import json
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
