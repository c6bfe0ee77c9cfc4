"""The LM head's weight gradient under the chunked loss (workloads.model._ChunkedCrossEntropy):
summed over the loss chunks in fp32, as one GEMM over all tokens sums it, not rounded to bf16
after every chunk as autograd's accumulation of checkpointed chunks does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from workloads.model import OutputProjection

TOKENS, DIM, VOCAB, CHUNK = 1024, 128, 1024, 128  # 8 loss chunks, as the 8b preset's 2 x 8192 / 2048


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    h = torch.randn(1, TOKENS, DIM, generator=generator).bfloat16()
    weight = (torch.randn(VOCAB, DIM, generator=generator) * 0.05).bfloat16()
    targets = torch.randint(0, VOCAB, (1, TOKENS), generator=generator)
    return h, weight, targets


def _one_gemm_weight_grad(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The weight gradient of the mean loss as one fp32-accumulating GEMM over all tokens: the
    logits' gradient in the compute dtype (bf16), as the chunks compute it, times h."""
    flat_h, flat_t = h.flatten(0, 1), targets.flatten()
    logits = F.linear(flat_h, weight).float().requires_grad_()
    (grad_logits,) = torch.autograd.grad(F.cross_entropy(logits, flat_t, reduction="sum") / flat_t.numel(), logits)
    return grad_logits.bfloat16().float().t() @ flat_h.float()


def _bf16_accumulated_weight_grad(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """What a checkpointed F.linear per chunk leaves in a bf16 weight's .grad (the former code)."""
    w = weight.clone().requires_grad_()
    flat_h, flat_t = h.flatten(0, 1), targets.flatten()

    def chunk_loss(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(F.linear(x, w).float(), t, reduction="sum")

    total = sum(
        checkpoint(chunk_loss, flat_h[s : s + CHUNK], flat_t[s : s + CHUNK], use_reentrant=False)
        for s in range(0, TOKENS, CHUNK)
    )
    (total / flat_t.numel()).backward()
    assert w.grad is not None and w.grad.dtype == torch.bfloat16
    return w.grad.float()


def _head(weight: torch.Tensor) -> OutputProjection:
    head = OutputProjection(DIM, VOCAB).bfloat16()
    head.chunk_tokens = CHUNK
    with torch.no_grad():
        head.weight.copy_(weight)
    return head


def test_the_chunks_weight_gradient_sums_in_fp32_like_one_gemm():
    h, weight, targets = _inputs()
    reference = _one_gemm_weight_grad(h, weight, targets)
    loss = _head(weight)(h, targets)
    # What the chunked loss hands autograd for the weight, before autograd casts it to the
    # parameter's dtype: the fp32 sum.
    chunked = loss.grad_fn.next_functions[0][0]  # loss = chunked sum / tokens
    grad_total = torch.tensor(1.0 / targets.numel())
    _, grad_weight, _, _ = chunked.apply(grad_total)
    assert grad_weight.dtype == torch.float32
    torch.testing.assert_close(grad_weight, reference, rtol=1.3e-6, atol=1e-8)
    # The former bf16 accumulation is not within fp32 tolerance of it.
    with pytest.raises(AssertionError):
        torch.testing.assert_close(_bf16_accumulated_weight_grad(h, weight, targets), reference, rtol=1.3e-6, atol=1e-8)


def test_the_parameter_gets_one_rounding_not_one_per_chunk():
    h, weight, targets = _inputs()
    reference = _one_gemm_weight_grad(h, weight, targets)
    head = _head(weight)
    head(h, targets).backward()
    assert head.weight.grad is not None and head.weight.grad.dtype == torch.bfloat16

    def error(grad: torch.Tensor) -> float:
        return float((grad.float() - reference).norm() / reference.norm())

    one_rounding = error(reference.bfloat16())
    assert error(head.weight.grad) == pytest.approx(one_rounding, rel=0.01)
    assert error(_bf16_accumulated_weight_grad(h, weight, targets)) > 1.5 * one_rounding


def test_the_input_gradient_and_loss_are_those_of_the_full_cross_entropy():
    h, weight, targets = _inputs()
    x = h.clone().requires_grad_()
    head = _head(weight)
    loss = head(x, targets)
    loss.backward()
    y = h.clone().requires_grad_()
    full = F.cross_entropy(F.linear(y.flatten(0, 1), weight).float(), targets.flatten())
    full.backward()
    assert loss.item() == pytest.approx(full.item(), rel=1e-6)
    assert x.grad is not None and y.grad is not None
    torch.testing.assert_close(x.grad, y.grad)
