"""Reading a DCP checkpoint without unpickling anything but DCP's own metadata.

The checkpoint directory is on FSx, writable by every pod that mounts the volume, so a checkpoint
is untrusted input. torch 2.13's DCP would run code from it on every rank that resumes:
`FileSystemReader.read_metadata` calls `pickle.load` on `.metadata`, and `DefaultLoadPlanner.
load_bytes` calls `torch.load(weights_only=False)` on every non-tensor item. Here the metadata is
read by an unpickler that resolves only the classes DCP's metadata is made of (any other global,
`os.system` say, is refused before it is called), and non-tensor items go through
`torch.load(weights_only=True)`, which accepts tensors and plain containers of primitives only.
"""

from __future__ import annotations

import io
import pickle
from enum import Enum
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING, Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem

#: Every global a DCP `.metadata` pickle names (seen in checkpoints of torch 2.13: the metadata
#: dataclasses, the file system's storage records, torch.Size, dtypes, layouts, and the path
#: FileSystemWriter records as the checkpoint id when it was given one), besides the getattr an
#: Enum member may be pickled with (_enum_member).
_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath"},
}


#: Enums of DCP's metadata, whose members a pickle may name (see _enum_member).
_ENUMS = (_MEM_FORMAT_ENCODING,)


class UnsafeCheckpoint(pickle.UnpicklingError):
    """A checkpoint file asks to load something no checkpoint of ours contains."""


def _enum_member(cls: Any, name: str) -> Any:
    """Stands in for `builtins.getattr`, with which Python pickles an Enum member by name
    (`getattr(_MEM_FORMAT_ENCODING, 'TORCH_CONTIGUOUS_FORMAT')`): members of the metadata's own
    enums only. A getattr free to walk attributes would reach any module from a function's
    globals."""
    if isinstance(cls, type) and issubclass(cls, Enum) and cls in _ENUMS and name in cls.__members__:
        return cls[name]
    raise UnsafeCheckpoint(
        f"its .metadata asks for getattr({getattr(cls, '__name__', type(cls).__name__)}, {name!r}), "
        "which DCP metadata never holds; refusing to unpickle it"
    )


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if name in _METADATA_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpoint(
            f"its .metadata asks to load {module}.{name}, which DCP metadata never holds; refusing to "
            "unpickle it (a crafted checkpoint would run code in every rank that resumes from it)"
        )


def read_metadata(stream: Any) -> Metadata:
    metadata = _MetadataUnpickler(stream).load()
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(f"its .metadata holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose metadata is read by the restricted unpickler (else as upstream)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = read_metadata(stream)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


class TensorsOnlyLoadPlanner(DefaultLoadPlanner):
    """Non-tensor items (step, data position, optimizer hyper-parameters) through
    torch.load(weights_only=True). `optional_keys` (flattened, e.g. "data.dataset_sha256") may be
    absent from a checkpoint written before they were saved: they load as None, and `absent`
    lists them; any other key missing fails the load as DCP's strict loading does."""

    def __init__(self, optional_keys: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.optional_keys = optional_keys
        self.absent: list[str] = []

    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None  # DCP sets the planner up with the checkpoint's metadata
        saved = self.metadata.state_dict_metadata
        self.absent = sorted(key for key in self.optional_keys if key in self.state_dict and key not in saved)
        for key in self.absent:
            # The keys are flattened ones: the constructor keeps DCP's default flatten_state_dict.
            set_element(self.original_state_dict, self.mappings[key], None)
            del self.state_dict[key]
        return super().create_local_plan()

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            raise UnsafeCheckpoint(f"item {read_item.dest_index.fqn} is not plain data: {err}") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
