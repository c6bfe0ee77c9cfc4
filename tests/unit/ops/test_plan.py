"""`nvrx-eks plan`: the Young/Daly interval, the goodput model, and the command's output."""

from __future__ import annotations

import json
import math
import re

import pytest

from infra.config import resolve_config
from nvrx_eks.planning.model import (
    INPROCESS_FIXED_S,
    daly_interval,
    expected_goodput,
    make_plan,
    young_interval,
)
from tests.support.cli_process import WIDE_TERMINAL, cli_process
from tests.support.profiles import profile_file
from workloads.memory import CHECKPOINT_BYTES_PER_PARAM, parameter_count
from workloads.presets import MODEL_PRESETS


def test_young_and_daly_agree_when_checkpoints_are_cheap():
    delta, mtbf = 1.0, 24 * 3600.0
    assert young_interval(delta, mtbf) == pytest.approx(math.sqrt(2 * delta * mtbf))
    assert daly_interval(delta, mtbf) == pytest.approx(young_interval(delta, mtbf), rel=0.01)
    # Expensive checkpoints relative to the MTBF: Daly's bound is the MTBF itself.
    assert daly_interval(3 * mtbf, mtbf) == mtbf


def test_optimal_interval_maximizes_the_goodput_model():
    delta, mtbf, recovery = 20.0, 50 * 3600.0, 270.0
    tau = daly_interval(delta, mtbf)
    best = expected_goodput(tau, delta, mtbf, recovery)
    for other in (tau / 4, tau / 2, tau * 2, tau * 4):
        assert expected_goodput(other, delta, mtbf, recovery) < best


def test_parameter_count_matches_the_model_the_trainer_builds():
    torch = pytest.importorskip("torch")
    from workloads.model import Transformer

    for preset in ("tiny", "small"):
        shape = MODEL_PRESETS[preset]
        with torch.device("meta"):
            model = Transformer(shape)
        assert parameter_count(shape) == sum(p.numel() for p in model.parameters()), preset
    assert 7.9e9 < parameter_count(MODEL_PRESETS["8b"]) < 8.1e9


def test_layered_strategy_beats_the_baseline_for_the_default_profile():
    plan = make_plan(resolve_config("p5"), tokens_per_step=16 * 2 * 8192, interval_steps=50)
    baseline, layered = plan.strategies
    assert layered.strategy.stall_s < baseline.strategy.stall_s
    assert layered.goodput_at_configured > baseline.goodput_at_configured
    assert layered.goodput_at_optimal > baseline.goodput_at_optimal
    assert plan.lost_cost_per_day(layered) < plan.lost_cost_per_day(baseline)


def test_capacity_block_only_type_has_no_price():
    config = resolve_config("p5").model_copy(
        update={"gpu_nodes": resolve_config("p5").gpu_nodes.model_copy(update={"instance_type": "p5e.48xlarge"})}
    )
    assert make_plan(config, tokens_per_step=1, interval_steps=1, step_time_s=1.0).usd_per_hour is None


def test_plan_command_prints_interval_and_goodput_for_the_default_profile():
    result = cli_process("plan", env=WIDE_TERMINAL)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "optimal interval" in out and "goodput" in out
    assert "2x p5.48xlarge" in out and "lost $" in out
    # Issue 14, acceptance 2: the per-GPU memory of the p5 default job, below an H100's 80 GB.
    match = re.search(
        r"Memory per GPU \(8b, 2 x 8192 tokens per micro-batch, 8 per step: global batch 2,097,152 tokens, "
        r"activation checkpointing on \d+ of 32 blocks \(auto: the fewest that fit\), world 16\): "
        r"([\d.]+) GiB of 79.2 GiB \(H100\): fits",
        " ".join(out.split()),
    )
    assert match, out
    assert float(match.group(1)) < 80


def test_inprocess_recovery_includes_reading_the_checkpoint():
    config = resolve_config("p5")
    plan = make_plan(config, tokens_per_step=16 * 2 * 8192, interval_steps=50)
    layered = plan.strategies[1].strategy
    state = parameter_count(MODEL_PRESETS["8b"]) * CHECKPOINT_BYTES_PER_PARAM
    assert layered.recovery_s == pytest.approx(INPROCESS_FIXED_S + state / (config.fsx.throughput_mbps * 1e6))
    assert layered.recovery_s > 25  # 96 GB from a 4.7 GB/s file system: not the old 10 s constant


def test_plan_as_json_is_the_plan_as_data():
    result = cli_process("plan", "-o", "json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["nodes"] == 2 and plan["gpus"] == 16
    assert [s["strategy"]["name"] for s in plan["strategies"]] == ["sync + pod restart", "NVRx async + in-process"]
    assert 0 < plan["strategies"][1]["goodput_at_optimal"] <= 1
    # The fault table: every kind on node 0 and the other node, and the coordinator's host faults.
    classes = [(c["kind"], c["node_class"], c["layer"]) for c in plan["fault_classes"]]
    assert classes == [
        ("soft", "node 0", "in process, from FSx"),
        ("network", "node 0", "in process, from FSx"),
        ("hardware", "node 0", "pod relaunch"),
        ("soft", "other nodes", "in process, from FSx"),
        ("network", "other nodes", "in process, from FSx"),
        ("hardware", "other nodes", "pod relaunch"),
        ("coordinator host", "coordinator", "pod relaunch"),
    ]
    by_layer = plan["goodput_by_layer"]
    assert list(by_layer) == ["sync + pod restart", "NVRx async + in-process"]
    assert by_layer["NVRx async + in-process"] < plan["strategies"][1]["goodput_at_optimal"]


def test_plan_at_80_columns_cuts_no_header():
    """Narrower than a table, each row becomes a block of `header: value` lines."""
    result = cli_process("plan", env={**WIDE_TERMINAL, "COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    assert "…" not in result.stdout
    assert "    optimal interval: " in result.stdout and "    configured interval: " in result.stdout
    # Each goodput says at which interval: a block never holds the same header twice.
    assert "    goodput at optimal: " in result.stdout and "    goodput at configured: " in result.stdout
    assert "    goodput: " not in result.stdout
    assert "    node class: coordinator" in result.stdout and "    cost with spares: " in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


def test_the_step_time_is_modelled_on_the_profiles_own_gpu():
    result = cli_process("plan", "-p", "p5en", env=WIDE_TERMINAL)
    assert result.returncode == 0, result.stderr
    assert "MFU of the H200's 989 TFLOP/s dense bf16 peak" in result.stdout


def test_a_gpu_without_a_published_peak_needs_a_measured_step_time():
    """g5's A10G has no published dense bf16 peak: no H100 figure stands in for it."""
    refused = cli_process("plan", "-p", "g5-smoke", env=WIDE_TERMINAL)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "the A10G has no published dense bf16 peak" in refused.stderr and "--step-time-s" in refused.stderr
    given = cli_process("plan", "-p", "g5-smoke", "--step-time-s", "0.5", env=WIDE_TERMINAL)
    assert given.returncode == 0, given.stderr
    assert "~0.50 s per step" in given.stdout and "H100" not in given.stdout


def test_a_tiny_model_is_refused_a_modelled_step_time(tmp_path):
    """Its FLOPs at the assumed MFU give microseconds per step: interval plans of millions of steps."""
    config = tmp_path / "tiny.yaml"
    config.write_text("model:\n  preset: tiny\n")
    refused = cli_process("plan", "--train-config", str(config), env=WIDE_TERMINAL)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "model tiny: its modelled step" in refused.stderr and "--step-time-s" in refused.stderr
    given = cli_process("plan", "--train-config", str(config), "--step-time-s", "0.2", env=WIDE_TERMINAL)
    assert given.returncode == 0, given.stderr


def test_plan_states_its_assumptions_and_their_sources():
    default = " ".join(cli_process("plan", env=WIDE_TERMINAL).stdout.split())
    assert "Assumptions: node MTBF 6,335 h (Llama 3: 419 interruptions in 54 days" in default
    assert "faults soft 15%, network 10%, hardware 75% (Llama 3's interruptions by cause" in default
    assert "MFU 40% (above)" in default
    given = " ".join(
        cli_process("plan", "--node-mtbf-hours", "1000", "--step-time-s", "3", env=WIDE_TERMINAL).stdout.split()
    )
    assert "Assumptions: node MTBF 1,000 h (given; --node-mtbf-hours)" in given and "given step time" in given


def test_the_scaling_table_has_one_row_per_node_count(tmp_path):
    """--nodes 16 is also one of the table's own rows: it is shown once."""
    profile = profile_file(tmp_path, gpu_nodes__max_size=16)
    text = cli_process("plan", "-c", str(profile), "--nodes", "16", env=WIDE_TERMINAL).stdout
    table = text.split("The same job at scale")[1].split("└")[0]
    rows = [line.split("│")[1].strip() for line in table.splitlines() if "│" in line]
    assert rows == ["16", "128", "1024", "2048"]
