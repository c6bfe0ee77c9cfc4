"""The smoke's budget and its report after every phase, with the launches replaced by ones that
take a set time on a fake clock: a later launch runs only if the time left covers the longest one
so far, a phase that would not fit is recorded as skipped for the budget, and gpu_smoke.json
holds each finished phase before the next one starts."""

from __future__ import annotations

import json
import sys

import pytest
from rich.console import Console

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.ops import gpu_smoke
from workloads.events import RunEvents


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _events(t0: float, backend: str = "gloo") -> RunEvents:
    steps = [
        {"event": "step_end", "rank": 0, "pid": 7, "t": t0 + s, "step": s, "step_s": 0.5, "loss": 5.0,
         "tokens_per_s": 2048.0, "tokens_per_s_per_gpu": 1024.0, "mfu": None}
        for s in (1, 2, 3)
    ]  # fmt: skip
    start = {"event": "run_start", "rank": 0, "pid": 7, "t": t0, "backend": backend}
    setup = {"event": "setup_end", "rank": 0, "pid": 7, "t": t0 + 0.5, "resumed_from_step": 20}
    return RunEvents([start, setup, *steps])


@pytest.fixture
def fake_launches(monkeypatch):
    """Each launch takes `seconds[name]` on the fake clock and ends with `exit_codes[name]` (0 by
    default); records what gpu_smoke.json held when it started."""
    clock = FakeClock()
    seconds = {"faulted": 60.0, "resume": 60.0, "sync": 60.0}
    exit_codes: dict[str, int] = {}
    launches: list[tuple[str, dict | None]] = []

    def launch(plan, run_dir, *, steps, faults, backend, resume, console):
        name = "resume" if resume else run_dir.name
        report = run_dir.parent / "gpu_smoke.json"
        launches.append((name, json.loads(report.read_text()) if report.is_file() else None))
        run_dir.mkdir(parents=True, exist_ok=True)
        t0 = clock.now
        clock.now += seconds[name]
        summary = {"checkpoints": {"median_stall_s": 0.1}}
        return {"exit_code": exit_codes.get(name, 0), "run": _events(t0), "summary": summary}

    real_budget = gpu_smoke.Budget
    monkeypatch.setattr(gpu_smoke, "_run", launch)
    monkeypatch.setattr(gpu_smoke, "Budget", lambda budget_s: real_budget(budget_s, clock=clock))
    return seconds, launches, exit_codes


def _smoke(tmp_path, budget_s):
    with open(tmp_path / "console.txt", "w") as sink:
        return gpu_smoke.smoke(
            out_dir=tmp_path / "smoke", dry_run=True, console=Console(file=sink, width=200), budget_s=budget_s
        )


def test_phases_that_would_not_fit_are_skipped_for_the_budget(tmp_path, fake_launches):
    _, launches, _ = fake_launches
    result = _smoke(tmp_path, budget_s=100)
    # 60 s of faults leaves 40 s: less than the 60 s a launch is known to take.
    assert [name for name, _ in launches] == ["faulted"]
    assert result["complete"] and result["skipped"] == ["resume", "stall"]
    for name in ("resume", "stall"):
        assert result["checks"][name] == {"ok": None, "skipped": "budget", "left_s": 40.0, "needed_s": 60.0}
    assert list(result["checks"]) == ["faults", "resume", "stall", "memory"]
    assert json.loads((tmp_path / "smoke" / "gpu_smoke.json").read_text()) == result
    assert "skipped: budget" in (tmp_path / "console.txt").read_text()


def test_every_phase_runs_when_the_budget_covers_it_and_each_is_reported_before_the_next(tmp_path, fake_launches):
    _, launches, _ = fake_launches
    result = _smoke(tmp_path, budget_s=200)
    assert [name for name, _ in launches] == ["faulted", "resume", "sync"]
    assert result["complete"] and result["skipped"] == []
    # What the report held as each later launch began: the phases before it, not yet complete.
    (_, before_faults), (_, before_resume), (_, before_sync) = launches
    assert before_faults is None
    assert list(before_resume["checks"]) == ["faults"] and before_resume["complete"] is False
    assert list(before_sync["checks"]) == ["faults", "resume"] and not before_sync["ok"]
    assert result["checks"]["resume"]["wall_s"] == 60.0
    assert result["checks"]["stall"]["tokens_per_s_per_rank"] == 1024 and result["checks"]["stall"]["mfu"] is None


def test_a_longer_first_phase_raises_the_estimate_of_the_next(tmp_path, fake_launches):
    seconds, launches, _ = fake_launches
    seconds["faulted"] = 90.0
    result = _smoke(tmp_path, budget_s=200)
    # 110 s left covers one more 90 s launch (resume takes 60), then 50 s does not.
    assert [name for name, _ in launches] == ["faulted", "resume"]
    assert result["skipped"] == ["stall"] and result["checks"]["stall"]["needed_s"] == 90.0


def test_a_budget_that_is_not_positive_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="--budget-s: 0 is not above 0"):
        gpu_smoke.smoke(out_dir=tmp_path / "x", dry_run=True, budget_s=0)


def test_a_launch_stopped_by_a_signal_ends_the_smoke_with_an_incomplete_report(tmp_path, fake_launches):
    """A timeout around the smoke sends SIGTERM: the launch in progress stops its ranks (run_local
    returns 128 + the signal) and no further launch starts."""
    _, launches, exit_codes = fake_launches
    exit_codes["resume"] = 143
    result = _smoke(tmp_path, budget_s=1000)
    assert [name for name, _ in launches] == ["faulted", "resume"]
    assert list(result["checks"]) == ["faults", "resume"] and result["checks"]["resume"]["exit_code"] == 143
    assert result["complete"] is False and result["ok"] is False and result["stopped"].startswith("by a signal")
    assert json.loads((tmp_path / "smoke" / "gpu_smoke.json").read_text()) == result


def test_a_smoke_stopped_before_any_rank_started_is_incomplete_too(tmp_path, fake_launches, monkeypatch):
    _, launches, exit_codes = fake_launches
    exit_codes["faulted"] = 143
    # The SIGTERM came before any rank wrote run_start.
    monkeypatch.setattr(sys.modules[__name__], "_events", lambda t0: RunEvents([]))
    result = _smoke(tmp_path, budget_s=1000)
    assert [name for name, _ in launches] == ["faulted"]
    faults = result["checks"]["faults"]
    assert result["complete"] is False and result["stopped"] and faults["exit_code"] == 143
    assert "no run_start event" in faults["error"]
