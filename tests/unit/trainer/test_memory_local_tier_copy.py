"""The node-local tier's host copy in the memory estimate (workloads.memory item 6): on a GPU its
buffers are pinned, one per tensor, and torch's pinned-memory cache rounds each up to a power of
two and keeps it, so the figure the plan shows is the rounded one."""

from __future__ import annotations

import math

from rich.console import Console

from workloads.config import TrainConfig
from workloads.memory import GIB, estimate_for, local_tier_copy_bytes, parameter_count, parameter_shapes
from workloads.presets import MODEL_PRESETS


def test_the_tensors_are_the_models_parameters():
    for name, shape in MODEL_PRESETS.items():
        assert sum(math.prod(tensor) for tensor in parameter_shapes(shape)) == parameter_count(shape), name


def test_the_pinned_copy_counts_each_tensor_rounded_up_to_a_power_of_two():
    eight_b, one_b = MODEL_PRESETS["8b"], MODEL_PRESETS["1b"]
    exact = local_tier_copy_bytes(eight_b, 16, pinned=False)
    assert abs(exact / GIB - 5.609) < 1e-3  # 12 bytes per parameter over 16 ranks
    assert abs(local_tier_copy_bytes(eight_b, 16, pinned=True) / GIB - 6.188) < 1e-3  # +10%
    assert (
        round(local_tier_copy_bytes(one_b, 16, pinned=True) / local_tier_copy_bytes(one_b, 16, pinned=False), 2) == 1.32
    )
    # On a GPU the estimate carries the pinned figure; on CPU the tier copies into pageable memory.
    train = TrainConfig.from_dict({}, "x", ["model.preset=8b"])
    assert estimate_for(train, 16).local_tier_copy == local_tier_copy_bytes(eight_b, 16, pinned=True)
    assert estimate_for(train, 16, bf16=False).local_tier_copy == exact


def test_the_plans_host_memory_shows_the_local_tiers_copy_when_it_is_on(tmp_path):
    from infra.config import resolve_config
    from nvrx_eks.jobs.spec import default_job
    from nvrx_eks.ops.plan import print_memory

    config = resolve_config("p5")
    train = default_job(config, 2, ["checkpoint.local.interval_steps=5"])
    memory = estimate_for(train, 16, ranks_per_node=8, gpu_memory_bytes=config.gpu_nodes.facts.gpu_cuda_memory_bytes)
    with open(tmp_path / "out.txt", "w") as sink:
        print_memory(memory, config, train, 16, Console(file=sink, width=200))
    out = (tmp_path / "out.txt").read_text()
    assert f"host memory of the node-local tier's copy: {memory.local_tier_copy / GIB:.1f} GiB per rank" in out
    assert "6.2 GiB per rank (pinned" in out
