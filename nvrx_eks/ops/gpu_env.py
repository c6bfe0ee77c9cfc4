"""What a GPU machine is, as the smoke's processes will meet it, read in a process of its own.

The smoke's parent never initializes CUDA: a context it held on GPU 0 would keep ~0.5 GB there
beside rank 0's through every launch, and on a GPU in EXCLUSIVE_PROCESS mode rank 0 could not
create its own. So the GPUs are read here, in a short-lived child that exits before any launch:

- `python -m nvrx_eks.ops.gpu_env facts --preset P --seq-len S --batch-size B` prints `gpu_facts`
  as one JSON line (the smoke reads it: `read_gpu_facts`).
- `python -m nvrx_eks.ops.gpu_env probe [INSTALL_PLAN]` (scripts/gpu-smoke-device.sh, before the
  smoke) imports every module the smoke's processes start from and prints `key: value` lines for
  env.txt: the interpreter, glibc, the install plan, torch, CUDA and NCCL. When something the smoke
  needs is missing it ends with `probe failed: <reason>` and exit 3. This module imports only the
  standard library before that, so a broken package is reported, not a traceback.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: The modules the smoke's processes start from (the smoke and its runner, each rank, the
#: coordinator, ft_launcher) and the NVRx layers the ranks use: importing them is importing
#: everything those processes import at start-up.
SMOKE_MODULES = (
    "nvrx_eks.ops.gpu_smoke",
    "nvrx_eks.local.runner",
    "workloads.train",
    "workloads.coordinator",
    "nvidia_resiliency_ext.fault_tolerance.launcher",
    "nvidia_resiliency_ext.inprocess",
    "nvidia_resiliency_ext.checkpointing.async_ckpt.core",
    "pydantic",
    "grpc",
)

#: Exit code of a probe that found the machine unable to run the smoke (the device script's
#: "could not be made ready").
PROBE_FAILED = 3

#: How long the smoke waits for `facts` (importing torch and creating one CUDA context).
FACTS_TIMEOUT_S = 180


def glibc() -> str:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or "unknown"
    except (AttributeError, ValueError, OSError):
        return " ".join(platform.libc_ver()) or "unknown"


def allocator_conf() -> str:
    """PYTORCH_CUDA_ALLOC_CONF as each rank starts with it: the environment's, else the trainer's
    own (workloads.device.resolve_runtime sets it before CUDA's first use)."""
    from workloads.process_env import CUDA_ALLOC_CONF

    return os.environ.get("PYTORCH_CUDA_ALLOC_CONF", CUDA_ALLOC_CONF)


def gpu_facts(preset: str, seq_len: int, batch_size: int) -> dict[str, Any]:
    """The GPUs as torch sees them (count, name, total_memory: what the trainer's `auto`
    activation checkpointing divides), torch's CUDA and NCCL, the caching allocator's backend and
    settings, and the attention kernel the ranks will run for the plan's shapes. CUDA is
    initialized here: call it in a child process (`read_gpu_facts`)."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", allocator_conf())
    import torch

    from nvrx_eks.facts.instances import cuda_total_memory_bytes
    from workloads.model import attention_kernel, attention_ops_run
    from workloads.presets import MODEL_PRESETS

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": [],
        "allocator_conf": os.environ["PYTORCH_CUDA_ALLOC_CONF"],
    }
    if count == 0:
        return facts
    facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    for index in range(count):
        properties = torch.cuda.get_device_properties(index)
        facts["gpus"].append(
            {
                "name": properties.name,
                "total_memory_bytes": properties.total_memory,
                "capability": f"{properties.major}.{properties.minor}",
                # The figure the plan uses for this GPU (nvrx_eks/facts/instances.py), to check it.
                "instance_facts_total_memory_bytes": cuda_total_memory_bytes(properties.name),
            }
        )
    device = torch.device("cuda", 0)
    shape = MODEL_PRESETS[preset]
    # Records, not requirements: one that fails says why in its place and the smoke goes on.
    facts["allocator"] = _recorded(lambda: _allocator(torch, device))
    facts["sdpa_dispatcher_choice"] = _recorded(
        lambda: attention_kernel(shape, seq_len, batch_size, device, torch.bfloat16)
    )
    facts["sdpa_ops_run"] = _recorded(lambda: attention_ops_run(shape, seq_len, batch_size, device, torch.bfloat16))
    return facts


def _allocator(torch: Any, device: Any) -> dict[str, Any]:
    """The caching allocator's backend and settings as the ranks will have them, after one block
    made its first segment (torch.cuda.memory._snapshot: private, present in torch 2.11 and 2.13;
    whether a segment is expandable shows whether PYTORCH_CUDA_ALLOC_CONF took effect)."""
    block = torch.empty(1 << 20, device=device)
    snapshot = torch.cuda.memory._snapshot()
    del block
    return {
        "backend": torch.cuda.get_allocator_backend(),
        "settings": snapshot.get("allocator_settings"),
        "expandable_segments": any(s.get("is_expandable", False) for s in snapshot.get("segments", [])),
    }


def _recorded(read: Any) -> Any:
    try:
        return read()
    except Exception as err:  # the record says what failed; the smoke does not depend on it
        return {"error": f"{type(err).__name__}: {err}"}


def read_gpu_facts(preset: str, seq_len: int, batch_size: int) -> dict[str, Any]:
    """gpu_facts, from a child process that exits before the smoke launches anything; a
    ConfigError naming what failed when it cannot be read (no driver, a broken torch)."""
    from nvrx_eks.facts.errors import ConfigError

    argv = [sys.executable, "-m", __name__, "facts", "--preset", preset]
    argv += ["--seq-len", str(seq_len), "--batch-size", str(batch_size)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=FACTS_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"gpu-smoke: reading the GPUs took over {FACTS_TIMEOUT_S} s; check the driver") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"gpu-smoke: reading the GPUs failed ({tail}); check the driver and torch's CUDA")
    return json.loads(lines[-1])


def probe(install_plan: Path | None = None) -> tuple[list[str], str | None]:
    """env.txt's lines about the interpreter and what the smoke imports, and the first reason the
    smoke cannot run here (None: it can). Short: imports and versions, no CUDA context."""
    lines = [
        f"python: {sys.version.split()[0]} ({sys.version})",
        f"executable: {sys.executable}",
        f"prefix: {sys.prefix}",
        f"glibc: {glibc()}",
        f"PYTHONPATH: {os.environ.get('PYTHONPATH', '')}",
    ]
    if install_plan is not None and install_plan.is_file():
        lines.append("--- install plan (action, distribution, version, why)")
        lines += install_plan.read_text().splitlines()
    problem = None
    began = time.monotonic()
    for module in SMOKE_MODULES:
        try:
            loaded = importlib.import_module(module)
        except Exception as err:  # what the ranks would die of, as one line
            problem = problem or f"import {module}: {type(err).__name__}: {err}"
            lines.append(f"import {module}: FAILED {type(err).__name__}: {err}")
            continue
        lines.append(f"import {module}: {Path(getattr(loaded, '__file__', '') or '?').parent}")
    lines.append(f"imports took: {time.monotonic() - began:.1f} s")
    if problem is not None:
        return lines, problem
    from importlib.metadata import version

    import torch

    from nvrx_eks.local.launcher_command import ft_launcher_command
    from workloads.process_env import nccl_version_problem

    for dist in ("nvidia-resiliency-ext", "pydantic", "pydantic-core", "grpcio", "numpy"):
        lines.append(f"{dist}: {version(dist)}")
    lines.append("ft_launcher as the runner starts it: " + " ".join(ft_launcher_command()))
    lines.append(f"torch: {torch.__version__} cuda: {torch.version.cuda}")
    lines.append(f"PYTORCH_CUDA_ALLOC_CONF of the ranks: {allocator_conf()}")
    if torch.version.cuda is None:
        lines.append("nccl: none (a CPU build of torch)")
        return lines, problem
    nccl = tuple(torch.cuda.nccl.version())
    lines.append(f"nccl: {'.'.join(map(str, nccl))}")
    mm_out_dtype = "dtype" in torch.ops.aten.mm.overloads()
    lines.append(f"torch.mm(out_dtype=): {'yes' if mm_out_dtype else 'no'}")
    if (why := nccl_version_problem(nccl)) is not None:
        problem = why
    elif not mm_out_dtype:
        problem = f"torch {torch.__version__} has no aten::mm.dtype (the LM head's fp32 accumulation needs it)"
    return lines, problem


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m nvrx_eks.ops.gpu_env", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    facts = sub.add_parser("facts")
    facts.add_argument("--preset", required=True)
    facts.add_argument("--seq-len", type=int, required=True)
    facts.add_argument("--batch-size", type=int, required=True)
    probe_args = sub.add_parser("probe")
    probe_args.add_argument("install_plan", type=Path, nargs="?")
    args = parser.parse_args(argv)
    if args.command == "facts":
        print(json.dumps(gpu_facts(args.preset, args.seq_len, args.batch_size)))
        return 0
    lines, problem = probe(args.install_plan)
    print("\n".join(lines), flush=True)
    if problem is not None:
        print(f"probe failed: {problem}")
        return PROBE_FAILED
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
