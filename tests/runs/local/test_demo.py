"""`make demo` end to end: the README's main command must keep working offline."""

from __future__ import annotations

import os

import pytest

from infra.config import resolve_config
from tests.support.cli_process import cli_process
from tests.support.trainer_fixtures import exclusive_trainer_runs, processes_mentioning
from workloads.events import load_run, summarize

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]


def test_demo_runs_every_step_offline(tmp_path, tmp_path_factory):
    run_dir = tmp_path / "demo"
    env = {**os.environ, "COLUMNS": "160"}
    for var in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        env.pop(var, None)
    with exclusive_trainer_runs(tmp_path_factory):
        result = cli_process("demo", "--run-dir", str(run_dir), env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    # 1. synth summary with cdk-nag status, 2. the job validated, 4. the report.
    assert "0 unacknowledged findings" in out
    assert "3 document(s) checked (kubernetes, project, crd): valid" in out
    # The job the default profile's node group can hold: render and submit refuse a larger one.
    gpu_nodes = resolve_config().gpu_nodes
    nodes = gpu_nodes.max_size
    assert f"JobSet for {nodes}x {gpu_nodes.instance_type}:" in out
    assert f"world size {nodes * gpu_nodes.facts.gpus}," in out
    assert "Where the time went" in out and (run_dir / "timeline.png").is_file()
    # 3. each fault recovered by the layer meant for it, and the run completed.
    report = summarize(load_run(run_dir))
    recovered_by = {o["fault"]: o.get("layer") for o in report.fault_outcomes()}
    assert recovered_by == {"exception@15:1": "inprocess", "hang@27:0": "inprocess", "sigkill@39:1": "launcher"}
    assert report.final_step == 50
    assert processes_mentioning(str(run_dir)) == []
