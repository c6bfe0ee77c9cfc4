"""The optimizer state a restore fills is created directly (init_adam_state), not by the whole
AdamW step on zero gradients that torch.distributed.checkpoint's helpers run otherwise: that step
was most of a restore's time once the checkpoint itself came from host memory (BENCHMARKS P5)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from tests.support import trainer_fixtures
from workloads.checkpoint.train_state import OptimizerState, init_adam_state

single_rank = trainer_fixtures.single_rank


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4, bias=False))
    model[1].weight.requires_grad_(False)  # a frozen parameter gets no state, as in a real step
    return model


@pytest.mark.parametrize("amsgrad", [False, True])
def test_the_direct_state_has_the_layout_the_optimizers_own_step_creates(amsgrad):
    """Keys, dtypes, devices and shapes as AdamW's own first step creates them (a torch upgrade
    that changes them fails here, not in a restore)."""
    reference, direct = _model(), _model()
    stepped = torch.optim.AdamW(reference.parameters(), lr=1e-3, amsgrad=amsgrad)
    for p in reference.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    stepped.step()
    fresh = torch.optim.AdamW(direct.parameters(), lr=1e-3, amsgrad=amsgrad)
    init_adam_state(fresh)
    theirs, ours = stepped.state_dict()["state"], fresh.state_dict()["state"]
    assert sorted(theirs) == sorted(ours)
    for index in theirs:
        assert sorted(theirs[index]) == sorted(ours[index])
        for key, tensor in theirs[index].items():
            mine = ours[index][key]
            assert (mine.dtype, mine.device, mine.shape) == (tensor.dtype, tensor.device, tensor.shape), key
    assert all(float(state["step"]) == 0.0 for state in ours.values())  # nothing was stepped
    assert all(not state["exp_avg"].any() for state in ours.values())


def test_a_restore_through_the_direct_state_continues_exactly(single_rank):
    """Save after two real steps, restore into a fresh optimizer (direct state), step on: the same
    parameters as the optimizer that never stopped."""
    model, batch = _model(), torch.randn(4, 8)

    def step(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        m(batch).square().mean().backward()
        opt.step()
        opt.zero_grad()

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        step(model, optimizer)
    saved = copy.deepcopy(OptimizerState(model, optimizer).state_dict())  # views of the live state
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    step(model, optimizer)

    resumed = _model()
    resumed.load_state_dict(weights)
    fresh = torch.optim.AdamW(resumed.parameters(), lr=1e-2)
    OptimizerState(resumed, fresh).load_state_dict(saved)
    step(resumed, fresh)
    for (name, a), b in zip(model.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_other_optimizers_keep_torchs_own_initialization():
    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    init_adam_state(sgd)
    assert not sgd.state
    assert get_optimizer_state_dict(model, sgd)["param_groups"]  # torch's way still works
