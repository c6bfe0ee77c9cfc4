"""`nvrx-eks export RUN --format hf --out DIR`: a committed checkpoint of a run as a Hugging Face
Llama checkpoint (safetensors weights, config.json, and tokenizer files AutoTokenizer loads).

On a CPU, without the job's GPUs, and streaming: DCP's metadata gives every tensor's full shape
and dtype up front, so each safetensors header is written first and the tensors follow one at a
time, each read from the rank shards holding its pieces (a DCP load of that one key) and converted
to Hugging Face's layout (workloads.hf_format). Memory is bounded by the largest tensor (a few
copies of it: the read pieces, the assembled tensor, its converted form), not by the model.

The checkpoint is untrusted input, read as nvrx_eks.ops.checkpoint_read reads it (every file
checked against the commit record, restricted loaders). The output appears under DIR only once
complete: it is written beside DIR and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nvrx_eks.data.prepare import BYTE_TOKENIZER, END_OF_DOCUMENT_TOKENS
from nvrx_eks.facts import checkpoint_layout as layout
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.ops.checkpoint_read import (
    RUN_CONFIG_FILE,
    OneMetadataReader,
    RunCheckpoints,
    committed_step,
    find_run,
    model_tensors,
    read_tensor,
    recorded_model,
    verified_commit,
)
from workloads.hf_format import (
    CONFIG_FILE,
    SAFETENSORS_DTYPES,
    WEIGHTS_INDEX_FILE,
    PlannedTensor,
    file_names,
    header_bytes,
    hf_config,
    hf_name,
    index_json,
    parameter_shapes,
    plan_files,
    to_hf,
)
from workloads.presets import ModelShape

#: Hugging Face's own default shard size for save_pretrained: files of at most 5 GB.
DEFAULT_MAX_FILE_BYTES = 5 * 10**9


@dataclass(frozen=True)
class Exported:
    out: Path
    step: int
    checkpoint: Path
    files: list[str]
    nbytes: int
    tokenizer: str
    notes: list[str]


def _write_weights(
    path: Path,
    tensors: list[PlannedTensor],
    reader: OneMetadataReader,
    shape: ModelShape,
    dtypes: dict[str, torch.dtype],
    dtype: torch.dtype,
) -> None:
    """One safetensors file: its header, then each tensor read, converted, written and dropped."""
    our_names = {hf_name(name): name for name in dtypes}
    with path.open("wb") as f:
        f.write(header_bytes(tensors))
        for planned in tensors:
            name = our_names[planned.name]
            converted = to_hf(name, read_tensor(reader, name, planned.shape, dtypes[name]), shape).to(dtype)
            f.write(converted.contiguous().reshape(-1).view(torch.uint8).numpy().data)
            del converted  # before the next tensor is read: one at a time


# ----- tokenizer files -----------------------------------------------------------------------------


def _byte_symbols() -> list[str]:
    """The character GPT-2's byte-level pre-tokenizer writes for each byte value (bytes_to_unicode):
    printable Latin-1 bytes stand for themselves, the others take code points from 256 on."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    symbols, extra = [], 0
    for value in range(256):
        if value in printable:
            symbols.append(chr(value))
        else:
            symbols.append(chr(256 + extra))
            extra += 1
    return symbols


def _write_byte_tokenizer(out: Path) -> None:
    """The byte tokenizer of `data prepare` as a tokenizer.json: byte-level pre-tokenization, and
    a vocabulary in which each byte's symbol has the byte's value as its id (no merges), so the
    ids are the UTF-8 bytes exactly as the shards hold them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {symbol: value for value, symbol in enumerate(_byte_symbols())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(out / "tokenizer.json"))


def _write_tokenizer(spec: str, out: Path, shape: ModelShape) -> None:
    """tokenizer.json and tokenizer_config.json (PreTrainedTokenizerFast) for `spec`."""
    from tokenizers import Tokenizer

    if spec == BYTE_TOKENIZER:
        _write_byte_tokenizer(out)
    else:
        if not Path(spec).is_file():
            raise ConfigError(f"--tokenizer: {spec} is not a file; give the run's tokenizer.json or {BYTE_TOKENIZER}")
        shutil.copyfile(spec, out / "tokenizer.json")
    try:
        tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    except Exception as err:  # noqa: BLE001 - the library raises plain Exceptions for bad files
        raise ConfigError(
            f"--tokenizer: {spec} is not a tokenizer.json the tokenizers library can load ({err})"
        ) from None
    if tok.get_vocab_size(with_added_tokens=True) > shape.vocab_size:
        raise ConfigError(
            f"--tokenizer: {spec} has {tok.get_vocab_size(with_added_tokens=True)} tokens, more than the model's "
            f"vocabulary ({shape.vocab_size}); give the tokenizer the run's data was prepared with"
        )
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": shape.max_seq_len,
        "clean_up_tokenization_spaces": False,
    }
    vocab = tok.get_vocab(with_added_tokens=True)
    eos = next((token for token in END_OF_DOCUMENT_TOKENS if token in vocab), None)
    if eos is not None:
        config["eos_token"] = eos
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def _run_tokenizer(run: RunCheckpoints, notes: list[str]) -> str:
    """The tokenizer the run's data was prepared with (its manifest), else the byte tokenizer."""
    from workloads.shards import read_manifest

    data = run.config.data if run.config is not None else None
    if data is not None and data.source == "memmap" and data.path and Path(data.path).is_dir():
        manifest = read_manifest(Path(data.path))
        if manifest is not None:
            return str(manifest["tokenizer"])
    notes.append(f"the run's data names no tokenizer: wrote the {BYTE_TOKENIZER} tokenizer (choose with --tokenizer)")
    return BYTE_TOKENIZER


# ----- the export --------------------------------------------------------------------------------


def export_hf(
    run: Path,
    out: Path,
    *,
    step: int | None = None,
    tokenizer: str | None = None,
    dtype: str = "float32",
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> Exported:
    """Write the committed checkpoint of `run` (its newest, or that of `step`) to `out`."""
    if dtype not in SAFETENSORS_DTYPES:
        raise ConfigError(f"--dtype {dtype}: use one of {', '.join(SAFETENSORS_DTYPES)}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} exists and is not an empty directory; give a new or empty one")
    found = find_run(run)
    path = committed_step(found.checkpoint_dir, step)
    model = recorded_model(path, verified_commit(path))
    shape = model.shape
    notes: list[str] = []
    rope_scaling = found.config.model.rope_scaling_settings if found.config is not None else None
    if found.config is None:
        notes.append(f"no {RUN_CONFIG_FILE} beside the checkpoints: config.json states no RoPE scaling")
    reader = OneMetadataReader(str(path))
    dtypes = model_tensors(reader.read_metadata(), shape, model.noun, path)
    planned = [
        PlannedTensor(hf_name(n), SAFETENSORS_DTYPES[dtype], size) for n, size in parameter_shapes(shape).items()
    ]
    groups = plan_files(planned, max_file_bytes)
    names = file_names(len(groups))
    spec = tokenizer if tokenizer is not None else _run_tokenizer(found, notes)

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)  # ours: a name with this process's id
    partial.mkdir()
    try:
        _write_tokenizer(spec, partial, shape)
        for group, name in zip(groups, names, strict=True):
            _write_weights(partial / name, group, reader, shape, dtypes, getattr(torch, dtype))
        if len(groups) > 1:
            (partial / WEIGHTS_INDEX_FILE).write_text(json.dumps(index_json(groups, names), indent=1))
        (partial / CONFIG_FILE).write_text(json.dumps(hf_config(shape, rope_scaling, dtype), indent=1))
        if out.exists():
            out.rmdir()  # checked empty above
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return Exported(
        out=out,
        step=layout.step_of(path.name),
        checkpoint=path,
        files=names,
        nbytes=sum(t.nbytes for t in planned),
        tokenizer=spec,
        notes=notes,
    )
