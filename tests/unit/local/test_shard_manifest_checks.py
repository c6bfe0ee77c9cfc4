"""A shard set's manifest.json (and hand-made shards) that the trainer cannot use is refused before
any rank starts, in one line naming data.path: the preflight exits 93, and a rank that meets it
raises ConfigError (exit 93 too). A manifest of the wrong shape, wrong types, a shard named
outside its directory, JSON nested past the parser or a number past Python's digit limit used to
end in KeyError, TypeError, ValueError, OverflowError or RecursionError tracebacks; a shard set
np.memmap cannot map failed in every rank, after the preflight had passed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nvrx_eks.data.prepare import prepare
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from tests.unit.local.test_data_prep import stdlib_text
from workloads.config import TrainConfig
from workloads.shards import MANIFEST_NAME, shard_files


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("shards")
    manifest = prepare(stdlib_text(60_000), root, "byte", shard_tokens=20_000)
    return root, manifest


def _set(manifest: dict, dotted: str, value: Any) -> dict:
    changed = json.loads(json.dumps(manifest))
    *parents, leaf = dotted.split(".")
    node = changed
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is _DROP:
        del node[leaf]
    else:
        node[leaf] = value
    return changed


_DROP = object()
#: (what the manifest holds, the field its refusal names)
HOSTILE: dict[str, tuple[Any, str]] = {
    "no shards": (("shards", _DROP), "shards: required field is missing"),
    "vocab_size a string": (("vocab_size", "abc"), "vocab_size: Input should be a valid integer"),
    "vocab_size NaN": (("vocab_size", float("nan")), "vocab_size: Input should be a valid integer"),
    "a shard that is a number": (("shards", [1]), "shards.0: Input should be a valid dictionary"),
    "tokens 1e400": (("shards.0.tokens", float("inf")), "shards.0.tokens: Input should be a valid integer"),
    "dtype float32": (("dtype", "float32"), "dtype: Input should be 'uint16' or 'uint32'"),
    "shard outside the directory": (("shards.0.file", "../../etc/passwd"), "shards.0.file: String should match"),
    "absolute shard path": (("shards.0.file", "/etc/passwd"), "shards.0.file: String should match"),
    "shard named ..": (("shards.0.file", ".."), "shards.0.file: must name a file in the shard directory"),
    "complete a string": (("complete", "yes"), "complete: Input should be a valid boolean"),
}


def _config(root: Path, tmp_path: Path) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "checkpoint": {"backend": "none"},
            "data": {"source": "memmap", "path": str(root)},
        }
    )


def _copy(prepared: tuple[Path, dict], tmp_path: Path, manifest_text: str) -> Path:
    root, _ = prepared
    copy = tmp_path / "shards"
    copy.mkdir()
    for shard in root.glob("*.bin"):
        (copy / shard.name).symlink_to(shard)
    (copy / MANIFEST_NAME).write_text(manifest_text)
    return copy


def _preflight_line(cfg: TrainConfig, capsys) -> str:
    from workloads.train import preflight

    assert preflight(cfg, world_size=2) == EXIT_DO_NOT_REQUEUE
    [line] = capsys.readouterr().err.strip().splitlines()
    return line


@pytest.mark.parametrize("case", HOSTILE, ids=HOSTILE)
def test_a_hostile_manifest_is_refused_in_one_line_naming_the_field(prepared, tmp_path, capsys, case):
    (field, value), named = HOSTILE[case]
    text = json.dumps(_set(prepared[1], field, value))  # NaN and Infinity as Python's json writes them
    root = _copy(prepared, tmp_path, text)
    line = _preflight_line(_config(root, tmp_path), capsys)
    assert line.startswith(f"error: data.path: {root / MANIFEST_NAME} is not a manifest `nvrx-eks data prepare` wrote")
    assert named in line and "re-run `nvrx-eks data prepare` into this directory" in line
    with pytest.raises(ConfigError, match="is not a manifest"):  # what a rank meets: exit 93 (Unrecoverable)
        shard_files(_config(root, tmp_path).data, 256)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"format": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nests JSON deeper than a manifest"),
        ('{"format": 1, "vocab_size": 1' + "0" * 5000 + "}", "is not a readable manifest (Exceeds the limit"),
    ],
    ids=["nested 100k deep", "5000-digit integer"],
)
def test_json_the_parser_cannot_take_is_refused_in_one_line(prepared, tmp_path, capsys, text, named):
    root = _copy(prepared, tmp_path, text)
    assert named in _preflight_line(_config(root, tmp_path), capsys)


@pytest.mark.parametrize(("size", "dtype"), [(0, None), (3, None), (6, "uint32")], ids=["empty", "odd", "partial"])
def test_hand_made_shards_np_memmap_cannot_map_are_refused_by_the_preflight(tmp_path, capsys, size, dtype):
    root = tmp_path / "hand-made"
    root.mkdir()
    (root / "a.bin").write_bytes(bytes(4096))
    (root / "b.bin").write_bytes(bytes(size))
    cfg = _config(root, tmp_path)
    if dtype:
        cfg = TrainConfig.from_dict(cfg.model_dump(), overrides=[f"data.dtype={dtype}"])
    line = _preflight_line(cfg, capsys)
    assert f"data.path: shard {root / 'b.bin'} has {size} bytes, not a whole number of" in line
