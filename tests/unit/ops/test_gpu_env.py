"""What the GPU smoke knows of its machine, read without a CUDA context in its own process
(nvrx_eks.ops.gpu_env): the smoke's GPU path reads the GPUs in a child and records them, the child
and the probe run here on CPU, and the probe names the first thing the smoke could not import."""

from __future__ import annotations

import json

import pytest
import torch
from rich.console import Console

from nvrx_eks.ops import gpu_env, gpu_smoke
from workloads.events import RunEvents

#: What gpu_env.gpu_facts reports on one H200 (figures of the lent machine: KINDS.md, a public log).
H200_FACTS = {
    "torch": "2.11.0+cu130",
    "cuda": "13.0",
    "nccl": "2.28.9",
    "gpus": [
        {
            "name": "NVIDIA H200",
            "total_memory_bytes": 143156 << 20,
            "capability": "9.0",
            "instance_facts_total_memory_bytes": 143156 << 20,
        }
    ],
    "allocator_conf": "expandable_segments:True",
    "allocator": {"backend": "native", "settings": {"expandable_segments": True}, "expandable_segments": True},
    "sdpa_dispatcher_choice": {"sdpa_kernel": "cudnn_attention"},
    "sdpa_ops_run": ["aten::_scaled_dot_product_cudnn_attention"],
}


def test_the_smokes_own_process_never_touches_cuda_and_records_what_the_child_read(tmp_path, monkeypatch):
    """A CUDA context in the smoke's process would sit on GPU 0 beside rank 0's through every
    launch (and keep rank 0 from creating one on a GPU in EXCLUSIVE_PROCESS mode)."""

    def no_cuda_here(*args, **kwargs):
        raise AssertionError("the smoke's own process called torch.cuda")

    for name in ("is_available", "device_count", "get_device_name", "get_device_properties", "init", "set_device"):
        monkeypatch.setattr(torch.cuda, name, no_cuda_here)
    monkeypatch.setattr(torch.cuda.nccl, "version", no_cuda_here)
    children = []

    def child(preset, seq_len, batch_size):
        children.append((preset, seq_len, batch_size))
        return H200_FACTS

    monkeypatch.setattr(gpu_env, "read_gpu_facts", child)

    def launch(plan, run_dir, **kwargs):
        run_dir.mkdir(parents=True, exist_ok=True)
        start = {"event": "run_start", "rank": 0, "pid": 7, "t": 1.0, "backend": "nccl"}
        return {"exit_code": 0, "run": RunEvents([start]), "summary": None}

    monkeypatch.setattr(gpu_smoke, "_run", launch)
    with open(tmp_path / "console.txt", "w") as sink:
        result = gpu_smoke.smoke(out_dir=tmp_path / "smoke", preset="small", console=Console(file=sink), budget_s=600)
    assert children == [("small", 1024, 2)]
    assert result["mode"] == "gpu" and result["nproc"] == 1 and result["device"] == H200_FACTS
    assert json.loads((tmp_path / "smoke" / "gpu_smoke.json").read_text())["device"] == H200_FACTS


def test_the_child_reads_this_machine_and_exits(tmp_path):
    facts = gpu_env.read_gpu_facts("tiny", 64, 2)
    assert facts["torch"] == torch.__version__ and facts["gpus"] == []
    assert facts["allocator_conf"] == "expandable_segments:True"
    # No GPU here: the smoke's real mode then refuses, naming --dry-run.
    from nvrx_eks.facts.errors import ConfigError

    with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
        gpu_smoke.plan_for(False, None, None, facts)


def test_a_child_that_fails_is_one_line_naming_what_failed(monkeypatch):
    from nvrx_eks.facts.errors import ConfigError

    monkeypatch.setattr(gpu_env, "__name__", "nvrx_eks.no_such_module")
    with pytest.raises(ConfigError, match=r"^gpu-smoke: reading the GPUs failed \(.*No module named") as failed:
        gpu_env.read_gpu_facts("tiny", 64, 2)
    assert "\n" not in str(failed.value)


def test_the_probe_records_the_interpreter_and_names_the_first_import_that_fails(tmp_path, monkeypatch):
    plan = tmp_path / "install-plan.txt"
    plan.write_text("install\tpydantic\t2.14.4\tnot installed\n")
    lines, problem = gpu_env.probe(plan)
    assert problem is None
    text = "\n".join(lines)
    for start in ("python: ", "glibc: ", "executable: ", "install\tpydantic", "import workloads.train: ", "torch: "):
        assert f"\n{start}" in f"\n{text}", start
    assert "nccl: none (a CPU build of torch)" in lines

    monkeypatch.setattr(gpu_env, "SMOKE_MODULES", ("json", "no_such_module_of_the_smoke", "also_missing"))
    lines, problem = gpu_env.probe(None)
    assert (
        problem
        == "import no_such_module_of_the_smoke: ModuleNotFoundError: No module named 'no_such_module_of_the_smoke'"
    )
    assert any(line.startswith("import also_missing: FAILED") for line in lines)


def test_on_a_gpu_the_child_reports_cudas_memory_beside_the_instance_facts_and_records_never_stop_it(monkeypatch):
    """gpu_facts' GPU branch with torch.cuda answering as one H100 would: what CUDA reports next
    to the figure the plan divides (nvrx_eks/facts/instances.py), and the allocator and attention
    records, which here cannot allocate on the device and say so instead of failing the smoke."""
    from types import SimpleNamespace

    from nvrx_eks.facts.instances import CUDA_TOTAL_MEMORY_MIB

    h100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=81090 << 20, major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: h100)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 28, 9))
    # Unset, and restored afterwards however gpu_facts sets it (the ranks' default).
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    facts = gpu_env.gpu_facts("tiny", 64, 2)
    assert facts["nccl"] == "2.28.9" and facts["allocator_conf"] == "expandable_segments:True"
    assert facts["gpus"] == [
        {
            "name": "NVIDIA H100 80GB HBM3",
            "total_memory_bytes": 81090 << 20,
            "capability": "9.0",
            "instance_facts_total_memory_bytes": CUDA_TOTAL_MEMORY_MIB["H100"] << 20,
        }
    ]
    for record in ("allocator", "sdpa_dispatcher_choice", "sdpa_ops_run"):
        assert set(facts[record]) == {"error"}, facts[record]
