"""What the GPU path records of attention and memory (workloads.model.attention_kernel and
attention_ops_run, workloads.device.allocator_counters), checked on CPU: the dispatcher is asked
with the very arguments training passes, and the counters come from the caching allocator."""

from __future__ import annotations

import torch

from workloads.model import Attention, _rope_tables, attention_kernel, attention_ops_run
from workloads.presets import MODEL_PRESETS


def _described(t: torch.Tensor) -> tuple:
    """What the SDPA backend checks read of an argument."""
    return tuple(t.shape), t.stride(), t.dtype, t.requires_grad, t.is_contiguous()


def test_the_dispatcher_is_asked_with_the_training_calls_layouts_and_requires_grad(monkeypatch):
    """The backend checks read strides, batch and requires_grad: v reaches SDPA as the transposed
    view of its projection, and in training every argument requires grad. A probe with other
    arguments can name a kernel training never runs."""
    shape = MODEL_PRESETS["tiny"]  # GQA: fewer key/value heads than query heads
    batch, seq = 2, 128
    trained: list[tuple] = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording_sdpa(q, k, v, **kwargs):
        trained.append(([_described(t) for t in (q, k, v)], kwargs))
        return real_sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa)
    attention = Attention(shape)
    cos, sin = _rope_tables(shape, torch.device("cpu"))
    attention(torch.randn(batch, seq, shape.dim, requires_grad=True), cos, sin)

    asked: list[tuple] = []
    real_choice = torch._fused_sdp_choice

    def recording_choice(q, k, v, **kwargs):
        asked.append(([_described(t) for t in (q, k, v)], kwargs))
        return real_choice(q, k, v, **kwargs)

    monkeypatch.setattr(torch, "_fused_sdp_choice", recording_choice)
    attention_kernel(shape, seq, batch, torch.device("cpu"), torch.float32)

    (trained_args, trained_kwargs), (asked_args, asked_kwargs) = trained[0], asked[0]
    assert asked_args == trained_args
    assert asked_kwargs == trained_kwargs == {"is_causal": True, "enable_gqa": True}
    assert trained_args[2][4] is False  # v is not contiguous
    assert all(arg[3] for arg in trained_args)  # each requires grad


def test_the_ops_a_forward_and_backward_ran_are_recorded():
    ops = attention_ops_run(MODEL_PRESETS["tiny"], 64, 2, torch.device("cpu"), torch.float32)
    # On CPU torch runs its flash kernel for CPU; on a GPU this names flash, cuDNN or efficient.
    assert ops == [
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    ]


def test_the_allocator_counters_come_from_the_caching_allocator_and_are_null_off_cuda(monkeypatch):
    from workloads import device as device_module
    from workloads.device import Runtime, allocator_counters

    asked = []

    def memory_stats(device):
        asked.append(device)
        return {"reserved_bytes.all.current": 3 << 30, "reserved_bytes.all.peak": 5 << 30, "num_alloc_retries": 2}

    monkeypatch.setattr(device_module.torch.cuda, "memory_stats", memory_stats)
    gpu = Runtime(device=torch.device("cuda", 1), backend="nccl", bf16=True, pg_timeout_s=60.0)
    cpu = Runtime(device=torch.device("cpu"), backend="gloo", bf16=False, pg_timeout_s=60.0)
    assert allocator_counters(cpu) == {"gpu_reserved_bytes": None, "gpu_alloc_retries": None} and asked == []
    assert allocator_counters(gpu) == {"gpu_reserved_bytes": 3 << 30, "gpu_alloc_retries": 2}
    assert asked == [torch.device("cuda", 1)]
