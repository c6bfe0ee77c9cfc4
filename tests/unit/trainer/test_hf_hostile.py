"""A Hugging Face checkpoint directory nobody vouches for (`model.init_from`): every damaged or
crafted input ends in one ConfigError naming model.init_from and the file, within a bound, and
the trainer's preflight exits 93 with one line: never a traceback, a MemoryError or a hang."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from tests.support import REPO_ROOT
from workloads import hf_files
from workloads.hf_format import (
    SINGLE_WEIGHTS_FILE,
    WEIGHTS_INDEX_FILE,
    hf_config,
    hf_name,
    open_checkpoint,
    parameter_shapes,
)
from workloads.presets import MODEL_PRESETS

TINY = MODEL_PRESETS["tiny"]
NAMES = [hf_name(n) for n in parameter_shapes(TINY)]
#: Every refusal here reads a few KB; a second is far more than any of them needs.
BOUND_S = 5.0


def _checkpoint(root: Path) -> Path:
    """A valid tiny checkpoint: config.json and one model.safetensors."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(hf_config(TINY, None, "float32")))
    save_file({hf_name(n): torch.zeros(s) for n, s in parameter_shapes(TINY).items()}, str(root / SINGLE_WEIGHTS_FILE))
    return root


def _with_header(path: Path, header: object, data: bytes = b"") -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def _index(root: Path, weight_map: object) -> None:
    (root / SINGLE_WEIGHTS_FILE).unlink()
    (root / WEIGHTS_INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))


def _table() -> tuple[dict, int]:
    """The tiny checkpoint's header as written by the library's rules, and its data's length."""
    header, offset = {}, 0
    for name, size in parameter_shapes(TINY).items():
        nbytes = 4 * torch.Size(size).numel()
        header[hf_name(name)] = {"dtype": "F32", "shape": list(size), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    return header, offset


def _refused(root: Path) -> str:
    """open_checkpoint's refusal of `root`, which must come as a ConfigError within BOUND_S."""
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            open_checkpoint(root, TINY, "the tiny preset", None)
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 - the test reports whatever escaped
            outcome.append(err)

    started = time.monotonic()
    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(BOUND_S)
    assert outcome, f"open_checkpoint still running after {BOUND_S} s"
    assert time.monotonic() - started < BOUND_S
    err = outcome[0]
    assert isinstance(err, ConfigError), f"accepted or not a ConfigError: {err!r}"
    assert str(err).startswith(f"model.init_from: {root}: "), str(err)
    assert "\n" not in str(err)
    return str(err)


# ----- H2: config.json of the wrong type ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[1, 2, 3]", "config.json is a JSON list, not a mapping of settings"),
        ("[" * 200_000 + "]" * 200_000, "config.json nests too deeply"),
        ('{"model_type": "llama", "rope_scaling": [1]}', "rope_scaling is list, not a mapping"),
        ('{"model_type": "llama", "rope_parameters": "x"}', "rope_parameters is str, not a mapping"),
        ("\xff\xfe not utf-8", "config.json is not JSON"),
    ],
    ids=["list", "nested-200k", "rope-scaling-list", "rope-parameters-str", "not-utf8"],
)
def test_a_config_json_of_the_wrong_shape_is_refused(tmp_path, text, named):
    root = _checkpoint(tmp_path / "hf")
    (root / "config.json").write_bytes(text.encode("latin-1") if text.startswith("\xff") else text.encode())
    assert named in _refused(root)


def test_a_config_json_larger_than_any_llamas_is_refused_unread(tmp_path):
    root = _checkpoint(tmp_path / "hf")
    with (root / "config.json").open("r+b") as f:
        f.truncate(hf_files.MAX_CONFIG_BYTES + 1)  # sparse: nothing to parse, and nothing is read
    assert f"more than the {hf_files.MAX_CONFIG_BYTES:,}" in _refused(root)


# ----- H3: a length prefix that is not a header's; files that are not safetensors -----------------


@pytest.mark.parametrize("bits", [62, 40])
def test_a_length_prefix_beyond_the_file_is_refused_without_reading_it(tmp_path, bits):
    root = _checkpoint(tmp_path / "hf")
    weights = root / SINGLE_WEIGHTS_FILE
    weights.write_bytes(struct.pack("<Q", 1 << bits) + weights.read_bytes()[8:])
    assert f"claims a {1 << bits:,}-byte header" in _refused(root)


def test_a_header_longer_than_the_librarys_limit_is_refused_even_in_a_file_that_long(tmp_path):
    root = _checkpoint(tmp_path / "hf")
    weights = root / SINGLE_WEIGHTS_FILE
    with weights.open("r+b") as f:
        f.write(struct.pack("<Q", hf_files.MAX_HEADER_BYTES + 1))
        f.truncate(hf_files.MAX_HEADER_BYTES + 100)  # sparse
    assert "(at most 100,000,000)" in _refused(root)


@pytest.mark.parametrize("target", ["/etc/passwd", "/dev/urandom"])
def test_an_index_naming_a_system_file_is_refused(tmp_path, target):
    root = _checkpoint(tmp_path / "hf")
    _index(root, {name: target for name in NAMES})
    assert f"{WEIGHTS_INDEX_FILE}: '{target}' is not a path inside the directory" in _refused(root)


def test_a_file_shorter_than_its_length_prefix_is_refused(tmp_path):
    root = _checkpoint(tmp_path / "hf")
    (root / SINGLE_WEIGHTS_FILE).write_bytes(b"\x01\x02")
    assert "too short for a safetensors file" in _refused(root)


# ----- H4: header and index of the wrong JSON types -----------------------------------------------


@pytest.mark.parametrize(
    ("header", "named"),
    [
        ([1, 2], "the header of model.safetensors is a JSON list"),
        ({name: [1] for name in NAMES}, "is a JSON list, not a mapping"),
        ({NAMES[0]: {"dtype": "F32", "shape": "64", "data_offsets": [0, 4]}}, "has shape '64'"),
        ({NAMES[0]: {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, "has shape [-1]"),
        ({NAMES[0]: {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, "has data_offsets [0]"),
        ({NAMES[0]: {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, "has data_offsets [4, 0]"),
        ({NAMES[0]: {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}}, "has dtype 'Q7'"),
        ({"__metadata__": [1]}, "the __metadata__ of model.safetensors is not a mapping"),
    ],
    ids=["list", "entry-list", "shape-str", "shape-negative", "offsets-one", "offsets-reversed", "dtype", "metadata"],
)
def test_a_header_of_the_wrong_types_is_refused(tmp_path, header, named):
    root = _checkpoint(tmp_path / "hf")
    _with_header(root / SINGLE_WEIGHTS_FILE, header, b"\0" * 4)
    assert named in _refused(root)


@pytest.mark.parametrize(
    "index",
    [{"weight_map": [SINGLE_WEIGHTS_FILE]}, {"weight_map": {"a": 1}}, [1], {"weight_map": None}],
    ids=["list", "int-values", "not-a-mapping", "null"],
)
def test_an_index_of_the_wrong_types_is_refused(tmp_path, index):
    root = _checkpoint(tmp_path / "hf")
    (root / WEIGHTS_INDEX_FILE).write_text(json.dumps(index))
    assert f"{WEIGHTS_INDEX_FILE} has no weight_map mapping tensor names to file names" in _refused(root)


def test_an_index_naming_more_files_than_the_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(hf_files, "MAX_WEIGHT_FILES", 3)
    root = _checkpoint(tmp_path / "hf")
    _index(root, {name: f"part-{i}.safetensors" for i, name in enumerate(NAMES)})
    assert f"names {len(NAMES)} files" in _refused(root)


def test_the_metadata_read_has_one_budget_for_the_whole_checkpoint(tmp_path, monkeypatch):
    root = _checkpoint(tmp_path / "hf")
    header_length = struct.unpack("<Q", (root / SINGLE_WEIGHTS_FILE).read_bytes()[:8])[0]
    config_length = (root / "config.json").stat().st_size
    monkeypatch.setattr(hf_files, "MAX_METADATA_BYTES", config_length + header_length - 1)
    assert "would take the metadata read past" in _refused(root)


# ----- H5: names that leave the directory ---------------------------------------------------------


@pytest.mark.parametrize("name", ["../other/model.safetensors", "ABSOLUTE", "sub/../../other/model.safetensors"])
def test_an_index_naming_a_file_outside_the_directory_is_refused(tmp_path, name):
    other = _checkpoint(tmp_path / "other")
    root = _checkpoint(tmp_path / "hf")
    name = str(other / SINGLE_WEIGHTS_FILE) if name == "ABSOLUTE" else name
    _index(root, {n: name for n in NAMES})
    assert f"'{name}' is not a path inside the directory" in _refused(root)


def test_a_symlink_leading_outside_the_directory_is_refused(tmp_path):
    other = _checkpoint(tmp_path / "other")
    root = _checkpoint(tmp_path / "hf")
    (root / SINGLE_WEIGHTS_FILE).unlink()
    (root / SINGLE_WEIGHTS_FILE).symlink_to(other / SINGLE_WEIGHTS_FILE)
    assert f"'{SINGLE_WEIGHTS_FILE}' leads outside the directory (to {other / SINGLE_WEIGHTS_FILE})" in _refused(root)


def test_a_hugging_face_cache_snapshot_whose_files_link_to_its_blobs_opens(tmp_path):
    """The hub cache's layout: models--org--name/snapshots/<rev>/<file> -> ../../blobs/<hash>."""
    source = _checkpoint(tmp_path / "source")
    repo = tmp_path / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for i, name in enumerate(("config.json", SINGLE_WEIGHTS_FILE)):
        (source / name).rename(repo / "blobs" / f"blob{i}")
        (snapshot / name).symlink_to(Path("../../blobs") / f"blob{i}")
    assert len(open_checkpoint(snapshot, TINY, "the tiny preset", None).tensors) == len(NAMES)
    # The exception is the cache's own blobs, not any directory two levels up.
    (snapshot / SINGLE_WEIGHTS_FILE).unlink()
    (snapshot / SINGLE_WEIGHTS_FILE).symlink_to(Path("../..") / "snapshots")
    assert "leads outside the directory" in _refused(snapshot)


# ----- H6: a FIFO (or anything but a regular file) never blocks -------------------------------------


def test_an_index_naming_a_fifo_is_refused_at_once(tmp_path):
    root = _checkpoint(tmp_path / "hf")
    _index(root, {name: "weights.safetensors" for name in NAMES})
    fifo = root / "weights.safetensors"
    os.mkfifo(fifo)
    try:
        assert "weights.safetensors is not a regular file" in _refused(root)
    finally:
        try:  # release a reader the old code left blocked in open(), so the worker can exit
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


def test_a_config_json_that_is_a_directory_is_refused(tmp_path):
    root = _checkpoint(tmp_path / "hf")
    (root / "config.json").unlink()
    (root / "config.json").mkdir()
    assert "config.json is not a regular file" in _refused(root)


# ----- H7: data offsets that do not describe the file ---------------------------------------------


def _offsets(root: Path, change, data_bytes: int | None = None) -> None:
    header, length = _table()
    change(header)
    _with_header(root / SINGLE_WEIGHTS_FILE, header, b"\0" * (length if data_bytes is None else data_bytes))


@pytest.mark.parametrize(
    ("change", "data_bytes", "named"),
    [
        (lambda h: h[NAMES[-2]].update(data_offsets=[0, 1 << 62]), None, "model.norm.weight"),
        (lambda h: None, 400, "end at byte"),
        (lambda h: None, _table()[1] + 8, "truncated or padded"),
        (lambda h: h[NAMES[1]].update(data_offsets=[0, 256]), None, "which do not follow"),
        (lambda h: h[NAMES[0]].update(shape=[256, 65]), None, "with its 66,560 bytes"),
        (lambda h: h[NAMES[0]].update(dtype="BF16"), None, "with its 32,768 bytes"),
    ],
    ids=["past-the-end", "file-shorter", "file-longer", "overlapping", "shape-bytes", "dtype-bytes"],
)
def test_data_offsets_that_do_not_describe_the_file_are_refused(tmp_path, change, data_bytes, named):
    root = _checkpoint(tmp_path / "hf")
    _offsets(root, change, data_bytes)
    assert named in _refused(root)


def test_a_header_written_by_the_librarys_rules_opens_and_safe_open_agrees(tmp_path):
    """The checks are the library's: the table written here by them opens, and safe_open reads it."""
    from safetensors import safe_open

    root = _checkpoint(tmp_path / "hf")
    _offsets(root, lambda h: None)
    assert len(open_checkpoint(root, TINY, "the tiny preset", None).tensors) == len(NAMES)
    with safe_open(str(root / SINGLE_WEIGHTS_FILE), framework="pt") as f:
        assert f.get_tensor(NAMES[0]).shape == (256, 64)


def test_a_tensor_the_index_places_in_another_file_is_refused(tmp_path):
    root = _checkpoint(tmp_path / "hf")
    (root / "other.safetensors").write_bytes((root / SINGLE_WEIGHTS_FILE).read_bytes())
    weight_map = {name: SINGLE_WEIGHTS_FILE for name in NAMES}
    weight_map[NAMES[0]] = "other.safetensors"
    (root / WEIGHTS_INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))
    assert f"puts tensor {NAMES[0]} in other.safetensors, but it is in model.safetensors" in _refused(root)


# ----- the real preflight -------------------------------------------------------------------------


def test_the_preflight_exits_93_with_one_line_for_each_kind(tmp_path):
    """`python -m workloads.train --preflight` (what the pod runs before ft_launcher) on a list
    config.json (a traceback before), a FIFO (a hang before) and offsets past the end (accepted
    before): exit 93, one line, no traceback, in seconds."""
    cases = {}
    cases["list"] = _checkpoint(tmp_path / "list")
    (cases["list"] / "config.json").write_text("[1, 2, 3]")
    cases["fifo"] = _checkpoint(tmp_path / "fifo")
    _index(cases["fifo"], {name: "w.safetensors" for name in NAMES})
    os.mkfifo(cases["fifo"] / "w.safetensors")
    cases["offsets"] = _checkpoint(tmp_path / "offsets")
    _offsets(cases["offsets"], lambda h: h[NAMES[-2]].update(data_offsets=[0, 1 << 62]), 400)
    config = tmp_path / "train.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\ncheckpoint:\n  backend: none\n")
    argv = [sys.executable, "-m", "workloads.train", "--config", str(config), "--preflight", "--world-size", "2"]
    for kind, root in cases.items():
        done = subprocess.run(
            [*argv, f"model.init_from={root}"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == EXIT_DO_NOT_REQUEUE, (kind, done.stderr)
        assert len(lines) == 1 and lines[0].startswith(f"error: model.init_from: {root}: "), (kind, done.stderr)
