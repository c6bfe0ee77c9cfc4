"""distributed.precision: one field says what the trainer computes in. auto follows the resolved
backend (bf16 on nccl, fp32 on gloo); bf16 where there is no GPU is refused with the field named;
the rendered GPU job states bf16 in its ConfigMap and in the summary render prints."""

from __future__ import annotations

import pytest
import yaml

from nvrx_eks.facts.errors import ConfigError
from tests.support.cli_harness import run_cli
from workloads.config import TrainConfig


def _config(*overrides: str) -> TrainConfig:
    return TrainConfig.from_dict({}, "test", list(overrides))


@pytest.mark.parametrize(
    ("precision", "backend", "expected"),
    [("auto", "nccl", "bf16"), ("auto", "gloo", "fp32"), ("fp32", "nccl", "fp32"), ("bf16", "nccl", "bf16")],
)
def test_precision_resolves_against_the_backend(precision, backend, expected):
    cfg = _config(f"distributed.precision={precision}")
    assert cfg.distributed.resolved_precision(backend) == expected


def test_bf16_with_gloo_is_refused_naming_the_field_and_the_fix():
    with pytest.raises(ConfigError, match=r"distributed\.precision: bf16 needs distributed\.backend=nccl.*fp32"):
        _config("distributed.precision=bf16", "distributed.backend=gloo")


def test_bf16_on_auto_that_resolves_to_gloo_is_refused_at_start_up():
    # backend auto on a machine without CUDA resolves to gloo: bf16 there is the same mistake.
    cfg = _config("distributed.precision=bf16")
    with pytest.raises(ConfigError, match=r"distributed\.precision: bf16 needs nccl .* resolved to gloo"):
        cfg.distributed.resolved_precision("gloo")


def test_the_cpu_runtime_computes_in_fp32_unless_told_otherwise():
    from workloads.device import resolve_runtime

    runtime = resolve_runtime(_config("distributed.backend=gloo"))
    assert runtime.backend == "gloo" and runtime.bf16 is False


def test_an_unknown_precision_is_a_config_error_exit_2():
    result = run_cli("render", "--nodes", "2", "--set", "distributed.precision=fp16")
    assert result.code == 2
    assert "distributed.precision" in result.stderr + result.stdout and "Traceback" not in result.stderr


def _rendered_train(*args: str) -> dict:
    result = run_cli("render", "--nodes", "2", *args)
    assert result.code == 0, result.stderr
    config_map = next(d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "ConfigMap")
    (text,) = config_map["data"].values()
    return yaml.safe_load(text)


def test_the_rendered_gpu_job_states_bf16_and_the_summary_prints_it():
    assert _rendered_train()["distributed"]["precision"] == "bf16"
    result = run_cli("render", "--nodes", "2")
    assert "precision bf16" in " ".join(result.stderr.split())


def test_an_explicit_fp32_is_kept_on_gpu_nodes():
    distributed = _rendered_train("--set", "distributed.precision=fp32")["distributed"]
    assert distributed == {**distributed, "backend": "nccl", "precision": "fp32"}
