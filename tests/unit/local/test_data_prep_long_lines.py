"""`data prepare` keeps memory bounded whatever the length of a line: a line is read and given to
the tokenizer in pieces of at most PIECE_CHARS characters, cut where a byte-level BPE tokenizer
starts a new pre-token anyway, so the shards are exactly what tokenizing whole lines gives; a
JSONL record, parsed whole, is bounded and refused past the bound. Hostile JSONL ends in exit 2
naming the line. (benchmarks/data-prepare-memory measures the memory itself.)"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import random
from pathlib import Path

import numpy as np
import pytest

from nvrx_eks.data import prepare as prepare_module
from nvrx_eks.data.prepare import prepare
from tests.unit.local.test_data_prep import prepare_cli, shard_tokens
from workloads.shards import read_manifest

#: A piece bound small enough that ordinary test text spans many pieces.
PIECE = 1000


@pytest.fixture
def small_pieces(monkeypatch) -> list[str]:
    """PIECE_CHARS set to PIECE; returns every piece the tokenizer is given, in order."""
    monkeypatch.setattr(prepare_module, "PIECE_CHARS", PIECE)
    given: list[str] = []
    load = prepare_module.load_tokenizer

    def recording(spec: str) -> prepare_module.Tokenizer:
        tok = load(spec)

        def encode(text: str) -> list[int]:
            given.append(text)
            return tok.encode(text)

        return dataclasses.replace(tok, encode=encode)

    monkeypatch.setattr(prepare_module, "load_tokenizer", recording)
    return given


def _long_line(rng: random.Random, chars: int) -> str:
    """Words and runs of spaces and tabs, one word far longer than a piece, no line break."""
    words: list[str] = []
    length = 0
    while length < chars:
        words.append("".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 12))))
        words.append(rng.choice([" ", " ", "  ", "\t", " \t "]))
        length += len(words[-2]) + len(words[-1])
    words.insert(len(words) // 2, "x" * (5 * PIECE))
    return "".join(words)


def test_a_line_far_longer_than_a_piece_is_tokenized_in_bounded_pieces_byte_exact(tmp_path, small_pieces):
    line = _long_line(random.Random(7), 300_000) + "é☃"  # multi-byte characters at the end
    corpus = tmp_path / "one-line.txt.gz"
    corpus.write_bytes(gzip.compress(line.encode()))
    result = prepare_cli([corpus], tmp_path / "out", "byte", "--shard-tokens", "65536")
    assert result.code == 0, result.stderr
    assert max(map(len, small_pieces)) <= PIECE and len(small_pieces) > 300_000 // PIECE
    assert "".join(small_pieces) == line
    manifest = read_manifest(tmp_path / "out")
    assert shard_tokens(tmp_path / "out", manifest).astype(np.uint8).tobytes() == line.encode()
    # The word of 5 pieces' length is cut at the bound: no space to cut before.
    assert sum(piece == "x" * PIECE for piece in small_pieces) >= 3


def _byte_level_bpe(tmp_path: Path, text: str) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<|endoftext|>"]))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_bpe_tokens_of_the_pieces_are_the_whole_lines(tmp_path, small_pieces):
    """Cut before a run of spaces that follows a word: GPT-2-style pre-tokenizers start a
    pre-token there, so the ids are those of the whole line, as a JSONL document and in lines."""
    from tokenizers import Tokenizer

    rng = random.Random(11)
    lines = [" ".join(_long_line(rng, 20_000).split("x" * (5 * PIECE))) + "\n" for _ in range(3)]
    tok_path = _byte_level_bpe(tmp_path, "".join(lines))
    whole = Tokenizer.from_file(str(tok_path))
    (text := tmp_path / "lines.txt").write_text("".join(lines))
    assert prepare_cli([text], tmp_path / "out", str(tok_path)).code == 0
    expected = [i for line in lines for i in whole.encode(line).ids]
    assert shard_tokens(tmp_path / "out", read_manifest(tmp_path / "out")).tolist() == expected
    assert max(map(len, small_pieces)) <= PIECE + 1 and len(small_pieces) > 60
    small_pieces.clear()
    (records := tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    assert prepare_cli([records], tmp_path / "docs", str(tok_path)).code == 0
    eod = whole.token_to_id("<|endoftext|>")
    expected = [i for line in lines for i in [*whole.encode(line).ids, eod]]
    assert shard_tokens(tmp_path / "docs", read_manifest(tmp_path / "docs")).tolist() == expected
    assert max(map(len, small_pieces)) <= PIECE + 1


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 64])
def test_units_are_the_lines_of_universal_newlines_whatever_the_piece_bound(tmp_path, monkeypatch, limit):
    """The held-out split and the resume position count units: a line cut into pieces (the
    bound falling inside a CRLF too) stays one unit, so they do not depend on the bound."""
    rng = random.Random(limit)
    text = "".join(rng.choice(["a", "b", " ", "\t", "\r", "\n", "\r\n", "é"]) for _ in range(5000))
    path = tmp_path / "mixed.txt"
    path.write_bytes(text.encode())
    monkeypatch.setattr(prepare_module, "PIECE_CHARS", limit)
    units: dict[int, str] = {}
    for unit, piece, ends_document in prepare_module._units(path, "text", lambda n: None):
        assert not ends_document and len(piece.rstrip("\r\n")) <= limit
        units[unit] = units.get(unit, "") + piece
    assert list(units) == list(range(len(units)))
    assert list(units.values()) == list(io.TextIOWrapper(io.BytesIO(text.encode()), newline=""))


def test_an_interruption_inside_a_long_line_resumes_to_the_same_shards(tmp_path, small_pieces):
    # Units 1, 4 and 5 are held out at 0.5 (prepare.held_out): long lines in both splits.
    lines = [_long_line(random.Random(seed), 15_000) + "\n" for seed in range(6)]
    (text := tmp_path / "long.txt").write_text("".join(lines))
    split = {"shard_tokens": 7_000, "eval_fraction": 0.5}
    whole = prepare([text], tmp_path / "whole", "byte", **split)
    with pytest.raises(KeyboardInterrupt):
        prepare([text], tmp_path / "cut", "byte", **split, stop_after_shards=5)
    cut = read_manifest(tmp_path / "cut")
    # Both splits stopped inside a line of many pieces.
    assert min(cut["resume"]["offset"], cut["eval"]["resume"]["offset"]) > 0
    resumed = prepare([text], tmp_path / "cut", "byte", **split)
    assert [s["sha256"] for s in resumed["shards"]] == [s["sha256"] for s in whole["shards"]]
    assert [s["sha256"] for s in resumed["eval"]["shards"]] == [s["sha256"] for s in whole["eval"]["shards"]]


def test_a_jsonl_record_longer_than_the_bound_is_refused_after_reading_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_module, "MAX_RECORD_CHARS", 50_000)
    records = tmp_path / "docs.jsonl.gz"
    records.write_bytes(
        gzip.compress((json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": "a" * 200_000}) + "\n").encode())
    )
    result = prepare_cli([records], tmp_path / "out", "byte")
    assert result.code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert f"{records}:2 is a JSONL record longer than 50,000 characters" in " ".join(line.split())


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        (
            '{"text": "x", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}",
            "it nests arrays or objects deeper than Python can parse",
        ),
        ('{"text": "x", "n": 1' + "0" * 5000 + "}", "it holds an integer longer than 4300 digits"),
    ],
    ids=["nested 100k deep", "5000-digit integer"],
)
def test_hostile_jsonl_records_exit_2_naming_the_line(tmp_path, record, problem):
    records = tmp_path / "docs.jsonl"
    records.write_text(json.dumps({"text": "fine"}) + "\n" + record + "\n")
    result = prepare_cli([records], tmp_path / "out", "byte")
    assert result.code == 2, result.output
    assert "Traceback" not in result.output
    assert f"INPUT: {records}:2 is not a JSON object Python can read ({problem});" in " ".join(result.stderr.split())


def test_a_lone_surrogate_in_jsonl_becomes_a_replacement_character(tmp_path):
    """JSON can escape a lone UTF-16 surrogate, which UTF-8 cannot encode: it becomes U+FFFD, as
    undecodable bytes of a text file do."""
    records = tmp_path / "docs.jsonl"
    records.write_text('{"text": "a\\ud800b"}\n')
    result = prepare_cli([records], tmp_path / "out", "byte")
    assert result.code == 0, result.output
    tokens = shard_tokens(tmp_path / "out", read_manifest(tmp_path / "out"))
    assert tokens.astype(np.uint8).tobytes() == "a\ufffdb\n".encode()
