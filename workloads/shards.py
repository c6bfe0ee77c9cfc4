"""Token shards on disk: the format `nvrx-eks data prepare` writes and the trainer reads. No torch.

A shard set is a directory of flat token arrays (`shard-NNNNN.bin`, native little-endian
uint16 or uint32, no header: what workloads.data's memmap source maps) and `manifest.json`:

    format        MANIFEST_FORMAT
    tokenizer     "byte" or the tokenizer.json path it was prepared with
    tokenizer_sha256  digest of that tokenizer.json (null for byte)
    vocab_size    ids are < vocab_size
    dtype         "uint16" (vocab_size <= 65536) or "uint32"
    shard_tokens  tokens per shard (the last one may hold fewer)
    text_field    the JSONL field read
    sources       [{path, bytes}] the inputs, in the order they were read
    shards        [{file, tokens, sha256}] completed shards, in order
    resume        {source, document, offset}: where the next shard starts in the inputs
    complete      true once every input was read and the last shard written
    total_tokens  sum of the shards' tokens

The manifest is rewritten (atomically) after every shard, which is what makes preparation
resumable. The trainer checks it against the model at start-up (vocabulary, dtype, every
shard's size: cheap) and the preflight also hashes the shards up to PREFLIGHT_HASH_BYTES.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from nvrx_eks.facts.errors import ConfigError, validation_issues
from workloads.config import DataConfig

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
SHARD_PATTERN = "shard-{index:05d}.bin"
#: The preflight hashes shards in order until this many bytes were read (at ~1 GB/s from FSx,
#: about 30 s); the rest are checked by size only, and the preflight says how many.
PREFLIGHT_HASH_BYTES = 32 << 30
#: Bytes per token of each shard dtype.
DTYPE_BYTES = {"uint16": 2, "uint32": 4}


def dtype_for_vocab(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def shard_name(index: int) -> str:
    return SHARD_PATTERN.format(index=index)


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Shard(_Strict):
    file: str = Field(pattern=r"^[^/\\]+$")
    tokens: int = Field(ge=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("file")
    @classmethod
    def _in_the_directory(cls, name: str) -> str:
        if name in (".", ".."):
            raise ValueError("must name a file in the shard directory")
        return name


class _Position(_Strict):
    source: int = Field(ge=0)
    unit: int = Field(ge=0)
    offset: int = Field(ge=0)


class _Split(_Strict):
    shards: list[_Shard]
    total_tokens: int = Field(ge=0)
    resume: _Position


class _Manifest(_Split):
    """What the trainer and a resumed `data prepare` read of a manifest, checked before either
    uses it; its other keys (the settings prepare compares) are prepare's own."""

    model_config = ConfigDict(extra="allow", strict=True)
    format: Literal[1]
    tokenizer: str
    tokenizer_sha256: str | None
    vocab_size: int = Field(ge=1, le=1 << 32)
    dtype: Literal["uint16", "uint32"]
    complete: bool
    eval: _Split | None = None


#: Far above a manifest's size (~150 bytes a shard: 100,000 shards of 64 Mi tokens are ~15 MB).
MAX_MANIFEST_BYTES = 64 << 20


def read_manifest(root: Path) -> dict[str, Any] | None:
    """The manifest of a shard directory, None if it has none (hand-made shards); ConfigError
    naming data.path when it cannot be read or is not one `nvrx-eks data prepare` writes."""
    path = root / MANIFEST_NAME
    if not path.is_file():
        return None
    redo = "re-run `nvrx-eks data prepare` into this directory"
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise ConfigError(f"data.path: {path} is larger than a manifest ({MAX_MANIFEST_BYTES:,} bytes); {redo}")
        manifest = json.loads(path.read_text())
    except RecursionError:
        raise ConfigError(f"data.path: {path} nests JSON deeper than a manifest; {redo}") from None
    except (OSError, ValueError) as err:  # unreadable, not UTF-8, not JSON, an integer past the digit limit
        raise ConfigError(f"data.path: {path} is not a readable manifest ({err}); {redo}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ConfigError(
            f"data.path: {path} is not a format-{MANIFEST_FORMAT} shard manifest; re-run `nvrx-eks data prepare`"
        )
    try:
        _Manifest.model_validate(manifest)
    except ValidationError as err:
        (field, problem), *_ = validation_issues(err)
        raise ConfigError(
            f"data.path: {path} is not a manifest `nvrx-eks data prepare` wrote ({'.'.join(field)}: {problem}); {redo}"
        ) from None
    return manifest


def write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    tmp = root / f".{MANIFEST_NAME}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, root / MANIFEST_NAME)


def check_shard_set(
    root: Path, manifest: dict[str, Any], *, vocab_size: int, dtype: str, hash_bytes: int = 0
) -> tuple[list[Path], int]:
    """Refuse a shard set the model cannot train on, naming the field or file at fault.

    Checks the manifest against the model (vocab_size, dtype), that preparation finished, and
    every shard's size against its token count; hashes shards in order while the bytes hashed
    stay within `hash_bytes`. Returns the shard paths and how many were hashed."""
    where = root / MANIFEST_NAME
    if not manifest.get("complete"):
        raise ConfigError(
            f"data.path: {where} says preparation did not finish; re-run the same "
            "`nvrx-eks data prepare` command to complete it"
        )
    if int(manifest["vocab_size"]) > vocab_size:
        raise ConfigError(
            f"data.path: {where} has vocab_size {manifest['vocab_size']} "
            f"(tokenizer {manifest.get('tokenizer')}) but the model's vocabulary is "
            f"{vocab_size}; set model.vocab_size to at least {manifest['vocab_size']} (or a model.preset whose "
            "vocabulary covers it), or prepare the data with the model's tokenizer"
        )
    if manifest["dtype"] != dtype:
        raise ConfigError(
            f"data.dtype: {dtype} but {where} says the shards are "
            f"{manifest['dtype']}; set data.dtype={manifest['dtype']}"
        )
    paths, hashed, hashed_bytes = [], 0, 0
    itemsize = DTYPE_BYTES[dtype]
    for shard in manifest["shards"]:
        path = root / shard["file"]
        expected = int(shard["tokens"]) * itemsize
        size = path.stat().st_size if path.is_file() else None
        if size != expected:
            found = "is missing" if size is None else f"has {size} bytes"
            raise ConfigError(
                f"data.path: shard {path} {found}; the manifest says {shard['tokens']} "
                f"{dtype} tokens ({expected} bytes): it is truncated or corrupt, "
                "prepare or copy it again"
            )
        if hashed_bytes + expected <= hash_bytes:
            if file_sha256(path) != shard["sha256"]:
                raise ConfigError(
                    f"data.path: shard {path} does not match its sha256 in "
                    f"{where}: it is corrupt, prepare or copy it again"
                )
            hashed, hashed_bytes = hashed + 1, hashed_bytes + expected
        paths.append(path)
    return paths, hashed


def shard_files(cfg: DataConfig, vocab_size: int, hash_bytes: int = 0) -> tuple[list[Path], str]:
    """The shards of data.path and their dtype. A directory with a manifest (`nvrx-eks data
    prepare`) is checked against the model first (workloads.shards.check_shard_set: vocabulary,
    dtype, each shard's size; sha256 within `hash_bytes`); without one, every `*.bin` is read
    as data.dtype (uint16 unless set)."""
    root = Path(cfg.path or "")
    manifest = read_manifest(root) if root.is_dir() else None
    if manifest is not None:
        dtype = cfg.dtype or manifest["dtype"]
        files, _ = check_shard_set(root, manifest, vocab_size=vocab_size, dtype=dtype, hash_bytes=hash_bytes)
        return files, dtype
    files = sorted(root.glob("*.bin")) if root.is_dir() else [root] if root.is_file() else []
    if not files:
        raise ConfigError(
            f"data.path: no .bin token shards at {root}; point it at a "
            "directory of pre-tokenized shards (`nvrx-eks data prepare`)"
        )
    dtype = cfg.dtype or "uint16"
    for path in files:
        # What np.memmap refuses in every rank (an empty file, a partial token): found here, once.
        size = path.stat().st_size
        if size == 0 or size % DTYPE_BYTES[dtype]:
            raise ConfigError(
                f"data.path: shard {path} has {size} bytes, not a whole number of {dtype} tokens (at least "
                "one); remove it, or set data.dtype to the shards' dtype"
            )
    return files, dtype
