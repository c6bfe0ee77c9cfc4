"""`nvrx-eks export` and `model.init_from` at their edges, on a tiny checkpoint written here: the
sharded weight layout with its index, and every refusal as one line with exit 2 (export) or 93
(the trainer's preflight), naming what to fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from nvrx_eks.ops.hf_export import export_hf
from tests.support import REPO_ROOT
from tests.support.cli_harness import run_cli
from tests.support.hf_checkpoints import step_dir, write_checkpoint
from workloads.hf_format import WEIGHTS_INDEX_FILE, parameter_shapes
from workloads.presets import MODEL_PRESETS

TINY = MODEL_PRESETS["tiny"]


@pytest.fixture
def run(tmp_path) -> Path:
    """A run directory with one committed tiny checkpoint (model and optimizer) at step 6."""
    generator = torch.Generator().manual_seed(1)
    model = {name: torch.randn(size, generator=generator) for name, size in parameter_shapes(TINY).items()}
    state = {"model": model, "optim": {"state": {n: {"exp_avg": t.clone()} for n, t in model.items()}}}
    return write_checkpoint(tmp_path / "run", state, preset="tiny", step=6)


def _refusal(*args: str) -> str:
    result = run_cli("export", *args)
    assert result.code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_weights_above_the_file_size_are_split_with_an_index_transformers_reads(run, tmp_path):
    from transformers import LlamaForCausalLM

    one, split = tmp_path / "one", tmp_path / "split"
    export_hf(run, one)
    exported = export_hf(run, split, max_file_bytes=100_000)
    assert len(exported.files) > 2 and exported.files[0] == f"model-00001-of-{len(exported.files):05d}.safetensors"
    index = json.loads((split / WEIGHTS_INDEX_FILE).read_text())
    assert sorted(set(index["weight_map"].values())) == exported.files
    tokens = torch.arange(40).reshape(2, 20)
    with torch.no_grad():
        logits = [LlamaForCausalLM.from_pretrained(d, dtype=torch.float32)(tokens).logits for d in (one, split)]
    assert torch.equal(*logits)


def test_bfloat16_export_declares_its_dtype(run, tmp_path):
    from safetensors import safe_open

    export_hf(run, tmp_path / "bf16", dtype="bfloat16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("lm_head.weight").dtype == torch.bfloat16


def test_another_format_is_refused(run, tmp_path):
    assert "--format 'onnx': use hf" in _refusal(str(run), "--format", "onnx", "--out", str(tmp_path / "o"))


def test_a_non_empty_out_is_refused_and_kept(run, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert f"--out {out} exists and is not an empty directory" in _refusal(str(run), "--out", str(out))
    assert (out / "notes.txt").read_text() == "mine"


def test_a_step_not_committed_is_refused_naming_the_committed(run, tmp_path):
    assert "--step 5: no committed checkpoint of that step" in (
        line := _refusal(str(run), "--step", "5", "--out", str(tmp_path / "o"))
    )
    assert line.endswith("committed: 6")


def test_a_directory_without_checkpoints_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    assert "RUN: no committed checkpoint under" in _refusal(str(tmp_path / "empty"), "--out", str(tmp_path / "o"))


def test_a_damaged_shard_is_refused_naming_it_and_nothing_is_left(run, tmp_path):
    shard = next(step_dir(run, 6).glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert f"RUN: {shard} does not match its commit record" in _refusal(str(run), "--out", str(tmp_path / "o"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_tokenizer_that_is_not_a_file_is_refused_and_nothing_is_left(run, tmp_path):
    line = _refusal(str(run), "--out", str(tmp_path / "o"), "--tokenizer", str(tmp_path / "nope.json"))
    assert "--tokenizer: " in line and "is not a file" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


# ----- model.init_from in the trainer's preflight ----------------------------------------------------


def _preflight(tmp_path: Path, init_from: Path, *overrides: str) -> subprocess.CompletedProcess:
    config = tmp_path / "train.yaml"
    config.write_text(f"run_dir: {tmp_path / 'r'}\ncheckpoint:\n  backend: none\n")
    argv = [sys.executable, "-m", "workloads.train", "--config", str(config), "--preflight", "--world-size", "2"]
    return subprocess.run(
        [*argv, f"model.init_from={init_from}", *overrides], capture_output=True, text=True, cwd=REPO_ROOT
    )


def test_preflight_accepts_an_export_and_refuses_another_shape_naming_the_tensor(run, tmp_path):
    export_hf(run, tmp_path / "hf")
    assert _preflight(tmp_path, tmp_path / "hf").returncode == 0
    refused = _preflight(tmp_path, tmp_path / "hf", "model.preset=small")
    assert refused.returncode == EXIT_DO_NOT_REQUEUE and "Traceback" not in refused.stderr
    assert "model.init_from" in refused.stderr and "vocab_size is 256, the small preset has 8192" in refused.stderr
    missing = _preflight(tmp_path, tmp_path / "nowhere")
    assert missing.returncode == EXIT_DO_NOT_REQUEUE and "is not a directory" in missing.stderr


#: config.json of Meta's Llama 3.1 8B as published (the fields a loader reads).
LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}


def test_llama_3_1_8b_fits_the_8b_preset_with_its_rope_scaling():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from workloads.config import TrainConfig
    from workloads.hf_format import config_problems
    from workloads.model import _rope_tables

    settings = {k: v for k, v in LLAMA_3_1_8B["rope_scaling"].items() if k != "rope_type"}
    model = TrainConfig.from_dict({"model": {"preset": "8b", "rope_scaling": settings}}).model
    assert config_problems(LLAMA_3_1_8B, model.shape, "8b", model.rope_scaling_settings) == []
    unscaled = config_problems(LLAMA_3_1_8B, model.shape, "8b", None)
    assert len(unscaled) == 1 and "set model.rope_scaling" in unscaled[0]
    # Our scaled tables are transformers' llama3 frequencies at every position of the preset.
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](LlamaConfig(**LLAMA_3_1_8B), torch.device("cpu"))
    cos, sin = _rope_tables(model.shape, torch.device("cpu"), model.rope_scaling_settings)
    angles = torch.outer(torch.arange(model.shape.max_seq_len).float(), inv_freq)
    torch.testing.assert_close(cos, angles.cos(), atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, angles.sin(), atol=1e-6, rtol=0)
