"""Acceptance 1-4 on CPU: one clean and one faulted 2-rank run under ft_launcher, made once per
test session and shared by all tests in this module.

Faulted run (checkpoint every 5 steps, keep 2, 30 steps):
  exception@7:1        in-process restart
  hang@13:0            in-process restart (soft timeout or the peer's gloo timeout)
  corrupt-latest@17:0 + exception@17:0
                       the restart's load meets the damaged newest checkpoint and falls back
  sigkill@21:1         ft_launcher restart; 21 is the step after a save was handed off, when the
                       previous save has committed for sure (one save in flight at most), so the
                       loss bound is exactly one interval
  kill-in-save@25      rank 0 dies right after handing off the step-25 save
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nvrx_eks.facts.checkpoint_layout import COMMIT_FILE, checkpoint_dirs, step_of
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from nvrx_eks.local.runner import LOCAL_CPU_PROFILE
from tests.support.named_runs import RUNS, named_run
from tests.support.trainer_fixtures import REPO, assert_nothing_left
from workloads.checkpoint.files import committed_checkpoints
from workloads.events import load_run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]

STEPS, INTERVAL, FAULTS = RUNS["faulted"].steps, RUNS["faulted"].interval, RUNS["faulted"].faults
KEEP = LOCAL_CPU_PROFILE["checkpoint"]["keep"]


def _completed(run_dir: Path) -> Path:
    record = json.loads((run_dir / "local_run.json").read_text())
    assert record["exit_code"] == 0, (run_dir / "launcher.log").read_text()[-4000:]
    return run_dir


# Each run happens once per session even when xdist spreads these tests over workers.
@pytest.fixture(scope="session")
def clean(tmp_path_factory) -> Path:
    return _completed(named_run(tmp_path_factory, "clean"))


@pytest.fixture(scope="session")
def faulted(tmp_path_factory) -> Path:
    return _completed(named_run(tmp_path_factory, "faulted"))


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _fault(run, kind: str, step: int) -> dict:
    (event,) = [e for e in run.of("fault_injected") if e["kind"] == kind and e["step"] == step]
    return event


def _first_after(run, name: str, t: float, rank: int = 0, **match) -> dict:
    for e in run.of(name, rank=rank):
        if e["t"] > t and all(e.get(k) == v for k, v in match.items()):
            return e
    raise AssertionError(f"no {name} {match} after {t}")


def test_faulted_run_ends_bit_identical_to_clean_run(clean, faulted):
    a, b = _summary(clean), _summary(faulted)
    assert a["final_step"] == b["final_step"] == STEPS
    assert a["state_sha256"] == b["state_sha256"]
    assert a["final_loss"] == b["final_loss"]
    assert b["restarts"]["inprocess"] >= 3 and b["restarts"]["launcher"] == 2


def test_clean_run_learns(clean):
    run = load_run(clean)
    losses = [e["loss"] for e in run.of("step_end", rank=0)]
    assert losses[-1] < losses[0] - 1.0
    # A fresh run has no pointer before its first commit; that is not a lost pointer.
    assert run.of("checkpoint_pointer_rebuilt") == []


@pytest.mark.parametrize("kind,step", [("exception", 7), ("hang", 13)])
def test_exception_and_hang_recover_in_process_with_same_pids(faulted, kind, step):
    run = load_run(faulted)
    fault = _fault(run, kind, step)
    for rank in (0, 1):
        before = [e for e in run.of("step_end", rank=rank) if e["t"] < fault["t"]][-1]
        begin = _first_after(run, "restart_begin", fault["t"], rank=rank)
        end = _first_after(run, "restart_end", begin["t"], rank=rank)
        assert end["layer"] == "inprocess"
        assert before["pid"] == begin["pid"] == end["pid"]  # same processes
        assert end["iteration"] == begin["iteration"] + 1
        assert end["since_begin_s"] > 0
        assert end["t"] - fault["t"] > 0  # restart latency from the fault is in the log


def test_in_process_restarts_keep_the_checkpoint_worker(faulted):
    """Every process starts with the worker it warmed at start-up; after the in-process restarts
    that hit no save in flight (the step-5 and step-10 saves commit a step later), the next
    iteration reuses it instead of spawning one (workloads.checkpoint.nvrx_worker)."""
    run = load_run(faulted)
    for e in run.of("checkpoint_worker"):
        if e["iteration"] == 0:
            assert e["start"] == "warmed", e
    for kind, step in (("exception", 7), ("hang", 13)):
        fault = _fault(run, kind, step)
        for rank in (0, 1):
            assert _first_after(run, "checkpoint_worker", fault["t"], rank=rank)["start"] == "reused"


def test_sigkill_recovered_by_launcher_losing_at_most_one_interval(faulted):
    run = load_run(faulted)
    fault = _fault(run, "sigkill", 21)
    end = _first_after(run, "restart_end", fault["t"], rank=1)
    assert end["layer"] == "launcher" and end["cycle"] == fault["cycle"] + 1
    assert end["pid"] != fault["pid"]
    completed = fault["step"] - 1
    assert completed - end["resumed_from_step"] <= INTERVAL


def test_kill_in_save_leaves_nothing_resume_would_pick(faulted):
    run = load_run(faulted)
    fault = _fault(run, "kill-in-save", 25)
    # The save was handed off (its stall was recorded) but never committed in that cycle...
    assert [e for e in run.of("checkpoint_stall", rank=0) if e["cycle"] == fault["cycle"] and e["step"] == 25]
    assert not [e for e in run.of("checkpoint_commit") if e["cycle"] == fault["cycle"] and e["step"] == 25]
    # ...and the next process loaded the previous committed checkpoint.
    load = _first_after(run, "checkpoint_load", fault["t"], rank=0)
    assert load["step"] == 20 and load["cycle"] == fault["cycle"] + 1


def test_corrupt_latest_falls_back_with_a_warning(faulted):
    run = load_run(faulted)
    fault = _fault(run, "corrupt-latest", 17)
    damaged_dir = Path(fault["damaged"]).parent
    fallback = _first_after(run, "checkpoint_fallback", fault["t"], rank=0)
    assert Path(fallback["path"]) == damaged_dir
    load = _first_after(run, "checkpoint_load", fault["t"], rank=0)
    assert load["step"] < step_of(damaged_dir.name)
    assert "skipping checkpoint" in (faulted / "launcher.log").read_text()


def test_retention_keeps_exactly_k_newest(faulted):
    ckpt = faulted / "checkpoints"
    committed = committed_checkpoints(ckpt)
    assert [step_of(n) for n in committed] == [30, 25]
    on_disk = checkpoint_dirs(ckpt)
    assert sorted(p.name for p in on_disk) == sorted(committed) and len(on_disk) == KEEP
    assert all((p / COMMIT_FILE).is_file() for p in on_disk)


def test_resume_restores_data_position_and_rng(clean, faulted):
    """The first step after every resume sees the same batch and produces the same loss as the
    uninterrupted run at that step (dropout is on in the tiny preset, so the RNG must match)."""
    reference = {(e["rank"], e["step"]): e for e in load_run(clean).of("step_end")}
    run = load_run(faulted)
    resumes = [e for e in run.of("restart_end") if e["resumed_from_step"] < STEPS]
    assert len(resumes) >= 8  # 5 restarts x 2 ranks, minus none
    for end in resumes:
        first = _first_after(run, "step_end", end["t"], rank=end["rank"])
        assert first["step"] == end["resumed_from_step"] + 1
        ref = reference[(end["rank"], first["step"])]
        assert first["batch_sha256"] == ref["batch_sha256"]
        assert first["loss"] == ref["loss"]


def test_runs_leave_no_process_behind(clean, faulted):
    for run_dir in (clean, faulted):
        assert_nothing_left(run_dir, json.loads((run_dir / "local_run.json").read_text()))


def test_preflight_lets_another_world_size_reshard_and_refuses_another_model_with_exit_93(clean, tmp_path):
    # A copy of the run's config (same checkpoint.dir): this check's command line must not name
    # the run directory, which the no-process-left test looks for.
    config = tmp_path / "config.yaml"
    config.write_text((clean / "config.yaml").read_text())

    def preflight(*overrides: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "workloads.train", "--config", str(config), "--preflight", "--world-size", "4"]
        return subprocess.run([*argv, *overrides], capture_output=True, text=True, cwd=REPO)

    assert preflight().returncode == 0  # DCP reshards the world-2 checkpoint onto 4 ranks
    refused = preflight("model.preset=small")
    assert refused.returncode == EXIT_DO_NOT_REQUEUE
    assert "preset='tiny'" in refused.stderr and "Traceback" not in refused.stderr
