"""`--spare-nodes` changes the job's launch, not its trainer config: the run stays in the job's own
directory, the node-local tier and the MFU peak stay on. Before, the config was rebuilt from a full
dump with distributed.spare_nodes set, which marked every field as given, so every job with spares
ran in /fsx/runs/default (sharing checkpoints), without the local tier and with MFU n/a."""

from __future__ import annotations

import yaml

from nvrx_eks.facts.instances import INSTANCE_FACTS
from tests.support.cli_harness import run_cli
from tests.support.profiles import profile_file


def _train_config(*args: str) -> dict:
    result = run_cli("render", *args)
    assert result.code == 0, result.output
    config_map = next(d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "ConfigMap")
    return yaml.safe_load(config_map["data"]["train.yaml"])


def test_spare_nodes_keep_the_jobs_config(tmp_path):
    config = str(profile_file(tmp_path, gpu_nodes__max_size=3, gpu_nodes__desired_size=3))
    without = _train_config("--config", config, "--nodes", "2", "--name", "exp1")
    spared = _train_config("--config", config, "--nodes", "2", "--spare-nodes", "1", "--name", "exp1")
    assert spared["run_dir"] == "/fsx/runs/exp1"
    assert spared["checkpoint"]["local"]["interval_steps"] is not None
    assert spared["peak_tflops_per_gpu"] == INSTANCE_FACTS["p5.48xlarge"].peak_bf16_tflops
    assert spared["distributed"]["spare_nodes"] == 1
    # Nothing else differs from the same job without spares.
    spared["distributed"]["spare_nodes"] = 0
    assert spared == without
