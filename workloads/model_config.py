"""ModelConfig: the `model:` section of a trainer config (workloads.config.TrainConfig).

The model's shape is a preset (workloads.presets) with any of its fields set over it, by name
(`model.vocab_size=32000 model.n_layers=40`), or read from a Hugging Face config.json with
`model.shape_from=PATH` (a file, or a directory holding one). shape_from is read once, where
the config is loaded, and replaced by the fields it gives: `render` reads it on the operator's
machine and the ConfigMap states the literal shape, so the pods never need the file and the
memory plan (workloads.memory) is checked against the real shape before anything is submitted.
Fields set beside shape_from win over the file's. The rules a Llama shape must keep (heads
divide the width, key/value heads divide the heads, an even head size for RoPE) are checked
here, each refusal naming the field and the fix.

Imports no torch, like workloads.config.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from workloads.presets import MODEL_PRESETS, ModelShape

#: Presets that recompute each block's activations in backward by default: without it the 8b
#: preset's saved activations alone (~176 KB per token per layer in bf16, workloads.memory) come
#: to ~92 GB at 2 x 8192 tokens per GPU, more than an H100 holds.
ACTIVATION_CHECKPOINTING_BY_DEFAULT = frozenset({"1b", "8b"})
#: The fields of a shape, each settable as model.<field> over the preset.
SHAPE_FIELDS = tuple(field.name for field in dataclasses.fields(ModelShape))
#: Upper bounds far beyond any published Llama (3.1 405B: dim 16384, ffn_dim 53248, 126 layers,
#: context 131072) that keep a mistyped or hostile value out of the arithmetic: the memory
#: estimate stays a finite float, "auto" checkpointing searches at most MAX_LAYERS blocks, and
#: the RoPE tables (max_seq_len x head_dim / 2 x 8 bytes) stay below a GiB at head_dim 128.
#: vocab_size: uint32 token ids (workloads.shards) address 2^32 tokens.
MAX_VOCAB = 1 << 32
MAX_DIM = 1 << 18
MAX_FFN_DIM = 1 << 20
MAX_LAYERS = 1024
MAX_SEQ_LEN = 1 << 20


class RopeScalingConfig(BaseModel):
    """Llama 3.x's RoPE frequency scaling, as its config.json states it (rope_type llama3; Llama
    3.1 8B: factor 8, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192)."""

    model_config = ConfigDict(extra="forbid")

    factor: float = Field(gt=0)
    low_freq_factor: float = Field(gt=0)
    high_freq_factor: float = Field(gt=0)
    original_max_position_embeddings: int = Field(ge=1)

    @model_validator(mode="after")
    def _bands_ordered(self) -> RopeScalingConfig:
        if not self.high_freq_factor > self.low_freq_factor:
            raise ValueError("model.rope_scaling.high_freq_factor: must exceed model.rope_scaling.low_freq_factor")
        return self


def _divisors_near(n: int, near: int, *, even_quotient: bool = False) -> str:
    """The divisors of n nearest below and above `near` (with `even_quotient`, those leaving an
    even n / d: a head size RoPE can rotate), as a fix names them."""
    divisors = [d for d in range(1, min(n, 1 << 16) + 1) if n % d == 0 and not (even_quotient and n // d % 2)]
    below = [d for d in divisors if d < near][-1:]
    above = [d for d in divisors if d > near][:1]
    return " or ".join(str(d) for d in below + above)


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    preset: Literal["tiny", "small", "1b", "8b"] = "tiny"
    shape_from: str | None = Field(
        default=None,
        description="a Hugging Face Llama config.json (or a directory holding one) whose shape the model takes "
        "over the preset's; read where the config is loaded and replaced by the fields below (fields set beside "
        "it win)",
    )
    vocab_size: int | None = Field(default=None, ge=2, le=MAX_VOCAB, description="default: the preset's")
    dim: int | None = Field(default=None, ge=2, le=MAX_DIM, description="hidden size; default: the preset's")
    n_layers: int | None = Field(default=None, ge=1, le=MAX_LAYERS, description="blocks; default: the preset's")
    n_heads: int | None = Field(default=None, ge=1, description="query heads, dividing dim; default: the preset's")
    n_kv_heads: int | None = Field(
        default=None, ge=1, description="key/value heads, dividing n_heads (GQA); default: the preset's"
    )
    ffn_dim: int | None = Field(default=None, ge=1, le=MAX_FFN_DIM, description="SwiGLU width; default: the preset's")
    max_seq_len: int | None = Field(
        default=None, ge=2, le=MAX_SEQ_LEN, description="longest data.seq_len; default: the preset's"
    )
    rope_theta: float | None = Field(default=None, gt=0, allow_inf_nan=False, description="default: the preset's")
    norm_eps: float | None = Field(default=None, gt=0, lt=1, description="RMSNorm epsilon; default: the preset's")
    dropout: float | None = Field(default=None, ge=0, lt=1, description="residual dropout; default: the preset's")
    rope_scaling: RopeScalingConfig | None = Field(
        default=None, description="Llama 3.x RoPE scaling (workloads.model); default: none, plain RoPE"
    )
    init_from: str | None = Field(
        default=None,
        description="a Hugging Face Llama checkpoint directory (config.json + safetensors) to start from "
        "instead of a random initialization; a committed checkpoint of the run still wins",
    )
    activation_checkpointing: bool | Literal["auto"] | None = Field(
        default=None,
        description="recompute blocks in backward: true (model.checkpoint_blocks of them, default all), false, or "
        "auto (the fewest whose memory estimate fits the GPU at the job's world size, workloads.memory); "
        "default: true for the 1b and 8b presets",
    )
    checkpoint_blocks: int | None = Field(
        default=None,
        ge=0,
        description="how many of the model's blocks recompute in backward, spread evenly over the depth "
        "(half: every other block); turns activation_checkpointing on, refused with false or auto; default: all",
    )
    loss_chunk_tokens: int = Field(
        default=2048,
        ge=1,
        description="tokens per chunk of the output projection + cross-entropy; each chunk's "
        "logits are recomputed in backward, so only one chunk's exist at a time",
    )

    @model_validator(mode="before")
    @classmethod
    def _shape_from_file(cls, data: Any) -> Any:
        """model.shape_from replaced by the fields its config.json gives (see the module docstring)."""
        if not isinstance(data, dict) or data.get("shape_from") is None:
            return data
        from workloads.hf_files import Unreadable
        from workloads.hf_format import llama_shape, read_config

        given = data["shape_from"]
        try:
            fields, scaling = llama_shape(read_config(given))
        except Unreadable as err:
            raise ValueError(
                f"model.shape_from: {given}: {err}; give a Hugging Face Llama config.json or the directory holding it"
            ) from None
        explicit = {key: value for key, value in data.items() if key != "shape_from"}
        return {**fields, "rope_scaling": scaling, **explicit}

    @field_validator("checkpoint_blocks")
    @classmethod
    def _blocks_with_checkpointing_on(cls, blocks: int | None, info: ValidationInfo) -> int | None:
        setting = info.data.get("activation_checkpointing")
        if blocks is not None and (setting is False or setting == "auto"):
            raise ValueError(
                f"counts the recomputed blocks only with model.activation_checkpointing=true (now {setting}); "
                "remove it, or set that to true"
            )
        return blocks

    @model_validator(mode="after")
    def _a_shape_the_model_can_take(self) -> ModelConfig:
        shape, problems = self.shape, []

        def heads_that_fit() -> str:
            return _divisors_near(shape.dim, shape.n_heads, even_quotient=True) or "another model.dim"

        if shape.dim % shape.n_heads:
            problems.append(
                f"model.n_heads: {shape.n_heads} does not divide model.dim ({shape.dim}), so the heads cannot "
                f"split it; use model.n_heads {heads_that_fit()}"
            )
        elif (shape.dim // shape.n_heads) % 2:
            problems.append(
                f"model.n_heads: {shape.dim} / {shape.n_heads} heads is {shape.dim // shape.n_heads} dimensions "
                "per head, an odd number, and RoPE rotates pairs of a head's dimensions; use model.n_heads "
                f"{heads_that_fit()}"
            )
        if shape.n_heads % shape.n_kv_heads:
            problems.append(
                f"model.n_kv_heads: {shape.n_kv_heads} does not divide model.n_heads ({shape.n_heads}); each "
                "key/value head serves a whole group of query heads: use "
                f"{_divisors_near(shape.n_heads, shape.n_kv_heads)}"
            )
        if self.checkpoint_blocks is not None and self.checkpoint_blocks > shape.n_layers:
            problems.append(
                f"model.checkpoint_blocks: {self.checkpoint_blocks} exceeds the {shape.n_layers} blocks of "
                f"{self.noun}; give at most {shape.n_layers}"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @model_serializer(mode="wrap")
    def _without_unset_shape(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A shape field left to the preset (None) is not written: a dumped config names only what
        # differs from the preset, and a preset's config dumps as it did before the fields existed.
        data = handler(self)
        for key in (*SHAPE_FIELDS, "shape_from"):
            if data.get(key) is None:
                data.pop(key, None)
        return data

    # ----- derived values -------------------------------------------------------------------

    @property
    def shape(self) -> ModelShape:
        """The preset's shape with the fields set here over it."""
        return dataclasses.replace(
            MODEL_PRESETS[self.preset],
            **{field: getattr(self, field) for field in SHAPE_FIELDS if getattr(self, field) is not None},
        )

    @property
    def shape_changes(self) -> dict[str, Any]:
        """The shape fields that differ from the preset's: with the preset, what a checkpoint records
        of the model (nvrx_eks.facts.checkpoint_layout.run_identity) and an export writes back."""
        preset = MODEL_PRESETS[self.preset]
        return {
            field: value
            for field in SHAPE_FIELDS
            if (value := getattr(self, field)) is not None and value != getattr(preset, field)
        }

    @property
    def name(self) -> str:
        """The model as the job summary, the plan and the memory check name it: the preset, with
        the fields that differ from it ("8b with vocab_size=32000, n_layers=40")."""
        changes = self.shape_changes
        if not changes:
            return self.preset
        shown = (
            f"{field}={value:g}" if isinstance(value, float) else f"{field}={value}" for field, value in changes.items()
        )
        return f"{self.preset} with " + ", ".join(shown)

    @property
    def noun(self) -> str:
        """The model as a sentence names it: "the tiny preset", or "the model (8b with ...)"."""
        return f"the {self.preset} preset" if not self.shape_changes else f"the model ({self.name})"

    @property
    def rope_scaling_settings(self) -> dict[str, Any] | None:
        """model.rope_scaling as the mapping the model and a config.json take, or None."""
        return self.rope_scaling.model_dump() if self.rope_scaling is not None else None

    @property
    def checkpointed_blocks(self) -> int | Literal["auto"]:
        """How many blocks recompute in backward, or "auto": workloads.memory chooses the count for
        the GPU and the world size (workloads.memory.resolve_checkpointed_blocks)."""
        setting = self.activation_checkpointing
        if setting is None:
            setting = self.preset in ACTIVATION_CHECKPOINTING_BY_DEFAULT or self.checkpoint_blocks is not None
        if setting == "auto":
            return "auto"
        if not setting:
            return 0
        return self.shape.n_layers if self.checkpoint_blocks is None else self.checkpoint_blocks
