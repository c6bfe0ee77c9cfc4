"""The evaluator's share of the held-out set per rank, and the goodput split's evaluation part."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workloads.config import TrainConfig
from workloads.data import build_batches, held_out_sequences
from workloads.evaluation import Evaluator, HeldOutShare, evaluation_enabled
from workloads.goodput import split_wall_time


def evaluator(cfg: TrainConfig) -> Evaluator:
    # The model, events and section are used when evaluating, not when deciding when to.
    return Evaluator(cfg, None, torch.device("cpu"), 0, 1, events=None, section=None, ping=lambda: None)  # type: ignore[arg-type]


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_every_world_size_evaluates_the_same_sequences_with_as_many_forwards_on_each_rank(world):
    cfg = TrainConfig.from_dict({"eval": {"enabled": True, "sequences": 11}, "data": {"batch_size": 2}})
    expected = held_out_sequences(cfg.data, cfg.model.shape.vocab_size, cfg.seed, 11)
    ranks = [HeldOutShare(cfg, rank, world) for rank in range(world)]
    assert len({len(r.batches) for r in ranks}) == 1
    counted = np.concatenate([b.tokens.numpy() for r in ranks for b in r.batches if b.counted])
    assert sorted(map(bytes, counted.astype(np.int64))) == sorted(map(bytes, expected))
    assert all(r.tokens == 11 * cfg.data.seq_len for r in ranks)


def test_held_out_synthetic_sequences_are_not_the_training_stream():
    cfg = TrainConfig.from_dict({"eval": {"enabled": True}})
    training = build_batches(cfg.data, 0, 1, cfg.model.shape.vocab_size, cfg.seed)._sequences(np.arange(64))
    held_out = held_out_sequences(cfg.data, cfg.model.shape.vocab_size, cfg.seed, 64)
    assert not {bytes(r) for r in training} & {bytes(r) for r in held_out}


def test_evaluation_is_off_by_default_on_synthetic_data_and_due_at_intervals_and_the_last_step():
    assert not evaluation_enabled(TrainConfig.from_dict({}))
    cfg = TrainConfig.from_dict({"steps": 25, "eval": {"enabled": True, "interval_steps": 10}})
    assert [s for s in range(1, 26) if evaluator(cfg).due(s)] == [10, 20, 25]
    assert not evaluator(TrainConfig.from_dict({"steps": 25})).due(10)


def test_evaluation_time_is_taken_out_of_other_time():
    split = split_wall_time(
        wall_s=100.0,
        step_ends=[{"step": 1, "step_s": 30.0}, {"step": 2, "step_s": 30.0}],
        stalls_s=[5.0],
        recovery_s=0.0,
        evals_s=[4.0, 6.0],
    )
    assert (split.productive_s, split.eval_s, split.other_s) == (60.0, 10.0, 25.0)
