"""`nvrx-eks local` refuses a rank count no machine of this size can run (a mistyped --nproc
100000 forked thousands of processes) unless --force, and refuses absurd numbers before starting
anything."""

from __future__ import annotations

import os

from nvrx_eks.local.runner import RANKS_PER_CORE
from tests.support.cli_harness import run_cli
from tests.support.trainer_fixtures import processes_mentioning


def _only_error_line(result) -> str:
    assert result.code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    return line


def test_more_ranks_than_the_cores_bound_is_refused_naming_the_bound_and_the_fix(tmp_path):
    run_dir = tmp_path / "run"
    line = _only_error_line(run_cli("local", "--nodes", "2", "--nproc", "100000", "--run-dir", str(run_dir)))
    cores = os.cpu_count() or 1
    assert line == (
        f"error: --nodes 2 x --nproc 100000 = 200000 ranks, more than {RANKS_PER_CORE * cores} "
        f"({RANKS_PER_CORE} per CPU core, {cores} here); lower --nproc, --nodes or --spare-nodes, or pass "
        "--force to start them anyway"
    )
    assert not run_dir.exists() and processes_mentioning(str(run_dir)) == []


def test_force_lets_a_modest_oversubscription_through(tmp_path, monkeypatch):
    # One core: 9 ranks are over the bound. The run is then stopped by a later check (the fault
    # names a rank outside the world), so nothing is started either way.
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    argv = ["local", "--nproc", str(RANKS_PER_CORE + 1), "--faults", "sigkill@5:99", "--run-dir", str(tmp_path / "r")]
    refused = _only_error_line(run_cli(*argv))
    assert f"ranks, more than {RANKS_PER_CORE} ({RANKS_PER_CORE} per CPU core, 1 here)" in refused
    forced = _only_error_line(run_cli(*argv, "--force"))
    assert forced.startswith("error: --faults: sigkill@5:99 targets rank 99;"), forced


def test_a_step_count_in_float_notation_is_refused():
    result = run_cli("local", "--steps", "1e23")
    assert result.code == 2 and "Invalid value for '--steps'" in result.output


def test_spare_nodes_count_in_the_rank_bound(tmp_path, monkeypatch):
    # One core, 8 ranks allowed: 1 active node and its spare of 5 ranks each start 10.
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    run_dir = tmp_path / "run"
    line = _only_error_line(
        run_cli("local", "--nodes", "1", "--spare-nodes", "1", "--nproc", "5", "--run-dir", str(run_dir))
    )
    assert line.startswith(f"error: --nodes 1 + --spare-nodes 1 x --nproc 5 = 10 ranks, more than {RANKS_PER_CORE} "), (
        line
    )
    assert not run_dir.exists()


def test_a_fault_on_a_spare_node_is_refused_naming_the_active_nodes(tmp_path):
    """--nodes 2 --spare-nodes 1: nodes 0 and 1 train, node 2 waits; a fault names an active node."""
    argv = ["local", "--nodes", "2", "--spare-nodes", "1", "--nproc", "1", "--run-dir", str(tmp_path / "r")]
    line = _only_error_line(run_cli(*argv, "--faults", "node-loss@5:2"))
    assert line == (
        "error: --faults: node-loss@5:2 targets node 2; with --nodes 2 --nproc 1 --spare-nodes 1 use an "
        "active node below 2"
    )
