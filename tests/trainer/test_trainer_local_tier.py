"""The node-local checkpoint tier end to end: `nvrx-eks local --nodes 2 --nproc 1` (two
ft_launchers, one rendezvous, a local root each), the same faults as the issue's acceptance plus
corrupt-local, against the same command without faults."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from tests.support.trainer_fixtures import assert_nothing_left, exclusive_trainer_runs, port_pair
from workloads.events import load_run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]

FAULTS = "exception@13:1,hang@27:0,sigkill@33:0,corrupt-local@25:1"


def _run(run_dir: Path, faults: str) -> tuple[int, dict]:
    from nvrx_eks.local.runner import run_local

    code = run_local(nodes=2, nproc=1, steps=40, faults=faults, run_dir=run_dir, preset="tiny",
                     checkpoint_interval=20, local_interval=2, backend="nvrx", port=port_pair(),
                     console=Console(file=open(os.devnull, "w")))  # noqa: SIM115  # fmt: skip
    return code, json.loads((run_dir / "summary.json").read_text())


def test_faults_recover_from_the_local_tier_and_end_bit_identical(tmp_path, tmp_path_factory):
    with exclusive_trainer_runs(tmp_path_factory):
        clean_code, clean = _run(tmp_path / "clean", "")
        code, faulted = _run(tmp_path / "faulted", FAULTS)
    assert clean_code == code == 0
    assert faulted["state_sha256"] == clean["state_sha256"]
    assert {f["fault"]: f["lost_steps"] <= 2 for f in faulted["faults"]} == {
        f: True for f in FAULTS.split(",")
    }  # fmt: skip
    run = load_run(tmp_path / "faulted")
    # Each node wrote its own root: replicas crossed simulated nodes.
    for node in (0, 1):
        assert any((tmp_path / "faulted" / f"local-node{node}").glob("step_*/rank*.json"))
    # corrupt-local: rank 1's own copy is refused by its SHA-256 and the replica held by rank 0
    # (the other node) takes over.
    skipped = run.of("local_copy_skipped", rank=1)
    assert skipped and skipped[0]["reason"] == "does not match its recorded SHA-256"
    replica = [e for e in run.of("local_restore", rank=1) if e["source"] == "replica"]
    assert replica and replica[0]["from_rank"] == 0 and replica[0]["step"] == 24
    # In-process restarts never load from FSx: every restore after a fault came from the local
    # tier, and no FSx checkpoint was loaded at all.
    inprocess = [e for e in run.of("restart_end") if e["layer"] == "inprocess"]
    assert inprocess
    assert all(e["iteration"] in {r["iteration"] for r in run.of("local_restore", rank=e["rank"])
                                  if r["cycle"] == e["cycle"]} for e in inprocess)  # fmt: skip
    assert run.of("checkpoint_load") == []
    assert_nothing_left(tmp_path / "faulted", json.loads((tmp_path / "faulted" / "local_run.json").read_text()))
