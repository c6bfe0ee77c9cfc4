"""Nothing read back from a checkpoint runs code (workloads/checkpoint/safe_load.py): a crafted
`.metadata` or non-tensor item is refused before any global it names is called, and a real DCP
checkpoint still loads through the same reader and planner."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

from workloads.checkpoint.safe_load import SafeFileSystemReader, TensorsOnlyLoadPlanner, UnsafeCheckpoint


class _Plant:
    """Unpickling this creates the file named: what an attacker's payload would do."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mknod, (self.path,))


def _state() -> dict:
    return {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "step": 7, "betas": (0.9, 0.95)}


def _save(path: Path) -> None:
    dcp.save(_state(), checkpoint_id=str(path), no_dist=True)


def _load(path: Path) -> dict:
    target = {"w": torch.zeros(2, 3), "step": 0, "betas": (0.0, 0.0)}
    dcp.load(
        target,
        checkpoint_id=str(path),
        storage_reader=SafeFileSystemReader(str(path)),
        planner=TensorsOnlyLoadPlanner(),
        no_dist=True,
    )
    return target


def test_a_real_checkpoint_loads(tmp_path):
    _save(tmp_path / "ckpt")
    loaded = _load(tmp_path / "ckpt")
    assert torch.equal(loaded["w"], _state()["w"]) and loaded["step"] == 7 and tuple(loaded["betas"]) == (0.9, 0.95)


def test_poisoned_metadata_is_refused_and_runs_nothing(tmp_path):
    _save(tmp_path / "ckpt")
    planted = tmp_path / "planted"
    (tmp_path / "ckpt" / ".metadata").write_bytes(pickle.dumps(_Plant(str(planted))))
    # DCP wraps the reader's error in its CheckpointException (a BaseException); the message stays.
    with pytest.raises(BaseException, match=r"asks to load posix\.mknod, which DCP metadata never holds; refusing"):
        _load(tmp_path / "ckpt")
    assert not planted.exists()


def test_poisoned_metadata_is_refused_even_inside_real_metadata(tmp_path):
    """The payload hidden in a field of otherwise genuine metadata."""
    _save(tmp_path / "ckpt")
    metadata = SafeFileSystemReader(str(tmp_path / "ckpt")).read_metadata()
    planted = tmp_path / "planted"
    metadata.planner_data = _Plant(str(planted))
    (tmp_path / "ckpt" / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(BaseException, match="refusing to unpickle"):
        _load(tmp_path / "ckpt")
    assert not planted.exists()


def test_poisoned_non_tensor_item_is_refused(tmp_path):
    planner = TensorsOnlyLoadPlanner()
    planted = tmp_path / "planted"
    buffer = io.BytesIO()
    torch.save(_Plant(str(planted)), buffer)
    buffer.seek(0)
    item = type("Item", (), {"dest_index": type("Index", (), {"fqn": "step"})()})()
    planner.flatten_state_dict, planner.state_dict = False, {}
    with pytest.raises(UnsafeCheckpoint, match="item step is not plain data"):
        planner.load_bytes(item, buffer)  # type: ignore[arg-type]
    assert not planted.exists()


def test_enum_members_pickled_by_name_load_and_nothing_else_through_getattr(tmp_path):
    """Python may pickle an Enum member as getattr(cls, name), as DCP's metadata written in the
    trainer image was: that loads; a getattr that walks anywhere else is refused."""
    _save(tmp_path / "ckpt")
    metadata_file = tmp_path / "ckpt" / ".metadata"
    metadata = SafeFileSystemReader(str(tmp_path / "ckpt")).read_metadata()

    class ByName:
        def __reduce__(self):
            return (getattr, (_MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS_FORMAT"))

    metadata.planner_data = {"memory_format": ByName()}
    metadata_file.write_bytes(pickle.dumps(metadata))
    assert SafeFileSystemReader(str(tmp_path / "ckpt")).read_metadata().planner_data == {
        "memory_format": _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT
    }

    class Walk:
        def __reduce__(self):
            return (getattr, (torch.Size, "__init__"))

    metadata.planner_data = Walk()
    metadata_file.write_bytes(pickle.dumps(metadata))
    with pytest.raises(UnsafeCheckpoint, match="getattr"):
        SafeFileSystemReader(str(tmp_path / "ckpt")).read_metadata()
