"""The files of a Hugging Face checkpoint directory, read as input nobody vouches for.

A `model.init_from` directory (or a `model.shape_from` config.json) comes from outside the run:
downloaded, copied onto FSx, perhaps damaged or crafted. The trainer's preflight reads it before
any rank starts, so every way it can be wrong must end in one ConfigError line (exit 93), within
a bound of time and memory, never a traceback or a hang:

* Only regular files are opened, and a file is stat-ed before it is opened for reading and
  opened with O_NONBLOCK then fstat-ed again: a FIFO or a device never blocks the preflight.
* A name the index gives is a path relative to the directory, without `..`, that resolves
  (symlinks followed) to a file inside it, or inside the blobs of the Hugging Face cache
  repository when the directory is a cache snapshot (`<repo>/snapshots/<rev>`, whose files are
  symlinks to `<repo>/blobs/`: https://huggingface.co/docs/hub/local-cache): `init_from` is a
  boundary, not a starting point.
* Every JSON document has a byte bound checked before it is read, and all of them together
  share one budget; nesting too deep for the parser is refused, not a RecursionError.
* A safetensors header is checked as the library checks it before its data is trusted (the
  header length within MAX_HEADER_BYTES and the file; each tensor's dtype, shape and byte size;
  data offsets contiguous from 0 to the end of the file), so a file the preflight accepts is one
  `safe_open` can slice.

No torch: the CLI reads config.json files with it too (workloads.hf_format.read_config).
"""

from __future__ import annotations

import json
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeGuard

#: safetensors' own limit on a header (MAX_HEADER_SIZE in the library's tensor.rs): a longer
#: one is not a file the library loads.
MAX_HEADER_BYTES = 100_000_000
#: config.json of a Llama model is about 1 KB; a generous bound for a file we parse whole.
MAX_CONFIG_BYTES = 1 << 20
#: model.safetensors.index.json: Llama 3.1 405B's maps 1,137 tensors (126 blocks of 9, plus 3) at
#: ~80 bytes an entry, ~100 KB; a mixture of experts with tens of thousands of tensors is a few
#: MB (estimated, not measured).
MAX_INDEX_BYTES = 64 << 20
#: All JSON read from one checkpoint (config.json, the index, every safetensors header): a
#: 405B checkpoint's headers total well under 1 MB (same estimate). The bound caps the
#: preflight's memory, which is a small multiple of it once parsed (Python objects; not measured).
MAX_METADATA_BYTES = 100_000_000
#: Weight files an index may name, and tensors all headers may list: far above any published
#: Llama checkpoint (405B: 191 files), low enough to bound the preflight's time.
MAX_WEIGHT_FILES = 10_000
MAX_TENSORS = 1_000_000
#: Bits per element of every safetensors dtype (the library's Dtype::bitsize).
DTYPE_BITS = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
_LENGTH_PREFIX = 8


class Unreadable(ValueError):
    """A file of the checkpoint cannot be trusted or read; the message says which and why."""


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a safetensors file: where it is and what it holds (no data read)."""

    file: Path
    dtype: str  # the safetensors code, e.g. F32, BF16
    shape: tuple[int, ...]


class ReadBudget:
    """The bytes of JSON one checkpoint may still make us read (MAX_METADATA_BYTES in all)."""

    def __init__(self) -> None:
        self.left = MAX_METADATA_BYTES

    def take(self, nbytes: int, what: str) -> None:
        if nbytes > self.left:
            raise Unreadable(
                f"{what} would take the metadata read past {MAX_METADATA_BYTES:,} bytes in all; "
                "not a checkpoint the trainer reads"
            )
        self.left -= nbytes


def _open_regular(path: Path, what: str) -> int:
    """A read-only descriptor of `path` once it is known to be a regular file. lstat first, so a
    FIFO or device is refused before any open; O_NONBLOCK and O_NOFOLLOW, so a file swapped for
    either (or for a symlink) after the lstat neither blocks nor leads elsewhere; fstat after."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise Unreadable(f"{what} is not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise Unreadable(f"{what} does not exist") from None
    except OSError as err:
        raise Unreadable(f"cannot open {what} ({err.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Unreadable(f"{what} is not a regular file")
    return fd


def _read_exactly(fd: int, count: int, what: str) -> bytes:
    chunks, left = [], count
    while left:
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            raise Unreadable(f"{what} ends early (truncated?)")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def parse_json(data: bytes, what: str) -> Any:
    """JSON text, refused (not raised past us) when it is not UTF-8 JSON or nests too deeply."""
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise Unreadable(f"{what} is not JSON ({err})") from None
    except RecursionError:
        raise Unreadable(f"{what} nests too deeply to be a Hugging Face JSON file") from None


def read_json_file(path: Path, limit: int, budget: ReadBudget, what: str) -> Any:
    """The JSON document in the regular file `path`, at most `limit` bytes."""
    fd = _open_regular(path, what)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise Unreadable(f"{what} is {size:,} bytes, more than the {limit:,} a Hugging Face file of its kind needs")
        budget.take(size, what)
        return parse_json(_read_exactly(fd, size, what), what)
    finally:
        os.close(fd)


class CheckpointDir:
    """A checkpoint directory and the files inside it that may be read (see the module docstring)."""

    def __init__(self, root: str | Path):
        self.given = Path(root)
        try:
            self.root = self.given.resolve(strict=True)
        except (OSError, RuntimeError):
            raise Unreadable("is not a directory") from None
        if not self.root.is_dir():
            raise Unreadable("is not a directory")
        self.allowed = [self.root]
        if self.root.parent.name == "snapshots":  # the Hugging Face cache: files link to ../../blobs
            self.allowed.append(self.root.parent.parent / "blobs")
        self.budget = ReadBudget()

    def file(self, name: str) -> Path:
        """The file `name` (as an index or this code names it) resolved inside the directory."""
        relative = PurePosixPath(name)
        if not name or relative.is_absolute() or ".." in relative.parts:
            raise Unreadable(f"{name!r} is not a path inside the directory")
        try:
            resolved = (self.root / relative).resolve(strict=True)
        except FileNotFoundError:
            raise Unreadable(f"{name!r} does not exist") from None
        except (OSError, RuntimeError) as err:
            raise Unreadable(f"cannot resolve {name!r} ({err})") from None
        if not any(resolved.is_relative_to(place) for place in self.allowed):
            raise Unreadable(f"{name!r} leads outside the directory (to {resolved})")
        return resolved

    def has(self, name: str) -> bool:
        return os.path.lexists(self.root / name)

    def json(self, name: str, limit: int) -> Any:
        return read_json_file(self.file(name), limit, self.budget, name)


def _whole_numbers(value: Any, length: int | None = None) -> TypeGuard[list[int]]:
    return (
        isinstance(value, list)
        and (length is None or len(value) == length)
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    )


def _tensor_entry(name: Any, entry: Any, where: str) -> tuple[str, list[int], tuple[int, int]]:
    """(dtype, shape, data_offsets) of one header entry, each of the type the format defines."""
    if not isinstance(entry, dict):
        raise Unreadable(f"{where}: tensor {name!r} is a JSON {type(entry).__name__}, not a mapping")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise Unreadable(f"{where}: tensor {name!r} has dtype {dtype!r}, not a safetensors dtype")
    if not _whole_numbers(shape):
        raise Unreadable(f"{where}: tensor {name!r} has shape {shape!r}, not a list of sizes")
    if not _whole_numbers(offsets, 2) or offsets[1] < offsets[0]:
        raise Unreadable(f"{where}: tensor {name!r} has data_offsets {offsets!r}, not [begin, end]")
    return dtype, shape, (offsets[0], offsets[1])


def safetensors_tensors(path: Path, name: str, budget: ReadBudget) -> dict[str, StoredTensor]:
    """The tensor table of the safetensors file `path` (`name` in messages), checked against the
    file: the library's own rules, so that what passes here is what `safe_open` slices."""
    fd = _open_regular(path, name)
    try:
        size = os.fstat(fd).st_size
        if size < _LENGTH_PREFIX:
            raise Unreadable(f"{name} is {size} bytes, too short for a safetensors file")
        (length,) = struct.unpack("<Q", _read_exactly(fd, _LENGTH_PREFIX, name))
        if length > MAX_HEADER_BYTES or _LENGTH_PREFIX + length > size:
            raise Unreadable(
                f"{name} claims a {length:,}-byte header in a {size:,}-byte file (at most "
                f"{MAX_HEADER_BYTES:,}); not a safetensors file"
            )
        budget.take(length, name)
        header = parse_json(_read_exactly(fd, length, name), f"the header of {name}")
    finally:
        os.close(fd)
    if not isinstance(header, dict):
        raise Unreadable(f"the header of {name} is a JSON {type(header).__name__}, not a mapping of tensors")
    if not isinstance(header.get("__metadata__", {}), dict):
        raise Unreadable(f"the __metadata__ of {name} is not a mapping")
    entries = [(key, *_tensor_entry(key, value, name)) for key, value in header.items() if key != "__metadata__"]
    # Sorted by offset, each tensor must start where the previous ended, hold exactly its
    # elements' bytes, and the last must end at the end of the file (the library's validate()).
    entries.sort(key=lambda e: e[3])
    end = 0
    for key, dtype, shape, (begin, stop) in entries:
        bits = DTYPE_BITS[dtype]
        for dimension in shape:
            bits *= dimension
        if begin != end or stop - begin != bits // 8 or bits % 8:
            raise Unreadable(
                f"{name}: tensor {key!r} ({dtype} {shape}) has data_offsets [{begin}, {stop}], which do not "
                f"follow the previous tensor's end ({end}) with its {bits / 8:,.0f} bytes"
            )
        end = stop
    if _LENGTH_PREFIX + length + end != size:
        raise Unreadable(
            f"the tensors of {name} end at byte {_LENGTH_PREFIX + length + end:,} of a {size:,}-byte file; "
            "truncated or padded"
        )
    return {key: StoredTensor(path, dtype, tuple(shape)) for key, dtype, shape, _ in entries}


def index_weight_map(index: Any, what: str) -> dict[str, str]:
    """The index's weight_map (tensor name -> file name), of the types the format defines."""
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise Unreadable(f"{what} has no weight_map mapping tensor names to file names")
    files = set(weight_map.values())
    if len(files) > MAX_WEIGHT_FILES or len(weight_map) > MAX_TENSORS:
        raise Unreadable(
            f"{what} names {len(files):,} files and {len(weight_map):,} tensors, more than a checkpoint "
            f"the trainer reads ({MAX_WEIGHT_FILES:,} files, {MAX_TENSORS:,} tensors)"
        )
    return weight_map
