"""What a step trusts from its one all-reduce (the loss and the stop/save votes), and the GPU-only
helpers of a step and of its iteration: pinned non-blocking token copies, the per-iteration
memory high-water mark, the attention kernel recorded at setup."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist

from tests.support.trainer_fixtures import single_rank_env
from workloads.config import TrainConfig
from workloads.device import Runtime


def _one_rank_config(tmp_path, monkeypatch, steps: int) -> TrainConfig:
    """A run of one rank in this process (gloo, no in-process layer, no checkpoints) and the
    environment ft_launcher would give it."""
    single_rank_env(monkeypatch)
    return TrainConfig.from_dict(
        {},
        "x",
        [
            f"run_dir={tmp_path}",
            f"steps={steps}",
            "distributed.backend=gloo",
            "inprocess.enabled=false",
            "checkpoint.backend=none",
        ],
    )


def _overwrite_step_reduces(monkeypatch, overwrite) -> None:
    """Hand each result of the step's all-reduce ([loss, stop, save, non-finite ranks]), with how
    many there were so far, to `overwrite(count, tensor)`: as an aborted collective leaves its
    buffer."""
    import workloads.trainer as trainer_module

    real = dist.all_reduce
    count = 0

    def all_reduce(tensor, *args, **kwargs):
        nonlocal count
        work = real(tensor, *args, **kwargs)
        if tensor.numel() == 4:
            count += 1
            overwrite(count, tensor)
        return work

    monkeypatch.setattr(trainer_module.dist, "all_reduce", all_reduce)


@pytest.mark.parametrize(
    ("garbage", "message"),
    [
        ((None, 7.0, 0.0, None), "7.0 stop votes from 1 ranks"),
        ((None, 0.0, 0.5, None), "0.5 save votes"),
        ((None, 0.0, 0.0, -1.0), "-1.0 nonfinite votes"),
        ((math.nan, 0, 0, 0), "nan"),
    ],
    ids=["stop-votes-above-world", "fractional-save-votes", "negative-nonfinite-count", "nan-loss-no-rank-flagged"],
)
def test_a_step_whose_all_reduce_returns_what_no_rank_sent_raises(tmp_path, monkeypatch, garbage, message):
    """As after an NCCL abort under the step's all-reduce: the buffer holds what it holds, and
    the step must not finish on it (no step_end, no stop, no save)."""
    from workloads.events import load_run
    from workloads.nonfinite import InvalidStepResult
    from workloads.process_state import ProcessState
    from workloads.train import train_attempt

    bad_step = 3
    cfg = _one_rank_config(tmp_path, monkeypatch, steps=5)

    def aborted_at_bad_step(count, tensor):
        if count == bad_step:
            for index, value in enumerate(garbage):
                if value is not None:
                    tensor[index] = value

    _overwrite_step_reduces(monkeypatch, aborted_at_bad_step)
    with pytest.raises(InvalidStepResult, match=f"step {bad_step}: .*{message}"):
        train_attempt(ProcessState(cfg, 0, 1, None))
    if dist.is_initialized():
        dist.destroy_process_group()
    run = load_run(tmp_path)
    assert [e["step"] for e in run.of("step_end")] == list(range(1, bad_step))
    assert run.of("sigterm") == [] and run.of("run_end") == []


def test_token_batches_reach_a_gpu_pinned_and_without_waiting(monkeypatch):
    from workloads.device import to_device

    cpu = Runtime(device=torch.device("cpu"), backend="gloo", bf16=False, pg_timeout_s=60.0)
    batch = torch.arange(6).view(2, 3)
    assert to_device(batch, cpu) is batch
    # A CUDA runtime, with the meta device standing in for the GPU (this machine has none).
    gpu = Runtime(device=torch.device("cuda", 0), backend="nccl", bf16=True, pg_timeout_s=60.0)
    calls = []

    def pin_memory(self):
        calls.append("pin")
        return self

    real_to = torch.Tensor.to

    def to(self, device, non_blocking=False):
        calls.append(("to", device, non_blocking))
        return real_to(self, "meta")

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "to", to)
    moved = to_device(batch, gpu)
    assert moved.device.type == "meta" and moved.shape == batch.shape
    assert calls == ["pin", ("to", torch.device("cuda", 0), True)]


def test_the_memory_high_water_mark_is_reset_per_iteration_on_cuda_only(monkeypatch):
    from workloads import device as device_module

    class Cuda:
        def __init__(self):
            self.calls = []

        def reset_peak_memory_stats(self, device):
            self.calls.append(("reset", device))

        def max_memory_reserved(self, device):
            self.calls.append(("peak", device))
            return 123

    cuda = Cuda()
    monkeypatch.setattr(device_module.torch, "cuda", cuda)
    gpu = Runtime(device=torch.device("cuda", 3), backend="nccl", bf16=True, pg_timeout_s=60.0)
    cpu = Runtime(device=torch.device("cpu"), backend="gloo", bf16=False, pg_timeout_s=60.0)
    device_module.reset_peak_memory(cpu)
    assert device_module.peak_memory_reserved(cpu) is None and cuda.calls == []
    device_module.reset_peak_memory(gpu)
    assert device_module.peak_memory_reserved(gpu) == 123
    assert cuda.calls == [("reset", torch.device("cuda", 3)), ("peak", torch.device("cuda", 3))]


def test_the_attention_kernel_is_the_one_torch_dispatches_to():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from workloads.model import attention_kernel
    from workloads.presets import MODEL_PRESETS

    shape = MODEL_PRESETS["small"]
    recorded = attention_kernel(shape, 256, 2, torch.device("cpu"), torch.float32)
    assert set(recorded) == {
        "sdpa_kernel",
        "sdpa_flash_enabled",
        "sdpa_cudnn_enabled",
        "sdpa_mem_efficient_enabled",
        "sdpa_math_enabled",
    }
    assert recorded["sdpa_kernel"] in {name.lower() for name in SDPBackend.__members__}
    with sdpa_kernel([SDPBackend.MATH]):  # the switches an operator may flip
        assert attention_kernel(shape, 256, 2, torch.device("cpu"), torch.float32)["sdpa_kernel"] == "math"


def test_the_same_step_diverging_again_on_every_rank_after_the_restart_ends_the_job(tmp_path, monkeypatch):
    """A non-finite loss on every rank is restarted once; the same step's loss non-finite on every
    rank again after replaying from the checkpoint is the run diverging: a ConfigError (exit 93,
    not requeued) naming the fix, not a restart until every budget is spent."""
    import workloads.train as train_module
    from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
    from workloads.events import load_run
    from workloads.nonfinite import InvalidStepResult
    from workloads.process_state import ProcessState
    from workloads.train import Unrecoverable, train_attempt

    cfg = _one_rank_config(tmp_path, monkeypatch, steps=4)

    def diverges_at_step_3(count, tensor):
        if count % 3 == 0:  # step 3 of each attempt (no checkpoint before it)
            tensor[0], tensor[3] = math.inf, 1.0  # every rank (of 1) flagged its loss

    _overwrite_step_reduces(monkeypatch, diverges_at_step_3)
    # The rank leaving on a ConfigError arms the exit watchdog (exit 93 within a bound): here it
    # would end the test process.
    armed = []
    monkeypatch.setattr(train_module, "arm_exit_watchdog", lambda code, *bound: armed.append(code))
    process = ProcessState(cfg, 0, 1, None)
    try:
        with pytest.raises(InvalidStepResult, match="step 3: .*every rank .*inf"):
            train_attempt(process)
        dist.destroy_process_group()  # as the in-process restart's finalize does
        # What the rank exits 93 on (workloads.train: a ConfigError inside the attempt).
        with pytest.raises(Unrecoverable, match="training diverged: .* step 3 again, on every rank, .* optimizer.lr"):
            train_attempt(process)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert "training diverged" in load_run(tmp_path).of("unrecoverable")[0]["reason"]
    assert armed == [EXIT_DO_NOT_REQUEUE]


class _NodeLeft(BaseException):
    """Stands in for workloads.node_exit.leave_with_node, which never returns (SIGKILL)."""


@pytest.fixture
def node_exits(monkeypatch) -> list[int]:
    """The ranks whose node left (workloads.node_exit.leave_with_node), in a world of nodes of one
    rank each."""
    import workloads.node_exit as node_exit

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    left: list[int] = []

    def leave_with_node():
        left.append(int(os.environ["TEST_RANK"]))
        raise _NodeLeft

    monkeypatch.setattr(node_exit, "leave_with_node", leave_with_node)
    return left


def _rank_of_two(tmp_path, monkeypatch, rank: int):
    """Rank `rank` of a world of two ranks, as ProcessState holds it."""
    from workloads.process_state import ProcessState

    monkeypatch.setenv("TEST_RANK", str(rank))
    cfg = TrainConfig.from_dict({}, "x", [f"run_dir={tmp_path}", "inprocess.enabled=false"])
    return ProcessState(cfg, rank, 2, None)


def test_a_loss_non_finite_on_one_node_only_takes_that_node_out_and_restarts_the_others(
    tmp_path, monkeypatch, node_exits
):
    """A GPU computing NaN while its peers, on the same parameters, do not is a hardware fault:
    its node leaves for a healthy one (no divergence, no exit 93), the other ranks restart from
    the checkpoint, however often the faulty GPU repeats it."""
    from workloads.events import load_run
    from workloads.nonfinite import InvalidStepResult, check_loss

    healthy = _rank_of_two(tmp_path, monkeypatch, rank=0)
    for _ in range(2):  # the same step again after a restart of the healthy rank changes nothing
        with pytest.raises(InvalidStepResult, match="not finite on 1 of 2 ranks, finite on this one"):
            check_loss(healthy, 7, math.nan, 1, 2, mine=lambda: False)
    faulty = _rank_of_two(tmp_path, monkeypatch, rank=1)
    with pytest.raises(_NodeLeft):
        check_loss(faulty, 7, math.nan, 1, 2, mine=lambda: True)
    assert node_exits == [1]
    (event,) = load_run(tmp_path).of("nonfinite_rank")
    assert (event["rank"], event["step"], event["node"], event["nonfinite_ranks"], event["world_size"]) == (
        1,
        7,
        1,
        1,
        2,
    )


def test_the_same_rank_non_finite_at_the_same_step_on_its_replacement_node_is_divergence(
    tmp_path, monkeypatch, node_exits
):
    """The node that took the faulty one's place computes NaN for the same rank at the same step:
    that rank's data at that step, not a GPU; exit 93 instead of replacing node after node. A
    later submission into the same run directory starts afresh."""
    from nvrx_eks.facts.errors import ConfigError
    from workloads.nonfinite import check_loss

    first = _rank_of_two(tmp_path, monkeypatch, rank=1)
    first.events.emit("run_start")  # the job's first process of rank 1 (cycle 0, attempt 0)
    with pytest.raises(_NodeLeft):
        check_loss(first, 7, math.nan, 1, 2, mine=lambda: True)
    monkeypatch.setenv("JOBSET_RESTART_ATTEMPT", "1")  # the pods the JobSet recreated
    replacement = _rank_of_two(tmp_path, monkeypatch, rank=1)
    replacement.events.emit("run_start")
    with pytest.raises(_NodeLeft):  # another step: the replacement's own GPU
        check_loss(replacement, 9, math.nan, 1, 2, mine=lambda: True)
    with pytest.raises(ConfigError, match="rank 1's loss is not finite at step 7 again on the node that replaced"):
        check_loss(replacement, 7, math.nan, 1, 2, mine=lambda: True)
    monkeypatch.setenv("JOBSET_RESTART_ATTEMPT", "0")  # a new submission into the same run directory
    resubmitted = _rank_of_two(tmp_path, monkeypatch, rank=1)
    resubmitted.events.emit("run_start")
    with pytest.raises(_NodeLeft):
        check_loss(resubmitted, 7, math.nan, 1, 2, mine=lambda: True)
    assert node_exits == [1, 1, 1]


def test_the_own_flag_is_read_only_when_some_ranks_but_not_all_flagged(tmp_path, monkeypatch, node_exits):
    """Reading the rank's own flag is a host sync: not on the path of a step that is fine or
    non-finite everywhere."""
    from workloads.nonfinite import InvalidStepResult, check_loss

    process = _rank_of_two(tmp_path, monkeypatch, rank=0)

    def never() -> bool:
        raise AssertionError("the own flag was read")

    check_loss(process, 3, 4.2, 0, 2, mine=never)
    for loss_sum, flagged in ((math.inf, 0), (math.nan, 2), (4.2, 1)):
        with pytest.raises(InvalidStepResult):
            check_loss(process, 3, loss_sum, flagged, 2, mine=never)
