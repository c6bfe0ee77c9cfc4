"""A fixed global batch (data.global_batch_tokens): the accumulation is derived from the world
size, so the tokens per optimizer step stay the same as a job grows or shrinks, and a world size
that cannot divide them into whole micro-batches is refused naming the ones that can."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nvrx_eks.facts.errors import ConfigError
from workloads.config import TrainConfig


def _data(**fields):
    return TrainConfig.from_dict({"data": {"seq_len": 64, "batch_size": 2, **fields}}, source="test").data


def test_the_accumulation_keeps_the_tokens_per_step_for_every_world_that_divides_them():
    data = _data(global_batch_tokens=64 * 2 * 16)  # 32 micro-batch sequences
    for world in (1, 2, 4, 8, 16):
        assert world * data.batch_size * data.seq_len * data.accumulation(world) == 2048


def test_a_world_that_cannot_divide_the_global_batch_is_refused_naming_the_ones_that_can():
    data = _data(global_batch_tokens=64 * 2 * 16)
    with pytest.raises(ConfigError, match=r"^data\.global_batch_tokens: 2,048 tokens .* near 3: 2, 4 "):
        data.accumulation(3)
    with pytest.raises(ConfigError, match=r"near 32: 16 \("):
        data.accumulation(32)  # more ranks than micro-batch sequences


def test_without_a_global_batch_the_accumulation_is_the_configured_one():
    assert _data(grad_accum_steps=3).accumulation(5) == 3


def test_an_accumulation_beside_a_global_batch_is_refused():
    with pytest.raises(ConfigError, match="data.grad_accum_steps: derived from data.global_batch_tokens"):
        _data(global_batch_tokens=4096, grad_accum_steps=2)


def test_the_preflight_refuses_a_world_that_cannot_divide_it(tmp_path):
    config = tmp_path / "train.yaml"
    data = "data:\n  seq_len: 64\n  batch_size: 2\n  global_batch_tokens: 2048\n"
    config.write_text(f"run_dir: {tmp_path / 'run'}\n{data}")
    preflight = subprocess.run(
        [sys.executable, "-m", "workloads.train", "--config", str(config), "--preflight", "--world-size", "3"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert preflight.returncode == 93
    assert "error: data.global_batch_tokens: 2,048 tokens is not a whole number of micro-batches" in preflight.stderr
