"""What a step's all-reduce result can be trusted with, and what a non-finite loss means.

Every rank adds its own flag, "my local loss is not finite", to the step's one all-reduce
(Trainer.train_step); the reduced count says who computed it, and every rank decides alike:

  no rank       a non-finite reduced loss is what an aborted collective left in the buffer: a
                fault, restarted from the last checkpoint (InvalidStepResult).
  some ranks    a hardware fault on their node(s): a GPU (or its memory or NVLink) that computes
                NaN while its peers, on the same parameters, do not. Those ranks take their node
                out of the job for a healthy one (workloads.node_exit; event `nonfinite_rank`),
                the others restart from the last checkpoint. It must be told at this first step:
                FSDP's reduce-scatter has already spread the faulty rank's gradients into every
                rank's shard, so from the next step on every loss would be NaN.
  every rank    the run diverging, once it repeats: the same step's loss not finite again after
                restarting from the checkpoint (which replays the same data from the same state)
                is no fault a restart fixes. ConfigError: exit 93, naming the fix.

One case looks like hardware and is not: the same rank's loss non-finite at the same step again
on the node that replaced the one that left (an earlier `nonfinite_rank` of this submission in
the run's event log, workloads.repeated_failure). That rank's data at that step, not its GPU:
also divergence, exit 93, instead of replacing node after node.

A GPU whose NaN appears only in backward (finite loss, non-finite gradients) is not told apart:
the reduce-scatter mixes every rank's gradients before any rank sees them. The next step's losses
are then non-finite on every rank, and the run is taken for diverging.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from nvrx_eks.facts.errors import ConfigError
from workloads.repeated_failure import submission_events

if TYPE_CHECKING:
    from workloads.process_state import ProcessState

log = logging.getLogger("workloads.train")

DIVERGENCE_FIX = (
    "resume from an earlier checkpoint with a lower optimizer.lr (or a longer optimizer.warmup_steps, or "
    "optimizer.grad_clip)"
)


class InvalidStepResult(RuntimeError):
    """The step's result is no state to continue from: an all-reduce that returned what no rank
    sent, or a non-finite loss. A fault, which the in-process layer restarts from the last
    checkpoint like any other."""


def check_votes(step: int, world: int, **votes: float) -> None:
    """Each count of the step's all-reduce is a whole number of ranks in [0, world]: an NCCL
    communicator aborted under the collective (by NVRx's abort, or on its own with
    TORCH_NCCL_ASYNC_ERROR_HANDLING=2) leaves whatever was in the buffer, and the step would
    finish on it before the abort's exception arrives (NVRx's usage guide: a few more bytecodes
    may run first)."""
    for name, count in votes.items():
        if not (0 <= count <= world and count == int(count)):
            raise InvalidStepResult(f"step {step}: {count!r} {name} votes from {world} ranks")


def check_loss(
    process: ProcessState, step: int, loss_sum: float, nonfinite_ranks: int, world: int, mine: Callable[[], bool]
) -> None:
    """Return when the step's loss is finite everywhere; otherwise decide as the module says.
    `mine()` is this rank's own flag (a host sync: asked only on this path)."""
    if nonfinite_ranks == 0 and math.isfinite(loss_sum):
        return
    if nonfinite_ranks == 0 or math.isfinite(loss_sum):
        raise InvalidStepResult(f"step {step}: the loss summed over the ranks is {loss_sum}")
    if nonfinite_ranks < world:
        if mine():
            _leave_with_faulty_node(process, step, nonfinite_ranks, world)
        raise InvalidStepResult(
            f"step {step}: the loss is not finite on {nonfinite_ranks} of {world} ranks, finite on this one: "
            "their node leaves the job for replacement"
        )
    if process.non_finite_loss_step == step:
        raise ConfigError(
            f"training diverged: the loss is {loss_sum} at step {step} again, on every rank, after restarting "
            f"from the last checkpoint; {DIVERGENCE_FIX}"
        )
    process.non_finite_loss_step = step
    raise InvalidStepResult(f"step {step}: the loss is not finite on every rank ({loss_sum})")


def _leave_with_faulty_node(process: ProcessState, step: int, nonfinite_ranks: int, world: int) -> None:
    """This rank computed the non-finite loss its peers did not: take its node out (never returns),
    unless the node that held this rank before already did so at this same step."""
    from workloads.node_exit import leave_with_node

    events = process.events
    seen = submission_events(process.cfg.run_dir, {process.rank, events.rank}, "nonfinite_rank")
    if [r for r in seen if r.get("rank") == events.rank and r.get("step") == step]:
        raise ConfigError(
            f"training diverged: rank {events.rank}'s loss is not finite at step {step} again on the node that "
            f"replaced the one which computed it first: its data at that step, not a GPU; {DIVERGENCE_FIX}"
        )
    node = events.rank // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    events.emit("nonfinite_rank", step=step, node=node, nonfinite_ranks=nonfinite_ranks, world_size=world)
    log.error(
        "step %d: this rank's loss is not finite, %d of %d ranks: a hardware fault; node %d leaves the job "
        "for replacement",
        step,
        nonfinite_ranks,
        world,
        node,
    )
    leave_with_node()
