"""The coordinator's stop: after SIGTERM its stores stay up while any rank or launcher is still
connected (the ranks' stop-save reads them), and go as soon as none is. Before, SIGTERM to every
process of a run (a node shutdown, a process-group kill) dropped the stores at once, and every
rank's stop-save hung on a broken pipe until SIGKILL."""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from unittest import mock

import torch.distributed as dist

from tests.support import REPO_ROOT
from tests.support.trainer_fixtures import port_pair
from workloads.config import TrainConfig


@contextlib.contextmanager
def _coordinator(port: int, grace_s: float) -> Iterator[subprocess.Popen]:
    """A coordinator on `port` whose stop grace is `grace_s`, killed at the end whatever happened."""
    from nvrx_eks.local.processes import start_coordinator

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    # The grace is the ranks' stop bound (launcher_term_timeout_s); a short one keeps the test short.
    with mock.patch.object(TrainConfig, "launcher_term_timeout_s", lambda self: grace_s):
        coordinator = start_coordinator(TrainConfig(), 1, port, env, subprocess.DEVNULL)
    try:
        yield coordinator
    finally:
        coordinator.kill()
        coordinator.wait()


def _client(port: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port + 1, is_master=False, timeout=datetime.timedelta(seconds=10))


def test_after_sigterm_the_stores_serve_a_connected_rank_then_stop_once_it_is_gone():
    port = port_pair()
    with _coordinator(port, grace_s=60) as coordinator:
        rank = _client(port)
        coordinator.send_signal(signal.SIGTERM)
        time.sleep(3)
        assert coordinator.poll() is None, "the stores went while a rank was still connected"
        rank.set("stop-save", "done")  # the store still answers
        assert rank.get("stop-save") == b"done"
        del rank  # the rank exits
        started = time.monotonic()
        assert coordinator.wait(timeout=15) == 0
        assert time.monotonic() - started < 5


def test_after_sigterm_with_no_client_the_coordinator_stops_at_once():
    with _coordinator(port_pair(), grace_s=60) as coordinator:
        started = time.monotonic()
        coordinator.send_signal(signal.SIGTERM)
        assert coordinator.wait(timeout=15) == 0
        assert time.monotonic() - started < 5


def test_the_grace_bounds_a_client_that_never_leaves():
    port = port_pair()
    with _coordinator(port, grace_s=4) as coordinator:
        rank = _client(port)
        started = time.monotonic()
        coordinator.send_signal(signal.SIGTERM)
        assert coordinator.wait(timeout=30) == 0
        assert 4 <= time.monotonic() - started < 12
        del rank
