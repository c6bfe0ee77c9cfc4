"""A job of the user's own model shape (`render --set model.*`, `model.shape_from=config.json`):
its memory plan is checked with that shape, a shape that cannot fit is refused with the fix, and
`plan` shows the same model. And the existing-cluster trap: a config on GPUs a job is sized for
that names no default_job is refused, not given the tiny model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from infra.config import resolve_config
from nvrx_eks.facts.instances import INSTANCE_FACTS
from tests.support.cli_harness import run_cli
from tests.support.hf_checkpoints import LLAMA_3_1_8B
from tests.support.profiles import profile_file
from workloads.config import TrainConfig
from workloads.memory import GIB, estimate_for

#: What one H100 offers a job, as the summary and the plan state it (CUDA's figure, not the 80 GB label).
H100_GIB = INSTANCE_FACTS["p5.48xlarge"].gpu_cuda_memory_bytes / GIB

#: Llama 3.1 70B's shape: 16 B of state per parameter over 16 H100s is ~66 GiB alone.
LLAMA_3_1_70B = {
    **LLAMA_3_1_8B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
}


def _config_json(directory: Path, config: dict) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _rendered(*args: str) -> tuple[dict, str]:
    """The trainer config of a render and its summary (one line)."""
    result = run_cli("render", *args)
    assert result.code == 0, result.stderr
    for doc in yaml.safe_load_all(result.stdout):
        if doc and doc.get("kind") == "ConfigMap" and "train.yaml" in doc.get("data", {}):
            return yaml.safe_load(doc["data"]["train.yaml"]), " ".join(result.stderr.split())
    raise AssertionError("no trainer ConfigMap in the render")


def _refusal(command: str, *args: str) -> str:
    result = run_cli(command, *args)
    assert result.code == 2, result.output
    assert "Traceback" not in result.output
    return " ".join(result.stderr.split())


def test_render_set_model_fields_checks_the_memory_of_that_shape():
    train, summary = _rendered("-p", "p5", "--set", "model.vocab_size=32000", "--set", "model.n_layers=40")
    assert train["model"]["preset"] == "8b"
    assert (train["model"]["vocab_size"], train["model"]["n_layers"]) == (32000, 40)
    assert "model 8b with vocab_size=32000, n_layers=40" in summary
    cfg = TrainConfig.from_dict(train)
    memory = estimate_for(cfg, 16, ranks_per_node=8, gpu_memory_bytes=80 * GIB)
    preset = estimate_for(TrainConfig.from_dict({**train, "model": {"preset": "8b"}}), 16, ranks_per_node=8)
    assert memory.checkpointed_blocks > 0 and memory.total != preset.total
    assert f"memory: ~{memory.total / GIB:.1f} of {H100_GIB:.1f} GiB per H100" in summary
    assert f"activation checkpointing on {memory.checkpointed_blocks} of 40 blocks" in summary


def test_render_shape_from_a_config_json_writes_the_literal_shape_into_the_configmap(tmp_path):
    source = _config_json(tmp_path / "llama-3.1-8b", LLAMA_3_1_8B)
    train, summary = _rendered("-p", "p5", "--set", f"model.shape_from={source}")
    assert "shape_from" not in train["model"] and str(source) not in json.dumps(train)
    assert train["model"]["vocab_size"] == 128256 and train["model"]["max_seq_len"] == 131072
    assert train["model"]["rope_scaling"]["factor"] == 8.0
    assert "model 8b with max_seq_len=131072" in summary


def test_a_shape_that_cannot_fit_is_refused_with_the_fix_and_fits_on_more_nodes(tmp_path):
    source = _config_json(tmp_path / "llama-3.1-70b", LLAMA_3_1_70B)
    line = _refusal("render", "-p", "p5", "--set", f"model.shape_from={source}")
    assert line.startswith(
        "error: --train-config/--set: model 8b with dim=8192, n_layers=80, n_heads=64, ffn_dim=28672"
    )
    assert f"exceeds the {H100_GIB:.1f} GiB of one H100 (p5.48xlarge)" in line
    assert "a smaller data.batch_size (now 2)" in line and "more nodes" in line
    config = str(profile_file(tmp_path / "profile", gpu_nodes__max_size=16))
    train, summary = _rendered("-c", config, "--nodes", "8", "--set", f"model.shape_from={source}")
    assert train["model"]["n_layers"] == 80 and "job train: 8 x p5.48xlarge, world 64" in summary


def test_plan_shows_the_set_shape_its_state_and_its_memory(tmp_path):
    source = _config_json(tmp_path / "llama-3.1-70b", LLAMA_3_1_70B)
    config = str(profile_file(tmp_path / "profile", gpu_nodes__max_size=16))
    result = run_cli("plan", "-c", config, "--nodes", "8", "--set", f"model.shape_from={source}")
    assert result.code == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "model 8b with dim=8192, n_layers=80, n_heads=64, ffn_dim=28672, max_seq_len=131072:" in out
    state_gb = float(re.search(r"model [^:]*: (\d+) GB of checkpointed state", out).group(1))
    assert 840 < state_gb < 850  # 12 B x 70.6 B parameters, not the 8b preset's 96 GB
    assert re.search(
        rf"Memory per GPU \(8b with dim=8192.*?world 64\): [\d.]+ GiB of {H100_GIB:.1f} GiB \(H100\): fits", out
    )


# ----- the existing-cluster trap --------------------------------------------------------------------

#: The README's `cluster:` sample, as a newcomer copies it.
README_CLUSTER_SAMPLE = {
    "name": "team-a",
    "account": "123456789012",
    "region": "us-east-1",
    "gpu_availability_zone": "us-east-1a",
    "kubernetes_version": "1.35",
    "gpu_nodes": {"instance_type": "p5.48xlarge", "desired_size": 2, "max_size": 4},
    "image": {"build": False, "uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer:1.0"},
    "cluster": {
        "context": "team-a-prod",
        "namespace": "ml-jobs",
        "pvc": "shared-lustre",
        "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer:1.0",
        "node_selector": {"karpenter.sh/nodepool": "training"},
    },
}


def _cluster_config(tmp_path: Path, **changes) -> str:
    path = tmp_path / "my-cluster.yaml"
    path.write_text(yaml.safe_dump({**README_CLUSTER_SAMPLE, **changes}))
    return str(path)


def test_a_p5_cluster_config_without_default_job_is_refused_naming_the_choices(tmp_path):
    config = _cluster_config(tmp_path)
    for command in ("render", "plan"):
        line = _refusal(command, "-c", config)
        assert line.startswith("error: default_job: the config names none"), line
        assert "p5.48xlarge (H100) would be the smoke job, the tiny model" in line
        assert "set default_job: llama3-8b (8b preset" in line and "default_job: smoke to prove the plumbing" in line
        assert "or give --train-config" in line


def test_the_corrected_readme_sample_renders_the_8b_job(tmp_path):
    train, summary = _rendered("-c", _cluster_config(tmp_path, default_job="llama3-8b"))
    assert train["model"]["preset"] == "8b" and "job train: 2 x p5.48xlarge, world 16, model 8b," in summary
    smoke, _ = _rendered("-c", _cluster_config(tmp_path, default_job="smoke"))
    assert smoke["model"]["preset"] == "tiny"


def test_a_trainer_config_needs_no_default_job(tmp_path):
    trainer = tmp_path / "train.yaml"
    trainer.write_text(yaml.safe_dump({"steps": 10, "model": {"preset": "1b"}}))
    train, _ = _rendered("-c", _cluster_config(tmp_path), "--train-config", str(trainer))
    assert train["model"]["preset"] == "1b" and train["steps"] == 10


def test_gpus_no_job_is_sized_for_keep_the_smoke_job_without_default_job(tmp_path):
    config = profile_file(tmp_path, "g5-smoke", default_job=None)
    assert resolve_config(None, str(config)).default_job is None
    train, _ = _rendered("-c", str(config))
    assert train["model"]["preset"] == "tiny"
