"""The trainer runs tests share, by name: each is made once per pytest session, by whichever
test asks first, and read by every test that names it. A test that needs a real multi-process run
reads one of these where it can (many checks on one run), and adds one here, not a private pair,
where it cannot. The runs come from `nvrx-eks local`'s own code path (local_run)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.support.trainer_fixtures import exclusive_trainer_runs, local_run, session_root

#: The fault schedule of the 2-rank run whose recoveries test_trainer_faults checks, one fault of
#: each kind a single node meets, on both ranks.
FAULTED_SCHEDULE = "exception@7:1,hang@13:0,corrupt-latest@17:0,exception@17:0,sigkill@21:1,kill-in-save@25"


@dataclass(frozen=True)
class RunSpec:
    """local_run's arguments (the tiny preset, the local CPU profile)."""

    steps: int
    interval: int = 5
    faults: str = ""
    nproc: int = 2
    nodes: int = 1
    backend: str = "nvrx"
    overrides: tuple[str, ...] = ()


RUNS: dict[str, RunSpec] = {
    # One node of two ranks, 30 steps: the reference of the fault, signal and lease tests.
    "clean": RunSpec(steps=30),
    "faulted": RunSpec(steps=30, faults=FAULTED_SCHEDULE),
    # Two nodes of one rank, 40 steps, a checkpoint every 10: the reference of the spares, the
    # local tier, the fault classes and the rehearsal.
    "clean-2x1-40": RunSpec(steps=40, interval=10, nproc=1, nodes=2),
    # A short committed run the reliability tests copy and damage.
    "reliability-base": RunSpec(steps=12),
    # Synchronous DCP saves, whose checkpoints the Hugging Face export reads.
    "hf-export": RunSpec(steps=30, interval=10, backend="sync"),
    # reliability-base's run (2 ranks, 12 steps, a checkpoint every 5) with settings that change
    # no numerics, each read by its own test: hybrid sharding (replication degree 1 on one node:
    # it must train exactly like full sharding), require_efa on gloo (the check is skipped), a
    # node-local root that cannot be made (/dev/null is not a directory: the tier turns itself off)
    # and an end-of-run digest on both ranks slower than the in-process soft timeout.
    "variants-2x12": RunSpec(
        steps=12,
        faults="slow-digest@12:0,slow-digest@12:1",
        overrides=(
            "distributed.shard=hybrid",
            "distributed.require_efa=true",
            "checkpoint.local.interval_steps=2",
            "checkpoint.local.dir=/dev/null/local",
        ),
    ),
}


def named_run(tmp_path_factory, name: str) -> Path:
    """The run directory of RUNS[name], made on first use in this session (under the lock that
    keeps trainer runs one at a time; not from inside it)."""
    spec = RUNS[name]
    run_dir = session_root(tmp_path_factory) / f"run-{name}"
    with exclusive_trainer_runs(tmp_path_factory):
        if not (run_dir / "local_run.json").is_file():
            local_run(run_dir, **asdict(spec))
    return run_dir


def named_summary(tmp_path_factory, name: str) -> dict:
    """summary.json of RUNS[name]."""
    return json.loads((named_run(tmp_path_factory, name) / "summary.json").read_text())
