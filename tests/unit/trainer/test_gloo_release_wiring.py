"""Where the gloo release (workloads.gloo_sockets) sits in the in-process abort chain, and which
connections it spares: the stores the restart coordinates through. The release itself, on two real
gloo ranks: tests/runs/trainer/test_gloo_release.py."""

from __future__ import annotations

from workloads.config import InProcessConfig


def test_the_gloo_abort_releases_the_sockets_first():
    from workloads.inprocess import ReleaseGlooPeers, abort_chain

    gloo = abort_chain(InProcessConfig(), "gloo", 29501)
    # Compose runs right to left: the release comes before the checkpoint worker is killed and
    # the process groups are destroyed.
    assert isinstance(gloo[-1], ReleaseGlooPeers)
    off = InProcessConfig(release_gloo_sockets=False)
    assert not any(isinstance(a, ReleaseGlooPeers) for a in abort_chain(off, "gloo", 29501))


def test_store_ports_cover_the_launcher_store_the_rendezvous_and_the_inprocess_store(monkeypatch):
    from workloads.gloo_sockets import store_ports
    from workloads.launch import inprocess_store_port

    monkeypatch.setenv("MASTER_PORT", "41000")
    store = inprocess_store_port("10.0.0.1:29400")
    assert store_ports(store) == {41000, 29400, store}
