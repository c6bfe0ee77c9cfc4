"""Activation checkpointing on some of the blocks: which blocks the model wraps, the count the
memory model chooses for "auto" (the fewest that fit the GPU), the config's refusals, where the
count is shown (plan, render summary, the run's setup_end event), and a CPU run that recomputes one
of the tiny preset's two blocks training exactly as one that recomputes none."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
import yaml
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from infra.config import resolve_config
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.instances import INSTANCE_FACTS
from nvrx_eks.facts.job_presets import JOB_PRESETS
from tests.support.cli_harness import run_cli
from tests.support.trainer_fixtures import single_rank_env
from workloads.config import TrainConfig
from workloads.memory import AUTO_FILL_SHARE, GIB, check_fits, estimate_for
from workloads.model import checkpointed_block_indices

H100 = INSTANCE_FACTS["p5.48xlarge"]
A10G = INSTANCE_FACTS["g5.12xlarge"]


@pytest.fixture
def single_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _auto_8b(*sets: str) -> TrainConfig:
    """The p5 profile's default job: llama3-8b, 2 x 8192 tokens per micro-batch, "auto"."""
    assert JOB_PRESETS["llama3-8b"].train["model"]["activation_checkpointing"] == "auto"
    return TrainConfig.from_dict(JOB_PRESETS["llama3-8b"].train, "x", list(sets))


def _on(train: TrainConfig, world: int, gpu_memory_gib: int):
    return estimate_for(train, world, ranks_per_node=8, gpu_memory_bytes=gpu_memory_gib * GIB)


# ----- which blocks ------------------------------------------------------------------------------


def test_the_checkpointed_blocks_are_spread_evenly_over_the_depth():
    assert checkpointed_block_indices(32, 16) == list(range(1, 32, 2))  # every other block
    assert checkpointed_block_indices(32, 32) == list(range(32))
    assert checkpointed_block_indices(32, 0) == []
    assert checkpointed_block_indices(2, 1) == [1]
    for count in range(33):
        indices = checkpointed_block_indices(32, count)
        assert len(indices) == count == len(set(indices))
        # No run of kept (unwrapped) blocks is longer than its even share, rounded up.
        if count:
            gaps = [b - a for a, b in zip([-1, *indices], [*indices, 32], strict=True)]
            assert max(gaps) - 1 <= -(-(32 - count) // count)


def test_build_model_wraps_exactly_those_blocks(single_rank):
    from torch.distributed.device_mesh import init_device_mesh

    from workloads.device import Runtime
    from workloads.model import build_model
    from workloads.presets import MODEL_PRESETS

    runtime = Runtime(device=torch.device("cpu"), backend="gloo", bf16=False, pg_timeout_s=60.0)
    model = build_model(MODEL_PRESETS["small"], runtime, init_device_mesh("cpu", (1,)), seed=1, checkpointed_blocks=3)
    wrapped = [i for i, block in enumerate(model.layers) if isinstance(block, CheckpointWrapper)]
    assert wrapped == checkpointed_block_indices(8, 3) == [2, 5, 7]


# ----- the config ------------------------------------------------------------------------------


def test_true_still_means_every_block_and_the_count_takes_part_of_them():
    assert TrainConfig.from_dict({}, "x", ["model.preset=8b"]).model.checkpointed_blocks == 32  # preset default
    assert TrainConfig.from_dict({}, "x", ["model.activation_checkpointing=true"]).model.checkpointed_blocks == 2
    assert TrainConfig.from_dict({}, "x").model.checkpointed_blocks == 0  # tiny: off
    some = TrainConfig.from_dict({}, "x", ["model.preset=8b", "model.checkpoint_blocks=12"])
    assert some.model.checkpointed_blocks == 12
    auto = TrainConfig.from_dict({}, "x", ["model.activation_checkpointing=auto"])
    assert auto.model.checkpointed_blocks == "auto"
    assert TrainConfig.from_dict(yaml.safe_load(auto.to_yaml()), "x").model.checkpointed_blocks == "auto"


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["model.checkpoint_blocks=3"], "model.checkpoint_blocks: 3 exceeds the 2 blocks of the tiny preset"),
        (["model.preset=8b", "model.checkpoint_blocks=33"], "model.checkpoint_blocks: 33 exceeds the 32 blocks"),
        (
            ["model.activation_checkpointing=false", "model.checkpoint_blocks=1"],
            "model.checkpoint_blocks: counts the recomputed blocks only with model.activation_checkpointing=true",
        ),
        (
            ["model.activation_checkpointing=auto", "model.checkpoint_blocks=1"],
            "model.checkpoint_blocks: counts the recomputed blocks only with model.activation_checkpointing=true",
        ),
    ],
)
def test_a_count_the_preset_cannot_take_is_refused_naming_the_field(sets, expected):
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_dict({}, "x", sets)
    assert expected in str(err.value)


def test_the_cli_refuses_too_many_blocks_with_exit_2_and_no_traceback():
    result = run_cli("render", "-p", "g5-smoke", "--set", "model.checkpoint_blocks=5")
    assert result.code == 2
    assert "model.checkpoint_blocks: 5 exceeds the 2 blocks of the tiny preset; give at most 2" in result.stderr
    assert "Traceback" not in result.stderr


# ----- the memory model's choice ---------------------------------------------------------------


def test_the_estimate_of_partial_checkpointing_lies_between_none_and_all():
    train = _auto_8b()
    by_count = [
        estimate_for(_auto_8b("model.activation_checkpointing=true", f"model.checkpoint_blocks={k}"), 16)
        for k in range(1, 33)
    ]
    activations = [est.activations for est in by_count]
    # Each block checkpointed drops its activations but its input: the same step every time.
    steps = {a - b for a, b in zip(activations, activations[1:], strict=False)}
    assert len(steps) == 1 and steps.pop() > 0
    none = estimate_for(_auto_8b("model.activation_checkpointing=false"), 16)
    # One checkpointed block costs a recomputed block in backward more than it saves.
    assert by_count[0].activations > none.activations > by_count[1].activations
    assert by_count[-1].total == estimate_for(_auto_8b("model.activation_checkpointing=true"), 16).total
    assert train.model.checkpointed_blocks == "auto"


def test_auto_keeps_some_blocks_at_16_h100s_and_still_fits():
    train = _auto_8b()
    chosen = _on(train, 16, H100.gpu_memory_gib)
    assert 0 < chosen.checkpointed_blocks < 32  # 17 of 32: 15 blocks keep their activations
    plan_to_fill = AUTO_FILL_SHARE * H100.gpu_memory_gib * GIB
    assert chosen.total <= plan_to_fill
    assert check_fits(train, 16, H100.gpu_memory_gib, "H100") is None
    # The fewest that fit the share auto may fill: one block fewer does not.
    fewer = _auto_8b("model.activation_checkpointing=true", f"model.checkpoint_blocks={chosen.checkpointed_blocks - 1}")
    assert estimate_for(fewer, 16).total > plan_to_fill


def test_auto_recomputes_more_where_each_gpu_holds_more_state():
    train = _auto_8b()
    at = {world: _on(train, world, H100.gpu_memory_gib).checkpointed_blocks for world in (2, 8, 16, 128)}
    assert at[2] == 32 > at[8] > at[16] >= at[128]
    # At 2 ranks even every block recomputed does not fit: the render refuses, naming the fixes.
    message = check_fits(train, 2, H100.gpu_memory_gib, "H100")
    assert message is not None and "more nodes" in message
    # 1b on one 24 GiB A10G: every block recomputed, and still not enough.
    one_b = TrainConfig.from_dict({}, "x", ["model.preset=1b", "model.activation_checkpointing=auto"])
    assert _on(one_b, 1, A10G.gpu_memory_gib).checkpointed_blocks == 22
    assert _on(one_b, 1, H100.gpu_memory_gib).checkpointed_blocks == 0  # room for all activations
    # Without a GPU there is nothing to fit: the CPU trainer recomputes nothing.
    assert estimate_for(one_b, 1, bf16=False).checkpointed_blocks == 0


def test_a_fixed_count_that_does_not_fit_is_refused_with_the_fix():
    train = _auto_8b("model.activation_checkpointing=true", "model.checkpoint_blocks=4")
    message = check_fits(train, 16, H100.gpu_memory_gib, "H100")
    assert message is not None
    assert "model.checkpoint_blocks up to 32 (now 4)" in message and "model.activation_checkpointing=auto" in message


# ----- where the count is shown ----------------------------------------------------------------


def test_the_render_summary_and_the_plan_show_the_chosen_count():
    config = resolve_config("p5")
    nodes = config.gpu_nodes.desired_size
    # The trainer divides the memory CUDA reports (training.resolve_checkpointed_blocks): so do they.
    cuda_reported = estimate_for(_auto_8b(), nodes * 8, ranks_per_node=8, gpu_memory_bytes=H100.gpu_cuda_memory_bytes)
    chosen = cuda_reported.checkpointed_blocks
    assert chosen != _on(_auto_8b(), nodes * 8, H100.gpu_memory_gib).checkpointed_blocks  # 18, not 17: the edge
    shown = f"activation checkpointing on {chosen} of 32 blocks (auto: the fewest that fit)"
    render = run_cli("render", "-p", "p5")
    assert render.code == 0, render.stderr
    assert shown in " ".join(render.stderr.split())
    plan = run_cli("plan", "-p", "p5")
    assert plan.code == 0, plan.stderr
    assert shown in " ".join(plan.stdout.split())
    as_data = run_cli("plan", "-p", "p5", "-o", "json")
    assert json.loads(as_data.stdout)["memory"]["checkpointed_blocks"] == chosen


# ----- a CPU run ------------------------------------------------------------------------------


def _run(run_dir, monkeypatch, *sets: str) -> list[dict]:
    from workloads.events import load_run
    from workloads.process_state import ProcessState
    from workloads.train import train_attempt

    settings = [
        f"run_dir={run_dir}",
        "steps=6",
        "distributed.backend=gloo",
        "inprocess.enabled=false",
        "checkpoint.backend=none",
        *sets,
    ]
    cfg = TrainConfig.from_dict({}, "x", settings)
    single_rank_env(monkeypatch)
    assert train_attempt(ProcessState(cfg, 0, 1, None)) == {"status": "completed"}
    return load_run(run_dir).events


def test_recomputing_one_of_two_blocks_trains_exactly_as_recomputing_none(tmp_path, monkeypatch):
    """On CPU the recompute is deterministic (and restores the dropout RNG), so the losses and
    the final state are bitwise the same; the run's setup_end says how many blocks it wrapped."""
    runs = {
        "none": _run(tmp_path / "none", monkeypatch, "model.activation_checkpointing=false"),
        "half": _run(
            tmp_path / "half", monkeypatch, "model.activation_checkpointing=true", "model.checkpoint_blocks=1"
        ),
        "auto": _run(tmp_path / "auto", monkeypatch, "model.activation_checkpointing=auto"),
    }

    def of(events: list[dict], kind: str) -> list[dict]:
        return [e for e in events if e["event"] == kind]

    blocks = {name: [e["checkpointed_blocks"] for e in of(events, "setup_end")] for name, events in runs.items()}
    assert blocks == {"none": [0], "half": [1], "auto": [0]}  # auto on CPU: no GPU memory to fit
    losses = {name: [e["loss"] for e in of(events, "step_end")] for name, events in runs.items()}
    assert len(losses["none"]) == 6 and losses["none"][-1] < losses["none"][0]
    assert losses["half"] == losses["none"] == losses["auto"]
    digests = {name: of(events, "run_end")[0]["state_sha256"] for name, events in runs.items()}
    assert digests["half"] == digests["none"] == digests["auto"]
