"""The Hugging Face Llama checkpoint format, as our model maps onto it: tensor names, the rotary
layout of the query and key projections, config.json, and reading a checkpoint's tensor table.

Shared by `nvrx-eks export` (our checkpoint out) and `model.init_from` (Hugging Face weights in,
workloads.hf_import). No torch import: the trainer's preflight checks an init_from directory
against the model before any rank starts; the layout functions only call tensor methods.

Rotary layout. Our attention (workloads.model._apply_rope) rotates adjacent pairs of a head's
dimensions, (0, 1), (2, 3), ..., pair i by frequency i. Hugging Face's Llama rotates the two
halves against each other (`rotate_half`): dimension i pairs with i + head_dim/2, by frequency i.
Both compute the same attention when the rows of wq and wk are reordered within each head: our
row 2i + j (j = 0, 1) is Hugging Face's row j * head_dim/2 + i. Values, outputs, norms and the
feed-forward are unaffected; wv and wo keep their rows.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvrx_eks.facts.errors import ConfigError
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


def hf_config(shape: ModelShape, rope_scaling: dict[str, Any] | None, dtype: str) -> dict[str, Any]:
    """config.json of LlamaForCausalLM for `shape`. RoPE in the form Llama 3.1's own config.json
    has (rope_theta, and rope_scaling with rope_type llama3), which transformers 4 and 5 both read."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.dim,
        "intermediate_size": shape.ffn_dim,
        "num_hidden_layers": shape.n_layers,
        "num_attention_heads": shape.n_heads,
        "num_key_value_heads": shape.n_kv_heads,
        "head_dim": shape.dim // shape.n_heads,
        "max_position_embeddings": shape.max_seq_len,
        "rms_norm_eps": shape.norm_eps,
        "rope_theta": shape.rope_theta,
        "rope_scaling": {"rope_type": "llama3", **rope_scaling} if rope_scaling else None,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
    }


def _rope_of(config: dict[str, Any]) -> tuple[Any, dict[str, Any] | None]:
    """(rope_theta, llama3 scaling or None) from either config.json form: rope_theta beside
    rope_scaling (Llama 3.1, transformers 4) or one rope_parameters mapping (transformers 5)."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or params
    theta = config.get("rope_theta") or params.get("rope_theta")
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise ConfigError(
            f"model.init_from: {CONFIG_FILE} has RoPE scaling of type {kind!r}; the trainer implements "
            "only Llama 3.x's (rope_type llama3)"
        )
    return theta, {key: scaling.get(key) for key in LLAMA3_SCALING_KEYS}


def config_problems(
    config: dict[str, Any], shape: ModelShape, preset: str, rope_scaling: dict[str, Any] | None
) -> list[str]:
    """How a Hugging Face config.json differs from the run's model, one line per field."""
    if config.get("model_type") != "llama":
        return [f"model_type is {config.get('model_type')!r}, not 'llama'; give a Llama checkpoint"]
    wanted = hf_config(shape, rope_scaling, "float32")
    problems = []
    for key in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "rms_norm_eps",
    ):
        # Not max_position_embeddings: a context the checkpoint supports beyond the preset's
        # max_seq_len (Llama 3.1: 131072) changes no weight; the run trains at its own seq_len.
        if config.get(key) != wanted[key]:
            problems.append(f"{key} is {config.get(key)}, the {preset} preset has {wanted[key]}")
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim != wanted["head_dim"]:
        problems.append(f"head_dim is {head_dim}, the {preset} preset has {wanted['head_dim']}")
    if config.get("tie_word_embeddings"):
        problems.append("tie_word_embeddings is true; the model has its own output projection")
    if config.get("attention_bias") or config.get("mlp_bias"):
        problems.append("the projections have biases; the model has none")
    theta, scaling = _rope_of(config)
    if theta != shape.rope_theta:
        problems.append(f"rope_theta is {theta}, the {preset} preset has {shape.rope_theta:g}")
    if scaling != rope_scaling:
        problems.append(
            f"RoPE scaling is {scaling}, the run has {rope_scaling}; set model.rope_scaling to the "
            f"checkpoint's ({', '.join(LLAMA3_SCALING_KEYS)}), or null when it has none"
        )
    return problems


# ----- reading a checkpoint's tensor table ---------------------------------------------------------


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a safetensors file: where it is and what it holds (no data read)."""

    file: Path
    dtype: str  # the safetensors code, e.g. F32, BF16
    shape: tuple[int, ...]


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: {name: {dtype, shape, data_offsets}, __metadata__}."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


def weight_files(root: Path) -> list[Path]:
    """The safetensors files of a Hugging Face checkpoint directory: the index's, or the one file."""
    index = root / WEIGHTS_INDEX_FILE
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [root / name for name in names]
    return [root / SINGLE_WEIGHTS_FILE]


@dataclass(frozen=True)
class HfCheckpoint:
    """A Hugging Face Llama checkpoint directory checked against a run's model."""

    root: Path
    config: dict[str, Any]
    tensors: dict[str, StoredTensor]  # by Hugging Face name


def open_checkpoint(
    root: str | Path, shape: ModelShape, preset: str, rope_scaling: dict[str, Any] | None
) -> HfCheckpoint:
    """Read `root`'s config.json and tensor tables and check them against the model: ConfigError
    naming model.init_from and the field or tensor that differs. Reads no weights."""
    where = f"model.init_from: {root}"
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"{where} is not a directory; give a Hugging Face Llama checkpoint directory")
    try:
        config = json.loads((root / CONFIG_FILE).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{where}: cannot read {CONFIG_FILE} ({err}); give a Hugging Face checkpoint directory"
        ) from None
    problems = config_problems(config, shape, preset, rope_scaling)
    if problems:
        raise ConfigError(f"{where}: {CONFIG_FILE} does not match the model: " + "; ".join(problems))
    tensors: dict[str, StoredTensor] = {}
    try:
        for path in weight_files(root):
            for name, entry in safetensors_header(path).items():
                if name != "__metadata__":
                    tensors[name] = StoredTensor(path, entry["dtype"], tuple(entry["shape"]))
    except (OSError, ValueError, KeyError, struct.error) as err:
        raise ConfigError(
            f"{where}: cannot read its safetensors files ({err}); give a Hugging Face checkpoint"
        ) from None
    for name, size in parameter_shapes(shape).items():
        stored = tensors.get(hf_name(name))
        if stored is None:
            raise ConfigError(f"{where}: tensor {hf_name(name)} is missing; the {preset} preset needs it")
        if stored.shape != size:
            raise ConfigError(
                f"{where}: tensor {hf_name(name)} has shape {list(stored.shape)}, the {preset} preset "
                f"needs {list(size)}; give a checkpoint of this model's shape or change model.preset"
            )
        if stored.dtype not in _BYTES_PER_ELEMENT:
            raise ConfigError(f"{where}: tensor {hf_name(name)} is {stored.dtype}; expected F32, BF16 or F16")
    return HfCheckpoint(root, config, tensors)


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
