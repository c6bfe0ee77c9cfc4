"""The GPU path, checked on CPU: the memory model against measurement, the model's memory
features (activation checkpointing, chunked loss, fp32 RoPE, GQA without copies), the backend
choice and GPU-count check, the restart finalize's device, the per-rank state digest under the
in-process watchdog (a digest slower than the soft timeout, end to end:
tests/runs/trainer/test_run_variants.py), and load-time trust of what the same process committed.
One module over 500 lines: each concern is a few tests sharing the same small-model fixtures."""

from __future__ import annotations

import hashlib
import sys
import threading

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from infra.config import resolve_config
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.job_presets import JOB_PRESETS
from nvrx_eks.jobs.spec import build_jobspec, load_train_config
from tests.support.trainer_fixtures import single_rank_env
from workloads.config import TrainConfig
from workloads.memory import (
    GIB,
    block_activation_bytes_per_token,
    estimate_for,
    saved_activation_bytes_per_token,
)
from workloads.presets import MODEL_PRESETS, ModelShape

#: The memory model's activation term must be within this of what autograd actually saves.
ACTIVATION_TOLERANCE = 0.05
#: A GQA shape (kv heads < heads) small enough for a CPU test.
GQA_SHAPE = ModelShape(vocab_size=512, dim=256, n_layers=1, n_heads=8, n_kv_heads=2, ffn_dim=704, max_seq_len=256)


@pytest.fixture
def single_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _cpu_runtime(bf16: bool = False):
    from workloads.device import Runtime

    return Runtime(device=torch.device("cpu"), backend="gloo", bf16=bf16, pg_timeout_s=60.0)


def _build(shape: ModelShape, **kwargs):
    from torch.distributed.device_mesh import init_device_mesh

    from workloads.model import build_model

    return build_model(shape, kwargs.pop("runtime", _cpu_runtime()), init_device_mesh("cpu", (1,)), seed=7, **kwargs)


# ----- memory model ----------------------------------------------------------------------------


def _saved_bytes_per_token(shape: ModelShape, tokens: tuple[int, int]) -> float:
    """What autograd saves for one Block's backward, per token, counting each storage once."""
    from workloads.model import Block, _rope_tables

    torch.manual_seed(0)
    block = Block(shape).train()
    cos, sin = _rope_tables(shape, torch.device("cpu"))
    x = torch.randn(*tokens, shape.dim, requires_grad=True)
    # Parameters and the RoPE tables are not activations; the block's input is (the previous
    # block's output, kept alive for this block's backward).
    skip = {p.data_ptr() for p in block.parameters()} | {cos.data_ptr(), sin.data_ptr()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, cos, sin)
    return sum(saved.values()) / (tokens[0] * tokens[1])


@pytest.mark.parametrize("shape", [MODEL_PRESETS["small"], GQA_SHAPE], ids=["small", "gqa"])
def test_activation_model_matches_what_autograd_saves(shape):
    # CPU: fp32 (4 bytes) and torch's composite RMSNorm, as the model states.
    measured = _saved_bytes_per_token(shape, (2, 128))
    modelled = block_activation_bytes_per_token(shape, 4, fused_norm=False)
    assert modelled == pytest.approx(measured, rel=ACTIVATION_TOLERANCE)


@pytest.mark.parametrize("checkpointed_blocks", [0, 3, 8], ids=["full", "3-of-8-checkpointed", "all-checkpointed"])
def test_whole_model_activations_match_the_model(single_rank, checkpointed_blocks):
    """Everything autograd holds at the end of forward (the storages still allocated then: FSDP
    has freed the blocks' unsharded parameters by that time), against
    saved_activation_bytes_per_token."""
    shape = MODEL_PRESETS["small"]
    model = _build(shape, checkpointed_blocks=checkpointed_blocks, loss_chunk_tokens=128).train()
    batch, seq = 2, 512
    inputs, targets = torch.randint(0, shape.vocab_size, (batch, seq)), torch.randint(0, shape.vocab_size, (batch, seq))
    storages = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dtype.is_floating_point:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(inputs, targets)
    # The [norm, output] group stays unsharded for backward (build_model): parameters, counted by
    # the model's unsharded-groups term, not activations.
    from torch.distributed.tensor import DTensor

    for param in model.parameters():
        if not isinstance(param, DTensor):  # registered unsharded
            storages.pop(param.untyped_storage().data_ptr(), None)
    measured = sum(s.nbytes() for s in storages.values()) / (batch * seq)
    modelled = saved_activation_bytes_per_token(shape, 4, checkpointed_blocks=checkpointed_blocks, fused_norm=False)
    assert modelled == pytest.approx(measured, rel=ACTIVATION_TOLERANCE)


def test_the_default_8b_job_fits_an_h100_only_with_activation_checkpointing():
    default_job = JOB_PRESETS["llama3-8b"].train
    world = 2 * 8  # the p5 profile's default: 2 nodes of 8 GPUs
    with_ac = estimate_for(TrainConfig.from_dict(default_job, "x", ["model.activation_checkpointing=true"]), world)
    assert with_ac.total < 0.5 * 80 * GIB  # headroom, not just a fit
    without = estimate_for(TrainConfig.from_dict(default_job, "x", ["model.activation_checkpointing=false"]), world)
    assert without.total > 80 * GIB
    assert without.activations > 80 * GIB  # 32 layers x 176 KB x 16384 tokens


def test_render_refuses_a_job_that_does_not_fit_with_the_numbers():
    train = load_train_config(
        None,
        ["model.preset=8b", "data.seq_len=8192", "data.batch_size=2", "model.activation_checkpointing=false"],
        None,
    )
    with pytest.raises(ConfigError) as err:
        build_jobspec(resolve_config("p5"), nodes=2, name="big", train=train)
    message = str(err.value)
    assert "GiB per GPU" in message and "79.2 GiB of one H100" in message
    assert "model.activation_checkpointing=true" in message
    ok = load_train_config(None, ["model.preset=8b", "data.seq_len=8192", "data.batch_size=2"], None)
    assert build_jobspec(resolve_config("p5"), nodes=2, name="fits", train=ok).train.model.preset == "8b"


def test_gpu_profiles_render_the_nccl_backend_explicitly():
    spec = build_jobspec(resolve_config("p5"), nodes=2, name="t", train=load_train_config(None, [], None))
    assert spec.train.distributed.backend == "nccl"
    kept = load_train_config(None, ["distributed.backend=gloo"], None)
    assert build_jobspec(resolve_config("p5"), nodes=1, name="t", train=kept).train.distributed.backend == "gloo"


# ----- model ------------------------------------------------------------------------------------


def test_chunked_loss_equals_full_cross_entropy_and_checkpointing_keeps_gradients(single_rank):
    shape = MODEL_PRESETS["tiny"]
    inputs, targets = torch.randint(0, 256, (4, 64)), torch.randint(0, 256, (4, 64))
    grads = []
    for blocks, chunk in ((0, 10_000), (2, 37), (0, 37)):
        model = _build(shape, checkpointed_blocks=blocks, loss_chunk_tokens=chunk).train()
        torch.manual_seed(1)  # the same dropout masks for both passes
        full = F.cross_entropy(model(inputs).float().flatten(0, 1), targets.flatten())
        torch.manual_seed(1)
        loss = model(inputs, targets)
        assert loss.item() == pytest.approx(full.item(), rel=1e-6)
        loss.backward()
        grads.append(
            {n.replace("_checkpoint_wrapped_module.", ""): p.grad.full_tensor() for n, p in model.named_parameters()}
        )
    for name, grad in grads[0].items():
        for other in grads[1:]:
            torch.testing.assert_close(other[name], grad, rtol=1e-5, atol=1e-7)


def test_checkpointed_model_keeps_parameter_names_and_initial_values(single_rank):
    plain = _build(MODEL_PRESETS["tiny"])
    wrapped = _build(MODEL_PRESETS["tiny"], checkpointed_blocks=1)
    a, b = plain.state_dict(), wrapped.state_dict()
    assert list(a) == list(b)
    assert all(torch.equal(a[k].full_tensor(), b[k].full_tensor()) for k in a)


def test_rope_rotates_in_fp32_under_bf16_compute(single_rank):
    model = _build(GQA_SHAPE, runtime=_cpu_runtime(bf16=True))
    seen = []
    model.layers[0].register_forward_pre_hook(lambda mod, args: seen.append(args[1].dtype))
    import workloads.model as model_module

    rotated = []
    original = model_module._apply_rope

    def spy(x, cos, sin):
        out = original(x, cos, sin)
        rotated.append((x.dtype, out.dtype))
        return out

    model_module._apply_rope = spy
    try:
        model(torch.randint(0, 512, (1, 16)))
    finally:
        model_module._apply_rope = original
    assert seen == [torch.float32]  # the tables reach the block uncast
    assert rotated and all(pair == (torch.bfloat16, torch.bfloat16) for pair in rotated)


def test_only_the_root_group_has_no_parameters(single_rank):
    from torch.distributed.fsdp import FSDPModule

    model = _build(MODEL_PRESETS["tiny"])
    assert isinstance(model.tok_embeddings, FSDPModule)
    assert isinstance(model.norm, FSDPModule) and isinstance(model.output, FSDPModule)
    root_params = model._get_fsdp_state()._fsdp_param_group
    assert root_params is None  # nothing stays unsharded between forward and backward


def test_the_last_group_stays_unsharded_for_backward_and_the_blocks_do_not(single_rank):
    from torch.distributed.tensor import DTensor

    shape = MODEL_PRESETS["tiny"]
    model = _build(shape)
    tokens = torch.randint(0, shape.vocab_size, (2, 32))
    loss = model(tokens, tokens)
    # Registered parameters are DTensors while a group is sharded, plain tensors while unsharded.
    assert not isinstance(model.output.weight, DTensor) and not isinstance(model.norm.weight, DTensor)
    assert isinstance(model.layers[0].attention.wq.weight, DTensor)
    assert isinstance(model.tok_embeddings.weight, DTensor)
    loss.backward()
    assert isinstance(model.output.weight, DTensor)  # resharded after its backward


# ----- backend and devices ------------------------------------------------------------------------


class _FakeCuda:
    def __init__(self, count: int):
        self.count = count
        self.set_devices: list = []

    def is_available(self):
        return self.count > 0

    def device_count(self):
        return self.count

    def set_device(self, device):
        self.set_devices.append(device)


def test_nccl_needs_a_visible_gpu_per_local_rank(monkeypatch):
    from workloads import device as device_module

    cfg = TrainConfig.from_dict({}, "x", ["distributed.backend=nccl"])
    fake = _FakeCuda(count=4)
    monkeypatch.setattr(device_module.torch, "cuda", fake)
    monkeypatch.setenv("LOCAL_RANK", "5")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    with pytest.raises(device_module.GpusMissing, match="sees 4 GPU\\(s\\) for 8 local rank"):
        device_module.resolve_runtime(cfg)
    assert fake.set_devices == []
    fake.count = 0  # a pod that sees no GPU at all
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(device_module.GpusMissing):
        device_module.resolve_runtime(cfg)
    fake.count = 8
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    runtime = device_module.resolve_runtime(cfg)
    assert runtime.device == torch.device("cuda", 0) and runtime.bf16
    assert fake.set_devices == [torch.device("cuda", 0)]
    import os

    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == device_module.CUDA_ALLOC_CONF
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")


def test_gpus_missing_ends_the_rank_with_do_not_requeue(monkeypatch):
    import workloads.train as train_module
    from workloads.device import GpusMissing

    class NoGpus:
        def __init__(self, process, call_wrapper):
            pass

        def run(self):
            raise GpusMissing("distributed.backend: nccl needs one GPU per local rank")

    class Events:
        def __init__(self):
            self.emitted = []

        def emit(self, kind, **fields):
            self.emitted.append((kind, fields))

    class Process:
        events = Events()
        cfg, rank, ft = None, 0, None  # no attempt id here: nothing is recorded, and no launcher

    armed = []
    # train_attempt turns a ConfigError into Unrecoverable, which run() ends with exit 93; the
    # exit watchdog it arms would end this test process, so it is recorded instead.
    import workloads.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "Trainer", NoGpus)
    monkeypatch.setattr(train_module, "arm_exit_watchdog", armed.append)
    with pytest.raises(train_module.Unrecoverable, match="one GPU per local rank"):
        train_module.train_attempt(Process())
    assert armed == [train_module.EXIT_DO_NOT_REQUEUE]
    assert Process.events.emitted[0][0] == "unrecoverable"


def test_cpu_shims_follow_the_gloo_backend_only(monkeypatch):
    import nvidia_resiliency_ext.checkpointing.async_ckpt.core as core

    from workloads.cuda_compat import install_cpu_checkpoint_shim, local_rank_hidden_on_cpu

    original = core.torch  # an earlier gloo run in this process may have installed it already
    core.torch = torch
    try:
        assert torch.cuda.is_available() is False  # the machine these tests run on
        assert install_cpu_checkpoint_shim("nccl") is False and core.torch is torch
        monkeypatch.setenv("LOCAL_RANK", "3")
        import os

        with local_rank_hidden_on_cpu("nccl"):
            assert os.environ.get("LOCAL_RANK") == "3"  # NVRx keeps its GPU health checks
        with local_rank_hidden_on_cpu("gloo"):
            assert "LOCAL_RANK" not in os.environ
        assert install_cpu_checkpoint_shim("gloo") is True and core.torch is not torch
    finally:
        core.torch = original


def test_restart_finalize_drains_the_ranks_own_gpu(monkeypatch, tmp_path):
    from workloads import inprocess as inprocess_module
    from workloads.events import EventLog

    local = threading.local()
    calls = []

    class Cuda:
        def is_available(self):
            return True

        def is_initialized(self):
            return True

        def current_device(self):
            return getattr(local, "device", 0)  # per thread, 0 in a new thread, as in CUDA

        def set_device(self, device):
            local.device = device

        def synchronize(self, device=None):
            calls.append(("synchronize", device, self.current_device()))

        def empty_cache(self):
            calls.append(("empty_cache", None, self.current_device()))

    cuda = Cuda()
    monkeypatch.setattr(inprocess_module.torch, "cuda", cuda)
    cuda.set_device(5)  # the rank's GPU, set in the main thread by resolve_runtime

    class Ft:
        def end_all_sections(self):
            pass

    class State:
        fn_exception = RuntimeError("boom")

    finalize = inprocess_module.RestartFinalize(EventLog(tmp_path, 0), Ft(), lambda: None, 1.0)
    finalize(State())
    assert calls == [("synchronize", 5, 5), ("empty_cache", None, 5)]


def test_recovery_bound_counts_the_cuda_checks_on_gpu():
    # nccl: hard 90 + barrier 120 + 3 x cuda 20 = 270 s; gloo: 210 s.
    assert TrainConfig.from_dict({}, "x", ["distributed.backend=gloo", "fault_tolerance.out_of_section_timeout_s=250"])
    with pytest.raises(ConfigError, match="= 270s"):
        TrainConfig.from_dict({}, "x", ["distributed.backend=nccl", "fault_tolerance.out_of_section_timeout_s=250"])


# ----- state digest and load-time trust ---------------------------------------------------------


def test_state_digest_combines_the_rank_digests(single_rank):
    from workloads.checkpoint.digest import state_digests

    state = {"model": {"w": torch.arange(10.0)}, "train": {"step": 3}}
    pings = []
    combined, ranks = state_digests(state, lambda: pings.append(1))
    assert len(ranks) == 1 and combined == hashlib.sha256(bytes.fromhex(ranks[0])).hexdigest()
    assert pings  # the watchdog hears from the digest
    state["model"]["w"][3] += 1
    assert state_digests(state)[0] != combined


def test_a_reload_in_the_same_process_trusts_what_it_committed(single_rank, tmp_path, monkeypatch):
    import workloads.checkpoint.files as files_module
    from workloads.checkpoint.checkpointer import Checkpointer
    from workloads.events import EventLog, load_run
    from workloads.faults import FaultInjector

    cfg = TrainConfig.from_dict({}, "x", [f"run_dir={tmp_path}", "checkpoint.backend=sync"])
    events = EventLog(tmp_path, 0)

    def checkpointer():
        return Checkpointer(
            cfg,
            events=events,
            faults=FaultInjector((), 0, tmp_path / "f", events.emit),
            device=torch.device("cpu"),
            identity={"world_size": 1, "preset": "tiny"},
        )

    state = {"w": torch.arange(4096.0)}
    first = checkpointer()
    first.save(5, state)
    first.close()
    hashed = []
    real = files_module.file_digest

    def recorded(path, with_sha):
        # Only the load's own hashing counts: the trusted files' background re-hash
        # (TrustedFilesRecheck) runs off the training thread by design.
        if threading.current_thread() is threading.main_thread():
            hashed.append(path.name)
        return real(path, with_sha)

    monkeypatch.setattr(files_module, "file_digest", recorded)
    # An in-process restart: a new Checkpointer in the same process.
    assert checkpointer().load_latest(lambda: {"w": torch.zeros(4096)}).step == 5
    assert not [n for n in hashed if n.endswith(".distcp")]  # no shard re-read before the restore
    assert load_run(tmp_path).of("checkpoint_load")[-1]["trusted_files"] >= 1
    # After a write to the shard, it is checked again, and the damage found.
    checkpointer().corrupt_latest()
    hashed.clear()
    with pytest.raises(ConfigError, match="none of the committed checkpoints"):
        checkpointer().load_latest(lambda: {"w": torch.zeros(4096)})
    assert [n for n in hashed if n.endswith(".distcp")]


def test_one_host_sync_per_step(tmp_path, monkeypatch):
    """The loss and the stop/save votes reach the host in one transfer per step (a GPU would
    otherwise drain its queue several times per step before the next batch is built)."""
    import workloads.trainer as trainer_module
    from workloads.process_state import ProcessState
    from workloads.train import train_attempt

    steps = 6
    cfg = TrainConfig.from_dict(
        {},
        "x",
        [
            f"run_dir={tmp_path}",
            f"steps={steps}",
            "distributed.backend=gloo",
            "inprocess.enabled=false",
            "checkpoint.backend=none",
        ],
    )
    single_rank_env(monkeypatch)
    syncs = []
    for method in ("item", "tolist"):
        real = getattr(torch.Tensor, method)

        def counted(self, *args, _real=real, _name=method, **kwargs):
            # The training loop's own transfers (the optimizer's CPU step counters are not).
            if sys._getframe(1).f_code.co_filename == trainer_module.__file__:
                syncs.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, method, counted)
    assert train_attempt(ProcessState(cfg, 0, 1, None)) == {"status": "completed"}
    assert syncs == ["tolist"] * steps


def test_a_rank_without_its_gpu_exits_93_with_the_message(tmp_path):
    """The real trainer process on this GPU-less machine with backend nccl, as a p5 pod whose
    GPUs are not visible: one clear message and the do-not-requeue exit code, not a CPU run."""
    import os
    import subprocess

    from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
    from nvrx_eks.local.processes import free_port_pair
    from tests.support.trainer_fixtures import REPO

    config = tmp_path / "train.yaml"
    config.write_text(
        TrainConfig.from_dict(
            {}, "x", [f"run_dir={tmp_path}", "distributed.backend=nccl", "inprocess.enabled=false", "steps=2"]
        ).to_yaml()
    )
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port_pair()),
    }
    result = subprocess.run(
        [sys.executable, "-m", "workloads.train", "--config", str(config)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == EXIT_DO_NOT_REQUEUE, result.stderr[-2000:]
    assert "nccl needs one GPU per local rank, but this process sees 0 GPU(s)" in result.stderr
    assert "Traceback" not in result.stderr


def test_render_command_exits_2_with_the_numbers_when_the_job_cannot_fit():
    import subprocess

    from tests.support.trainer_fixtures import REPO

    sets = ["model.preset=8b", "data.seq_len=8192", "data.batch_size=2", "model.activation_checkpointing=false"]
    argv = [sys.executable, "-m", "nvrx_eks.cli", "render", "--nodes", "2"]
    for item in sets:
        argv += ["--set", item]
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2, result.stderr
    message = " ".join(result.stderr.split())
    assert "GiB per GPU" in message and "exceeds the 79.2 GiB of one H100" in message
    assert "Traceback" not in result.stderr and result.stdout == ""
