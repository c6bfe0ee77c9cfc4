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
from tests.support.hf_checkpoints import LLAMA_3_1_8B, step_dir, write_checkpoint
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


def test_llama_3_1_8b_fits_the_8b_preset_with_its_rope_scaling():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from workloads.config import TrainConfig
    from workloads.hf_format import config_problems
    from workloads.model import _rope_tables

    settings = {k: v for k, v in LLAMA_3_1_8B["rope_scaling"].items() if k != "rope_type"}
    model = TrainConfig.from_dict({"model": {"preset": "8b", "rope_scaling": settings}}).model
    assert config_problems(LLAMA_3_1_8B, model.shape, model.noun, model.rope_scaling_settings) == []
    unscaled = config_problems(LLAMA_3_1_8B, model.shape, model.noun, None)
    assert len(unscaled) == 1 and "set model.rope_scaling" in unscaled[0]
    # Our scaled tables are transformers' llama3 frequencies at every position of the preset.
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](LlamaConfig(**LLAMA_3_1_8B), torch.device("cpu"))
    cos, sin = _rope_tables(model.shape, torch.device("cpu"), model.rope_scaling_settings)
    angles = torch.outer(torch.arange(model.shape.max_seq_len).float(), inv_freq)
    torch.testing.assert_close(cos, angles.cos(), atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, angles.sin(), atol=1e-6, rtol=0)


# ----- a shape of the user's own ---------------------------------------------------------------------

#: The tiny preset with a vocabulary, a depth and a feed-forward width of its own.
OWN_SHAPE = {"vocab_size": 300, "n_layers": 3, "ffn_dim": 96}


def test_an_export_writes_the_shape_the_checkpoint_records_and_transformers_computes_its_logits(tmp_path):
    from transformers import LlamaForCausalLM

    from tests.support.hf_checkpoints import our_model
    from workloads.model_config import ModelConfig

    shape = ModelConfig(preset="tiny", **OWN_SHAPE).shape
    generator = torch.Generator().manual_seed(2)
    model = {name: torch.randn(size, generator=generator) * 0.1 for name, size in parameter_shapes(shape).items()}
    run = write_checkpoint(tmp_path / "run", {"model": model}, preset="tiny", step=4, model_shape=OWN_SHAPE)
    export_hf(run, tmp_path / "hf", tokenizer="byte")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["vocab_size"], config["num_hidden_layers"], config["intermediate_size"]) == (300, 3, 96)
    theirs = LlamaForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32, attn_implementation="eager")
    tokens = torch.randint(0, 300, (2, 24), generator=generator)
    with torch.no_grad():
        ours = our_model(step_dir(run, 4), shape)(tokens)
        torch.testing.assert_close(theirs.eval()(tokens).logits, ours, atol=2e-5, rtol=2e-5)


def test_a_record_of_a_shape_the_model_cannot_take_is_refused_naming_it(tmp_path):
    from workloads.model_config import ModelConfig

    shape = ModelConfig(preset="tiny", **OWN_SHAPE).shape
    model = {name: torch.zeros(size) for name, size in parameter_shapes(shape).items()}
    for changes, says in [
        ({"n_heads": 5}, "records a model shape the model cannot take: model.n_heads: 5 does not divide"),
        ({"init_from": "/etc"}, "records a model shape this version does not know: {'init_from': '/etc'}"),
        ([1], "records a model shape this version does not know: [1]"),
    ]:
        run = write_checkpoint(
            tmp_path / f"run-{len(says)}", {"model": model}, preset="tiny", step=4, model_shape=changes
        )
        assert says in _refusal(str(run), "--out", str(tmp_path / "o"))


def _own_shape_export(tmp_path: Path) -> Path:
    """A Hugging Face checkpoint of OWN_SHAPE, exported from a committed checkpoint of that shape."""
    from workloads.model_config import ModelConfig

    shape = ModelConfig(preset="tiny", **OWN_SHAPE).shape
    generator = torch.Generator().manual_seed(3)
    model = {name: torch.randn(size, generator=generator) * 0.1 for name, size in parameter_shapes(shape).items()}
    run = write_checkpoint(tmp_path / "own-run", {"model": model}, preset="tiny", step=2, model_shape=OWN_SHAPE)
    return export_hf(run, tmp_path / "own-hf", tokenizer="byte").out


def test_preflight_takes_an_own_models_shape_from_its_config_json(tmp_path):
    hf = _own_shape_export(tmp_path)
    refused = _preflight(tmp_path, hf)
    assert refused.returncode == EXIT_DO_NOT_REQUEUE and len(refused.stderr.strip().splitlines()) == 1
    assert "vocab_size is 300, the tiny preset has 256" in refused.stderr
    assert "or take its shape with model.shape_from" in refused.stderr
    taken = _preflight(tmp_path, hf, f"model.shape_from={hf}")
    assert taken.returncode == 0, taken.stderr
