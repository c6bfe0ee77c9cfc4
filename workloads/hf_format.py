"""The Hugging Face Llama checkpoint format, as our model maps onto it: tensor names, the rotary
layout of the query and key projections, config.json, and reading a checkpoint's tensor table.

Shared by `nvrx-eks export` (our checkpoint out), `model.init_from` (Hugging Face weights in,
workloads.hf_import) and `model.shape_from` (a config.json's shape as the run's model,
workloads.config): one reader of config.json (llama_shape), whose files are read as untrusted
input (workloads.hf_files). No torch import: the trainer's preflight checks an init_from
directory against the model before any rank starts, and the CLI reads config.json files; the
layout functions only call tensor methods.

Rotary layout. Our attention (workloads.model._apply_rope) rotates adjacent pairs of a head's
dimensions, (0, 1), (2, 3), ..., pair i by frequency i. Hugging Face's Llama rotates the two
halves against each other (`rotate_half`): dimension i pairs with i + head_dim/2, by frequency i.
Both compute the same attention when the rows of wq and wk are reordered within each head: our
row 2i + j (j = 0, 1) is Hugging Face's row j * head_dim/2 + i. Values, outputs, norms and the
feed-forward are unaffected; wv and wo keep their rows.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvrx_eks.facts.errors import ConfigError
from workloads.hf_files import (
    MAX_CONFIG_BYTES,
    MAX_INDEX_BYTES,
    MAX_TENSORS,
    CheckpointDir,
    ReadBudget,
    StoredTensor,
    Unreadable,
    index_weight_map,
    read_json_file,
    safetensors_tensors,
)
from workloads.presets import ModelShape

if TYPE_CHECKING:
    import torch

CONFIG_FILE = "config.json"
#: One safetensors file, or several named by the index (Hugging Face's sharded layout).
SINGLE_WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
#: safetensors dtype codes of the dtypes we write and read.
SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_BYTES_PER_ELEMENT = {"F32": 4, "BF16": 2, "F16": 2}

#: Our parameter name (a model state-dict key without the "model." prefix) -> Hugging Face's.
_BLOCK_NAMES = {
    "attention_norm.weight": "input_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
#: The projections whose rows are reordered within each head (see the module docstring).
_ROTARY = ("attention.wq.weight", "attention.wk.weight")


def parameter_shapes(shape: ModelShape) -> dict[str, tuple[int, ...]]:
    """Every parameter of workloads.model.Transformer by our name, with its full shape."""
    head_dim = shape.dim // shape.n_heads
    q, kv = shape.n_heads * head_dim, shape.n_kv_heads * head_dim
    block = {
        "attention_norm.weight": (shape.dim,),
        "attention.wq.weight": (q, shape.dim),
        "attention.wk.weight": (kv, shape.dim),
        "attention.wv.weight": (kv, shape.dim),
        "attention.wo.weight": (shape.dim, q),
        "ffn_norm.weight": (shape.dim,),
        "feed_forward.w1.weight": (shape.ffn_dim, shape.dim),
        "feed_forward.w3.weight": (shape.ffn_dim, shape.dim),
        "feed_forward.w2.weight": (shape.dim, shape.ffn_dim),
    }
    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (shape.vocab_size, shape.dim)}
    for layer in range(shape.n_layers):
        shapes.update({f"layers.{layer}.{name}": size for name, size in block.items()})
    shapes["norm.weight"] = (shape.dim,)
    shapes["output.weight"] = (shape.vocab_size, shape.dim)
    return shapes


def hf_name(name: str) -> str:
    """Hugging Face's name for our parameter `name` (e.g. layers.3.attention.wq.weight)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    prefix, _, rest = name.partition(".")
    layer, _, inner = rest.partition(".")
    if prefix != "layers" or not layer.isdigit() or inner not in _BLOCK_NAMES:
        raise KeyError(f"{name} is not a parameter of our Llama model")
    return f"model.layers.{layer}.{_BLOCK_NAMES[inner]}"


def rows_per_block(name: str, shape: ModelShape) -> int:
    """Rows that the layout change moves together: a head's for wq and wk, else one. A range
    of rows aligned to these blocks converts on its own (workloads.hf_import reads such ranges)."""
    return shape.dim // shape.n_heads if name.endswith(_ROTARY) else 1


def to_hf(name: str, tensor: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    """Our parameter `name` (whole heads of rows, for wq and wk) in Hugging Face's layout."""
    if not name.endswith(_ROTARY):
        return tensor
    head_dim = rows_per_block(name, shape)
    rows, cols = tensor.shape
    # [heads, pair i, j, cols] -> [heads, j, pair i, cols]: row 2i + j becomes j * head_dim/2 + i.
    return tensor.reshape(rows // head_dim, head_dim // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def from_hf(name: str, tensor: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    """The inverse of to_hf: Hugging Face's rows (whole heads, for wq and wk) in our layout."""
    if not name.endswith(_ROTARY):
        return tensor
    head_dim = rows_per_block(name, shape)
    rows, cols = tensor.shape
    return tensor.reshape(rows // head_dim, 2, head_dim // 2, cols).transpose(1, 2).reshape(rows, cols)


# ----- config.json ------------------------------------------------------------------------------------

#: Llama 3.x's RoPE scaling settings (model.rope_scaling), as config.json names them.
LLAMA3_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
#: Our shape field (workloads.presets.ModelShape, model.<field> in the trainer config) -> the
#: config.json key of LlamaConfig that states it. rope_theta and dropout are read apart: the
#: first has two forms (_rope_of), the second is not Llama's (it has none).
SHAPE_KEYS = {
    "vocab_size": "vocab_size",
    "dim": "hidden_size",
    "ffn_dim": "intermediate_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "max_seq_len": "max_position_embeddings",
    "norm_eps": "rms_norm_eps",
}
#: What LlamaConfig takes when config.json leaves a key out (transformers 4 and 5 agree); the
#: sizes have no such default here: a config.json without them is not one to guess at.
_LLAMA_DEFAULTS = {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
#: Fields a checkpoint may differ in from the run's model: a context it supports beyond the run's
#: max_seq_len (Llama 3.1: 131072) changes no weight, the run trains at its own seq_len; dropout
#: is the run's choice (Llama's config states none).
_NOT_COMPARED = ("max_seq_len", "dropout")


def hf_config(shape: ModelShape, rope_scaling: dict[str, Any] | None, dtype: str) -> dict[str, Any]:
    """config.json of LlamaForCausalLM for `shape`. RoPE in the form Llama 3.1's own config.json
    has (rope_theta, and rope_scaling with rope_type llama3), which transformers 4 and 5 both read."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **{key: getattr(shape, field) for field, key in SHAPE_KEYS.items()},
        "head_dim": shape.dim // shape.n_heads,
        "rope_theta": shape.rope_theta,
        "rope_scaling": {"rope_type": "llama3", **rope_scaling} if rope_scaling else None,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
    }


def _mapping(config: dict[str, Any], key: str) -> dict[str, Any]:
    value = config.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Unreadable(f"{key} is {type(value).__name__}, not a mapping")
    return value


def _rope_of(config: dict[str, Any]) -> tuple[Any, dict[str, Any] | None]:
    """(rope_theta, llama3 scaling or None) from either config.json form: rope_theta beside
    rope_scaling (Llama 3.1, transformers 4) or one rope_parameters mapping (transformers 5)."""
    params = _mapping(config, "rope_parameters")
    scaling = _mapping(config, "rope_scaling") or params
    theta = config.get("rope_theta")
    if theta is None:
        theta = params.get("rope_theta", _LLAMA_DEFAULTS["rope_theta"])
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise Unreadable(
            f"RoPE scaling is of type {kind!r}; the trainer implements only Llama 3.x's (rope_type llama3)"
        )
    return theta, {key: scaling.get(key) for key in LLAMA3_SCALING_KEYS}


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def llama_shape(config: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The model a Hugging Face config.json describes, as our shape fields (model.vocab_size,
    model.dim, ...) and the llama3 RoPE scaling or None. Raises Unreadable naming the key when it
    is not a Llama our model can be: another architecture, tied embeddings, biases, another
    activation or head size, a value of the wrong type."""
    if not isinstance(config, dict):
        raise Unreadable(f"is a JSON {type(config).__name__}, not a mapping of settings")
    if config.get("model_type") != "llama":
        raise Unreadable(f"model_type is {config.get('model_type')!r}, not 'llama'; give a Llama checkpoint's")
    problems = []
    if config.get("tie_word_embeddings"):
        problems.append("tie_word_embeddings is true; the model has its own output projection")
    if config.get("attention_bias") or config.get("mlp_bias"):
        problems.append("the projections have biases; the model has none")
    if config.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act is {config.get('hidden_act')!r}; the model's feed-forward is SwiGLU (silu)")
    if config.get("attention_dropout", 0) not in (0, 0.0):
        problems.append(f"attention_dropout is {config.get('attention_dropout')}; the model has no attention dropout")
    values: dict[str, Any] = {key: config.get(key, _LLAMA_DEFAULTS.get(key)) for key in SHAPE_KEYS.values()}
    if values["num_key_value_heads"] is None:  # LlamaConfig: one key/value head per query head
        values["num_key_value_heads"] = values["num_attention_heads"]
    theta, scaling = _rope_of(config)
    for key, value in values.items():
        if key == "rms_norm_eps":
            if not _positive(value):
                problems.append(f"{key} is {value!r}, not a positive number")
        elif not _whole(value):
            problems.append(f"{key} is {value!r}, not a positive whole number")
    if not _positive(theta):
        problems.append(f"rope_theta is {theta!r}, not a positive number")
    head_dim = config.get("head_dim")
    heads, hidden = values["num_attention_heads"], values["hidden_size"]
    if head_dim is not None and _whole(heads) and _whole(hidden) and head_dim != hidden / heads:
        problems.append(f"head_dim is {head_dim!r}; the model's heads take hidden_size / num_attention_heads")
    if problems:
        raise Unreadable("; ".join(problems))
    fields: dict[str, Any] = {field: values[key] for field, key in SHAPE_KEYS.items()}
    return {**fields, "rope_theta": float(theta), "dropout": 0.0}, scaling


def read_config(path: str | Path) -> dict[str, Any]:
    """config.json named by the user (the file, or a directory holding it): bounded, checked JSON.
    Raises Unreadable."""
    path = Path(path)
    try:
        path = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise Unreadable("does not exist") from None
    if path.is_dir():
        try:
            path = (path / CONFIG_FILE).resolve(strict=True)
        except (OSError, RuntimeError):
            raise Unreadable(f"holds no {CONFIG_FILE}") from None
    config = read_json_file(path, MAX_CONFIG_BYTES, ReadBudget(), str(path))
    if not isinstance(config, dict):
        raise Unreadable(f"{path} is a JSON {type(config).__name__}, not a mapping of settings")
    return config


def config_problems(
    config: dict[str, Any], shape: ModelShape, model: str, rope_scaling: dict[str, Any] | None
) -> list[str]:
    """How a Hugging Face config.json differs from the run's model (`model` names it in the
    lines: "the tiny preset"), one line per field. Raises Unreadable (llama_shape) when it is not
    a Llama the model can be at all."""
    fields, scaling = llama_shape(config)
    problems = []
    for field, value in fields.items():
        wanted = getattr(shape, field)
        if field in _NOT_COMPARED or value == wanted:
            continue
        key = SHAPE_KEYS.get(field, field)
        shown = f"{wanted:g}" if field == "rope_theta" else wanted
        problems.append(f"{key} is {config.get(key, value)}, {model} has {shown}")
    if scaling != rope_scaling:
        problems.append(
            f"RoPE scaling is {scaling}, the run has {rope_scaling}; set model.rope_scaling to the "
            f"checkpoint's ({', '.join(LLAMA3_SCALING_KEYS)}), or null when it has none"
        )
    return problems


# ----- reading a checkpoint's tensor table ---------------------------------------------------------


def weight_files(files: CheckpointDir) -> tuple[list[str], dict[str, str] | None]:
    """The safetensors files of a checkpoint (the index's, or the one file) and the index's
    weight map (None without an index)."""
    if not files.has(WEIGHTS_INDEX_FILE):
        return [SINGLE_WEIGHTS_FILE], None
    weight_map = index_weight_map(files.json(WEIGHTS_INDEX_FILE, MAX_INDEX_BYTES), WEIGHTS_INDEX_FILE)
    return sorted(set(weight_map.values())), weight_map


def tensor_table(files: CheckpointDir) -> dict[str, StoredTensor]:
    """Every tensor of the checkpoint by Hugging Face name, each where the index says it is."""
    names, weight_map = weight_files(files)
    tensors: dict[str, StoredTensor] = {}
    for name in names:
        try:
            path = files.file(name)
        except Unreadable as err:
            raise Unreadable(f"{WEIGHTS_INDEX_FILE}: {err}" if weight_map is not None else str(err)) from None
        for key, stored in safetensors_tensors(path, name, files.budget).items():
            if key in tensors:
                raise Unreadable(f"tensor {key} is in both {tensors[key].file.name} and {name}")
            if weight_map is not None and weight_map.get(key, name) != name:
                raise Unreadable(f"{WEIGHTS_INDEX_FILE} puts tensor {key} in {weight_map[key]}, but it is in {name}")
            tensors[key] = stored
        if len(tensors) > MAX_TENSORS:
            raise Unreadable(f"more than {MAX_TENSORS:,} tensors; not a checkpoint the trainer reads")
    return tensors


@dataclass(frozen=True)
class HfCheckpoint:
    """A Hugging Face Llama checkpoint directory checked against a run's model."""

    root: Path
    config: dict[str, Any]
    tensors: dict[str, StoredTensor]  # by Hugging Face name


def open_checkpoint(
    root: str | Path, shape: ModelShape, model: str, rope_scaling: dict[str, Any] | None
) -> HfCheckpoint:
    """Read `root`'s config.json and tensor tables and check them against the model (`model`
    names it in messages: "the tiny preset"): ConfigError naming model.init_from and the field or
    tensor that differs, or the file that cannot be trusted (workloads.hf_files). Reads no weights."""
    where = f"model.init_from: {root}"
    try:
        files = CheckpointDir(root)
        config = files.json(CONFIG_FILE, MAX_CONFIG_BYTES)
        if not isinstance(config, dict):
            raise Unreadable(f"{CONFIG_FILE} is a JSON {type(config).__name__}, not a mapping of settings")
        try:
            problems = config_problems(config, shape, model, rope_scaling)
        except Unreadable as err:
            raise Unreadable(f"{CONFIG_FILE}: {err}") from None
        if problems:
            raise ConfigError(
                f"{where}: {CONFIG_FILE} does not match the model: " + "; ".join(problems) + "; give a checkpoint "
                f"of the run's shape, or take its shape with model.shape_from (a copy of its {CONFIG_FILE})"
            )
        tensors = tensor_table(files)
    except Unreadable as err:
        raise ConfigError(f"{where}: {err}; give a Hugging Face Llama checkpoint directory") from None
    for name, size in parameter_shapes(shape).items():
        stored = tensors.get(hf_name(name))
        if stored is None:
            raise ConfigError(f"{where}: tensor {hf_name(name)} is missing; {model} needs it")
        if stored.shape != size:
            raise ConfigError(
                f"{where}: tensor {hf_name(name)} has shape {list(stored.shape)}, {model} needs {list(size)}; give "
                "a checkpoint of this model's shape, or take its shape with model.shape_from"
            )
        if stored.dtype not in _BYTES_PER_ELEMENT:
            raise ConfigError(f"{where}: tensor {hf_name(name)} is {stored.dtype}; expected F32, BF16 or F16")
    return HfCheckpoint(files.root, config, tensors)


# ----- writing safetensors, one tensor at a time -----------------------------------------------------


@dataclass(frozen=True)
class PlannedTensor:
    name: str  # Hugging Face's
    dtype: str  # safetensors code
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * _BYTES_PER_ELEMENT[self.dtype]


def plan_files(tensors: list[PlannedTensor], max_file_bytes: int) -> list[list[PlannedTensor]]:
    """Tensors grouped into safetensors files of at most max_file_bytes (a larger tensor alone)."""
    files: list[list[PlannedTensor]] = [[]]
    size = 0
    for tensor in tensors:
        if files[-1] and size + tensor.nbytes > max_file_bytes:
            files.append([])
            size = 0
        files[-1].append(tensor)
        size += tensor.nbytes
    return files


def file_names(count: int) -> list[str]:
    """Hugging Face's names for `count` weight files."""
    if count == 1:
        return [SINGLE_WEIGHTS_FILE]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def header_bytes(tensors: list[PlannedTensor]) -> bytes:
    """The length-prefixed header of a safetensors file holding `tensors` in this order. Known
    before any data, which is what lets a writer stream the data after it tensor by tensor."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for tensor in tensors:
        header[tensor.name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the library writes it
    return struct.pack("<Q", len(text)) + text


def index_json(files: list[list[PlannedTensor]], names: list[str]) -> dict[str, Any]:
    return {
        "metadata": {"total_size": sum(t.nbytes for group in files for t in group)},
        "weight_map": {t.name: name for group, name in zip(files, names, strict=True) for t in group},
    }
