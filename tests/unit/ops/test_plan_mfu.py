"""The plan's step time rests on an assumed MFU unless a measured one is given: `plan` prints the
figure and its published source, and `-o json` carries both."""

from __future__ import annotations

import json

import pytest

from infra.config import resolve_config
from nvrx_eks.facts.instances import PEAK_BF16_DENSE_TFLOPS
from nvrx_eks.planning.model import ASSUMED_MFU, MFU_SOURCE, make_plan
from tests.support.cli_process import WIDE_TERMINAL, cli_process
from workloads.memory import parameter_count
from workloads.presets import MODEL_PRESETS


def test_the_modelled_step_time_is_the_assumed_mfu_of_the_h100_peak():
    tokens = 16 * 2 * 8192
    plan = make_plan(resolve_config("p5"), tokens_per_step=tokens, interval_steps=50)
    flops = 6 * parameter_count(MODEL_PRESETS["8b"]) * tokens
    assert plan.assumed_mfu == ASSUMED_MFU
    assert plan.step_time_s == pytest.approx(flops / (plan.gpus * ASSUMED_MFU * PEAK_BF16_DENSE_TFLOPS["H100"] * 1e12))
    assert plan.step_time_source == MFU_SOURCE and "2407.21783" in MFU_SOURCE


def test_a_given_step_time_assumes_no_mfu():
    plan = make_plan(resolve_config("p5"), tokens_per_step=1, interval_steps=1, step_time_s=3.0)
    assert plan.assumed_mfu is None and plan.step_time_source == "given"


def test_plan_prints_the_assumption_and_its_source_and_json_carries_them():
    text = cli_process("plan", env=WIDE_TERMINAL)
    assert text.returncode == 0, text.stderr
    printed = " ".join(text.stdout.split())
    assert f"assumed {ASSUMED_MFU:.0%} MFU of the H100's 989 TFLOP/s dense bf16 peak. Source: {MFU_SOURCE}" in printed
    data = json.loads(cli_process("plan", "-o", "json").stdout)
    assert data["assumed_mfu"] == ASSUMED_MFU and data["step_time_source"] == MFU_SOURCE
    measured = json.loads(cli_process("plan", "-o", "json", "--step-time-s", "10").stdout)
    assert measured["assumed_mfu"] is None and measured["step_time_s"] == 10
