"""`nvrx-eks local`'s verdict on a run with lost nodes: the run's exit code from the launchers'
codes, and what it says of a fault no restart followed."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from nvrx_eks.local.outcome import print_report
from nvrx_eks.local.runner import run_code


@pytest.mark.parametrize(
    "codes,spares,completed,expected",
    [
        ([0, 0], 0, True, (0, 0)),
        ([0, 1], 0, False, (1, 0)),
        # A spare took the lost node's place and the survivors completed the run.
        ([0, -9, 0], 1, True, (0, 1)),
        ([0, 1, 0], 1, True, (0, 1)),
        # Node 0 (the stores) lost: the others could not go on, the run did not complete.
        ([-9, 0, 0], 1, False, (137, 0)),
        # More nodes lost than there are spares.
        ([0, -9, -9], 1, False, (137, 0)),
        ([0, -9, 1], 1, True, (137, 0)),
    ],
)
def test_the_run_code_counts_a_lost_node_only_when_the_survivors_completed(codes, spares, completed, expected):
    assert run_code(codes, spares, completed=completed) == expected


def _run_with_fault(run_dir: Path, kind: str, target: int) -> None:
    events = [
        {"t": 1.0, "event": "run_start", "world_size": 2},
        {"t": 2.0, "event": "step_end", "step": 1, "loss": 5.0, "step_s": 0.1},
        {"t": 3.0, "event": "fault_injected", "kind": kind, "step": 2, "target_rank": target, "node": target},
    ]
    (run_dir / "events").mkdir(parents=True)
    common = {"v": 1, "rank": 0, "pid": 1, "host": "h", "cycle": 0, "iteration": 0}
    (run_dir / "events" / "rank0.jsonl").write_text("".join(json.dumps({**common, **e}) + "\n" for e in events))


def _report(run_dir: Path, code: int) -> str:
    out = io.StringIO()
    print_report(Console(file=out, width=200), run_dir, code, 10.0, [])
    return out.getvalue()


def test_losing_node_0_is_reported_as_the_end_of_the_run(tmp_path):
    _run_with_fault(tmp_path, "node-loss", 0)
    text = _report(tmp_path, 137)
    assert "launcher exit 137" in text
    assert "not recovered: node 0 hosts the rendezvous and in-process stores" in text
    assert "no restart needed" not in text


def test_a_fault_no_restart_followed_in_a_failed_run_is_not_called_harmless(tmp_path):
    _run_with_fault(tmp_path, "exception", 1)
    assert "injected; no restart followed (the run ended with exit 1)" in _report(tmp_path, 1)
    assert "injected (no restart needed)" in _report(tmp_path, 0)
