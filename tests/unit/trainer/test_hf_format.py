"""The Hugging Face layout without a training run: the rotary reordering against transformers'
Llama (also with Llama 3.x RoPE scaling), the config.json and tensor checks that refuse a
mismatch naming it, the tokenizer files, and the export's memory bound."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from nvrx_eks.facts.errors import ConfigError
from tests.support import REPO_ROOT
from tests.support.hf_checkpoints import write_checkpoint
from workloads.hf_format import from_hf, hf_config, hf_name, open_checkpoint, parameter_shapes, to_hf
from workloads.model import Transformer
from workloads.presets import MODEL_PRESETS

TINY = MODEL_PRESETS["tiny"]
#: Llama 3.1's scaling, with the original context shortened so that the tiny preset's head
#: (16 dimensions, rope_theta 10000) has frequencies in all three bands at 48 positions.
SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
#: fp32 logits of two implementations of the same arithmetic in another order (HF's eager
#: attention against our SDPA): measured differences are ~1e-6.
ATOL = RTOL = 2e-5


def _ours(rope_scaling=None, seed=3) -> Transformer:
    model = Transformer(TINY, rope_scaling)
    model.init_weights(seed, torch.device("cpu"))
    return model.eval()  # the tiny preset has dropout


def _hf_model(model: Transformer, rope_scaling=None, *, reorder=True):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = hf_config(TINY, rope_scaling, "float32")
    hf = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="eager")).eval()
    params = dict(model.named_parameters())
    converted = {hf_name(n): to_hf(n, p, TINY) if reorder else p for n, p in params.items()}
    missing, unexpected = hf.load_state_dict(converted, strict=False)
    assert not unexpected and all("rotary" in name for name in missing), (missing, unexpected)
    return hf


def _logits(model, tokens):
    with torch.no_grad():
        out = model(tokens)
    return out if isinstance(out, torch.Tensor) else out.logits


TOKENS = torch.randint(0, TINY.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("rope_scaling", [None, SCALING], ids=["plain-rope", "llama3-scaling"])
def test_reordered_weights_give_transformers_our_logits(rope_scaling):
    model = _ours(rope_scaling)
    ours, theirs = _logits(model, TOKENS), _logits(_hf_model(model, rope_scaling), TOKENS)
    torch.testing.assert_close(theirs, ours, atol=ATOL, rtol=RTOL)
    # The reordering is what makes them agree: without it the same weights differ grossly.
    unordered = _logits(_hf_model(model, rope_scaling, reorder=False), TOKENS)
    assert (unordered - ours).abs().max() > 100 * ATOL


def test_llama3_scaling_changes_the_logits():
    """The scaled tables are in use: the same weights without scaling give other logits."""
    plain, scaled = _ours(None), _ours(SCALING)
    assert (_logits(plain, TOKENS) - _logits(scaled, TOKENS)).abs().max() > 100 * ATOL


def test_layout_change_is_a_permutation_undone_by_its_inverse():
    for name, size in parameter_shapes(TINY).items():
        tensor = torch.randn(size)
        assert torch.equal(from_hf(name, to_hf(name, tensor, TINY), TINY), tensor), name
    moved = to_hf("layers.0.attention.wq.weight", torch.arange(64.0)[:, None].repeat(1, 64), TINY)
    # Our row 2i + j becomes row j * 8 + i within each 16-row head.
    assert moved[:16, 0].tolist() == [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15]
    assert moved[16:32, 0].tolist() == [v + 16 for v in moved[:16, 0].tolist()]


# ----- refusals naming what differs ----------------------------------------------------------------


def _hf_dir(tmp_path: Path, config_changes=None, tensor_changes=None) -> Path:
    root = tmp_path / "hf"
    root.mkdir()
    config = {**hf_config(TINY, None, "float32"), **(config_changes or {})}
    (root / "config.json").write_text(json.dumps(config))
    tensors = {hf_name(n): torch.zeros(size) for n, size in parameter_shapes(TINY).items()}
    tensors.update(tensor_changes or {})
    save_file(tensors, str(root / "model.safetensors"))
    return root


def test_a_matching_checkpoint_opens(tmp_path):
    opened = open_checkpoint(_hf_dir(tmp_path), TINY, "the tiny preset", None)
    assert len(opened.tensors) == len(parameter_shapes(TINY))


def test_a_tensor_of_another_shape_is_refused_naming_it(tmp_path):
    root = _hf_dir(tmp_path, tensor_changes={"model.layers.1.self_attn.k_proj.weight": torch.zeros(64, 64)})
    with pytest.raises(ConfigError) as err:
        open_checkpoint(root, TINY, "the tiny preset", None)
    assert "model.init_from" in str(err.value)
    assert "tensor model.layers.1.self_attn.k_proj.weight has shape [64, 64]" in str(err.value)
    assert "needs [32, 64]" in str(err.value)


def test_a_missing_tensor_is_refused_naming_it(tmp_path):
    root = _hf_dir(tmp_path)
    tensors = {hf_name(n): torch.zeros(s) for n, s in parameter_shapes(TINY).items() if n != "norm.weight"}
    save_file(tensors, str(root / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"tensor model\.norm\.weight is missing"):
        open_checkpoint(root, TINY, "the tiny preset", None)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"num_key_value_heads": 4}, "num_key_value_heads is 4, the tiny preset has 2"),
        ({"rope_theta": 500000.0}, "rope_theta is 500000.0"),
        ({"rope_scaling": {"rope_type": "llama3", **SCALING}}, "set model.rope_scaling"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "only Llama 3.x's"),
        ({"tie_word_embeddings": True}, "tie_word_embeddings"),
        ({"model_type": "mistral"}, "model_type is 'mistral'"),
    ],
)
def test_a_config_of_another_model_is_refused_naming_the_field(tmp_path, changes, named):
    with pytest.raises(ConfigError) as err:
        open_checkpoint(_hf_dir(tmp_path, config_changes=changes), TINY, "the tiny preset", None)
    assert named in str(err.value) and "model.init_from" in str(err.value)


def test_the_transformers_5_rope_form_is_read(tmp_path):
    """transformers 5 writes one rope_parameters mapping instead of rope_theta + rope_scaling."""
    changes = {
        "rope_theta": None,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": TINY.rope_theta, **SCALING},
    }
    opened = open_checkpoint(_hf_dir(tmp_path, config_changes=changes), TINY, "the tiny preset", SCALING)
    assert opened.config["rope_parameters"]["rope_type"] == "llama3"


# ----- tokenizer files -----------------------------------------------------------------------------


def test_the_byte_tokenizer_loads_in_transformers_with_the_shards_ids(tmp_path):
    from transformers import AutoTokenizer

    from nvrx_eks.data.prepare import load_tokenizer
    from nvrx_eks.ops.hf_export import _write_tokenizer

    _write_tokenizer("byte", tmp_path, TINY)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    text = "Grüße, 世界! 🎉\n\tend  "
    ids = tok(text, add_special_tokens=False).input_ids
    assert ids == load_tokenizer("byte").encode(text) == list(text.encode())
    assert tok.decode(ids) == text


def test_a_tokenizer_json_loads_in_transformers_with_the_shards_ids(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer

    from nvrx_eks.data.prepare import load_tokenizer
    from nvrx_eks.ops.hf_export import _write_tokenizer

    docs = [f"document {i}: the quick brown fox jumps over {i * 7} lazy dogs" for i in range(200)]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=250, special_tokens=["<unk>", "<|endoftext|>"]))
    path = tmp_path / "src" / "tokenizer.json"
    path.parent.mkdir()
    bpe.save(str(path))
    out = tmp_path / "out"
    out.mkdir()
    _write_tokenizer(str(path), out, TINY)
    tok = AutoTokenizer.from_pretrained(out)
    text = "the quick brown fox, document 12"
    assert tok(text, add_special_tokens=False).input_ids == load_tokenizer(str(path)).encode(text)
    assert tok.eos_token == "<|endoftext|>"


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path):
    from nvrx_eks.ops.hf_export import _write_tokenizer

    with pytest.raises(ConfigError, match="--tokenizer: byte has 256 tokens, more than the model's vocabulary"):
        _write_tokenizer("byte", tmp_path, dataclasses.replace(TINY, vocab_size=200))


# ----- memory ---------------------------------------------------------------------------------------

#: The export in a fresh process: its resident memory once everything is imported, and the peak
#: (VmHWM: this process's own high-water mark, where ru_maxrss would carry the forking parent's).
_MEASURE = """
import json, sys
from pathlib import Path
import psutil
from nvrx_eks.ops.hf_export import export_hf
before = psutil.Process().memory_info().rss
export_hf(Path(sys.argv[1]), Path(sys.argv[2]))
status = Path("/proc/self/status").read_text()
peak = int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) * 1024
print(json.dumps({"before": before, "peak": peak}))
"""


def test_export_memory_stays_well_below_the_model_size(tmp_path):
    """The small preset's 136 MiB of fp32 weights (the optimizer's moments beside them, as in a
    real checkpoint) export with the process growing by less than half of that: the largest
    tensor is the 16 MiB embedding, held a few times at most."""
    small = MODEL_PRESETS["small"]
    generator = torch.Generator().manual_seed(0)
    model = {n: torch.randn(s, generator=generator) for n, s in parameter_shapes(small).items()}
    state = {
        "model": model,
        "optim": {"state": {n: {"exp_avg": t.clone(), "exp_avg_sq": t.clone()} for n, t in model.items()}},
    }
    model_bytes = sum(t.numel() * 4 for t in model.values())
    run = write_checkpoint(tmp_path / "run", state, preset="small", step=3)
    del state, model
    measured = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(run), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
        check=True,
    )
    rss = json.loads(measured.stdout.strip().splitlines()[-1])
    grew = rss["peak"] - rss["before"]
    assert grew < model_bytes / 2, f"grew {grew / 2**20:.0f} MiB exporting {model_bytes / 2**20:.0f} MiB"
    assert (tmp_path / "out" / "model.safetensors").stat().st_size > model_bytes
