"""TrainConfig, fault specs and the ft_launcher argv: fast, no processes, no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from tests.support.trainer_fixtures import REPO
from workloads.config import TrainConfig
from workloads.faults import parse_fault_spec
from workloads.launch import build_coordinator_argv, build_ft_launcher_argv, build_preflight_argv, inprocess_store_port


def _error(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({}, "train.yaml", overrides)
    return str(info.value)


def test_light_modules_import_without_torch():
    code = (
        "import sys, workloads.config, workloads.launch, workloads.events, workloads.faults; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_defaults_are_valid_and_yaml_round_trips(tmp_path):
    cfg = TrainConfig()
    path = tmp_path / "train.yaml"
    path.write_text(cfg.to_yaml())
    assert TrainConfig.from_yaml(path) == cfg


def test_dotted_overrides_parse_yaml_scalars(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("steps: 10\ncheckpoint:\n  interval_steps: 5\n")
    cfg = TrainConfig.from_yaml(
        path, ["checkpoint.interval_seconds=30", "inprocess.enabled=false", "checkpoint.dir=null", "model.preset=small"]
    )
    assert cfg.checkpoint.interval_steps == 5 and cfg.checkpoint.interval_seconds == 30
    assert cfg.inprocess.enabled is False and cfg.model.preset == "small"


def test_overrides_leave_the_callers_dict_untouched():
    profile = {"inprocess": {"enabled": True}, "data": {"batch_size": 8}}
    changed = TrainConfig.from_dict(profile, overrides=["inprocess.enabled=false", "data.batch_size=1"])
    assert changed.inprocess.enabled is False and changed.data.batch_size == 1
    assert profile == {"inprocess": {"enabled": True}, "data": {"batch_size": 8}}
    assert TrainConfig.from_dict(profile).inprocess.enabled is True


@pytest.mark.parametrize(
    "overrides,field",
    [
        (["model.presett=tiny"], "model.presett: unknown field"),
        (["checkpoint.keep=1"], "checkpoint.keep"),
        (["checkpoint.backend=tape"], "checkpoint.backend"),
        (["inprocess.soft_timeout_s=95"], "inprocess.soft_timeout_s: must be below inprocess.hard"),
        (["inprocess.hard_timeout_s=150"], "inprocess.hard_timeout_s: must be below inprocess.barrier"),
        (["data.source=memmap"], "data.path: required"),
        (["faults=explode@3"], "faults: fault 'explode@3'"),
        (["faults=sigkill@500:0"], "faults: sigkill@500:0 is after the last step"),
        (["faults=kill-in-save@5", "checkpoint.backend=none"], "faults: kill-in-save@5:0 needs"),
    ],
)
def test_errors_name_the_field_and_the_fix(overrides, field):
    message = _error(overrides)
    assert message.startswith("invalid configuration in train.yaml:")
    assert field in message


def test_gloo_timeout_must_stay_below_the_inprocess_hard_timeout():
    message = _error(["distributed.backend=gloo", "distributed.timeout_s=90"])
    assert "distributed.timeout_s: 90s must be below inprocess.hard_timeout_s (90s) with gloo" in message
    TrainConfig.from_dict({}, "x", ["distributed.backend=gloo", "distributed.timeout_s=30"])
    # Without the in-process layer nothing has to be aborted, so the rule does not apply.
    TrainConfig.from_dict({}, "x", ["distributed.backend=gloo", "distributed.timeout_s=600", "inprocess.enabled=false"])


def test_nccl_watchdog_must_outlast_the_inprocess_hard_timeout():
    message = _error(["distributed.backend=nccl", "distributed.timeout_s=60"])
    assert "distributed.timeout_s: 60s must exceed inprocess.hard_timeout_s (90s) with NCCL" in message
    TrainConfig.from_dict({}, "x", ["distributed.backend=nccl", "distributed.timeout_s=600"])


def test_auto_backend_refuses_an_explicit_timeout():
    assert "cannot be set with distributed.backend=auto" in _error(["distributed.timeout_s=30"])


def test_derived_process_group_timeouts_respect_both_rules():
    cfg = TrainConfig()
    assert cfg.resolved_pg_timeout_s("gloo") < cfg.inprocess.hard_timeout_s
    assert cfg.resolved_pg_timeout_s("nccl") > cfg.inprocess.hard_timeout_s


def test_launcher_timeouts_must_outlast_inprocess_recovery():
    # hard 90 + barrier 120 = 210s of possible in-process recovery.
    assert "fault_tolerance.out_of_section_timeout_s: 200s must exceed" in _error(
        ["fault_tolerance.out_of_section_timeout_s=200"]
    )
    assert "fault_tolerance.heartbeat_timeout_s: 100s must exceed" in _error(
        ["fault_tolerance.monitor=heartbeat", "fault_tolerance.heartbeat_timeout_s=100"]
    )
    assert "fault_tolerance.section_timeouts_s.step: 60s must exceed" in _error(
        ["fault_tolerance.section_timeouts_s.step=60"]
    )
    assert "section_timeouts_s.checkpointing: must exceed checkpoint.finalize_timeout_s" in _error(
        ["fault_tolerance.section_timeouts_s.checkpointing=100"]
    )


def test_termination_grace_covers_a_checkpoint_finalize():
    cfg = TrainConfig.from_dict({}, "x", ["checkpoint.finalize_timeout_s=120"])
    assert cfg.launcher_term_timeout_s() > 120
    assert cfg.recommended_termination_grace_period_s() > cfg.launcher_term_timeout_s()


def test_fault_spec_parsing():
    faults = parse_fault_spec("exception@20:1, sigkill@40, kill-in-save@7:0")
    assert [(f.kind, f.step, f.rank) for f in faults] == [
        ("exception", 20, 1),
        ("sigkill", 40, 0),
        ("kill-in-save", 7, 0),
    ]
    assert parse_fault_spec("") == ()
    for bad in ("exception", "exception@x", "exception@0", "boom@3", "hang@3:-1"):
        with pytest.raises(ValueError):
            parse_fault_spec(bad)


def test_exit_code_93_is_nvrx_do_not_requeue():
    from nvidia_resiliency_ext.fault_tolerance.utils import DEFAULT_NO_RESTART_EXIT_CODE

    assert EXIT_DO_NOT_REQUEUE == DEFAULT_NO_RESTART_EXIT_CODE == 93


@pytest.mark.parametrize("monitor", ["sections", "heartbeat"])
def test_launcher_argv_is_accepted_by_ft_launchers_own_parser(monitor):
    from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig
    from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser

    cfg = TrainConfig.from_dict({}, "x", [f"fault_tolerance.monitor={monitor}"])
    argv = build_ft_launcher_argv(
        cfg,
        config_path="/etc/nvrx/train.yaml",
        nnodes="2:2",
        nproc_per_node=8,
        rdzv_endpoint="job-0.job:29500",
        rdzv_id="job",
    )
    assert argv[0] == "ft_launcher" and "localhost" not in " ".join(argv)
    args = get_args_parser().parse_args(argv[1:])
    assert args.rdzv_backend == "c10d" and args.rdzv_endpoint == "job-0.job:29500"
    assert args.max_restarts == cfg.fault_tolerance.max_restarts
    assert args.module and args.training_script == "workloads.train"
    assert args.training_script_args == ["--config", "/etc/nvrx/train.yaml", "--store", "job-0.job:29501"]
    # Every launcher a client of the coordinator's rendezvous store: none hosts it.
    assert args.rdzv_conf == "is_host=false"
    ft = FaultToleranceConfig.from_args(args)
    assert ft.max_no_progress_cycles == cfg.fault_tolerance.max_no_progress_cycles
    if monitor == "sections":
        assert ft.rank_section_timeouts == {"setup": 900.0, "step": 300.0, "checkpointing": 360.0}
        assert ft.rank_heartbeat_timeout is None
    else:
        assert ft.rank_heartbeat_timeout == 300.0 and ft.rank_section_timeouts == {}


def test_store_port_follows_the_rendezvous_endpoint():
    assert inprocess_store_port("10.0.0.1:29500") == 29501
    with pytest.raises(ValueError):
        inprocess_store_port("no-port")


def test_the_coordinator_serves_the_rendezvous_the_launchers_join():
    from workloads.coordinator import main as coordinator_main  # noqa: F401 - importable without a GPU

    cfg = TrainConfig()
    argv = build_coordinator_argv(cfg, nnodes="2:3", rdzv_endpoint="job-coordinator:29500", rdzv_id="job")
    assert argv[:3] == ["python", "-m", "workloads.coordinator"]
    assert argv[3:9] == ["--nnodes", "2:3", "--rdzv-endpoint", "job-coordinator:29500", "--rdzv-id", "job"]
    # After SIGTERM the stores stay up as long as the ranks may take to stop.
    assert argv[9:] == ["--stop-grace-s", f"{cfg.launcher_term_timeout_s():g}"]


def test_a_rank_without_the_coordinators_store_is_refused_with_the_fix(tmp_path, monkeypatch):
    from workloads.train import run

    monkeypatch.setenv("RANK", "1")  # not rank 0: no run lease is taken
    cfg = TrainConfig.from_dict({"run_dir": str(tmp_path)}, "x")
    with pytest.raises(ConfigError, match="inprocess.enabled: .* needs --store HOST:PORT"):
        run(cfg, None)


def test_trainer_exits_93_without_traceback_on_config_errors(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("inprocess:\n  soft_timeout_s: 500\n")
    argv = build_preflight_argv(config_path=str(path), world_size=2, python=sys.executable)
    result = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    assert result.returncode == EXIT_DO_NOT_REQUEUE
    assert "inprocess.soft_timeout_s: must be below inprocess.hard_timeout_s" in result.stderr
    assert "Traceback" not in result.stderr


def test_launcher_term_timeout_covers_the_in_flight_save_and_the_stop_save():
    # Review #12: after SIGTERM the stop-save first waits for the save in flight; both may take
    # up to checkpoint.finalize_timeout_s before ft_launcher's SIGKILL.
    cfg = TrainConfig.from_dict({}, "x", ["checkpoint.finalize_timeout_s=120"])
    assert cfg.launcher_term_timeout_s() > 2 * 120
    assert cfg.recommended_termination_grace_period_s() > cfg.launcher_term_timeout_s()
