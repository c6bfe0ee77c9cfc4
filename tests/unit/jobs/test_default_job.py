"""The profiles' default jobs (render with no options) and the throughput metrics' arithmetic."""

from __future__ import annotations

import re

import pytest
import yaml

from infra.config import resolve_config
from nvrx_eks.facts.instances import INSTANCE_FACTS
from nvrx_eks.jobs.spec import default_job
from nvrx_eks.planning.model import optimal_interval_steps
from tests.support.cli_harness import run_cli
from tests.support.profiles import profile_file
from workloads.config import TrainConfig
from workloads.memory import estimate_for
from workloads.metrics import flops_per_token, step_throughput, summarize_throughput
from workloads.presets import MODEL_PRESETS


def rendered_train(*args: str) -> dict:
    result = run_cli("render", *args)
    assert result.code == 0, result.stderr
    for doc in yaml.safe_load_all(result.stdout):
        if doc and doc.get("kind") == "ConfigMap" and "train.yaml" in doc.get("data", {}):
            return yaml.safe_load(doc["data"]["train.yaml"])
    raise AssertionError("no trainer ConfigMap in the render")


@pytest.mark.parametrize("profile", ["p5", "p5en"])
def test_p5_renders_the_8b_job_with_recomputation_accumulation_and_the_plans_interval(profile):
    train = rendered_train("-p", profile)
    config = resolve_config(profile)
    assert train["model"]["preset"] == "8b" and train["model"]["activation_checkpointing"] == "auto"
    assert train["distributed"]["backend"] == "nccl"  # GPUs: the trainer computes in bf16
    gpus = config.gpu_nodes.desired_size * config.gpu_nodes.facts.gpus
    data = TrainConfig.from_dict(train, source="the render").data
    assert data.global_batch_tokens == 1 << 21
    assert gpus * data.batch_size * data.seq_len * data.accumulation(gpus) == 1 << 21
    expected = optimal_interval_steps(config, default_job(config, config.gpu_nodes.desired_size, []), 2)
    assert train["checkpoint"]["interval_steps"] == expected > 50  # computed, not the trainer's 50
    assert train["peak_tflops_per_gpu"] == INSTANCE_FACTS[config.gpu_nodes.instance_type].peak_bf16_tflops


def test_plan_prints_the_same_interval_the_render_uses_and_memory_below_80_gb():
    result = run_cli("plan")
    assert result.code == 0, result.stderr
    out = " ".join(result.stdout.split())
    steps = re.findall(r"\(~(\d+) steps\)", out)
    assert int(steps[-1]) == rendered_train()["checkpoint"]["interval_steps"]
    gib = float(re.search(r"world 16\): ([\d.]+) GiB of 79.2 GiB \(H100\): fits", out).group(1))
    assert gib < 80


def test_set_overrides_win_over_the_derived_fields():
    train = rendered_train("--set", "data.global_batch_tokens=524288", "--set", "checkpoint.interval_steps=100")
    assert train["data"]["global_batch_tokens"] == 1 << 19 and train["checkpoint"]["interval_steps"] == 100
    assert train["model"]["preset"] == "8b"


def test_an_accumulation_set_beside_the_global_batch_is_refused_naming_both():
    result = run_cli("render", "--set", "data.grad_accum_steps=2")
    assert result.code == 2
    assert "data.grad_accum_steps: derived from data.global_batch_tokens when that is set" in result.stderr


def _p5_for(tmp_path, nodes: int) -> str:
    """The p5 profile with a node group that holds `nodes` (as shipped it holds 2)."""
    return str(profile_file(tmp_path, gpu_nodes__max_size=nodes, gpu_nodes__desired_size=nodes))


def test_the_global_batch_stays_as_the_node_count_changes(tmp_path):
    """2 to 16 nodes train on the same tokens per step (the accumulation is derived); a node count
    that cannot divide them into whole micro-batches is refused, naming the counts that can."""
    config = _p5_for(tmp_path, 16)
    for nodes in (2, 4, 8, 16):
        data = TrainConfig.from_dict(rendered_train("--config", config, "--nodes", str(nodes)), source="x").data
        assert data.accumulation(nodes * 8) * nodes * 8 * data.batch_size * data.seq_len == 1 << 21
    result = run_cli("render", "--config", config, "--nodes", "5")
    assert result.code == 2
    assert "--nodes 5: 40 ranks do not divide data.global_batch_tokens" in result.stderr
    assert "nodes that do: 4 or 8" in result.stderr


def test_g5_smoke_keeps_a_small_preset():
    train = rendered_train("-p", "g5-smoke")
    assert train["model"]["preset"] == "tiny" and train["peak_tflops_per_gpu"] is None


def test_render_data_points_the_job_at_the_shards_on_fsx():
    train = rendered_train("--data", "s3/corpus-v1")
    assert train["data"]["source"] == "memmap" and train["data"]["path"] == "/fsx/s3/corpus-v1"


def test_unknown_default_job_in_a_profile_names_the_field(tmp_path):
    from infra.config import DeploymentConfig

    data = resolve_config("p5").model_dump(mode="json")
    data["default_job"] = "llama-70b"
    with pytest.raises(ValueError, match="llama-70b.*not a job preset"):
        DeploymentConfig.model_validate(data)


def test_flops_per_token_is_six_n_plus_the_attention_term():
    s = MODEL_PRESETS["8b"]
    head = s.dim // s.n_heads
    block = s.dim * head * (2 * s.n_heads + 2 * s.n_kv_heads) + 3 * s.dim * s.ffn_dim + 2 * s.dim
    non_embedding = s.n_layers * block + s.vocab_size * s.dim + s.dim  # the lookup table is not a product
    assert flops_per_token(s, 8192) == 6 * non_embedding + 12 * s.n_layers * s.n_heads * head * 8192
    assert 57e9 < flops_per_token(s, 8192) < 59e9  # Llama-3-8B at 8k: ~7.5 B multiplying weights


def test_mfu_is_model_flops_over_peak_and_none_without_a_peak():
    speed = step_throughput(tokens=1 << 20, world_size=16, step_s=8.0, flops_token=58e9, peak_tflops=989.0)
    assert speed.tokens_per_s == (1 << 20) / 8 and speed.tokens_per_s_per_gpu == (1 << 20) / 8 / 16
    assert speed.mfu == pytest.approx((1 << 20) / 8 / 16 * 58e9 / 989e12)
    assert step_throughput(tokens=10, world_size=1, step_s=1.0, flops_token=1.0, peak_tflops=None).mfu is None


def test_throughput_summary_leaves_out_the_warm_up_step():
    steps = [
        {"step": i, "loss": 5.0 - i, "step_s": s, "tokens_per_s": 100 / s, "tokens_per_s_per_gpu": 50 / s, "mfu": None}
        for i, s in ((1, 10.0), (2, 1.0), (3, 1.0), (4, 2.0))
    ]
    summary = summarize_throughput(steps)
    assert summary["tokens_per_s"] == 100.0 and summary["step_time_s"] == 1.0 and summary["mfu"] is None
    assert (summary["first_loss"], summary["last_loss"]) == (4.0, 1.0)


def test_hybrid_shard_divides_the_state_by_one_nodes_gpus_only(tmp_path):
    full = rendered_train()
    hybrid = rendered_train("--config", _p5_for(tmp_path, 4), "--set", "distributed.shard=hybrid", "--nodes", "4")
    assert full["distributed"]["shard"] == "full" and hybrid["distributed"]["shard"] == "hybrid"
    config = resolve_config("p5")
    job = default_job(config, 4, ["distributed.shard=hybrid"])
    sharded_full = estimate_for(TrainConfig.from_dict({**job.model_dump(), "distributed": {}}), 32).sharded_state
    sharded_hybrid = estimate_for(job, 32, ranks_per_node=8).sharded_state
    assert sharded_hybrid == 4 * sharded_full  # 1/8 of the state per GPU instead of 1/32
