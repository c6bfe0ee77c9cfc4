"""What render and submit print about the job they build (nvrx_eks/jobs/summary.py): the tokens
per step, the same on every node count the global batch allows; whether the data is synthetic;
the checkpoint cadence and an estimate, or why there is none."""

from __future__ import annotations

import pytest

from tests.support.cli_harness import run_cli
from tests.support.profiles import profile_file


def _summary(*args: str) -> str:
    result = run_cli("render", *args)
    assert result.code == 0, result.stderr
    return " ".join(result.stderr.split())


@pytest.mark.parametrize(
    ("nodes", "micro_batches"),
    [(2, "8 micro-batches"), (4, "4 micro-batches"), (8, "2 micro-batches"), (16, "1 micro-batch")],
)
def test_every_node_count_trains_on_the_same_tokens_per_step_and_says_so(tmp_path, nodes, micro_batches):
    config = str(profile_file(tmp_path, gpu_nodes__max_size=16, gpu_nodes__desired_size=2))
    summary = _summary("--config", config, "--nodes", str(nodes))
    world = nodes * 8
    assert f"job train: {nodes} x p5.48xlarge, world {world}, model 8b" in summary
    batch = f"batch: {world} ranks x 2 x 8192 tokens x {micro_batches} = 2,097,152 tokens per step"
    assert batch in summary
    assert "(data.global_batch_tokens: the same on any node count)" in summary
    assert "checkpoints: every " in summary and " to FSx, node-local every " in summary
    assert "data: synthetic tokens (no data.path)" in summary
    assert "estimate: 5,000 steps x ~" in summary and " on demand" in summary


def test_a_job_without_a_fixed_global_batch_and_a_tiny_model_says_what_it_cannot_say():
    summary = _summary("-p", "g5-smoke")
    assert "grows with the node count; set data.global_batch_tokens to fix it" in summary
    assert "estimate: n/a for model tiny" in summary


def test_a_job_on_real_data_names_it():
    assert "data: /fsx/s3/corpus-v1" in _summary("--data", "s3/corpus-v1")
