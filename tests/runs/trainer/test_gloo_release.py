"""The in-process abort releases a rank blocked in a gloo collective at once (workloads.gloo_sockets):
two real gloo ranks, one blocked in an all_reduce its peer never joins. (Where the release sits in
the abort chain, and which ports it spares: tests/unit/trainer/test_gloo_release_wiring.py.)"""

from __future__ import annotations

import datetime
import os
import time

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.support.trainer_fixtures import port_pair

PG_TIMEOUT_S = 20


def _rank(rank: int, port: int, release: bool, result) -> None:
    import torch

    from workloads.gloo_sockets import shutdown_gloo_pairs

    os.environ["MASTER_PORT"] = str(port)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=PG_TIMEOUT_S)
    )
    dist.all_reduce(torch.ones(1))  # the pairs are connected
    if rank == 0:
        # The faulting rank: it never joins the next collective; its abort runs instead.
        store.wait(["blocked"])
        time.sleep(0.5)
        if release:
            result.put(("released", shutdown_gloo_pairs({port})))
        store.wait(["done"], datetime.timedelta(seconds=PG_TIMEOUT_S + 30))
        return
    store.set("blocked", "1")
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1))
        outcome = "completed"
    except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError or DistBackendError
        outcome = type(e).__name__
    waited = time.monotonic() - started
    # The store connection was left alone: the in-process restart coordinates through it.
    store.set("after", "ok")
    result.put(("blocked", outcome, waited, store.get("after").decode()))
    store.set("done", "1")


def _blocked_peer(release: bool) -> dict:
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    port = port_pair()
    procs = [ctx.Process(target=_rank, args=(r, port, release, result)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        out = {}
        for _ in range(2 if release else 1):
            item = result.get(timeout=PG_TIMEOUT_S + 60)
            out[item[0]] = item[1:]
        return out
    finally:
        for p in procs:
            p.join(timeout=PG_TIMEOUT_S + 30)
            if p.is_alive():
                p.kill()


@pytest.mark.slow
def test_shutting_down_the_pair_sockets_releases_the_blocked_peer_at_once_and_keeps_the_store():
    out = _blocked_peer(release=True)
    assert out["released"][0] >= 1, out
    outcome, waited, store_after = out["blocked"]
    assert outcome != "completed" and waited < 3, out  # not the 20 s gloo timeout
    assert store_after == "ok"


@pytest.mark.slow
def test_without_the_release_the_peer_waits_out_the_gloo_timeout():
    """Why the release exists: the faulting rank's process-group teardown leaves the peer blocked."""
    out = _blocked_peer(release=False)
    outcome, waited, _ = out["blocked"]
    assert outcome != "completed" and waited >= PG_TIMEOUT_S - 1, out
