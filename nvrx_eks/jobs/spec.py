"""JobSpec: everything a training job manifest depends on, validated once, then rendered.

A JobSpec is built from facts stated elsewhere and never retyped here:
- the deployment: DeploymentConfig (offline), the cluster stack's outputs (live) or the config's
  `cluster:` section (a cluster we did not create), for the namespace, the FSx claim, the
  instance type, the Kubernetes version and the image;
- the instance facts table, for GPUs (= processes per node), EFA interfaces, CPU and memory;
- nvrx_eks/facts/names.py, for node labels, taints and extended resource names;
- nvrx_eks/facts/job_names.py, for the names of the job's objects and pod 0's rendezvous host;
- the TrainConfig, for everything the trainer and ft_launcher need, including the timeouts that
  size the pod's termination grace period.

Offline image choice: a rendered manifest needs an image, but the trainer image is built and
pushed by `cdk deploy`. Offline (no stack), the image is, in order: `--image`, the profile's
`image.uri`, else OFFLINE_PLACEHOLDER_IMAGE, a tag under `localhost/` that no cluster can pull,
so a manifest rendered offline validates but is never mistaken for a deployable one (validation
warns, and live submission refuses it). `submit` without `--dry-run` takes the image from the
stack output TrainerImageUri.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import PurePosixPath
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infra.config import DeploymentConfig
from nvrx_eks.deploy.node_count import default_nodes
from nvrx_eks.deploy.stack_outputs import StackOutputs
from nvrx_eks.facts import job_names, training_metrics
from nvrx_eks.facts.errors import ConfigError, describe_validation_error
from nvrx_eks.facts.instances import INSTANCE_FACTS, InstanceFacts, facts_for
from nvrx_eks.facts.job_kinds import Api
from nvrx_eks.facts.job_presets import FALLBACK_JOB, JOB_PRESETS
from nvrx_eks.facts.names import (
    FSX_MOUNT_PATH,
    FSX_PVC_NAME,
    GPU_NODE_LABEL_KEY,
    SYSTEM_NODE_LABEL_VALUE,
    TRAINING_NAMESPACE,
)
from nvrx_eks.jobs.backstop import active_deadline_s
from nvrx_eks.jobs.options import Workload
from nvrx_eks.planning.model import optimal_interval_steps
from workloads.config import TrainConfig
from workloads.launch import inprocess_store_port
from workloads.memory import GIB, check_fits

#: Where the node-local checkpoint tier's directory (infra.pod_security.LOCAL_CHECKPOINT_HOST_PATH,
#: the job's subdirectory) is mounted in trainer pods: checkpoint.local.dir on EKS.
LOCAL_CHECKPOINT_MOUNT_PATH = "/local-checkpoints"
#: Where the trainer ConfigMap is mounted, and the key holding the TrainConfig YAML.
TRAIN_CONFIG_DIR = "/etc/nvrx-eks"
TRAIN_CONFIG_KEY = "train.yaml"
TRAIN_CONFIG_PATH = f"{TRAIN_CONFIG_DIR}/{TRAIN_CONFIG_KEY}"

#: The image of an offline render when nothing names one (see the module docstring).
OFFLINE_PLACEHOLDER_IMAGE = "localhost/nvrx-eks-trainer:offline-render"
#: nccl-tests built with Open MPI, libfabric/EFA and aws-ofi-nccl by AWS (awsome-distributed-ai
#: micro-benchmarks/nccl-tests): CUDA 13.0.2, EFA installer 1.48.0, aws-ofi-nccl 1.19.0, NCCL
#: 2.30.4, nccl-tests 2.18.3 (the trainer image uses the same CUDA and EFA installer). A tag,
#: not `latest`, which moves; pin a digest (`--image ...@sha256:...`) for repeatable fabric baselines.
NCCL_TESTS_IMAGE = "public.ecr.aws/hpc-cloud/nccl-tests:cuda13.0.2-efa1.48.0-ofiv1.19.0-ncclv2.30.4-1-testsv2.18.3"


# Kubernetes object names here become DNS labels: pod hostnames are
# `<name>-worker-<job>-<index>` (JobSet) or `<name>-worker-<index>` (PyTorchJob), which must fit 63.
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME_LENGTH = 40
#: A dotted Python module name (`python -m` takes it).
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class JobSpec(BaseModel):
    """The validated inputs of one rendered job (training or fabric smoke test)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: str
    namespace: str = TRAINING_NAMESPACE
    api: Api = "jobset"
    workload: Workload = "train"
    nodes: Annotated[int, Field(ge=1, le=1024)]
    instance_type: str
    image: str
    pvc_name: str = FSX_PVC_NAME
    kubernetes_version: str
    #: Node labels the pods select on beyond the GPU pool and the instance type (an existing
    #: cluster's cluster.node_selector).
    node_selector: dict[str, str] = Field(default_factory=dict)
    #: Where the job's coordinator pod runs: our stacks' system nodes; on an existing cluster, any
    #: node it schedules on (its GPU nodes are expected to be tainted, so a CPU node).
    coordinator_node_selector: dict[str, str] = Field(
        default_factory=lambda: {GPU_NODE_LABEL_KEY: SYSTEM_NODE_LABEL_VALUE}
    )
    #: Kubernetes-level restarts of the whole job (JobSet maxRestarts / PyTorchJob backoffLimit).
    max_restarts: Annotated[int, Field(ge=0, le=1000)] = 3
    #: Hot spare nodes launched beyond `nodes` (workloads/spares.py); the active world stays `nodes`.
    spare_nodes: Annotated[int, Field(ge=0, le=64)] = 0
    #: Ranks per pod when not one per GPU: a rehearsal on CPUs (nvrx_eks.rehearse) runs the pods
    #: with fewer ranks than the instance has GPUs.
    ranks_per_node: Annotated[int, Field(ge=1, le=64)] | None = None
    #: A trainer of the user's own that the pods run in place of workloads.train: a module name or
    #: the absolute path of a script (workloads/README.md, "Bring your own trainer"); None: ours.
    trainer: str | None = None
    #: Longest healthy training step; sizes the job's deadline (nvrx_eks/jobs/backstop.py).
    max_step_time_s: Annotated[float, Field(gt=0)] | None = None
    train: TrainConfig = TrainConfig.model_validate({})

    @field_validator("name")
    @classmethod
    def _dns_label(cls, name: str) -> str:
        if len(name) > MAX_NAME_LENGTH or not _NAME_RE.match(name):
            raise ValueError(
                f"'{name}' must be lower-case letters, digits and '-', start with a letter, end with a "
                f"letter or digit, and be at most {MAX_NAME_LENGTH} characters (pod host names derive "
                "from it)"
            )
        return name

    @field_validator("instance_type")
    @classmethod
    def _known_instance(cls, instance_type: str) -> str:
        facts_for(instance_type)
        return instance_type

    @field_validator("image")
    @classmethod
    def _image_reference(cls, image: str) -> str:
        if not image or image != image.strip() or " " in image:
            raise ValueError(
                "give a container image reference such as 123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer:1.0"
            )
        return image

    @field_validator("trainer")
    @classmethod
    def _trainer_entry(cls, trainer: str | None) -> str | None:
        # A name ending in .py is a script (render runs it by path), never the module `py` of a package.
        if trainer is None or (_MODULE_RE.match(trainer) and not trainer.endswith(".py")):
            return trainer
        path = PurePosixPath(trainer)
        if not (path.is_absolute() and path.suffix == ".py" and ".." not in path.parts and " " not in trainer):
            raise ValueError(
                f"'{trainer}' is neither a Python module name (mypkg.train) nor the absolute path of a .py script "
                "in the pod (/fsx/code/train.py)"
            )
        return trainer

    @model_validator(mode="after")
    def _api_for_workload(self) -> JobSpec:
        if self.workload == "nccl-test" and self.api != "jobset":
            raise ValueError("the NCCL/EFA fabric test is rendered as a JobSet only; drop --api pytorchjob")
        return self

    # ----- derived facts --------------------------------------------------------------------

    @property
    def facts(self) -> InstanceFacts:
        return facts_for(self.instance_type)

    @property
    def nproc_per_node(self) -> int:
        return self.ranks_per_node or self.facts.gpus

    @property
    def world_size(self) -> int:
        """The active world: the ranks that train (spares wait outside it)."""
        return self.nodes * self.nproc_per_node

    @property
    def launched_nodes(self) -> int:
        return self.nodes + self.spare_nodes

    @property
    def rendezvous_host(self) -> str:
        return job_names.rendezvous_host(self.api, self.name)

    @property
    def rendezvous_endpoint(self) -> str:
        return job_names.rendezvous_endpoint(self.api, self.name)

    @property
    def inprocess_store_port(self) -> int:
        """The trainer's in-process restart store, which workloads/launch.py places beside the rendezvous."""
        return inprocess_store_port(self.rendezvous_endpoint)

    @property
    def config_map_name(self) -> str:
        return job_names.config_map_name(self.name)

    @property
    def network_policy_name(self) -> str:
        return job_names.network_policy_name(self.name)

    @property
    def container_name(self) -> str:
        if self.workload == "nccl-test":
            return job_names.FABRIC_TEST_CONTAINER
        return job_names.trainer_container(self.api)

    @property
    def cpu_request(self) -> int:
        return self.facts.allocatable_vcpus

    @property
    def memory_request_gib(self) -> int:
        return self.facts.allocatable_memory_gib

    @property
    def shm_size_gib(self) -> int:
        """/dev/shm holds NCCL's intra-node buffers, DataLoader batches and NVRx's async-checkpoint
        staging copy of this node's shards. Pages there count against the pod's memory, so cap it
        at half the request: a runaway writer fails its own writes instead of OOM-killing ranks."""
        return self.memory_request_gib // 2

    @property
    def termination_grace_period_s(self) -> int:
        """Long enough for ft_launcher to forward SIGTERM and for ranks to finish the checkpoint in
        flight (derived by the TrainConfig from its checkpoint finalize timeout)."""
        return self.train.recommended_termination_grace_period_s()

    @property
    def active_deadline_s(self) -> int:
        # A JobSet's recreated Jobs start their own deadlines; a PyTorchJob's spans every attempt.
        restarts = self.max_restarts if self.api == "pytorchjob" else 0
        return active_deadline_s(self.train, kubernetes_restarts=restarts, step_time_s=self.max_step_time_s)


def resolve_train_paths(train: TrainConfig, job_name: str) -> TrainConfig:
    """Place the run on the shared file system.

    Pods are ephemeral, so every path the trainer writes or reads must be on the FSx claim:
    relative paths in the TrainConfig are taken relative to FSX_MOUNT_PATH, and a run directory
    left at its default becomes the job's own directory (own_run_dir). What the job writes (run_dir,
    checkpoint.dir) must lie there: its pods may write nothing else of the claim (infra/pod_security.py).
    """
    run_dir = train.run_dir if "run_dir" in train.model_fields_set else own_run_dir(job_name)
    data = train.model_dump(mode="json")
    data["run_dir"] = _on_fsx(run_dir, "run_dir")
    if train.checkpoint.dir:
        data["checkpoint"]["dir"] = _on_fsx(train.checkpoint.dir, "checkpoint.dir")
    for field, path in (("run_dir", data["run_dir"]), ("checkpoint.dir", data["checkpoint"]["dir"])):
        problem = path and own_run_dir_problem(path, job_name)
        if problem:
            raise ConfigError(f"--train-config/--set {field}: {problem}")
    if train.data.path:
        data["data"]["path"] = _on_fsx(train.data.path, "data.path")
    if train.checkpoint.local.enabled:
        # The node's instance store, not FSx: that is the point of the tier.
        data["checkpoint"]["local"]["dir"] = LOCAL_CHECKPOINT_MOUNT_PATH
    return TrainConfig.from_dict(data, source="the trainer config placed on FSx")


def own_run_dir(job_name: str) -> str:
    """The job's own directory as its pods see it (/fsx/runs/<job name>)."""
    return f"{FSX_MOUNT_PATH}/{job_names.run_dir_on_claim(job_name)}"


def own_run_dir_problem(path: str, job_name: str) -> str | None:
    """Why `path`, a directory the job writes, is not inside the job's own directory, or None.
    Another job's run, every run (/fsx/runs) or a dataset would be written over by this job, and
    its pods could not write there anyway: the claim is mounted read-only outside their own
    directory. Judged on the normalised path."""
    own = PurePosixPath(own_run_dir(job_name))
    where = PurePosixPath(posixpath.normpath(path))
    if where.is_relative_to(own):
        return None
    runs = own.parent
    resume = (
        f", or resume that run under its own name (--name {where.relative_to(runs).parts[0]})"
        if where.is_relative_to(runs) and where != runs
        else ""
    )
    return (
        f"{path} is outside this job's own directory {own}, the only place on the shared file system its "
        f"pods may write; leave it unset or give a path under {own}{resume}"
    )


#: On GPU nodes the local tier saves this many times per FSx interval unless the trainer config
#: sets checkpoint.local.interval_steps (null turns it off). A starting point, not a measured
#: optimum: `nvrx-eks plan` prints the optimal pair of intervals for the profile.
LOCAL_SAVES_PER_FSX_INTERVAL = 10


def with_local_tier(train: TrainConfig) -> TrainConfig:
    """The node-local tier on by default on GPU nodes (each node has TBs of instance store)."""
    local = train.checkpoint.local
    if "interval_steps" in local.model_fields_set or train.checkpoint.backend == "none":
        return train
    interval = max(1, train.checkpoint.interval_steps // LOCAL_SAVES_PER_FSX_INTERVAL)
    checkpoint = train.checkpoint.model_copy(update={"local": local.model_copy(update={"interval_steps": interval})})
    return train.model_copy(update={"checkpoint": checkpoint})


def require_efa_where_expected(train: TrainConfig, instance_type: str) -> TrainConfig:
    """distributed.require_efa, unless set explicitly, follows the instance facts: on where NCCL
    must run over EFA with RDMA (p5, p4d), off on the g5 rehearsal types, whose single EFA has no
    RDMA (workloads/transport.py)."""
    if "require_efa" in train.distributed.model_fields_set or instance_type not in INSTANCE_FACTS:
        return train
    distributed = train.distributed.model_copy(update={"require_efa": INSTANCE_FACTS[instance_type].efa_rdma})
    return train.model_copy(update={"distributed": distributed})


def metrics_to_the_deployment(train: TrainConfig, deployment: str) -> TrainConfig:
    """metrics.log_group, unless set explicitly, is the deployment's EMF log group (created with a
    retention by its cluster stack), so the jobs of two deployments never share one."""
    if "log_group" in train.metrics.model_fields_set:
        return train
    metrics = train.metrics.model_copy(update={"log_group": training_metrics.log_group(deployment)})
    return train.model_copy(update={"metrics": metrics})


def peak_tflops_from_facts(train: TrainConfig, instance_type: str) -> TrainConfig:
    """peak_tflops_per_gpu, unless set explicitly, is the GPU's dense bf16 peak from the instance
    facts (None where none is published: MFU is then n/a): the trainer image has no infra/."""
    if "peak_tflops_per_gpu" in train.model_fields_set or instance_type not in INSTANCE_FACTS:
        return train
    return train.model_copy(update={"peak_tflops_per_gpu": INSTANCE_FACTS[instance_type].peak_bf16_tflops})


def _on_fsx(path: str, field: str) -> str:
    """`path` (the TrainConfig's `field`) as the pods see it: relative to FSX_MOUNT_PATH unless
    absolute, normalised. A `..` component is refused: joined to /fsx it can lead anywhere
    (`../../etc` is /etc, in the container's writable layer, gone with the pod)."""
    problem = parent_component_problem(path)
    if problem:
        raise ConfigError(f"--train-config/--set {field}: {problem}")
    p = PurePosixPath(posixpath.normpath(path))
    return str(p if p.is_absolute() else PurePosixPath(FSX_MOUNT_PATH) / p)


def parent_component_problem(path: str) -> str | None:
    """Why `path` may not be joined to the FSx mount as it stands (a `..` component), or None."""
    if ".." in PurePosixPath(path).parts:
        return (
            f"{path!r} has a '..' component, which can lead off the FSx volume; give a path under "
            f"{FSX_MOUNT_PATH} (absolute, or relative to it) without '..'"
        )
    return None


def fsx_path_problem(path: str) -> str | None:
    """Why a directory the trainer writes or reads (run_dir, checkpoint.dir, data.path) is not on
    the FSx claim, or None. Checked on the normalised path, and no `..` at all: a string prefix
    says nothing about where `/fsx/../../etc` leads."""
    problem = parent_component_problem(path)
    if problem is None and not posixpath.normpath(path).startswith(FSX_MOUNT_PATH + "/"):
        problem = f"{path!r} is not on the FSx volume ({FSX_MOUNT_PATH}); it would vanish with the pod"
    return problem


def load_train_config(
    path: str | None,
    overrides: list[str],
    faults: str | None,
    *,
    config: DeploymentConfig | None = None,
    nodes: int | None = None,
) -> TrainConfig:
    """The TrainConfig from `--train-config` (default: the profile's default job, given `config`
    and `nodes`; else the trainer's defaults), `--set` overrides and `--faults` (the
    fault-injection spec passed through to the trainer for chaos runs)."""
    overrides = list(overrides)
    if faults is not None:
        overrides.append(f"faults={faults}")
    if path:
        return TrainConfig.from_yaml(path, overrides=overrides)
    if config is not None:
        return default_job(config, nodes or default_nodes(config), overrides)
    return TrainConfig.from_dict({}, source="--set/--faults", overrides=overrides)


def default_job_name(config: DeploymentConfig) -> str:
    """The config's default_job. A config that names none gets the smoke job only on GPUs no job
    preset is sized for: on a p5 it would train the tiny model while looking like the real job
    (exit 0, the model named once in the summary), so it is refused naming the choices."""
    if config.default_job is not None:
        return config.default_job
    facts = config.gpu_nodes.facts
    sized = [name for name, job in JOB_PRESETS.items() if facts.gpu_model in job.gpu_models]
    if sized:
        choices = "; ".join(f"default_job: {name} ({JOB_PRESETS[name].description})" for name in sized)
        raise ConfigError(
            f"default_job: the config names none, and without one the job on {facts.instance_type} "
            f"({facts.gpu_model}) would be the {FALLBACK_JOB} job, the tiny model; set {choices}; or "
            f"default_job: {FALLBACK_JOB} to prove the plumbing first; or give --train-config"
        )
    return FALLBACK_JOB


def default_job(config: DeploymentConfig, nodes: int, overrides: list[str]) -> TrainConfig:
    """The profile's default job (nvrx_eks.facts.job_presets.JOB_PRESETS[default_job_name(config)]) on
    `nodes`, with `--set` overrides on top. Unless an override sets it, checkpoint.interval_steps of a
    preset sized for the cluster is the checkpoint-interval plan's optimum for this job
    (nvrx_eks.planning.model.optimal_interval_steps, the figure `nvrx-eks plan` prints)."""
    name = default_job_name(config)
    preset = JOB_PRESETS[name]
    source = f"the {name} default job with --set/--faults"
    train = TrainConfig.from_dict(preset.train, source=source, overrides=overrides)
    given = {item.partition("=")[0].strip() for item in overrides}
    if preset.plan_interval and "checkpoint.interval_steps" not in given:
        try:
            interval = optimal_interval_steps(config, train, nodes)
        except ConfigError:
            return train  # the node count does not fit the job: build_jobspec says why, naming --nodes
        derived = [f"checkpoint.interval_steps={interval}"]
        train = TrainConfig.from_dict(preset.train, source=source, overrides=[*overrides, *derived])
    return train


def build_jobspec(
    config: DeploymentConfig,
    *,
    nodes: int,
    name: str,
    api: Api = "jobset",
    workload: Workload = "train",
    image: str | None = None,
    train: TrainConfig | None = None,
    max_restarts: int = 3,
    max_step_time_s: float | None = None,
    outputs: StackOutputs | None = None,
    spare_nodes: int = 0,
    ranks_per_node: int | None = None,
    trainer: str | None = None,
) -> JobSpec:
    """A JobSpec for `config`: from live stack outputs when given, else derived offline.

    Raises ConfigError naming the flag to fix.
    """
    if outputs is not None:
        namespace, pvc_name = outputs.namespace, outputs.pvc_name
        instance_type, k8s_version = outputs.instance_type, outputs.kubernetes_version
        default_image = outputs.image_uri
    elif config.cluster is not None:  # a cluster we did not create: the config names it all
        namespace, pvc_name = config.cluster.namespace, config.cluster.pvc
        instance_type, k8s_version = config.gpu_nodes.instance_type, config.kubernetes_version
        default_image = config.cluster.image
    else:
        namespace, pvc_name = TRAINING_NAMESPACE, FSX_PVC_NAME
        instance_type, k8s_version = config.gpu_nodes.instance_type, config.kubernetes_version
        default_image = config.image.uri or OFFLINE_PLACEHOLDER_IMAGE
    if workload == "nccl-test":
        default_image = NCCL_TESTS_IMAGE
    train = require_efa_where_expected(train or TrainConfig.model_validate({}), instance_type)
    train = metrics_to_the_deployment(train, config.name)
    if spare_nodes:
        # A copy with the one field changed: rebuilt from a full dump, every field would count as
        # set, and the defaults that follow (run directory, local tier, MFU peak) would be skipped.
        distributed = train.distributed.model_copy(update={"spare_nodes": spare_nodes})
        train = train.model_copy(update={"distributed": distributed})
    train = for_gpu_nodes(resolve_train_paths(with_local_tier(peak_tflops_from_facts(train, instance_type)), name))
    try:
        spec = JobSpec(
            name=name,
            namespace=namespace,
            api=api,
            workload=workload,
            nodes=nodes,
            instance_type=instance_type,
            image=image or default_image,
            pvc_name=pvc_name,
            kubernetes_version=k8s_version,
            node_selector=config.cluster.node_selector if config.cluster else {},
            **({"coordinator_node_selector": {}} if config.cluster else {}),
            max_restarts=max_restarts,
            max_step_time_s=max_step_time_s,
            spare_nodes=spare_nodes,
            ranks_per_node=ranks_per_node,
            trainer=trainer,
            train=train,
        )
    except ValidationError as e:
        raise _flag_error(e) from None
    if workload == "train":
        facts = spec.facts
        problem = check_fits(
            spec.train,
            spec.world_size,
            facts.gpu_cuda_memory_bytes / GIB,
            f"{facts.gpu_model} ({spec.instance_type})",
            ranks_per_node=spec.nproc_per_node,
        )
        if problem:
            raise ConfigError(f"--train-config/--set: {problem}")
    return spec


def check_faults(spec: JobSpec) -> None:
    """--faults against the job's active world, as `nvrx-eks local` checks them against its own:
    a fault naming a rank (or, for node-loss, a node) the job does not have would never fire."""
    if spec.workload != "train":
        return
    from workloads.faults import parse_fault_spec, target_limit

    for fault in parse_fault_spec(spec.train.faults):
        unit, limit = target_limit(fault, nodes=spec.nodes, world_size=spec.world_size)
        if fault.rank >= limit:
            raise ConfigError(
                f"--faults: {fault.label} targets {unit} {fault.rank}, but --nodes {spec.nodes} gives "
                f"{limit} active {unit}{'' if limit == 1 else 's'}; use a {unit} below {limit}"
            )


def check_global_batch(spec: JobSpec) -> None:
    """The node count must divide the fixed global batch (data.global_batch_tokens) into whole
    micro-batches; otherwise name the node counts nearby that do."""
    if spec.workload != "train":
        return
    data = spec.train.data
    try:
        data.accumulation(spec.world_size)
    except ConfigError:
        per_node = spec.nproc_per_node
        nodes = [w // per_node for w in data.world_sizes_near(spec.world_size) if w % per_node == 0]
        fitting = " or ".join(str(n) for n in nodes) or "none nearby"
        raise ConfigError(
            f"--nodes {spec.nodes}: {spec.world_size} ranks do not divide data.global_batch_tokens "
            f"({data.global_batch_tokens:,} tokens) into micro-batches of {data.batch_size} x {data.seq_len} "
            f"tokens per rank; nodes that do: {fitting} (or change data.global_batch_tokens, "
            "data.batch_size or data.seq_len)"
        ) from None


def for_gpu_nodes(train: TrainConfig) -> TrainConfig:
    """Every instance type this project deploys has GPUs: the pod's trainer must use them. An
    explicit `backend: nccl` (rather than auto) makes a pod that cannot see its GPUs (device
    plugin, driver, NVIDIA_VISIBLE_DEVICES) fail at start-up instead of silently training on
    CPU with gloo; an explicitly chosen backend is kept. The precision is written out too (bf16
    on nccl unless chosen), so the ConfigMap states what the pods compute in."""
    distributed = train.distributed
    if distributed.backend != "auto" and distributed.precision != "auto":
        return train
    backend = "nccl" if distributed.backend == "auto" else distributed.backend
    data = train.model_dump(mode="json")
    data["distributed"]["backend"] = backend
    data["distributed"]["precision"] = distributed.resolved_precision(backend)
    return TrainConfig.from_dict(data, source="the trainer config for GPU nodes")


#: JobSpec field -> the CLI flag that sets it, so errors name what the user typed.
_FLAGS = {
    "name": "--name",
    "nodes": "--nodes",
    "image": "--image",
    "api": "--api",
    "max_restarts": "--max-restarts",
    "max_step_time_s": "--max-step-time-s",
    "trainer": "--trainer",
    "instance_type": "the profile's gpu_nodes.instance_type",
}


def _flag_error(err: ValidationError) -> ConfigError:
    issues = []
    for e in err.errors():
        field = str(e["loc"][0]) if e["loc"] else ""
        where = _FLAGS.get(field, field or "job")
        issues.append(((where,), e["msg"].removeprefix("Value error, ")))
    if not issues:
        return describe_validation_error(err, "job spec")
    return ConfigError("invalid job options:", issues=issues)
