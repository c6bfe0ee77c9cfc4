"""Evaluation on held-out tokens, inside the run: every `eval.interval_steps` steps and at the last
step, all ranks run the model forward without gradients over one fixed set of held-out sequences
(workloads.data.held_out_sequences) and agree on its mean per-token loss with one all-reduce.

The set is the same at every evaluation and for every world size: sequence i goes to rank
i mod world. FSDP2 gathers parameters in every forward, so every rank must run as many forwards
as the others: a rank whose share ends early runs its last ones on a placeholder sequence whose
loss counts zero.

Evaluation leaves training exactly as it was: no gradients, no optimizer or scheduler step, no
draw from any random generator the training reads (the held-out synthetic stream has its own
seed), and the data loader's position untouched; so a run's state digest is the same with and
without it. Its time is `eval_end.eval_s`, its own part of the goodput split (workloads.goodput).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from workloads.config import TrainConfig
from workloads.data import has_held_out_split, held_out_sequences
from workloads.events import EventLog

log = logging.getLogger("workloads.train")


def evaluation_enabled(cfg: TrainConfig) -> bool:
    """eval.enabled, or when unset: whether data.path holds a held-out split."""
    return cfg.eval.enabled if cfg.eval.enabled is not None else has_held_out_split(cfg.data)


@dataclass(frozen=True)
class _Batch:
    tokens: torch.Tensor  # [rows, seq_len + 1]
    counted: bool  # False: a placeholder that keeps this rank's forwards in step with the others


class HeldOutShare:
    """One rank's forwards over the held-out set of a config (sequence i on rank i mod world)."""

    def __init__(self, cfg: TrainConfig, rank: int, world: int):
        held_out = held_out_sequences(cfg.data, cfg.model.shape.vocab_size, cfg.seed, cfg.eval.sequences)
        self.sequences = len(held_out)
        self.tokens = self.sequences * cfg.data.seq_len
        batch = cfg.data.batch_size
        mine = held_out[rank::world]
        forwards = max(1, math.ceil(math.ceil(self.sequences / world) / batch))
        self.batches: list[_Batch] = []
        for index in range(forwards):
            rows = mine[index * batch : (index + 1) * batch]
            counted = len(rows) > 0
            tokens = np.ascontiguousarray(rows if counted else held_out[:1])
            self.batches.append(_Batch(torch.from_numpy(tokens), counted))

    def mean_loss(self, model: torch.nn.Module, device: torch.device, ping: Callable[[], None]) -> float:
        """The mean per-token loss over the whole set: this rank's share, summed over the ranks
        when a process group is up (without one, this process holds the whole set)."""
        was_training = model.training
        model.eval()
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        try:
            with torch.no_grad():
                for batch in self.batches:
                    tokens = batch.tokens.to(device)
                    # The model returns the mean over the batch's tokens; the sum is what adds up
                    # across batches and ranks.
                    mean = model(tokens[:, :-1], tokens[:, 1:])
                    if batch.counted:
                        loss_sum += mean.double() * tokens[:, 1:].numel()
                    ping()
        finally:
            model.train(was_training)
        if dist.is_initialized():
            dist.all_reduce(loss_sum)
        return float(loss_sum.item()) / self.tokens


class Evaluator:
    """Owns when to evaluate and how; the training loop calls maybe_evaluate(step) after each step."""

    def __init__(
        self,
        cfg: TrainConfig,
        model: torch.nn.Module,
        device: torch.device,
        rank: int,
        world: int,
        *,
        events: EventLog,
        section: Callable[[str], AbstractContextManager[Any]],
        ping: Callable[[], None],
    ):
        self.cfg, self.model, self.device = cfg, model, device
        self.events, self.section, self.ping = events, section, ping
        self.rank = rank
        self.share = HeldOutShare(cfg, rank, world) if evaluation_enabled(cfg) else None

    def due(self, step: int) -> bool:
        return self.share is not None and (step % self.cfg.eval.interval_steps == 0 or step == self.cfg.steps)

    def maybe_evaluate(self, step: int, *, stopping: bool) -> float | None:
        """Evaluate if `step` is due (not on the way out after a stop request): the loss, or None."""
        if self.share is None or stopping or not self.due(step):
            return None
        started = time.monotonic()
        # The launcher knows the sections setup, step and checkpointing; a forward-only pass over
        # a bounded set is timed like a step.
        with self.section("step"):
            loss = self.share.mean_loss(self.model, self.device, self.ping)
        eval_s = time.monotonic() - started
        self.events.emit(
            "eval_end", step=step, loss=loss, eval_s=eval_s, sequences=self.share.sequences, tokens=self.share.tokens
        )
        if self.rank == 0:  # the form nvrx_eks.facts.training_metrics.METRICS_LINE reads back
            log.info(
                "eval step %d loss %.4f over %d held-out sequences (%.2fs)", step, loss, self.share.sequences, eval_s
            )
        return loss
