"""`nvrx-eks data prepare --eval-fraction`: the held-out split, on real text shipped with Python."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nvrx_eks.data.prepare import held_out, prepare
from nvrx_eks.facts.errors import ConfigError
from tests.unit.local.test_data_prep import prepare_cli, stdlib_text
from workloads.config import TrainConfig
from workloads.data import has_held_out_split, held_out_sequences
from workloads.shards import read_manifest


def split_bytes(out: Path, shards: list[dict]) -> bytes:
    return b"".join(np.fromfile(out / s["file"], dtype=np.uint16).astype(np.uint8).tobytes() for s in shards)


def lines_by_split(inputs: list[Path], fraction: float) -> tuple[bytes, bytes]:
    """What each split must hold: every line of the inputs, whole, on the side its position hashes to."""
    train, evaluation = [], []
    for source, path in enumerate(inputs):
        for unit, line in enumerate(path.read_bytes().splitlines(keepends=True)):
            (evaluation if held_out(source, unit, fraction) else train).append(line)
    return b"".join(train), b"".join(evaluation)


def test_each_line_goes_whole_to_one_split_and_the_manifest_lists_both(tmp_path):
    inputs = stdlib_text(150_000)
    result = prepare_cli(inputs, tmp_path / "out", "byte", "--shard-tokens", "20000", "--eval-fraction", "0.05")
    assert result.code == 0, result.output
    manifest = read_manifest(tmp_path / "out")
    train, evaluation = lines_by_split(inputs, 0.05)
    assert split_bytes(tmp_path / "out", manifest["shards"]) == train
    assert split_bytes(tmp_path / "out", manifest["eval"]["shards"]) == evaluation
    assert manifest["eval"]["total_tokens"] == len(evaluation) and manifest["total_tokens"] == len(train)
    assert 0.03 < len(evaluation) / (len(train) + len(evaluation)) < 0.07
    assert all(s["file"].startswith("eval-") for s in manifest["eval"]["shards"])
    assert "held out for evaluation" in result.stdout


def test_an_interrupted_split_prepare_resumes_to_the_same_shards(tmp_path):
    inputs = stdlib_text(150_000)
    prepare(inputs, tmp_path / "whole", "byte", shard_tokens=7000, eval_fraction=0.2)
    with pytest.raises(KeyboardInterrupt):
        prepare(inputs, tmp_path / "resumed", "byte", shard_tokens=7000, eval_fraction=0.2, stop_after_shards=4)
    resumed = prepare(inputs, tmp_path / "resumed", "byte", shard_tokens=7000, eval_fraction=0.2)
    whole = read_manifest(tmp_path / "whole")
    assert resumed["shards"] == whole["shards"] and resumed["eval"]["shards"] == whole["eval"]["shards"]


def test_resuming_with_another_fraction_is_refused_naming_the_option(tmp_path):
    inputs = stdlib_text(150_000)
    with pytest.raises(KeyboardInterrupt):
        prepare(inputs, tmp_path / "out", "byte", shard_tokens=7000, eval_fraction=0.2, stop_after_shards=1)
    result = prepare_cli(inputs, tmp_path / "out", "byte", "--shard-tokens", "7000", "--eval-fraction", "0.1")
    assert result.code == 2 and "--eval-fraction" in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize("fraction", ["1", "-0.1"])
def test_a_fraction_outside_0_1_is_refused_naming_the_option(tmp_path, fraction):
    result = prepare_cli(stdlib_text(1000), tmp_path / "out", "byte", "--eval-fraction", fraction)
    assert result.code == 2 and "--eval-fraction" in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_held_out_sequences_are_the_split_read_in_order_and_never_training_data(tmp_path):
    prepare(stdlib_text(150_000), tmp_path / "out", "byte", shard_tokens=20000, eval_fraction=0.05)
    cfg = TrainConfig.from_dict({"data": {"source": "memmap", "path": str(tmp_path / "out"), "seq_len": 32}})
    assert has_held_out_split(cfg.data)
    sequences = held_out_sequences(cfg.data, 256, cfg.seed, 5)
    evaluation = split_bytes(tmp_path / "out", read_manifest(tmp_path / "out")["eval"]["shards"])
    assert sequences.shape == (5, 33)
    for i, row in enumerate(sequences):
        assert row.astype(np.uint8).tobytes() == evaluation[i * 32 : i * 32 + 33]


def test_evaluation_of_data_without_a_split_is_refused_naming_the_setting(tmp_path):
    prepare(stdlib_text(50_000), tmp_path / "out", "byte", shard_tokens=20000)
    data = {"source": "memmap", "path": str(tmp_path / "out")}
    cfg = TrainConfig.from_dict({"data": data, "eval": {"enabled": True}})
    assert not has_held_out_split(cfg.data)
    with pytest.raises(ConfigError, match=r"eval\.enabled: .* --eval-fraction"):
        held_out_sequences(cfg.data, 256, cfg.seed, 4)
