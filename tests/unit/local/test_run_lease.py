"""One writer per run directory (workloads/lease.py): a second run on a directory a live run holds
is refused, naming the holder, before it writes anything; the first run is untouched. A second
`nvrx-eks local` meeting a live one: tests/runs/local/test_live_run.py (on the run it watches)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.support.trainer_fixtures import port_pair
from workloads.events import load_run
from workloads.lease import BEAT_S, LEASE_FILE, RunDirectoryInUse, RunLease


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


# --- The lease follows rank 0 (spares), and two contenders never both take it -------------------

LAUNCH_HOLDER = """
import pathlib, sys, time
import workloads.lease as lease
lease.BEAT_S = 0.2
run_dir, attempt, rendezvous_round = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
lease.HeartbeatLease(run_dir, attempt, "workloads.train rank 0", rendezvous_round).take()
print("held", flush=True)
time.sleep(60)
"""


def _launch_holder(run_dir, attempt: str, rendezvous_round: str) -> subprocess.Popen:
    """A rank 0 of job attempt `attempt` in `rendezvous_round`, beating on run_dir's lease."""
    holder = subprocess.Popen(
        [sys.executable, "-c", LAUNCH_HOLDER, str(run_dir), attempt, rendezvous_round],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def _lease(run_dir) -> dict:
    return json.loads((run_dir / LEASE_FILE).read_text())


def test_the_process_that_becomes_rank_0_takes_its_own_launchs_lease_at_once(tmp_path, monkeypatch):
    """A spare made rank 0 at an in-process restart: the lost rank 0's lease, still fresh, is its
    own job's, taken over without the STALE_S wait; the replaced holder (alive here, as a node's
    discarded rank 0 is for a moment) sees the higher term at its next beat and stops renewing."""
    import workloads.lease as lease

    monkeypatch.setattr(lease, "BEAT_S", 0.2)
    old = _launch_holder(tmp_path, "uid-1-0", "10.0.0.1:29400")
    try:
        begin = time.monotonic()
        follower = lease.RankZeroLease(
            tmp_path, attempt="uid-1-0", rendezvous_round="10.0.0.1:29400", command="rank 0 now"
        )
        assert follower.follow(2) is None and follower.held is None  # not rank 0: nothing to hold
        how = follower.follow(0)
        assert time.monotonic() - begin < lease.BEAT_S
        assert how is not None and how.startswith("taken over from workloads.train rank 0, pid ")
        assert _lease(tmp_path)["pid"] == os.getpid() and _lease(tmp_path)["term"] == 2
        time.sleep(6 * lease.BEAT_S)  # the old holder beats again, sees term 2 and stops
        held = _lease(tmp_path)
        assert (held["pid"], held["command"]) == (os.getpid(), "rank 0 now") and held["beat"] >= 3
    finally:
        old.kill()
        _, stderr = old.communicate()
        if follower.held is not None:
            follower.held.release()
    assert "the run directory's lease is now held by rank 0 now, pid" in stderr


@pytest.mark.parametrize(
    ("attempt", "rendezvous_round"),
    [("uid-2-0", "10.0.0.1:29400"), ("train", "10.0.0.9:41017")],
    ids=["another-job", "same-name-resubmitted"],
)
def test_a_live_lease_of_another_launch_is_still_refused(tmp_path, monkeypatch, attempt, rendezvous_round):
    """Another job, or the same PyTorchJob name submitted again (its attempt id is the name; its
    rendezvous round is its own), is refused once the lease is seen beating."""
    import workloads.lease as lease

    monkeypatch.setattr(lease, "BEAT_S", 0.2)
    other = _launch_holder(tmp_path, "train" if attempt == "train" else "uid-1-0", "10.0.0.1:29400")
    try:
        follower = lease.RankZeroLease(tmp_path, attempt=attempt, rendezvous_round=rendezvous_round, command="x")
        with pytest.raises(RunDirectoryInUse, match=r"in use by another run \(workloads.train rank 0, pid"):
            follower.follow(0)
        assert follower.held is None and _lease(tmp_path)["pid"] == other.pid
    finally:
        other.kill()
        other.wait()


def test_a_process_no_longer_rank_0_stops_renewing_the_lease(tmp_path, monkeypatch):
    import workloads.lease as lease

    monkeypatch.setattr(lease, "BEAT_S", 0.1)
    follower = lease.RankZeroLease(tmp_path, attempt="uid-1-0", rendezvous_round="10.0.0.1:29400", command="x")
    assert follower.follow(0) == "taken"
    assert follower.follow(0) is None  # still rank 0 after a restart: it holds it already
    time.sleep(3 * lease.BEAT_S)
    assert _lease(tmp_path)["beat"] >= 1
    follower.follow(1)
    time.sleep(lease.BEAT_S)  # a beat in flight when it was released
    last = (tmp_path / LEASE_FILE).read_text()
    time.sleep(3 * lease.BEAT_S)
    assert (tmp_path / LEASE_FILE).read_text() == last


CONTENDER = """
import pathlib, sys, time
import workloads.lease as lease
lease.BEAT_S, lease.STALE_S = 0.2, 0.0
run_dir, name, sync = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
read = lease.HeartbeatLease._read
first = [True]
def read_in_step(self):
    # Both contenders have read the lease before either writes it: the window a wait loop leaves.
    text = read(self)
    if first[0]:
        first[0] = False
        (sync / f"ready-{name}").touch()
        while not (sync / "go").exists():
            time.sleep(0.005)
    return text
lease.HeartbeatLease._read = read_in_step
replace, stall = lease.os.replace, [float(sys.argv[4])]
def replace_after_a_stall(src, dst):
    # Descheduled between its check that the lease is still the one it read and its first write.
    if pathlib.Path(dst) == run_dir / lease.LEASE_FILE:
        time.sleep(stall.pop() if stall else 0)
    replace(src, dst)
lease.os.replace = replace_after_a_stall
try:
    lease.HeartbeatLease(run_dir, name, f"contender {name}").take()
    print("held", flush=True)
except lease.RunDirectoryInUse as err:
    print(f"refused: {err}", flush=True)
time.sleep(1.0)
"""


@pytest.mark.parametrize(
    ("lease_before", "stall_s"),
    [("none", 0.0), ("stale", 0.0), ("stale", BEAT_S / 2 + 0.5)],
    ids=["none", "stale", "stale-claimant-stalled"],
)
def test_two_contenders_that_read_the_same_lease_never_both_take_it(tmp_path, lease_before, stall_s):
    """S5's window: both read an absent (or stale) lease, then both write. The absent one is
    created by a hard link, the stale one replaced under a claim: exactly one holds it, also when
    the claimant stalls between its check and its write for longer than half a beat (a loaded
    machine; the contender that waited on its claim once took it for dead then)."""
    run_dir, sync = tmp_path / "run", tmp_path / "sync"
    run_dir.mkdir()
    sync.mkdir()
    if lease_before == "stale":
        (run_dir / LEASE_FILE).write_text(json.dumps({"pid": 1, "host": "lost-node", "command": "x", "since": 0}))
    contenders = {
        name: subprocess.Popen([sys.executable, "-c", CONTENDER, str(run_dir), name, str(sync), str(stall_s)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in ("a", "b")
    }  # fmt: skip
    deadline = time.monotonic() + 30
    while not all((sync / f"ready-{n}").exists() for n in contenders) and time.monotonic() < deadline:
        time.sleep(0.01)
    (sync / "go").touch()
    said = {name: p.communicate(timeout=30)[0].strip() for name, p in contenders.items()}
    holders = [name for name, out in said.items() if out == "held"]
    assert len(holders) == 1, said
    (loser,) = set(said) - set(holders)
    assert said[loser].startswith(f"refused: run_dir: {run_dir} is in use by another run (contender {holders[0]}, pid")
    assert _lease(run_dir)["command"] == f"contender {holders[0]}"
    assert [p.name for p in run_dir.iterdir()] == [LEASE_FILE]  # no claim or temporary file left


def test_each_in_process_iteration_the_process_nvrx_made_rank_0_holds_the_lease(tmp_path, monkeypatch):
    """workloads.train at an iteration's start: RANK is NVRx's assignment for it."""
    from types import SimpleNamespace

    import workloads.lease as lease
    import workloads.train as train
    from workloads.events import EventLog

    monkeypatch.setattr(lease, "BEAT_S", 0.1)
    follower = lease.RankZeroLease(tmp_path, attempt="uid-1-0", rendezvous_round="10.0.0.1:29400", command="x")
    monkeypatch.setattr(train, "_run_lease", follower)
    process = SimpleNamespace(events=EventLog(tmp_path, 2))  # a spare, started as rank 2
    monkeypatch.setenv("RANK", "2")
    train._follow_rank_0(process, None)
    assert follower.held is None and not (tmp_path / LEASE_FILE).exists()
    monkeypatch.setenv("RANK", "0")  # rank 0's node was lost: this process is rank 0 now
    train._follow_rank_0(process, None)
    try:
        assert _lease(tmp_path)["pid"] == os.getpid()
        (event,) = load_run(tmp_path).of("run_lease")
        assert (event["rank"], event["how"]) == (0, "taken")
    finally:
        assert follower.held is not None
        follower.held.release()
