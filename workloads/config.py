"""TrainConfig: the one validated description of a training run.

Loaded from YAML (the Kubernetes manifests put it in a ConfigMap) with dotted command-line
overrides (`checkpoint.interval_steps=5`). Imports no torch: the CLI and the manifest renderer
validate trainer configs without paying for it.

Every model is strict (`extra="forbid"`): a misspelt key is an error naming its path, never a
silently ignored setting. Cross-field rules live here as validators, most importantly the timeouts
that must respect each other across the three resilience layers:

* NVRx in-process Wrapper: soft < hard < barrier, and the monitoring intervals below the timeouts
  they serve (the same rules `nvidia_resiliency_ext.inprocess.Wrapper.__init__` enforces, checked
  here so the user gets a message naming the field instead of an assertion inside NVRx).
* Process-group timeout per backend. gloo collectives cannot be aborted: a rank blocked in one
  returns only when it times out, so that timeout must be shorter than the in-process hard timeout
  or the rank is killed instead of restarted. NCCL is the reverse: NVRx aborts NCCL communicators
  itself, and the NCCL watchdog, which kills the process when it fires, must wait longer than the
  hard timeout.
* ft_launcher's heartbeat/section timeouts must outlast what the in-process layer may spend on a
  recovery, or the launcher kills a rank that was about to recover in place.

Public contract (other modules and the manifests rely on it):
    TrainConfig.from_yaml(path, overrides=()) -> TrainConfig   (raises ConfigError)
    TrainConfig.from_dict(data, source, overrides=())          (raises ConfigError)
    cfg.to_yaml() -> str
    cfg.checkpoint_dir -> str
    cfg.resolved_pg_timeout_s(backend) -> float
    cfg.launcher_term_timeout_s() / cfg.recommended_termination_grace_period_s() -> float
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from nvrx_eks.facts.errors import ConfigError, validation_issues
from nvrx_eks.facts.training_metrics import DEFAULT_LOG_GROUP, EMF_AGENT_ENDPOINT
from nvrx_eks.facts.user_yaml import load_user_yaml, read_user_text
from workloads.checkpoint.backends import CheckpointBackend
from workloads.faults import KINDS_NEEDING_CHECKPOINTS, KINDS_NEEDING_LOCAL_TIER, parse_fault_spec
from workloads.model_config import ModelConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataConfig(_Strict):
    source: Literal["synthetic", "memmap"] = "synthetic"
    # memmap: a directory of pre-tokenized shards (`*.bin`, flat token arrays) or one .bin file.
    path: str | None = None
    dtype: Literal["uint16", "uint32"] | None = Field(
        default=None, description="token dtype of the shards; default: the manifest's, else uint16"
    )
    seq_len: int = Field(default=64, ge=2)
    batch_size: int = Field(default=8, ge=1, description="sequences per rank per micro-batch")
    grad_accum_steps: int = Field(
        default=1,
        ge=1,
        description="micro-batches per optimizer step; global batch = world size x batch_size x "
        "grad_accum_steps sequences (derived instead when global_batch_tokens is set)",
    )
    global_batch_tokens: int | None = Field(
        default=None,
        ge=1,
        description="tokens per optimizer step over all ranks, kept whatever the world size: "
        "grad_accum_steps becomes global_batch_tokens / (world size x batch_size x seq_len), and a "
        "world size that does not divide it is refused naming the ones that do",
    )

    def accumulation(self, world_size: int) -> int:
        """Micro-batches per optimizer step for `world_size` ranks (see global_batch_tokens)."""
        if self.global_batch_tokens is None:
            return self.grad_accum_steps
        micro_step = world_size * self.batch_size * self.seq_len
        accumulation, rest = divmod(self.global_batch_tokens, micro_step)
        if accumulation < 1 or rest:
            fitting = ", ".join(str(w) for w in self.world_sizes_near(world_size)) or "none"
            raise ConfigError(
                f"data.global_batch_tokens: {self.global_batch_tokens:,} tokens is not a whole number of "
                f"micro-batches of {world_size} ranks x {self.batch_size} x {self.seq_len} tokens; world sizes "
                f"that divide it near {world_size}: {fitting} (or change data.batch_size, data.seq_len or "
                "data.global_batch_tokens)"
            )
        return accumulation

    def world_sizes_near(self, world_size: int) -> list[int]:
        """The world sizes that divide global_batch_tokens nearest below and above `world_size`."""
        assert self.global_batch_tokens is not None
        sequences, rest = divmod(self.global_batch_tokens, self.batch_size * self.seq_len)
        if rest:
            return []
        fitting = [w for w in range(1, sequences + 1) if sequences % w == 0]
        below = [w for w in fitting if w < world_size][-1:]
        above = [w for w in fitting if w > world_size][:1]
        return below + above

    @model_validator(mode="after")
    def _path_matches_source(self) -> DataConfig:
        if self.source == "memmap" and not self.path:
            raise ValueError(
                "data.path: required when data.source is memmap; point it at the directory of .bin token shards"
            )
        if self.source == "synthetic" and self.path:
            raise ValueError("data.path: only used with data.source=memmap; remove it or set data.source=memmap")
        # The default 1 is no choice (a dumped config carries it): only another value conflicts.
        if self.global_batch_tokens is not None and self.grad_accum_steps != 1:
            raise ValueError(
                "data.grad_accum_steps: derived from data.global_batch_tokens when that is set; set one of them"
            )
        return self


class EvalConfig(_Strict):
    """Evaluation on held-out tokens (workloads.evaluation): the same sequences every time, on all
    ranks, without gradients; its time is its own part of the goodput split."""

    enabled: bool | None = Field(
        default=None,
        description="None: on when data.path holds a held-out split (`nvrx-eks data prepare "
        "--eval-fraction`); true with synthetic data holds out sequences of their own",
    )
    interval_steps: int = Field(default=50, ge=1, description="evaluate every N steps, and at the last step")
    sequences: int = Field(
        default=64, ge=1, description="held-out sequences of data.seq_len tokens per evaluation (at most)"
    )


class MetricsConfig(_Strict):
    """Live metrics from rank 0 (workloads.live_metrics)."""

    tensorboard: bool = Field(default=True, description="TensorBoard scalars in <run_dir>/tensorboard")
    cloudwatch: bool | None = Field(
        default=None,
        description="CloudWatch embedded-metric-format datagrams to the node's CloudWatch agent "
        "(nvrx_eks/facts/training_metrics.py); None: on inside a Kubernetes pod",
    )
    emf_endpoint: str = Field(default=EMF_AGENT_ENDPOINT, description="udp://HOST:PORT of the agent's EMF listener")
    log_group: str = Field(
        default=DEFAULT_LOG_GROUP,
        description="CloudWatch log group the agent writes the EMF documents to: the deployment's, "
        "set by the job commands (nvrx_eks/facts/training_metrics.py)",
    )

    @field_validator("log_group")
    @classmethod
    def _log_group_name(cls, value: str) -> str:
        if not re.fullmatch(r"[\w./#-]{1,512}", value):
            raise ValueError(f"{value!r} is not a CloudWatch log group name (letters, digits and _ . / # -)")
        return value

    @field_validator("emf_endpoint")
    @classmethod
    def _udp_endpoint(cls, value: str) -> str:
        if not re.fullmatch(r"udp://[^:/\s]+:\d{1,5}", value):
            raise ValueError(f"{value!r} is not udp://HOST:PORT; give the CloudWatch agent's EMF listener")
        return value


class OptimizerConfig(_Strict):
    lr: float = Field(default=1e-3, gt=0)
    weight_decay: float = Field(default=0.1, ge=0)
    beta1: float = Field(default=0.9, gt=0, lt=1)
    beta2: float = Field(default=0.95, gt=0, lt=1)
    eps: float = Field(default=1e-8, gt=0)
    warmup_steps: int = Field(default=10, ge=0)
    schedule: Literal["cosine", "constant"] = "cosine"
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    grad_clip: float | None = Field(default=1.0, gt=0)


class LocalTierConfig(_Strict):
    """The node-local checkpoint tier (workloads.checkpoint.local_tier): each rank's own shards, replicated
    to a rank on another node. Off unless interval_steps is set."""

    interval_steps: int | None = Field(default=None, ge=1, description="local saves every N steps; None: off")
    dir: str | None = Field(
        default=None,
        description="node-local root; default: <run_dir>/local-checkpoints (on EKS the pod's instance-store mount)",
    )
    keep: int = Field(default=2, ge=2, description="steps kept per tier copy; the newest can be damaged")

    @property
    def enabled(self) -> bool:
        return self.interval_steps is not None


class CheckpointConfig(_Strict):
    backend: CheckpointBackend = "nvrx"
    dir: str | None = Field(default=None, description="default: <run_dir>/checkpoints")
    interval_steps: int = Field(default=50, ge=1)
    interval_seconds: float | None = Field(default=None, gt=0)
    keep: int = Field(default=3, ge=2, description="committed checkpoints kept; the newest can be corrupt")
    # sha256 catches any damage but every rank hashes its own files at commit time; size only
    # catches truncation. Loading re-checks what the commit recorded.
    verify: Literal["sha256", "size"] = "sha256"
    finalize_timeout_s: float = Field(
        default=300.0, gt=0, description="the longest one save may take from hand-off to commit before it is a fault"
    )
    write_threads: int = Field(
        default=2,
        ge=1,
        le=16,
        description="backend nvrx: threads of the checkpoint worker that write a rank's shards, each "
        "its own file; more shorten the time to commit (the next save waits for it), not the stall",
    )
    local: LocalTierConfig = LocalTierConfig()


class DistributedConfig(_Strict):
    backend: Literal["gloo", "nccl", "auto"] = "auto"
    spare_nodes: int = Field(
        default=0,
        ge=0,
        description="of the launched nodes, how many wait as hot spares outside the process group "
        "(workloads/spares.py); the active world is the rest",
    )
    timeout_s: float | None = Field(
        default=None, gt=0, description="process-group timeout; default derived per backend from inprocess timeouts"
    )
    require_efa: bool = Field(
        default=False,
        description="on NCCL, exit 93 unless NCCL uses the aws-ofi-nccl plugin with provider efa "
        "(workloads/transport.py); the render sets it from the instance facts",
    )
    shard: Literal["full", "hybrid"] = Field(
        default="full",
        description="full: FSDP2 shards over every rank. hybrid: shards inside a node and "
        "replicates across nodes (2-D mesh nodes x local ranks): the all-gathers and "
        "reduce-scatters stay on NVLink, only a gradient all-reduce crosses EFA, and "
        "each GPU holds 1/local-ranks of the state instead of 1/world",
    )
    precision: Literal["bf16", "fp32", "auto"] = Field(
        default="auto",
        description="compute precision. bf16: bf16 compute with fp32 master weights and fp32 "
        "gradient reduction, on nccl (GPUs) only. fp32: fp32 throughout. auto: bf16 on nccl, fp32 "
        "on gloo (CPU); the render writes bf16 for GPU nodes",
    )

    @model_validator(mode="after")
    def _precision_on_its_backend(self) -> DistributedConfig:
        if self.precision == "bf16" and self.backend == "gloo":
            raise ValueError(
                "distributed.precision: bf16 needs distributed.backend=nccl (GPUs); set precision fp32 or auto on gloo"
            )
        return self

    def resolved_precision(self, backend: str) -> Literal["bf16", "fp32"]:
        """The precision a run on `backend` ("gloo" or "nccl", already resolved) computes in."""
        if self.precision == "auto":
            return "bf16" if backend == "nccl" else "fp32"
        if self.precision == "bf16" and backend != "nccl":
            raise ConfigError(
                f"distributed.precision: bf16 needs nccl (GPUs), but the backend resolved to {backend}; "
                "set distributed.precision=fp32 or auto, or run where CUDA is visible"
            )
        return self.precision


class InProcessConfig(_Strict):
    enabled: bool = True
    soft_timeout_s: float = Field(default=60.0, gt=0)
    hard_timeout_s: float = Field(default=90.0, gt=0)
    barrier_timeout_s: float = Field(default=120.0, gt=0)
    completion_timeout_s: float = Field(default=120.0, gt=0)
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    heartbeat_timeout_s: float = Field(default=30.0, gt=0)
    monitor_interval_s: float = Field(default=1.0, gt=0)
    progress_watchdog_interval_s: float = Field(default=1.0, gt=0)
    last_call_wait_s: float = Field(default=1.0, ge=0)
    termination_grace_s: float = Field(default=5.0, ge=0)
    cuda_timeout_s: float = Field(
        default=20.0, gt=0, description="GPU drain in the restart's finalize, and NVRx's CUDA health check"
    )
    # A deterministic bug would otherwise restart in place forever; past the cap the ranks exit
    # and ft_launcher (with its own max_restarts) takes over.
    max_restarts: int | None = Field(default=10, ge=0, description="in-process restarts per process")
    # Off only to measure what it saves (bench): without it a gloo peer of a faulting rank waits
    # out the process-group timeout (workloads.gloo_sockets).
    release_gloo_sockets: bool = Field(
        default=True,
        description="the restart shuts down gloo's pair sockets (never the stores): the process group's with gloo, "
        "the checkpoint groups' with nccl too",
    )

    @model_validator(mode="after")
    def _nvrx_ordering(self) -> InProcessConfig:
        # The same relations inprocess.Wrapper enforces with enforce_value(...).
        rules = [
            (
                self.soft_timeout_s < self.hard_timeout_s,
                "inprocess.soft_timeout_s",
                "must be below inprocess.hard_timeout_s (a soft timeout restarts, a hard one kills)",
            ),
            (
                self.hard_timeout_s < self.barrier_timeout_s,
                "inprocess.hard_timeout_s",
                "must be below inprocess.barrier_timeout_s",
            ),
            (
                self.heartbeat_timeout_s < self.barrier_timeout_s,
                "inprocess.heartbeat_timeout_s",
                "must be below inprocess.barrier_timeout_s",
            ),
            (
                self.heartbeat_interval_s < self.heartbeat_timeout_s,
                "inprocess.heartbeat_interval_s",
                "must be below inprocess.heartbeat_timeout_s",
            ),
            (
                self.monitor_interval_s < min(self.soft_timeout_s, self.heartbeat_timeout_s, self.barrier_timeout_s),
                "inprocess.monitor_interval_s",
                "must be below inprocess.soft_timeout_s and inprocess.heartbeat_timeout_s",
            ),
            (
                self.progress_watchdog_interval_s < self.soft_timeout_s,
                "inprocess.progress_watchdog_interval_s",
                "must be below inprocess.soft_timeout_s",
            ),
        ]
        problems = [f"{field}: {msg}" for ok, field, msg in rules if not ok]
        if problems:
            raise ValueError("\n".join(problems))
        return self


class SectionTimeouts(_Strict):
    setup: float = Field(default=900.0, gt=0, description="process group, model build, checkpoint load")
    step: float = Field(default=300.0, gt=0)
    checkpointing: float | None = Field(default=None, gt=0, description="default: checkpoint.finalize_timeout_s + 60")


class FaultToleranceConfig(_Strict):
    """ft_launcher settings (rendered into its --ft-* flags by workloads.launch)."""

    max_restarts: int = Field(default=3, ge=0, description="worker-group restarts by ft_launcher")
    monitor: Literal["heartbeat", "sections"] = "sections"
    initial_heartbeat_timeout_s: float | None = Field(default=900.0, gt=0)
    heartbeat_timeout_s: float | None = Field(default=300.0, gt=0)
    section_timeouts_s: SectionTimeouts = SectionTimeouts()
    out_of_section_timeout_s: float | None = Field(default=300.0, gt=0)
    workload_check_interval_s: float = Field(default=5.0, gt=0)
    workers_stop_timeout_s: float = Field(
        default=15.0, gt=0, description="SIGTERM-to-SIGKILL wait when the launcher restarts its ranks"
    )
    max_no_progress_cycles: int = Field(
        default=3, ge=0, description="restarts without a newer committed checkpoint before exit 93; 0=off"
    )


class TrainConfig(_Strict):
    run_dir: str = "runs/default"
    steps: int = Field(default=100, ge=1)
    seed: int = 1234
    log_every: int = Field(default=10, ge=1)
    faults: str = Field(default="", description="KIND@STEP[:RANK],... see workloads/faults.py")
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    eval: EvalConfig = EvalConfig()
    metrics: MetricsConfig = MetricsConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    distributed: DistributedConfig = DistributedConfig()
    inprocess: InProcessConfig = InProcessConfig()
    fault_tolerance: FaultToleranceConfig = FaultToleranceConfig()
    peak_tflops_per_gpu: float | None = Field(
        default=None,
        gt=0,
        description="dense bf16 peak of one GPU, the denominator of MFU (workloads/metrics.py); "
        "the render sets it from nvrx_eks/facts/instances.py; unset: MFU is n/a",
    )

    @field_validator("faults")
    @classmethod
    def _faults_parse(cls, value: str) -> str:
        parse_fault_spec(value)
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> TrainConfig:
        problems: list[str] = []
        shape = self.model.shape
        if self.data.seq_len > shape.max_seq_len:
            problems.append(
                f"data.seq_len: {self.data.seq_len} exceeds the max_seq_len of {self.model.noun}, "
                f"{shape.max_seq_len}; lower it, or raise model.max_seq_len"
            )
        for fault in parse_fault_spec(self.faults):
            if fault.step > self.steps:
                problems.append(f"faults: {fault.label} is after the last step ({self.steps}); it would never fire")
            if fault.kind in KINDS_NEEDING_CHECKPOINTS and self.checkpoint.backend == "none":
                problems.append(f"faults: {fault.label} needs checkpoints; set checkpoint.backend")
            if fault.kind in KINDS_NEEDING_LOCAL_TIER and not self.checkpoint.local.enabled:
                problems.append(f"faults: {fault.label} needs the local tier; set checkpoint.local.interval_steps")
        problems += self._timeout_problems()
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _timeout_problems(self) -> list[str]:
        problems: list[str] = []
        ip, dist, ft = self.inprocess, self.distributed, self.fault_tolerance
        if dist.backend == "auto" and dist.timeout_s is not None:
            problems.append(
                "distributed.timeout_s: cannot be set with distributed.backend=auto, because gloo "
                "needs it below inprocess.hard_timeout_s and NCCL above it; set "
                "distributed.backend to gloo or nccl, or leave timeout_s unset to derive it"
            )
        if ip.enabled and dist.timeout_s is not None:
            if dist.backend == "gloo" and not dist.timeout_s < ip.hard_timeout_s:
                problems.append(
                    f"distributed.timeout_s: {dist.timeout_s:g}s must be below "
                    f"inprocess.hard_timeout_s ({ip.hard_timeout_s:g}s) with gloo: gloo "
                    "collectives cannot be aborted, so a rank waiting in one would be killed by "
                    "the hard timeout instead of restarting in place; lower distributed.timeout_s"
                )
            if dist.backend == "nccl" and not dist.timeout_s > ip.hard_timeout_s:
                problems.append(
                    f"distributed.timeout_s: {dist.timeout_s:g}s must exceed "
                    f"inprocess.hard_timeout_s ({ip.hard_timeout_s:g}s) with NCCL: the NCCL "
                    "watchdog kills the process when it fires, before NVRx can restart it; "
                    "raise distributed.timeout_s"
                )
        if not ip.enabled:
            return problems
        # What the in-process layer may spend before training resumes after a fault: up to the
        # hard timeout to detect, up to the barrier timeout to regroup, and on GPU up to the CUDA
        # timeout three times: the finalize's drain and the CUDA health check, which NVRx runs at
        # the restart and again at the next iteration's start.
        recovery = ip.hard_timeout_s + ip.barrier_timeout_s
        if dist.backend != "gloo":
            recovery += 3 * ip.cuda_timeout_s
        if ft.monitor == "heartbeat":
            if ft.heartbeat_timeout_s is not None and not ft.heartbeat_timeout_s > recovery:
                problems.append(
                    f"fault_tolerance.heartbeat_timeout_s: {ft.heartbeat_timeout_s:g}s must "
                    f"exceed the in-process recovery bound, inprocess.hard_timeout_s + "
                    f"inprocess.barrier_timeout_s (+ 3 x inprocess.cuda_timeout_s on GPU) = "
                    f"{recovery:g}s, or ft_launcher kills ranks that are restarting in place"
                )
        else:
            st = ft.section_timeouts_s
            if ft.out_of_section_timeout_s is not None and not ft.out_of_section_timeout_s > recovery:
                problems.append(
                    f"fault_tolerance.out_of_section_timeout_s: {ft.out_of_section_timeout_s:g}s "
                    f"must exceed the in-process recovery bound, inprocess.hard_timeout_s + "
                    f"inprocess.barrier_timeout_s (+ 3 x inprocess.cuda_timeout_s on GPU) = "
                    f"{recovery:g}s: in-process restarts run outside any section"
                )
            if not st.step > ip.hard_timeout_s:
                problems.append(
                    f"fault_tolerance.section_timeouts_s.step: {st.step:g}s must exceed "
                    f"inprocess.hard_timeout_s ({ip.hard_timeout_s:g}s) so a stuck step is "
                    "handled by the in-process layer first"
                )
            if not self.checkpoint_section_timeout_s() > self.checkpoint.finalize_timeout_s:
                problems.append(
                    "fault_tolerance.section_timeouts_s.checkpointing: must exceed "
                    f"checkpoint.finalize_timeout_s ({self.checkpoint.finalize_timeout_s:g}s)"
                )
        return problems

    # ----- derived values -------------------------------------------------------------------

    @property
    def checkpoint_dir(self) -> str:
        return self.checkpoint.dir or str(Path(self.run_dir) / "checkpoints")

    @property
    def local_checkpoint_dir(self) -> str:
        return self.checkpoint.local.dir or str(Path(self.run_dir) / "local-checkpoints")

    def resolved_pg_timeout_s(self, backend: str) -> float:
        """Process-group timeout for the resolved backend ("gloo" or "nccl").

        Derived when unset: gloo uses the soft timeout (a collective that waits longer than that
        has already triggered a restart, and it stays below the hard timeout); NCCL uses twice the
        hard timeout so its watchdog never fires before NVRx has acted.
        """
        if self.distributed.timeout_s is not None:
            return self.distributed.timeout_s
        if backend == "gloo":
            return self.inprocess.soft_timeout_s if self.inprocess.enabled else 300.0
        return 2 * self.inprocess.hard_timeout_s if self.inprocess.enabled else 1800.0

    def checkpoint_section_timeout_s(self) -> float:
        explicit = self.fault_tolerance.section_timeouts_s.checkpointing
        return explicit if explicit is not None else self.checkpoint.finalize_timeout_s + 60.0

    def launcher_term_timeout_s(self) -> float:
        """ft_launcher --term-timeout: how long ranks get after a forwarded SIGTERM before
        SIGKILL. The stop path may need two saves: the one in flight when the signal arrived
        (one save in flight at most, so the stop-save first waits for it) and the stop-save of
        the current step; each may take up to checkpoint.finalize_timeout_s. Plus a step."""
        return 2 * self.checkpoint.finalize_timeout_s + 30.0

    def recommended_termination_grace_period_s(self) -> int:
        """Kubernetes terminationGracePeriodSeconds for the pod running ft_launcher: the
        launcher's term timeout plus time for the launcher itself to exit."""
        return int(self.launcher_term_timeout_s() + 30)

    # ----- loading --------------------------------------------------------------------------

    @classmethod
    def from_dict(
        cls, data: dict[str, Any] | None, source: str = "config", overrides: list[str] | tuple[str, ...] = ()
    ) -> TrainConfig:
        # A deep copy: overrides are applied in place, and nested sections of `data` are often
        # shared (e.g. a module-level profile reused for every run of one process).
        data = apply_overrides(copy.deepcopy(data or {}), overrides)
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise _config_error(err, source) from None

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
        path = Path(path)
        try:
            text = read_user_text(path)
        except OSError as err:
            # No flag named: the CLI passes this path as --train-config, the trainer as --config.
            raise ConfigError(
                f"cannot read trainer config {path}: {err.strerror}; give the path of a trainer config YAML file"
            ) from None
        except UnicodeDecodeError:
            raise ConfigError(
                f"trainer config {path} is not a text file (not UTF-8); give the path of a trainer config YAML file"
            ) from None
        try:
            data = load_user_yaml(text, str(path))
        except yaml.YAMLError as err:
            raise ConfigError(f"invalid YAML in {path}: {err}") from None
        if data is not None and not isinstance(data, dict):
            raise ConfigError(f"invalid configuration in {path}: the top level must be a mapping")
        return cls.from_dict(data, source=str(path), overrides=overrides)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides; values are parsed as YAML scalars (3, true, null, [1, 2])."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r}: expected dotted.key=value, e.g. checkpoint.interval_steps=5")
        try:
            value = load_user_yaml(raw, f"override {key}") if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def _config_error(err: ValidationError, source: str) -> ConfigError:
    """The pydantic errors as issues, with our cross-field messages ("a.b: message", "faults:
    message") filed under the field they name instead of "(top level)" or the enclosing section."""
    issues = []
    for path, message in validation_issues(err):
        named, sep, rest = message.split("\n", 1)[0].partition(": ")
        if sep and ("." in named and " " not in named or named == "faults"):
            path, message = tuple(named.split(".")), message[len(named) + len(sep) :]
        issues.append((path, message))
    return ConfigError(issues=issues, source=source)
