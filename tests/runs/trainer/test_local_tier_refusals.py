"""The node-local tier when it cannot be used: a root that cannot be made turns the tier off (one
event naming checkpoint.local.dir) and the run completes on the FSx tier (the shared run
variants-2x12, whose local root is under /dev/null). A resume with another preset, refused by the
preflight and then by the local copies' own identity, is tested on a copy of the local tier's
faulted run (test_trainer_local_tier)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.named_runs import RUNS, named_run
from tests.support.trainer_fixtures import assert_nothing_left
from workloads.events import load_run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]


def test_a_local_root_that_cannot_be_created_turns_the_tier_off_and_the_run_completes(tmp_path_factory):
    # Under a file that is not a directory, mkdir fails (ENOTDIR) even for root, whom chmod does not stop.
    spec = RUNS["variants-2x12"]
    (root,) = [o.removeprefix("checkpoint.local.dir=") for o in spec.overrides if o.startswith("checkpoint.local.dir=")]
    assert Path(root).parent == Path("/dev/null") and "checkpoint.local.interval_steps=2" in spec.overrides
    run_dir = named_run(tmp_path_factory, "variants-2x12")
    record = json.loads((run_dir / "local_run.json").read_text())
    assert record["exit_code"] == 0, (run_dir / "launcher.log").read_text()[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["final_step"] == spec.steps
    run = load_run(run_dir)
    (disabled,) = run.of("local_tier_disabled")
    assert disabled["rank"] == 0
    assert disabled["reason"].startswith(f"rank 0: checkpoint.local.dir {root} cannot be created: ")
    assert "Not a directory" in disabled["reason"]
    assert not run.of("local_save") and run.of("checkpoint_commit")
    assert not [e for e in run.events if e["event"] == "restart_end"]
    assert_nothing_left(run_dir, record)
