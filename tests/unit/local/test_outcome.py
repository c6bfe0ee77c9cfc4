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


def test_a_fault_no_restart_followed_in_a_failed_run_is_not_called_harmless(tmp_path):
    _run_with_fault(tmp_path, "exception", 1)
    assert "injected; no restart followed (the run ended with exit 1)" in _report(tmp_path, 1)
    assert "injected (no restart needed)" in _report(tmp_path, 0)


def _write_events(run_dir: Path, events: list[dict]) -> None:
    """Events on rank 0 of host h; each names its pid (a process) and time."""
    (run_dir / "events").mkdir(parents=True, exist_ok=True)
    common = {"v": 1, "rank": 0, "host": "h", "cycle": 0, "iteration": 0, "attempt": 0}
    with (run_dir / "events" / "rank0.jsonl").open("a") as out:
        out.writelines(json.dumps({**common, **e}) + "\n" for e in sorted(events, key=lambda e: e["t"]))


def _steps(pid: int, first: int, last: int, t: float) -> list[dict]:
    return [
        {"pid": pid, "t": t + i, "event": "step_end", "step": step, "loss": 1.0, "step_s": 1.0}
        for i, step in enumerate(range(first, last + 1))
    ]


def _rows(run_dir: Path, started_at: float, code: int = 0) -> dict[str, str]:
    """The report's table as label -> value."""
    out = io.StringIO()
    print_report(Console(file=out, width=400), run_dir, code, 10.0, [], started_at)
    cells = [line.strip("│").split("│") for line in out.getvalue().splitlines() if line.startswith("│")]
    return {label.strip(): value.strip() for label, value in cells}


def test_a_local_tier_whose_saves_all_failed_says_so(tmp_path):
    # A rank reports the first of the saves that fail in a row (and the first that succeeds again).
    reason = "own copy: OSError: [Errno 30] Read-only file system: '/local/run/rank0'"
    saves = [{"pid": 1, "t": 10.0 + s, "event": "local_save", "step": s, "stall_s": 0.01} for s in range(1, 16)]
    failure = {"pid": 1, "t": 11.5, "event": "local_save_failed", "step": 1, "reason": reason}
    _write_events(tmp_path, [{"pid": 1, "t": 1.0, "event": "run_start"}, *saves, failure])
    assert _rows(tmp_path, 0.0)["local tier"] == (
        f"15 saves, saves failed on rank(s) 0 from step 1 (still failing at the end; last: {reason}); "
        "restores by rank: 0 own copy, 0 replica; FSx loads 0"
    )
    recovered = {"pid": 1, "t": 15.5, "event": "local_save_recovered", "step": 5, "failed_saves": 4, "since_step": 1}
    _write_events(tmp_path / "recovered", [{"pid": 1, "t": 1.0, "event": "run_start"}, *saves, failure, recovered])
    line = _rows(tmp_path / "recovered", 0.0)["local tier"]
    assert "saves failed on rank(s) 0 from step 1 (then recovered; last: " in line


def test_replayed_steps_count_a_resume_that_fell_back_to_an_older_checkpoint(tmp_path):
    # The first run reached step 30; the resume found step 30 damaged, loaded 20 and did 21-30 again.
    first = [{"pid": 1, "t": 1.0, "event": "run_start"}, *_steps(1, 1, 30, 2.0)]
    resumed = [
        {"pid": 2, "t": 100.0, "event": "run_start"},
        {"pid": 2, "t": 101.0, "event": "checkpoint_fallback", "path": "/r/checkpoints/step_30", "reason": "sha"},
        {"pid": 2, "t": 102.0, "event": "checkpoint_load", "step": 20},
        *_steps(2, 21, 35, 103.0),
    ]
    _write_events(tmp_path, first + resumed)
    assert _rows(tmp_path, 99.0)["goodput"].endswith("(replayed steps: 10)")


def test_a_concurrent_runs_faults_and_restarts_are_not_this_runs(tmp_path):
    # Run A (pid 1) started first and goes on; this run (pid 2) starts on the same directory at 100.
    other = [
        {"pid": 1, "t": 1.0, "event": "run_start"},
        *_steps(1, 1, 5, 2.0),
        {"pid": 1, "t": 150.0, "event": "fault_injected", "kind": "slow", "step": 6, "target_rank": 0},
        {"pid": 1, "t": 151.0, "event": "restart_begin", "layer": "inprocess"},
        {"pid": 1, "t": 160.0, "event": "unrecoverable", "reason": "the other run's problem"},
    ]
    mine = [{"pid": 2, "t": 100.0, "event": "run_start"}, *_steps(2, 1, 8, 101.0)]
    _write_events(tmp_path, other + mine)
    rows = _rows(tmp_path, 99.0)
    assert not any(label.startswith("fault") for label in rows) and "stopped" not in rows
    assert rows["restarts"] == "in-process 0, launcher 0"
    assert rows["final step"] == "8"
