"""model.init_from is read only by an iteration that restores nothing: a restored checkpoint
replaces every weight, and reading the Hugging Face weights anyway cost each rank ~1 GB from FSx
(8b preset, 16 ranks) at every restart (world size 1, gloo, in one process)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import save_file

from tests.support.trainer_fixtures import single_rank_env
from workloads.config import TrainConfig
from workloads.hf_format import hf_config, hf_name, parameter_shapes
from workloads.presets import MODEL_PRESETS


@pytest.fixture
def hf_weights(tmp_path):
    """A Hugging Face checkpoint of the tiny preset (small random weights)."""
    root = tmp_path / "hf"
    root.mkdir()
    shape = MODEL_PRESETS["tiny"]
    (root / "config.json").write_text(json.dumps(hf_config(shape, None, "float32")))
    generator = torch.Generator().manual_seed(0)
    tensors = {hf_name(n): 0.02 * torch.randn(size, generator=generator) for n, size in parameter_shapes(shape).items()}
    save_file(tensors, str(root / "model.safetensors"))
    return root


def test_the_weights_are_read_when_nothing_is_restored_and_only_then(tmp_path, monkeypatch, hf_weights):
    import workloads.hf_import as hf_import
    from workloads.events import load_run
    from workloads.process_state import ProcessState
    from workloads.train import train_attempt

    reads: list[str] = []
    real = hf_import.load_hf_weights

    def counted(model, root, *args):
        reads.append(str(root))
        return real(model, root, *args)

    monkeypatch.setattr(hf_import, "load_hf_weights", counted)
    single_rank_env(monkeypatch)

    def attempt(steps: int) -> None:
        settings = [
            f"run_dir={tmp_path / 'run'}",
            f"steps={steps}",
            f"model.init_from={hf_weights}",
            "distributed.backend=gloo",
            "inprocess.enabled=false",
            "checkpoint.backend=sync",
            "checkpoint.interval_steps=2",
        ]
        try:
            assert train_attempt(ProcessState(TrainConfig.from_dict({}, "x", settings), 0, 1, None))
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()

    attempt(steps=2)  # a fresh start: from the Hugging Face weights; commits step 2
    assert reads == [str(hf_weights)]
    attempt(steps=4)  # the next attempt (a restart or a resume): restores step 2 over any weights
    assert reads == [str(hf_weights)]
    loads = load_run(tmp_path / "run").of("checkpoint_load")
    assert [e["step"] for e in loads] == [2]
