"""`nvrx-eks data prepare/upload` and the trainer's checks of a shard set, on real text made here
or shipped with Python (no download)."""

from __future__ import annotations

import gzip
import json
import sysconfig
from pathlib import Path

import boto3
import numpy as np
import pytest
import zstandard
from moto import mock_aws

from nvrx_eks.data.prepare import prepare
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from tests.support import cli_harness
from tests.support.cli_harness import run_cli
from workloads.config import TrainConfig
from workloads.shards import MANIFEST_NAME, read_manifest, shard_files

no_credentials = cli_harness.no_credentials


def stdlib_text(limit_bytes: int) -> list[Path]:
    """Python's own library sources: real text of every kind that ships with the interpreter."""
    files, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        files.append(path)
        total += path.stat().st_size
        if total >= limit_bytes:
            break
    return files


def prepare_cli(inputs: list[Path], out: Path, tokenizer: str, *options: str):
    """`nvrx-eks data prepare INPUTS --out OUT --tokenizer TOKENIZER OPTIONS`."""
    return run_cli("data", "prepare", *map(str, inputs), "--out", str(out), "--tokenizer", tokenizer, *options)


def shard_tokens(out: Path, manifest: dict) -> np.ndarray:
    """Every token of a prepared set, shard after shard."""
    return np.concatenate([np.fromfile(out / s["file"], dtype=np.uint16) for s in manifest["shards"]])


def test_byte_shards_hold_exactly_the_text_and_the_manifest_describes_them(tmp_path):
    inputs = stdlib_text(200_000)
    result = prepare_cli(inputs, tmp_path / "out", "byte", "--shard-tokens", "50000")
    assert result.code == 0, result.stderr
    manifest = read_manifest(tmp_path / "out")
    assert manifest["complete"] and manifest["vocab_size"] == 256 and manifest["dtype"] == "uint16"
    tokens = shard_tokens(tmp_path / "out", manifest)
    expected = b"".join(p.read_bytes() for p in inputs)
    assert tokens.astype(np.uint8).tobytes() == expected
    assert [s["tokens"] for s in manifest["shards"][:-1]] == [50000] * (len(manifest["shards"]) - 1)
    assert manifest["total_tokens"] == len(expected)
    assert [s["path"] for s in manifest["sources"]] == [str(p.resolve()) for p in inputs]


def test_interrupted_prepare_resumes_to_the_same_shards(tmp_path):
    inputs = stdlib_text(300_000)
    whole = prepare(inputs, tmp_path / "whole", "byte", shard_tokens=40000)
    with pytest.raises(KeyboardInterrupt):
        prepare(inputs, tmp_path / "cut", "byte", shard_tokens=40000, stop_after_shards=3)
    partial = read_manifest(tmp_path / "cut")
    assert len(partial["shards"]) == 3 and not partial["complete"]
    first = (tmp_path / "cut" / partial["shards"][0]["file"]).stat().st_mtime_ns
    result = prepare_cli(inputs, tmp_path / "cut", "byte", "--shard-tokens", "40000")
    assert result.code == 0, result.stderr
    assert "resuming" in result.stdout and "after 3 completed shard(s)" in result.stdout
    resumed = read_manifest(tmp_path / "cut")
    assert [s["sha256"] for s in resumed["shards"]] == [s["sha256"] for s in whole["shards"]]
    assert (tmp_path / "cut" / partial["shards"][0]["file"]).stat().st_mtime_ns == first  # not rewritten


def test_resume_with_other_settings_is_refused(tmp_path):
    inputs = stdlib_text(100_000)
    with pytest.raises(KeyboardInterrupt):
        prepare(inputs, tmp_path / "out", "byte", shard_tokens=30000, stop_after_shards=1)
    result = prepare_cli(inputs, tmp_path / "out", "byte", "--shard-tokens", "20000")
    assert result.code == 2
    assert "--shard-tokens" in result.stderr and "Traceback" not in result.stderr


def _jsonl_corpus(tmp_path: Path) -> tuple[list[Path], list[str]]:
    docs = [f"Record {i}: the quick brown fox jumps over the lazy dog {i % 7} times." for i in range(400)]
    plain = tmp_path / "a.jsonl"
    plain.write_text("".join(json.dumps({"body": d}) + "\n" for d in docs[:100]))
    gz = tmp_path / "b.jsonl.gz"
    gz.write_bytes(gzip.compress("".join(json.dumps({"body": d}) + "\n" for d in docs[100:250]).encode()))
    zst = tmp_path / "c.jsonl.zst"
    zst.write_bytes(
        zstandard.ZstdCompressor().compress("".join(json.dumps({"body": d}) + "\n" for d in docs[250:]).encode())
    )
    return [plain, gz, zst], docs


def test_jsonl_gz_zst_with_a_tokenizer_trained_here(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    inputs, docs = _jsonl_corpus(tmp_path)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<|endoftext|>"]))
    tok_path = tmp_path / "tokenizer.json"
    tok.save(str(tok_path))
    result = prepare_cli(inputs, tmp_path / "out", str(tok_path), "--text-field", "body", "--shard-tokens", "3000")
    assert result.code == 0, result.stderr
    manifest = read_manifest(tmp_path / "out")
    assert manifest["vocab_size"] == tok.get_vocab_size() and manifest["tokenizer_sha256"]
    ids = shard_tokens(tmp_path / "out", manifest)
    eod = tok.token_to_id("<|endoftext|>")
    assert int((ids == eod).sum()) == len(docs)
    first = ids[: int(np.argmax(ids == eod))].tolist()
    assert tok.decode(first) == docs[0]


def test_jsonl_without_the_text_field_names_it(tmp_path):
    inputs, _ = _jsonl_corpus(tmp_path)
    result = run_cli("data", "prepare", str(inputs[0]), "--out", str(tmp_path / "out"), "--tokenizer", "byte")
    assert result.code == 2
    assert "--text-field" in result.stderr and "a.jsonl:1" in result.stderr


def _damaged(compressed: bytes, kind: str) -> bytes:
    """`compressed` made unreadable: not compressed at all, cut short, or a byte flipped inside."""
    if kind == "not compressed":
        return b"plain text, not a compressed stream\n" * 4
    if kind == "cut short":
        return compressed[: len(compressed) // 2]
    flipped = bytearray(compressed)
    flipped[len(flipped) // 3] ^= 0xFF
    return bytes(flipped)


_TEXT = "".join(f"line {i} of a corpus\n" for i in range(2000)).encode()


@pytest.mark.parametrize(
    ("suffix", "kind"),
    [(".gz", "not compressed"), (".gz", "cut short"), (".gz", "byte flipped"), (".zst", "not compressed")],
)
def test_damaged_compressed_input_is_named_without_a_traceback(tmp_path, suffix, kind):
    compressed = gzip.compress(_TEXT) if suffix == ".gz" else zstandard.ZstdCompressor().compress(_TEXT)
    damaged = tmp_path / f"corpus.txt{suffix}"
    damaged.write_bytes(_damaged(compressed, kind))
    result = prepare_cli([damaged], tmp_path / "out", "byte")
    assert result.code == 2, result.output
    assert f"INPUT: {damaged} is not a readable {suffix} file" in result.stderr
    assert "Traceback" not in result.output


def _prepared(tmp_path: Path) -> Path:
    prepare(stdlib_text(150_000), tmp_path / "shards", "byte", shard_tokens=50000)
    return tmp_path / "shards"


def _memmap_cfg(path: Path, preset: str = "tiny") -> TrainConfig:
    return TrainConfig.from_dict({"model": {"preset": preset}, "data": {"source": "memmap", "path": str(path)}})


def test_trainer_takes_dtype_and_shards_from_the_manifest(tmp_path):
    root = _prepared(tmp_path)
    cfg = _memmap_cfg(root)
    files, dtype = shard_files(cfg.data, cfg.model.shape.vocab_size, hash_bytes=1 << 30)
    assert dtype == "uint16" and [f.name for f in files] == [s["file"] for s in read_manifest(root)["shards"]]


def test_vocab_larger_than_the_model_is_refused_naming_the_field(tmp_path):
    root = _prepared(tmp_path)
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    manifest["vocab_size"] = 50257
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    cfg = _memmap_cfg(root)
    with pytest.raises(ConfigError, match="vocab_size 50257.*vocabulary is 256"):
        shard_files(cfg.data, cfg.model.shape.vocab_size)


def test_the_vocabulary_check_uses_the_models_own_vocab_size(tmp_path):
    """A tokenizer of one's own: model.vocab_size set over the preset is what the shards are checked
    against (the trainer and its preflight both call shard_files with cfg.model.shape.vocab_size)."""
    root = _prepared(tmp_path)
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    manifest["vocab_size"] = 50257
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    data = {"source": "memmap", "path": str(root)}
    own = TrainConfig.from_dict({"model": {"preset": "tiny", "vocab_size": 50257}, "data": data})
    files, _ = shard_files(own.data, own.model.shape.vocab_size)
    assert len(files) == len(manifest["shards"])
    short = TrainConfig.from_dict({"model": {"preset": "tiny", "vocab_size": 50000}, "data": data})
    with pytest.raises(ConfigError, match="vocabulary is 50000; set model.vocab_size to at least 50257"):
        shard_files(short.data, short.model.shape.vocab_size)


def test_dtype_disagreeing_with_the_manifest_is_refused(tmp_path):
    root = _prepared(tmp_path)
    cfg = TrainConfig.from_dict({"data": {"source": "memmap", "path": str(root), "dtype": "uint32"}})
    with pytest.raises(ConfigError, match="data.dtype: uint32 .* set data.dtype=uint16"):
        shard_files(cfg.data, 256)


def test_truncated_shard_is_named_at_start_up(tmp_path):
    root = _prepared(tmp_path)
    victim = root / read_manifest(root)["shards"][1]["file"]
    victim.write_bytes(victim.read_bytes()[:-10])
    with pytest.raises(ConfigError, match=f"shard {victim} has 99990 bytes"):
        shard_files(_memmap_cfg(root).data, 256)


def _write_config(tmp_path: Path, cfg: TrainConfig) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(cfg.to_yaml())
    return path


def test_preflight_hashes_shards_and_exits_93_naming_a_corrupt_one(tmp_path, capsys):
    from workloads.train import main

    root = _prepared(tmp_path)
    victim = root / read_manifest(root)["shards"][0]["file"]
    data = bytearray(victim.read_bytes())
    data[100] ^= 0x01  # same size: only the digest can tell
    victim.write_bytes(bytes(data))
    cfg = TrainConfig.from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "checkpoint": {"backend": "none"},
            "data": {"source": "memmap", "path": str(root)},
        }
    )
    code = main(["--config", str(_write_config(tmp_path, cfg)), "--preflight", "--world-size", "2"])
    assert code == EXIT_DO_NOT_REQUEUE
    assert f"shard {victim} does not match its sha256" in capsys.readouterr().err


@mock_aws
def test_upload_puts_shards_then_manifest_in_the_data_prefix_and_prints_the_pod_path(tmp_path):
    root = _prepared(tmp_path)
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="nvrx-data")
    result = run_cli("data", "upload", str(root), "s3://nvrx-data/data/corpus-v1")
    assert result.code == 0, result.stderr
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="nvrx-data")["Contents"])
    names = [s["file"] for s in read_manifest(root)["shards"]] + [MANIFEST_NAME]
    assert keys == sorted(f"data/corpus-v1/{n}" for n in names)
    body = s3.get_object(Bucket="nvrx-data", Key=f"data/corpus-v1/{names[0]}")["Body"].read()
    assert body == (root / names[0]).read_bytes()
    assert "in the pods: /fsx/s3/corpus-v1" in result.stdout


@mock_aws
def test_upload_outside_the_associated_prefix_is_refused(tmp_path):
    root = _prepared(tmp_path)
    result = run_cli("data", "upload", str(root), "s3://nvrx-data/elsewhere/corpus")
    assert result.code == 2
    assert "fsx.data_bucket_prefix" in result.stderr and "s3://BUCKET/data/NAME" in result.stderr


def test_upload_without_credentials_exits_2_with_one_line(tmp_path, no_credentials):
    root = _prepared(tmp_path)
    result = run_cli("data", "upload", str(root), "s3://nvrx-data/data/corpus")
    assert result.code == 2 and "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "no AWS credentials found while uploading" in line and "aws configure sso" in line


@mock_aws
def test_upload_to_a_bucket_that_does_not_exist_exits_2_naming_it(tmp_path):
    root = _prepared(tmp_path)
    result = run_cli("data", "upload", str(root), "s3://no-such-bucket/data/corpus")
    assert result.code == 2 and "Traceback" not in result.stderr
    assert "NoSuchBucket" in result.stderr and "s3://no-such-bucket/data/corpus/" in result.stderr


@mock_aws
def test_prepare_with_upload_puts_the_finished_set_in_the_bucket(tmp_path):
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="nvrx-data")
    inputs = stdlib_text(60_000)
    result = prepare_cli(inputs, tmp_path / "out", "byte", "--upload", "s3://nvrx-data/data/small")
    assert result.code == 0, result.stderr
    listed = boto3.client("s3", region_name="us-east-1").list_objects_v2(Bucket="nvrx-data", Prefix="data/small/")
    assert f"data/small/{MANIFEST_NAME}" in {o["Key"] for o in listed["Contents"]}
    assert "in the pods: /fsx/s3/small" in result.stdout


def test_an_interrupted_prepare_is_resumed_by_the_cli(tmp_path):
    inputs = stdlib_text(2_000_000)
    shards = tmp_path / "shards"
    with pytest.raises(KeyboardInterrupt):
        prepare(inputs, shards, "byte", shard_tokens=400_000, stop_after_shards=2)
    result = run_cli(
        "data", "prepare", *map(str, inputs), "--out", str(shards), "--tokenizer", "byte", "--shard-tokens", "400000"
    )
    assert result.code == 0 and "after 2 completed shard(s)" in result.stdout, result.stderr
    assert read_manifest(shards)["complete"]
