"""The gloo group each checkpoint component opens beside the run's default group (dcp-async's
writer, the local tier's replica exchange): their collectives run in writer threads, or during a
restore, while the training thread uses the default group.

Bounded: a group made without a timeout gets torch's default for gloo, 30 minutes, and a rank
blocked in one of its collectives for longer than the in-process layer waits is killed by the
hard timeout, which turns an in-process restart into a launcher restart. The bound is the one a
save already has, checkpoint.finalize_timeout_s: these groups carry checkpoint data, whose
transfer a shorter bound would cut (a 6 GB replica, a writer's gather that waits for the
slowest rank's files). At a restart the in-process abort releases them at once on any backend
(workloads.inprocess.abort_chain)."""

from __future__ import annotations

import datetime

import torch.distributed as dist


def checkpoint_gloo_group(timeout_s: float) -> dist.ProcessGroup:
    """A gloo group of every rank whose collectives give up after `timeout_s`. Collective."""
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    assert group is not None  # every rank is a member
    return group
