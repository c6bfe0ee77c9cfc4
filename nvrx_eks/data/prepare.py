"""`nvrx-eks data prepare`: text in, the trainer's token shards out (format: workloads.shards).

Inputs are read in the order given, streaming: plain text line by line, JSONL record by record
(the text in `text_field`), each optionally gzip (.gz) or Zstandard (.zst) compressed. Tokens
collect in one shard-sized buffer, and the tokenizer is given at most PIECE_CHARS characters at
once: a longer line is read and tokenized in pieces. So memory is bounded by a shard whatever the
corpus size or the length of a line (a JSONL record, parsed whole, may hold MAX_RECORD_CHARS).

Pieces of a long line: each is cut before a space or tab that follows a word, where the
pre-tokenizers of byte-level BPE tokenizers (GPT-2, Llama 3, ...) start a new pre-token anyway,
so the tokens are the whole line's. A seam is otherwise like a line break: a tokenizer that marks
the start of its input (SentencePiece's prepended "▁") marks each piece, as it marks each line.
A piece of PIECE_CHARS characters without such a space (no natural text) is cut at that length,
where a BPE tokenizer's tokens may differ from the whole line's. The byte tokenizer's never do.

Units and documents: a plain-text line (with its newline) or a JSONL record is one unit; a JSONL
record is followed by the tokenizer's end-of-document token. The position in the inputs is
(source, unit, token offset within the unit); the manifest records it after every completed
shard, so a rerun of the same command re-reads the inputs up to that position without
tokenizing them and continues, producing exactly the shards an uninterrupted run would have.

Held-out split (`eval_fraction`): each unit goes whole to the training shards or to the held-out
ones (`eval-NNNNN.bin`, listed under the manifest's `eval`), decided by a hash of its position in
the inputs, so a document never straddles the two and a rerun splits the same way. Each split
has its own buffer and its own resume position; a rerun re-reads from the older of the two.

Tokenizers (no download anywhere):
* `byte`: the UTF-8 bytes, vocabulary 256, no special tokens: a JSONL record ends with a
  newline (byte 10). It fits every preset, including `tiny` (vocabulary 256).
* a path to a Hugging Face `tokenizer.json`, loaded with the `tokenizers` library; the end of a
  JSONL record is the first of END_OF_DOCUMENT_TOKENS the vocabulary has (none if it has none).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import sys
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import numpy as np

from nvrx_eks.facts.errors import ConfigError
from workloads.shards import (
    MANIFEST_FORMAT,
    dtype_for_vocab,
    file_sha256,
    read_manifest,
    shard_name,
    write_manifest,
)

BYTE_TOKENIZER = "byte"
BYTE_VOCAB_SIZE = 256
BYTE_END_OF_DOCUMENT = ord("\n")
#: End-of-document tokens of common tokenizer.json files (GPT-2/NeoX, Llama 2, Llama 3, Gemma).
END_OF_DOCUMENT_TOKENS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
#: 64 Mi tokens: 128 MiB shards in uint16, 256 MiB in uint32.
DEFAULT_SHARD_TOKENS = 1 << 26
#: The most characters (besides a line break) the tokenizer is given at once: a longer line is
#: read and tokenized in pieces (_seam says where they are cut), so that memory stays bounded by
#: a shard's buffer whatever a line's length. A piece's token ids take ~8 bytes each.
PIECE_CHARS = 1 << 20
#: The longest JSONL record read: a record is parsed whole, so this bounds its memory (its line
#: and its text, 1 to 4 bytes a character each). Far above any document of a training corpus.
MAX_RECORD_CHARS = 1 << 25
#: Settings that must match between a run and its resumption (manifest key -> CLI flag).
_RESUME_KEYS = {
    "tokenizer": "--tokenizer",
    "tokenizer_sha256": "--tokenizer",
    "shard_tokens": "--shard-tokens",
    "text_field": "--text-field",
    "sources": "INPUT",
    "eval_fraction": "--eval-fraction",
}
#: Held-out shards, beside the training shards (workloads.shards.shard_name).
EVAL_SHARD_PATTERN = "eval-{index:05d}.bin"


@dataclass(frozen=True)
class Tokenizer:
    name: str
    sha256: str | None
    vocab_size: int
    end_of_document: int | None
    encode: Callable[[str], list[int]]


def load_tokenizer(spec: str) -> Tokenizer:
    if spec == BYTE_TOKENIZER:
        return Tokenizer(
            BYTE_TOKENIZER, None, BYTE_VOCAB_SIZE, BYTE_END_OF_DOCUMENT, lambda text: list(text.encode("utf-8"))
        )
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(
            f"--tokenizer: {spec} is not a file; give the path of a Hugging Face tokenizer.json or '{BYTE_TOKENIZER}'"
        )
    from tokenizers import Tokenizer as HfTokenizer

    try:
        tok = HfTokenizer.from_file(str(path))
    except Exception as err:  # noqa: BLE001 - the library raises plain Exceptions for bad files
        raise ConfigError(
            f"--tokenizer: {spec} is not a tokenizer.json the tokenizers library "
            f"can load ({err}); give the tokenizer.json of your model"
        ) from None
    vocab = tok.get_vocab(with_added_tokens=True)
    eod = next((vocab[t] for t in END_OF_DOCUMENT_TOKENS if t in vocab), None)
    return Tokenizer(
        str(path.resolve()),
        file_sha256(path),
        tok.get_vocab_size(with_added_tokens=True),
        eod,
        lambda text: tok.encode(text, add_special_tokens=False).ids,
    )


def _open_text(path: Path) -> tuple[IO[bytes], IO[str], tuple[type[Exception], ...]]:
    """(raw file, text stream, what reading the stream raises when the compressed data is
    damaged): the raw file's position is the progress through the input."""
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    corrupt: tuple[type[Exception], ...] = ()
    if path.suffix == ".gz":
        # A binary stream that typeshed does not declare as IO[bytes].
        stream: IO[bytes] = cast(IO[bytes], gzip.GzipFile(fileobj=raw))
        # Not gzip at all (BadGzipFile), damaged deflate data (zlib.error), cut short (EOFError).
        corrupt = (gzip.BadGzipFile, zlib.error, EOFError)
    elif path.suffix == ".zst":
        import zstandard

        stream = zstandard.ZstdDecompressor().stream_reader(raw)
        corrupt = (zstandard.ZstdError,)
    else:
        stream = raw
    return raw, io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline=""), corrupt


def _is_jsonl(path: Path) -> bool:
    stem = path.with_suffix("") if path.suffix in (".gz", ".zst") else path
    return stem.suffix in (".jsonl", ".json", ".ndjson")


def _line_chunks(read_line: Callable[[int], str], limit: int) -> Iterator[tuple[str, bool]]:
    """(chunk, ends_line) through a text stream: its lines in chunks of at most `limit`
    characters and a line break (`read_line` is TextIOWrapper.readline, which stops at the
    limit), so that no line is ever held whole. Line breaks are universal newlines (LF, CRLF, CR)."""
    chunk = read_line(limit)
    while chunk:
        following = read_line(limit)
        if following == "\n" and chunk.endswith("\r"):
            # The limit fell between the CR and the LF of one CRLF.
            chunk, following = chunk + following, read_line(limit)
        yield chunk, chunk.endswith(("\n", "\r")) or not following
        chunk = following


#: Where a piece of a long line may end: before a run of spaces or tabs that follows a character
#: that is not one. The pre-tokenizers of byte-level BPE tokenizers (GPT-2, Llama 3, ...) start a
#: pre-token there and never merge across it, so their tokens of the pieces are the whole line's.
_SEAM = re.compile(r"(?<=\S)[^\S\r\n]")


def _body_length(text: str) -> int:
    """len(text) without the line break it ends with, if any."""
    return len(text) - (2 if text.endswith("\r\n") else 1 if text.endswith(("\n", "\r")) else 0)


def _seam(text: str, start: int, limit: int) -> int:
    """Where the piece of `text` that starts at `start` ends, the rest being longer than `limit`:
    before the last _SEAM in the second half of its `limit` characters, else after exactly
    `limit` characters (a word that long has no honest place to cut: the tokens of a BPE
    tokenizer may then differ at the seam from the whole line's; the byte tokenizer's never do)."""
    last = deque(_SEAM.finditer(text, start + limit // 2 + 1, start + limit + 1), maxlen=1)
    return last[0].start() if last else start + limit


def _pieces(chunks: Iterable[tuple[str, bool]], limit: int) -> Iterator[tuple[str, bool]]:
    """(piece, ends_line): each line of `chunks` in pieces of at most `limit` characters and
    its line break, cut where _seam says. A line that short is one piece, itself."""
    carry = ""
    for chunk, ends_line in chunks:
        carry += chunk  # at most 2 * limit + 2 characters: one piece and one chunk
        start = 0
        while _body_length(carry) - start > limit:
            cut = _seam(carry, start, limit)
            yield carry[start:cut], False
            start = cut
        carry = carry[start:]
        if ends_line:
            yield carry, True
            carry = ""


def _records(chunks: Iterable[tuple[str, bool]], path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of a JSONL input, each line whole: ConfigError for one longer than
    MAX_RECORD_CHARS, found after reading that many characters of it."""
    number, parts, size = 1, [], 0
    for chunk, ends_line in chunks:
        size += len(chunk)
        if size > MAX_RECORD_CHARS:
            raise ConfigError(
                f"INPUT: {path}:{number} is a JSONL record longer than {MAX_RECORD_CHARS:,} characters, "
                "which is parsed whole; split the document into several records, or give its text as "
                "a plain-text file (read in pieces, whatever a line's length)"
            )
        parts.append(chunk)
        if ends_line:
            yield number, "".join(parts)
            number, parts, size = number + 1, [], 0


#: Lone UTF-16 surrogates, which JSON's \ud800 escapes can write and UTF-8 cannot encode.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _record_text(line: str, path: Path, number: int, text_field: str) -> str:
    """The text of one JSONL record, its lone surrogates replaced by U+FFFD as undecodable bytes
    of a text file are; ConfigError naming the line for anything else."""
    problem = None
    try:
        record = json.loads(line)
    except RecursionError:
        problem = "it nests arrays or objects deeper than Python can parse"
    except json.JSONDecodeError as err:
        problem = err.msg
    except ValueError:  # the only other: an integer past Python's digit limit
        problem = f"it holds an integer longer than {sys.get_int_max_str_digits()} digits"
    if problem is not None:
        raise ConfigError(
            f"INPUT: {path}:{number} is not a JSON object Python can read ({problem}); give "
            "JSONL, one object per line, or a plain-text file"
        )
    value = record.get(text_field) if isinstance(record, dict) else None
    if not isinstance(value, str):
        raise ConfigError(
            f"--text-field: {path}:{number} has no string field '{text_field}'; name the field that holds the text"
        )
    return _SURROGATE.sub("\ufffd", value)


def _units(path: Path, text_field: str, on_bytes: Callable[[int], None]) -> Iterator[tuple[int, str, bool]]:
    """(unit, piece, ends_document) through one input: each unit's pieces in order, at most
    PIECE_CHARS characters each (and a line break), with the unit's number. A plain-text line is
    read and yielded piece by piece, whatever its length; a JSONL record is parsed whole (at most
    MAX_RECORD_CHARS), and its last piece ends the document."""
    raw, text, corrupt = _open_text(path)
    with raw, text:
        chunks = _line_chunks(text.readline, PIECE_CHARS)
        units = _jsonl_units(chunks, path, text_field) if _is_jsonl(path) else _text_units(chunks)
        last = 0
        while True:
            # Only decompression errors are caught here: a mistake in the text has its own message.
            try:
                unit = next(units)
            except StopIteration:
                return
            except corrupt as err:
                raise ConfigError(
                    f"INPUT: {path} is not a readable {path.suffix} file ({err}); give the intact "
                    "compressed file, or the text uncompressed"
                ) from None
            if raw.tell() != last:
                on_bytes(raw.tell() - last)
                last = raw.tell()
            yield unit


def _text_units(chunks: Iterable[tuple[str, bool]]) -> Iterator[tuple[int, str, bool]]:
    """A plain-text input's units: one per line, with its line break."""
    unit = 0
    for piece, ends_line in _pieces(chunks, PIECE_CHARS):
        yield unit, piece, False
        unit += ends_line


def _jsonl_units(chunks: Iterable[tuple[str, bool]], path: Path, text_field: str) -> Iterator[tuple[int, str, bool]]:
    """A JSONL input's units: one per record (blank lines are none), its text field's text."""
    unit = 0
    for number, line in _records(chunks, path):
        if not line.strip():
            continue
        for piece, ends in _pieces([(_record_text(line, path, number, text_field), True)], PIECE_CHARS):
            yield unit, piece, ends
        unit += 1


def eval_shard_name(index: int) -> str:
    return EVAL_SHARD_PATTERN.format(index=index)


def held_out(source: int, unit: int, fraction: float) -> bool:
    """Whether unit `unit` of input `source` belongs to the held-out split: a fixed hash of its
    position, uniform in [0, 1), below `fraction`."""
    digest = hashlib.sha256(f"{source}:{unit}".encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64 < fraction


class _ShardWriter:
    """One split's shards: `split` is the part of the manifest that lists them (the manifest
    itself for training, its `eval` for the held-out split) with their tokens and resume point."""

    def __init__(
        self,
        out: Path,
        manifest: dict[str, Any],
        split: dict[str, Any],
        name: Callable[[int], str],
        on_shard: Callable[[dict], None],
    ):
        self.out, self.manifest, self.split, self.name, self.on_shard = out, manifest, split, name, on_shard
        self.buffer = np.empty(manifest["shard_tokens"], dtype=manifest["dtype"])
        self.fill = 0

    @property
    def resume(self) -> tuple[int, int, int]:
        at = self.split["resume"]
        return at["source"], at["unit"], at["offset"]

    def add(self, ids: list[int], start: int, source: int, unit: int, unit_offset: int) -> None:
        """ids[start:], tokens of unit `unit` of input `source` whose first is the unit's token
        `unit_offset`: into the buffer, flushing each full shard with where the next one starts."""
        offset = start
        while offset < len(ids):
            take = min(len(ids) - offset, len(self.buffer) - self.fill)
            self.buffer[self.fill : self.fill + take] = ids[offset : offset + take]
            self.fill, offset = self.fill + take, offset + take
            if self.fill == len(self.buffer):
                self.flush({"source": source, "unit": unit, "offset": unit_offset + offset})

    def flush(self, resume: dict[str, int]) -> None:
        path = self.out / self.name(len(self.split["shards"]))
        tmp = self.out / f".{path.name}.tmp"
        self.buffer[: self.fill].tofile(tmp)
        os.replace(tmp, path)
        shard = {"file": path.name, "tokens": self.fill, "sha256": file_sha256(path)}
        self.split["shards"].append(shard)
        self.split["total_tokens"] += self.fill
        self.split["resume"] = resume
        write_manifest(self.out, self.manifest)
        self.fill = 0
        self.on_shard(shard)


def _new_manifest(tok: Tokenizer, inputs: list[Path], shard_tokens: int, text_field: str, eval_fraction: float) -> dict:
    start = {"source": 0, "unit": 0, "offset": 0}
    held_out_split = {"shards": [], "resume": dict(start), "total_tokens": 0}
    return {
        "format": MANIFEST_FORMAT,
        "tokenizer": tok.name,
        "tokenizer_sha256": tok.sha256,
        "vocab_size": tok.vocab_size,
        "dtype": dtype_for_vocab(tok.vocab_size),
        "shard_tokens": shard_tokens,
        "text_field": text_field,
        "sources": [{"path": str(p.resolve()), "bytes": p.stat().st_size} for p in inputs],
        "shards": [],
        "resume": start,
        "complete": False,
        "total_tokens": 0,
        # null: no held-out split (workloads.shards reads `eval` only when present).
        "eval_fraction": eval_fraction or None,
        **({"eval": held_out_split} if eval_fraction else {}),
    }


def _resumable(out: Path, fresh: dict[str, Any]) -> dict[str, Any]:
    """The manifest to continue from: the one in `out` if its settings match this command."""
    old = read_manifest(out)
    if old is None:
        return fresh
    for key, flag in _RESUME_KEYS.items():
        if old.get(key) != fresh[key]:
            raise ConfigError(
                f"{flag}: {out} was prepared with {key}={old.get(key)!r}, this "
                f"command gives {fresh[key]!r}; rerun with the same settings to "
                "resume, or choose another --out"
            )
    return old


def check_arguments(
    inputs: list[Path], out: Path, tokenizer: str, shard_tokens: int, eval_fraction: float = 0.0
) -> Tokenizer:
    """Every argument, before any work: ConfigError naming the one at fault. Returns the tokenizer."""
    for path in inputs:
        if not path.is_file():
            raise ConfigError(f"INPUT: {path} is not a file; give text, JSONL, .gz or .zst files")
    if shard_tokens < 2:
        raise ConfigError("--shard-tokens: must be at least 2")
    if not 0.0 <= eval_fraction < 1.0:
        raise ConfigError(f"--eval-fraction: {eval_fraction:g} is not in [0, 1); give e.g. 0.01 to hold out 1%")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out: {out} is a file; give a directory for the shards")
    tok = load_tokenizer(tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    return tok


def prepare(
    inputs: list[Path],
    out: Path,
    tokenizer: str,
    *,
    text_field: str = "text",
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    eval_fraction: float = 0.0,
    progress: Callable[[str, int], None] = lambda kind, n: None,
    stop_after_shards: int | None = None,
) -> dict[str, Any]:
    """Tokenize `inputs` into shards in `out` and return the manifest.

    progress(kind, n): kind "bytes" (input bytes read), "shard" (tokens of a shard written).
    stop_after_shards: raise KeyboardInterrupt after that many new shards, as an interruption
    by the user would (tests)."""
    tok = check_arguments(inputs, out, tokenizer, shard_tokens, eval_fraction)
    manifest = _resumable(out, _new_manifest(tok, inputs, shard_tokens, text_field, eval_fraction))
    if manifest["complete"]:
        return manifest
    written = 0

    def on_shard(shard: dict) -> None:
        nonlocal written
        written += 1
        progress("shard", shard["tokens"])
        if stop_after_shards is not None and written >= stop_after_shards:
            raise KeyboardInterrupt

    train = _ShardWriter(out, manifest, manifest, shard_name, on_shard)
    held = _ShardWriter(out, manifest, manifest["eval"], eval_shard_name, on_shard) if eval_fraction else None
    writers = [w for w in (train, held) if w is not None]
    first_source = min(w.resume for w in writers)[0]
    for source_index, path in enumerate(inputs):
        if source_index < first_source:
            progress("bytes", path.stat().st_size)
            continue
        unit, writer, skip, tokens_before = -1, train, 0, 0
        for unit_index, piece, ends_document in _units(path, text_field, lambda n: progress("bytes", n)):
            if unit_index != unit:
                unit, tokens_before = unit_index, 0
                writer = held if held is not None and held_out(source_index, unit, eval_fraction) else train
                resume_source, resume_unit, resume_offset = writer.resume
                # Tokens of this unit already in a completed shard of its split: read, not written.
                skip = resume_offset if (source_index, unit) == (resume_source, resume_unit) else 0
            if (source_index, unit) < (resume_source, resume_unit):
                continue  # in a completed shard of its split: read, not tokenized
            ids = tok.encode(piece)
            if ends_document and tok.end_of_document is not None:
                ids.append(tok.end_of_document)
            writer.add(ids, max(0, skip - tokens_before), source_index, unit, tokens_before)
            tokens_before += len(ids)
    end = {"source": len(inputs), "unit": 0, "offset": 0}
    for writer in writers:
        if writer.fill:
            writer.flush(end)
        writer.split["resume"] = end
    # Checked before the manifest says complete, so that a rerun does not take the set as done.
    if not manifest["shards"]:
        raise ConfigError("INPUT: the inputs hold no text; give non-empty files")
    if held is not None and not held.split["shards"]:
        raise ConfigError(
            f"--eval-fraction: no text fell into the held-out split at {eval_fraction:g}; "
            "give more text or a larger fraction"
        )
    manifest["complete"] = True
    write_manifest(out, manifest)
    return manifest
