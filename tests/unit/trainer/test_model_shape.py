"""The model's shape from the user's own model: fields set over a preset (`model.vocab_size=...`)
or a Hugging Face config.json (`model.shape_from=PATH`), the rules a Llama shape keeps (each
refusal naming the field and the fix), one reader of config.json for shape_from and init_from,
and the checkpoint identity that carries the shape."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nvrx_eks.facts import checkpoint_layout as layout
from nvrx_eks.facts.errors import ConfigError
from tests.support.hf_checkpoints import LLAMA_3_1_8B
from workloads.config import TrainConfig
from workloads.hf_format import config_problems, hf_config, llama_shape
from workloads.model_config import SHAPE_FIELDS, ModelConfig
from workloads.presets import MODEL_PRESETS

#: A Llama 2 13B-shaped config.json with a tokenizer of our own (vocabulary 50,000).
OWN_13B = {
    **LLAMA_3_1_8B,
    "vocab_size": 50000,
    "hidden_size": 5120,
    "intermediate_size": 13824,
    "num_hidden_layers": 40,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rope_scaling": None,
}


def _config(*overrides: str, preset: str = "8b") -> TrainConfig:
    return TrainConfig.from_dict({"model": {"preset": preset}}, source="test", overrides=overrides)


def _issues(*overrides: str, preset: str = "8b") -> dict[str, str]:
    with pytest.raises(ConfigError) as err:
        _config(*overrides, preset=preset)
    return {".".join(path): message for path, message in err.value.issues}


def _config_json(directory: Path, config: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


# ----- fields over a preset -------------------------------------------------------------------------


def test_shape_fields_set_over_a_preset_change_only_those_fields():
    model = _config("model.vocab_size=32000", "model.n_layers=40").model
    eight_b = MODEL_PRESETS["8b"]
    assert (model.shape.vocab_size, model.shape.n_layers) == (32000, 40)
    assert (model.shape.dim, model.shape.n_kv_heads, model.shape.rope_theta) == (4096, 8, eight_b.rope_theta)
    assert model.shape_changes == {"vocab_size": 32000, "n_layers": 40}
    assert model.name == "8b with vocab_size=32000, n_layers=40"
    assert model.noun == "the model (8b with vocab_size=32000, n_layers=40)"


def test_a_shaped_config_dumps_the_fields_it_sets_and_loads_back_the_same():
    cfg = _config("model.vocab_size=32000", "model.n_layers=40", "model.norm_eps=1e-6")
    dumped = cfg.model_dump(mode="json")["model"]
    assert {k: dumped[k] for k in ("preset", "vocab_size", "n_layers", "norm_eps")} == {
        "preset": "8b",
        "vocab_size": 32000,
        "n_layers": 40,
        "norm_eps": 1e-6,
    }
    assert not {"dim", "n_heads", "shape_from"} & set(dumped)
    assert TrainConfig.from_dict(cfg.model_dump(mode="json")).model.shape == cfg.model.shape


def test_a_preset_config_dumps_exactly_as_before_the_shape_fields():
    """The rendered ConfigMap of every default job stays byte-identical (tests/golden)."""
    assert list(TrainConfig().model_dump(mode="json")["model"]) == [
        "preset",
        "rope_scaling",
        "init_from",
        "activation_checkpointing",
        "checkpoint_blocks",
        "loss_chunk_tokens",
    ]
    assert ModelConfig().shape == MODEL_PRESETS["tiny"] and ModelConfig().shape_changes == {}


def test_a_field_set_to_the_presets_own_value_changes_nothing():
    model = _config("model.dim=4096", "model.n_heads=32").model
    assert model.shape_changes == {} and model.name == "8b" and model.noun == "the 8b preset"


@pytest.mark.parametrize(
    ("overrides", "field", "says"),
    [
        (["model.n_heads=24"], "model.n_heads", "24 does not divide model.dim (4096), so the heads cannot split it; "
         "use model.n_heads 16 or 32"),
        (["model.dim=4100"], "model.n_heads", "32 does not divide model.dim (4100)"),
        (["model.dim=4160", "model.n_heads=64"], "model.n_heads", "65 dimensions per head, an odd number, and RoPE "
         "rotates pairs of a head's dimensions; use model.n_heads 52 or 65"),
        (["model.n_kv_heads=3"], "model.n_kv_heads", "3 does not divide model.n_heads (32); each key/value head serves "
         "a whole group of query heads: use 2 or 4"),
        (["model.n_kv_heads=64"], "model.n_kv_heads", "64 does not divide model.n_heads (32)"),
        (["model.activation_checkpointing=true", "model.checkpoint_blocks=33"], "model.checkpoint_blocks",
         "33 exceeds the 32 blocks of the 8b preset; give at most 32"),
        (["model.n_layers=20", "model.activation_checkpointing=true", "model.checkpoint_blocks=21"],
         "model.checkpoint_blocks", "21 exceeds the 20 blocks of the model (8b with n_layers=20); give at most 20"),
        (["model.n_layers=100000"], "model.n_layers", "less than or equal to 1024"),
        (["model.vocab_size=1"], "model.vocab_size", "greater than or equal to 2"),
        (["model.rope_theta=.nan"], "model.rope_theta", "finite number"),
        (["model.norm_eps=0"], "model.norm_eps", "greater than 0"),
        (["model.max_seq_len=4096"], "data.seq_len", "8192 exceeds the max_seq_len of the model (8b with "
         "max_seq_len=4096), 4096; lower it, or raise model.max_seq_len"),
    ],
    ids=["heads", "dim", "odd-head", "kv-heads", "kv-above-heads", "blocks", "blocks-of-own-depth", "layers-bound",
         "vocab-bound", "theta-nan", "eps", "seq-len"],
)  # fmt: skip
def test_a_shape_the_model_cannot_take_is_refused_naming_the_field_and_the_fix(overrides, field, says):
    overrides = [*overrides, "data.seq_len=8192"] if field == "data.seq_len" else overrides
    issues = _issues(*overrides)
    assert field in issues and says in issues[field], issues


def test_a_shape_that_fits_the_rules_is_accepted_at_its_own_depth():
    model = _config("model.n_layers=40", "model.activation_checkpointing=true", "model.checkpoint_blocks=40").model
    assert model.checkpointed_blocks == 40


# ----- a Hugging Face config.json ---------------------------------------------------------------


def test_shape_from_a_config_json_takes_every_shape_field_and_writes_them_out(tmp_path):
    source = _config_json(tmp_path / "own-13b", OWN_13B)
    cfg = _config(f"model.shape_from={source}")
    assert cfg.model.shape == MODEL_PRESETS["8b"].__class__(
        vocab_size=50000, dim=5120, n_layers=40, n_heads=40, n_kv_heads=8, ffn_dim=13824, max_seq_len=4096,
        rope_theta=10000.0, dropout=0.0, norm_eps=1e-5,
    )  # fmt: skip
    dumped = cfg.model_dump(mode="json")["model"]
    # What the ConfigMap states: the literal shape, never the operator's local path.
    assert "shape_from" not in dumped and dumped["vocab_size"] == 50000 and dumped["rope_scaling"] is None
    assert TrainConfig.from_dict(cfg.model_dump(mode="json")).model.shape == cfg.model.shape
    # The file itself works as well as its directory; a field set beside it wins.
    assert _config(f"model.shape_from={source / 'config.json'}").model.shape == cfg.model.shape
    assert _config(f"model.shape_from={source}", "model.vocab_size=65536").model.shape.vocab_size == 65536


def test_shape_from_llama_3_1_takes_its_rope_scaling_and_its_context(tmp_path):
    model = _config(f"model.shape_from={_config_json(tmp_path / 'l31', LLAMA_3_1_8B)}").model
    assert model.rope_scaling_settings == {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert model.shape_changes == {"max_seq_len": 131072}  # every weight's shape is the 8b preset's
    assert config_problems(LLAMA_3_1_8B, model.shape, model.noun, model.rope_scaling_settings) == []


def test_transformers_defaults_fill_the_keys_a_config_json_leaves_out(tmp_path):
    sparse = {k: v for k, v in OWN_13B.items() if k not in ("num_key_value_heads", "rms_norm_eps", "rope_theta")}
    shape = _config(f"model.shape_from={_config_json(tmp_path / 'sparse', sparse)}").model.shape
    assert (shape.n_kv_heads, shape.norm_eps, shape.rope_theta) == (40, 1e-6, 10000.0)  # LlamaConfig's


@pytest.mark.parametrize("preset", sorted(MODEL_PRESETS))
def test_the_config_json_we_write_reads_back_as_the_same_shape(preset):
    """One mapping both ways: hf_config (export) and llama_shape (shape_from, init_from)."""
    shape = MODEL_PRESETS[preset]
    fields, scaling = llama_shape(hf_config(shape, None, "float32"))
    assert {k: v for k, v in fields.items() if k != "dropout"} == {
        f: getattr(shape, f) for f in SHAPE_FIELDS if f != "dropout"
    }
    assert scaling is None


@pytest.mark.parametrize(
    ("write", "says"),
    [
        (lambda d: (d / "config.json").write_text("[1, 2]"), "is a JSON list, not a mapping of settings"),
        (lambda d: (d / "config.json").write_text("[" * 100_000 + "]" * 100_000), "nests too deeply"),
        (lambda d: (d / "config.json").write_text(json.dumps({**OWN_13B, "model_type": "mistral"})), "'mistral'"),
        (lambda d: (d / "config.json").write_text(json.dumps({**OWN_13B, "hidden_size": "5120"})),
         "hidden_size is '5120', not a positive whole number"),
        (lambda d: (d / "config.json").write_text(json.dumps({**OWN_13B, "tie_word_embeddings": True})),
         "tie_word_embeddings is true"),
        (lambda d: (d / "config.json").write_text(json.dumps({**OWN_13B, "head_dim": 64})), "head_dim is 64"),
        (lambda d: os.mkfifo(d / "config.json"), "is not a regular file"),
        (lambda d: None, "holds no config.json"),
    ],
    ids=["list", "nested", "mistral", "string-size", "tied", "head-dim", "fifo", "missing"],
)  # fmt: skip
def test_a_config_json_that_is_not_a_llama_shape_is_refused_naming_shape_from(tmp_path, write, says):
    directory = tmp_path / "hf"
    directory.mkdir()
    write(directory)
    issues = _issues(f"model.shape_from={directory}")
    assert list(issues) == ["model.shape_from"] and says in issues["model.shape_from"], issues
    assert issues["model.shape_from"].endswith("give a Hugging Face Llama config.json or the directory holding it")


def test_a_shape_from_config_json_is_checked_by_the_same_rules(tmp_path):
    odd = _config_json(tmp_path / "odd", {**OWN_13B, "num_key_value_heads": 3})
    assert "3 does not divide model.n_heads (40)" in _issues(f"model.shape_from={odd}")["model.n_kv_heads"]


# ----- what a checkpoint records ------------------------------------------------------------------


def test_a_checkpoint_of_another_shape_is_refused_naming_the_shape():
    written = layout.run_identity(16, "8b", _config("model.vocab_size=32000").model.shape_changes)
    resuming = layout.run_identity(16, "8b", _config().model.shape_changes)
    problem = layout.incompatibility(written, resuming, layout_may_differ=True)
    assert problem is not None and "model_shape={'vocab_size': 32000}" in problem and "model.vocab_size" in problem
    assert layout.incompatibility(written, written, layout_may_differ=True) is None


def test_a_record_from_before_shapes_is_the_presets_shape():
    before = {"world_size": 16, "preset": "8b"}
    assert layout.incompatibility(before, layout.run_identity(16, "8b", {}), layout_may_differ=True) is None
    shaped = layout.run_identity(16, "8b", {"n_layers": 40})
    assert "model_shape" in (layout.incompatibility(before, shaped, layout_may_differ=True) or "")
