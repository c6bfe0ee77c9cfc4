"""Token batches with a checkpointable position.

Both sources address the data by a global sequence index, and the loader's position is (epoch,
cursor): the number of sequences all ranks together have consumed in the current epoch.
Step s of rank r reads sequences [cursor + r*B, cursor + (r+1)*B), then every rank advances the
cursor by world_size*B. Restoring (epoch, cursor) therefore resumes exactly at the next unread
batch, and a batch never depends on how many restarts happened before it. The state also records
what the data is (the epoch's length and a digest of the data set's identity), and a resume onto
other data is refused naming data.path: the position would index into different sequences.

* synthetic: an endless deterministic stream from a fixed sparse Markov chain (each token has 4
  likely successors), so a model can really learn it: loss falls from ln(vocab) toward ~ln(4).
  Sequence i is generated from a generator seeded by (seed, i).
* memmap: pre-tokenized shards (flat uint16/uint32 `.bin` token arrays, e.g. on FSx, written by
  `nvrx-eks data prepare` with a manifest checked at start-up: workloads.shards), read
  through np.memmap as windows of seq_len+1 tokens. Each epoch visits all windows in an order
  given by an affine permutation i -> (a*i + b) mod N with gcd(a, N) = 1, chosen from
  (seed, epoch): a full shuffle in O(1) memory, whatever the dataset size.

Held-out sequences for evaluation (workloads.evaluation) come from the same two sources, never
from the training data: synthetic sequences drawn from another seed stream of the same chain, or
the held-out shards `nvrx-eks data prepare --eval-fraction` lists under the manifest's `eval`,
read in order (held_out_sequences).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nvrx_eks.facts.errors import ConfigError
from workloads.config import DataConfig
from workloads.shards import check_shard_set, read_manifest, shard_files

_SUCCESSORS = 4
#: Seed streams of synthetic sequences: training, and the held-out sequences of evaluation.
_TRAIN_STREAM = 0x5EED
_HELD_OUT_STREAM = 0xE7A1


class TokenBatches:
    """Base: cursor bookkeeping and the state_dict protocol DCP calls."""

    #: State keys a checkpoint written before they existed lacks: the Checkpointer loads them as
    #: None and warns (see load_state_dict).
    optional_state_keys = ("dataset_sha256",)

    def __init__(self, cfg: DataConfig, rank: int, world_size: int, vocab_size: int, seed: int):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.vocab_size, self.seed = vocab_size, seed
        self.epoch = 0
        self.cursor = 0

    def _sequences(self, indices: np.ndarray) -> np.ndarray:  # [n, seq_len + 1] int64
        raise NotImplementedError

    def _epoch_length(self) -> int | None:  # None: endless
        return None

    def dataset_sha256(self) -> str:
        raise NotImplementedError

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        per_step = self.world_size * self.cfg.batch_size
        length = self._epoch_length()
        if length is not None and self.cursor + per_step > length:
            self.epoch, self.cursor = self.epoch + 1, 0
        start = self.cursor + self.rank * self.cfg.batch_size
        tokens = self._sequences(np.arange(start, start + self.cfg.batch_size))
        self.cursor += per_step
        if int(tokens.max()) >= self.vocab_size:
            raise ConfigError(
                f"data.path: token id {int(tokens.max())} is outside the model's "
                f"vocabulary ({self.vocab_size}); check data.dtype and model.vocab_size"
            )
        batch = torch.from_numpy(tokens)
        return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()

    def state_dict(self) -> dict[str, int | str]:
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "epoch_length": self._epoch_length() or 0,
            "dataset_sha256": self.dataset_sha256(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["epoch_length"]) != (self._epoch_length() or 0):
            raise ConfigError(
                f"data.path: the dataset has {self._epoch_length() or 0} windows but the "
                f"checkpoint was taken with {state['epoch_length']}; resume with the same data"
            )
        recorded = state.get("dataset_sha256")
        # None: a checkpoint written before the digest was recorded. Its data is unknown, not
        # different: refusing it would strand every run that predates the digest, so it loads
        # as it did then, and the Checkpointer warns that the data could not be compared.
        if recorded is not None and recorded != self.dataset_sha256():
            raise ConfigError(
                f"data.path: the data set differs from the one the checkpoint was trained on "
                f"(digest {str(recorded)[:16]}..., this one {self.dataset_sha256()[:16]}...), though "
                "it has as many windows; resume with the same data, or point checkpoint.dir at an "
                "empty directory to train on this data from the start"
            )
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])


class SyntheticTokens(TokenBatches):
    def __init__(
        self, cfg: DataConfig, rank: int, world_size: int, vocab_size: int, seed: int, stream: int = _TRAIN_STREAM
    ):
        super().__init__(cfg, rank, world_size, vocab_size, seed)
        self.stream = stream
        chain = np.random.default_rng([seed, 0xC4A1])
        self.successors = chain.integers(0, vocab_size, size=(vocab_size, _SUCCESSORS))
        self.weights = chain.dirichlet(np.ones(_SUCCESSORS), size=vocab_size).cumsum(axis=1)

    def dataset_sha256(self) -> str:
        # The stream is fixed by the seed and the vocabulary; the preset (the vocabulary) is
        # checked by the checkpoint's identity.
        return hashlib.sha256(b"synthetic").hexdigest()

    def _sequences(self, indices: np.ndarray) -> np.ndarray:
        out = np.empty((len(indices), self.cfg.seq_len + 1), dtype=np.int64)
        for row, index in enumerate(indices):
            rng = np.random.default_rng([self.seed, self.stream, int(index)])
            draws = rng.random(self.cfg.seq_len)
            token = int(rng.integers(0, self.vocab_size))
            out[row, 0] = token
            for t in range(self.cfg.seq_len):
                choice = int(np.searchsorted(self.weights[token], draws[t]))
                token = int(self.successors[token, min(choice, _SUCCESSORS - 1)])
                out[row, t + 1] = token
        return out


class ShardWindows:
    """Shards read as windows of seq_len + 1 tokens, window i of a shard starting at token
    i * seq_len (consecutive windows share one token: the last target of one is the first input
    of the next), numbered across the shards in order."""

    def __init__(self, files: list[Path], dtype: str, seq_len: int):
        self.seq_len = seq_len
        self.shards = [np.memmap(f, dtype=np.dtype(dtype), mode="r") for f in files]
        counts = [max(0, (len(s) - 1) // seq_len) for s in self.shards]
        self.offsets = np.cumsum([0] + counts)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def read(self, windows: list[int]) -> np.ndarray:  # [n, seq_len + 1] int64
        out = np.empty((len(windows), self.seq_len + 1), dtype=np.int64)
        for row, window in enumerate(windows):
            shard = int(np.searchsorted(self.offsets, window, side="right") - 1)
            start = (window - int(self.offsets[shard])) * self.seq_len
            out[row] = self.shards[shard][start : start + self.seq_len + 1]
        return out


class MemmapTokens(TokenBatches):
    def __init__(self, cfg: DataConfig, rank: int, world_size: int, vocab_size: int, seed: int):
        super().__init__(cfg, rank, world_size, vocab_size, seed)
        files, dtype = shard_files(cfg, vocab_size)
        self._dataset_sha256 = memmap_dataset_sha256(Path(cfg.path or ""), files, dtype)
        self.windows = ShardWindows(files, dtype, cfg.seq_len)
        if len(self.windows) < world_size * cfg.batch_size:
            raise ConfigError(
                f"data.path: {len(self.windows)} windows of {cfg.seq_len} tokens cannot "
                f"fill one step of {world_size}x{cfg.batch_size} sequences"
            )

    def _epoch_length(self) -> int:
        return len(self.windows)

    def dataset_sha256(self) -> str:
        return self._dataset_sha256

    def _permuted(self, index: int) -> int:
        n = self._epoch_length()
        digest = hashlib.sha256(f"{self.seed}:{self.epoch}".encode()).digest()
        a = int.from_bytes(digest[:8], "little") % n or 1
        while math.gcd(a, n) != 1:
            a = a % n + 1
        b = int.from_bytes(digest[8:16], "little") % n
        return (a * index + b) % n

    def _sequences(self, indices: np.ndarray) -> np.ndarray:
        return self.windows.read([self._permuted(int(index)) for index in indices])


def memmap_dataset_sha256(root: Path, files: list[Path], dtype: str) -> str:
    """What a shard set is, as one digest: from the manifest of `nvrx-eks data prepare`, the
    tokenizer and every shard's SHA-256 (the contents, wherever the set was copied to); for
    hand-made shards without one, their names and sizes (hashing their contents at every start
    would read the whole data set, so same-named shards of the same size pass)."""
    manifest = read_manifest(root) if root.is_dir() else None
    if manifest is not None:
        identity: dict[str, Any] = {
            "tokenizer": manifest.get("tokenizer_sha256") or manifest.get("tokenizer"),
            "dtype": dtype,
            "shards": [shard["sha256"] for shard in manifest["shards"]],
        }
    else:
        identity = {"dtype": dtype, "shards": [[f.name, f.stat().st_size] for f in files]}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def build_batches(cfg: DataConfig, rank: int, world_size: int, vocab_size: int, seed: int) -> TokenBatches:
    cls = MemmapTokens if cfg.source == "memmap" else SyntheticTokens
    return cls(cfg, rank, world_size, vocab_size, seed)


def has_held_out_split(cfg: DataConfig) -> bool:
    """Whether data.path is a shard set prepared with a held-out split (`--eval-fraction`)."""
    root = Path(cfg.path or "")
    if cfg.source != "memmap" or not root.is_dir():
        return False
    manifest = read_manifest(root)
    return manifest is not None and bool(manifest.get("eval", {}).get("shards"))


def held_out_sequences(cfg: DataConfig, vocab_size: int, seed: int, count: int) -> np.ndarray:
    """The first `count` held-out sequences, [n, seq_len + 1] int64 with n <= count: the same ones
    at every call, whatever the world size. Memmap data without a held-out split is refused naming
    the fix."""
    if cfg.source == "synthetic":
        stream = SyntheticTokens(cfg, 0, 1, vocab_size, seed, stream=_HELD_OUT_STREAM)
        return stream._sequences(np.arange(count))
    root = Path(cfg.path or "")
    manifest = read_manifest(root) if root.is_dir() else None
    if manifest is None or not manifest.get("eval", {}).get("shards"):
        raise ConfigError(
            f"eval.enabled: {root} holds no held-out split; prepare it with `nvrx-eks data prepare "
            "--eval-fraction 0.01`, or set eval.enabled=false"
        )
    dtype = cfg.dtype or manifest["dtype"]
    held_out = {**manifest, "shards": manifest["eval"]["shards"]}
    files, _ = check_shard_set(root, held_out, vocab_size=vocab_size, dtype=dtype)
    windows = ShardWindows(files, dtype, cfg.seq_len)
    if len(windows) == 0:
        raise ConfigError(
            f"eval.enabled: the held-out split of {root} holds {manifest['eval']['total_tokens']} tokens, less "
            f"than one sequence of data.seq_len + 1 = {cfg.seq_len + 1}; prepare with a larger --eval-fraction"
        )
    return windows.read(list(range(min(count, len(windows)))))


def batch_fingerprint(inputs: torch.Tensor) -> str:
    return hashlib.sha256(inputs.numpy().tobytes()).hexdigest()[:16]
