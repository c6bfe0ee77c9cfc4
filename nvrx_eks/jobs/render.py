"""Render a JobSpec into Kubernetes manifests with the Jinja templates in templates/.

Templates hold the shape of each manifest; this module computes what goes in it from the facts
(instance table, conventions, TrainConfig, launch command) so no template restates a number. The
environment uses StrictUndefined: a variable missing from the context is an error at render
time, never an empty string in a manifest.

Output is YAML text (what `render` prints and the golden files hold) plus the parsed documents
(what validation and submission use, and `render -o json` prints).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from pathlib import Path

import jinja2
import yaml

from infra import pod_security
from nvrx_eks.facts import job_kinds, job_names
from nvrx_eks.facts import names as conventions
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from nvrx_eks.facts.instances import InstanceFacts
from nvrx_eks.jobs.claim_mounts import claim_mounts
from nvrx_eks.jobs.spec import (
    TRAIN_CONFIG_DIR,
    TRAIN_CONFIG_KEY,
    TRAIN_CONFIG_PATH,
    JobSpec,
    own_run_dir,
)
from nvrx_eks.resources import templates_dir
from workloads import do_not_requeue
from workloads.launch import build_coordinator_argv, build_ft_launcher_argv, build_preflight_argv
from workloads.numa import GPUS_PER_NUMA_ENV
from workloads.process_env import TRAINER_PROCESS_ENV
from workloads.transport import NET_PLUGIN

#: How long a pod waits for the rendezvous host's DNS record before failing (and being retried).
RENDEZVOUS_DNS_WAIT_S = 300
#: nccl-tests: port of the per-pod sshd mpirun launches ranks through, how long pods wait for
#: each other, and the whole test's deadline.
NCCL_SSH_PORT = 2222
NCCL_WAIT_S = 600
NCCL_DEADLINE_S = 1800
#: Open MPI as the EFA installer puts it in the nccl-tests image.
MPIRUN = "/opt/amazon/openmpi/bin/mpirun"

#: p5-class tuning from AWS's published nccl-tests manifests for p5 (8 MiB NCCL buffers, 512 KiB
#: chunks for point-to-point over the network), which fit 3200 Gbps EFA across 16-32 NICs: applied
#: to every instance type whose facts give it that network.
_P5_CLASS_NETWORK_GBPS = 3200


def fabric_env(facts: InstanceFacts, *, debug: str = "WARN") -> dict[str, str]:
    """NCCL/libfabric environment for the instance family."""
    env = {
        # libfabric may use only its EFA provider. This does not stop NCCL from falling back to
        # TCP sockets when the plugin fails: the trainer (workloads/transport.py) and the
        # fabric test check NCCL's log for that.
        "FI_PROVIDER": "efa",
        # The same plugin name as the image, so NCCL opens the library the image build checked.
        "NCCL_NET_PLUGIN": NET_PLUGIN,
        "FI_EFA_USE_DEVICE_RDMA": "1" if facts.efa_rdma else "0",
        # DataLoader workers fork after EFA memory registration; rdma-core must stay fork-safe.
        "FI_EFA_FORK_SAFE": "1",
        # libfabric 2.x ignores FI_EFA_FORK_SAFE on AL2023's kernels and tries 2 MiB huge pages
        # for its buffers. The GPU nodes reserve none and pods request none, so say so instead
        # of relying on the fallback to normal pages.
        "FI_EFA_USE_HUGE_PAGE": "0",
        # NCCL's bootstrap and socket fallback use the pod's primary interface, not loopback or
        # the CNI's host-side links.
        "NCCL_SOCKET_IFNAME": "^lo,docker,veth",
        "NCCL_DEBUG": debug,
    }
    if facts.network_gbps >= _P5_CLASS_NETWORK_GBPS:
        env["NCCL_BUFFSIZE"] = "8388608"
        env["NCCL_P2P_NET_CHUNKSIZE"] = "524288"
    return env


def trainer_env(spec: JobSpec) -> dict[str, str]:
    """The trainer container's environment: fabric, the NCCL/torch settings NVRx's in-process
    restart needs and the CUDA allocator's (workloads.process_env; also in the image, but a job
    run with another image must keep them), NUMA
    binding, unbuffered output (a rank killed by a fault must not take its last lines with it)."""
    env = {**fabric_env(spec.facts), **TRAINER_PROCESS_ENV, "PYTHONUNBUFFERED": "1"}
    if spec.facts.numa_nodes > 1:
        # Each rank binds itself to the CPUs next to its GPU (workloads/numa.py), so host memory
        # for checkpoint staging and data comes from that socket. Not NVRx's NVRX_GPUS_PER_NUMA:
        # its numactl cannot run under the pod's seccomp profile.
        env[GPUS_PER_NUMA_ENV] = str(spec.facts.gpus // spec.facts.numa_nodes)
    return env


#: The coordinator's share of a system node: it serves two key-value stores to the job's
#: launchers and ranks (a few hundred connections at 128 nodes), and imports torch.
COORDINATOR_CPU = "1"
COORDINATOR_MEMORY = "2Gi"
#: A user with no privilege (nobody): the coordinator writes nothing but its log to stdout.
COORDINATOR_USER = 65534


def coordinator_context(spec: JobSpec) -> dict:
    """What the coordinator container (templates/_coordinator.yaml.j2) is made of."""
    return {
        "container": job_names.COORDINATOR_CONTAINER,
        "replicated_job": job_names.COORDINATOR_REPLICATED_JOB,
        "argv": build_coordinator_argv(
            spec.train, nnodes=spec.launched_nodes, rdzv_endpoint=spec.rendezvous_endpoint, rdzv_id=spec.name
        ),
        "ports": [
            (job_names.RENDEZVOUS_PORT_NAME, job_names.RENDEZVOUS_PORT),
            (job_names.INPROCESS_STORE_PORT_NAME, spec.inprocess_store_port),
        ],
        "cpu": COORDINATOR_CPU,
        "memory": COORDINATOR_MEMORY,
        "run_as_user": COORDINATOR_USER,
    }


def trainer_entrypoint_args(spec: JobSpec) -> tuple[list[str], list[str]]:
    """(preflight argv, ft_launcher argv) exactly as workloads/launch.py builds them, but for a
    trainer of the user's own (spec.trainer) in place of ours."""
    preflight = build_preflight_argv(config_path=TRAIN_CONFIG_PATH, world_size=spec.world_size)
    launcher = build_ft_launcher_argv(
        spec.train,
        config_path=TRAIN_CONFIG_PATH,
        nnodes=spec.launched_nodes,
        nproc_per_node=spec.nproc_per_node,
        rdzv_endpoint=spec.rendezvous_endpoint,
        rdzv_id=spec.name,
    )
    return _with_trainer(preflight, spec.trainer), _with_trainer(launcher, spec.trainer)


def _with_trainer(argv: list[str], trainer: str | None) -> list[str]:
    """`argv` (python's or ft_launcher's, whose last `-m MODULE` runs our trainer) running
    `trainer` instead: `-m` another module, or a script's path in place of `-m MODULE`."""
    if trainer is None:
        return argv
    at = len(argv) - 1 - argv[::-1].index("-m")
    entry = [trainer] if trainer.endswith(".py") else ["-m", trainer]
    return [*argv[:at], *entry, *argv[at + 2 :]]


#: Where a trainer pod learns which attempt of its job it belongs to (workloads.do_not_requeue):
#: (env var, pod label read through the downward API) pairs, then the attempt id built from them
#: with Kubernetes' $(VAR) expansion. A JobSet restart recreates every pod with the next
#: restart-attempt label. The training operator recreates single pods of a PyTorchJob, never the
#: whole job, and puts no job uid on its pods: the job name names the attempt, and the entrypoint
#: ignores records older than itself (an earlier submission under the same name).
ATTEMPT_ID_SOURCES: dict[str, tuple[list[tuple[str, str]], str]] = {
    "jobset": (
        [
            ("JOBSET_UID", job_kinds.JOBSET_UID_LABEL),
            (job_kinds.JOBSET_RESTART_ATTEMPT_ENV, job_kinds.JOBSET_RESTART_ATTEMPT_LABEL),
        ],
        f"$(JOBSET_UID)-$({job_kinds.JOBSET_RESTART_ATTEMPT_ENV})",
    ),
    "pytorchjob": ([("PYTORCHJOB_NAME", job_kinds.PYTORCHJOB.pod_label)], "$(PYTORCHJOB_NAME)"),
}


def _labels(spec: JobSpec) -> dict[str, str]:
    return {
        job_names.APP_NAME_LABEL: job_names.TRAINER_APP if spec.workload == "train" else job_names.FABRIC_TEST_APP,
        job_names.APP_INSTANCE_LABEL: spec.name,
        job_names.MANAGED_BY_LABEL: job_names.MANAGED_BY,
    }


def _quote(value) -> str:
    """A YAML scalar for any string: JSON string syntax is valid YAML and never misread
    (`"1.0"`, `"yes"`, `"0123"` stay strings)."""
    return json.dumps(value)


def _literal_block(text: str, indent: int) -> str:
    """A YAML literal block scalar (`|`), its lines indented by `indent` spaces."""
    lines = text.rstrip("\n").split("\n")
    if lines and lines[0][:1] in (" ", "\t"):
        raise ValueError("a literal block must not start with whitespace")
    if any(line != line.rstrip() for line in lines):
        raise ValueError("literal block lines must not end in whitespace (YAML would keep it)")
    pad = " " * indent
    return "|\n" + "\n".join(pad + line if line else "" for line in lines)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = _quote
    env.filters["block"] = _literal_block
    return env


_ENV = _environment()


def _common_context(spec: JobSpec) -> dict:
    return {
        "job": spec,
        "labels": _labels(spec),
        "job_kind": job_kinds.JOB_KINDS[spec.api],
        "annotations": {
            "world_size": job_names.WORLD_SIZE_ANNOTATION,
            "spare_nodes": job_names.SPARE_NODES_ANNOTATION,
        },
        "replicated_job": job_names.JOBSET_REPLICATED_JOB,
        "disrupted_pattern": job_kinds.DISRUPTED_MESSAGE_PATTERN,
        "exit_do_not_requeue": EXIT_DO_NOT_REQUEUE,
        "claim_mounts": claim_mounts(spec, nccl_exchange_dir(spec)),
        "node": {
            "label_key": conventions.GPU_NODE_LABEL_KEY,
            "label_value": conventions.GPU_NODE_LABEL_VALUE,
            "instance_type_label_key": conventions.INSTANCE_TYPE_LABEL_KEY,
            "taint_key": conventions.GPU_TAINT_KEY,
            "taint_value": conventions.GPU_TAINT_VALUE,
            "taint_effect": conventions.GPU_TAINT_EFFECT,
        },
        "resources": {"gpu": conventions.GPU_RESOURCE, "efa": conventions.EFA_RESOURCE},
        "security": {"seccomp_profile": pod_security.SECCOMP_PROFILE},
    }


def _network_policy(spec: JobSpec, context: dict) -> str:
    if spec.workload == "nccl-test":
        served = f"mpirun's sshd on {NCCL_SSH_PORT}"
    else:
        served = (
            f"the rendezvous store on {job_names.RENDEZVOUS_PORT}, the in-process restart store on "
            f"{spec.inprocess_store_port}"
        )
    return _ENV.get_template("networkpolicy.yaml.j2").render(
        **context, ports_served=served, pod_selector_keys=job_names.JOB_POD_SELECTOR_KEYS
    )


@dataclass(frozen=True)
class RenderedJob:
    spec: JobSpec
    #: One YAML text per document, as rendered (comments kept).
    texts: list[str]
    documents: list[dict]

    @property
    def text(self) -> str:
        return "---\n".join(self.texts)

    @property
    def job_document(self) -> dict:
        return next(d for d in self.documents if d["kind"] in job_kinds.JOB_KIND_BY_NAME)

    def formatted(self, output: str) -> str:
        """All objects in `render -o`'s format: the YAML documents as rendered, or one JSON
        document, a kubectl `List` (JSON has no multi-document stream); `kubectl apply -f -`
        takes either."""
        if output == "yaml":
            return self.text
        return _json_text({"apiVersion": "v1", "kind": LIST_KIND, "items": self.documents})


#: kubectl's one document holding several objects (its `items`), as `render -o json` prints them.
LIST_KIND = "List"


def list_items(documents: list) -> list:
    """The objects of loaded documents, each `List` replaced by its items, as kubectl reads them;
    anything else (a malformed List too) stays as it is, for validation to report."""
    objects = []
    for document in documents:
        is_list = isinstance(document, dict) and document.get("kind") == LIST_KIND
        items = document.get("items") if is_list else None
        objects.extend(items if isinstance(items, list) else [document])
    return objects


def render_job(spec: JobSpec) -> RenderedJob:
    """All manifests of the job: the trainer ConfigMap then the JobSet/PyTorchJob, or the
    fabric test JobSet alone; then the job's NetworkPolicy (submit creates it first)."""
    context = _common_context(spec)
    render = _render_fabric_test if spec.workload == "nccl-test" else _render_training
    texts = [*render(spec, context), _network_policy(spec, context)]
    documents = [yaml.safe_load(t) for t in texts]
    return RenderedJob(spec, texts, documents)


def _render_fabric_test(spec: JobSpec, context: dict) -> list[str]:
    # INFO for INIT and NET prints which network and libfabric provider NCCL chose on each node.
    env = {**fabric_env(spec.facts, debug="INFO"), "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    max_bytes = nccl_max_bytes(spec.facts)
    script = _ENV.get_template("scripts/nccl-tests.sh.j2").render(
        **context,
        env=env,
        exchange_root=nccl_exchange_dir(spec),
        wait_s=NCCL_WAIT_S,
        ssh_port=NCCL_SSH_PORT,
        # Pod names by the loop's $node index.
        pod_host=job_names.jobset_pod_host(spec.name, "$node"),
        pod_dns_name=job_names.jobset_pod_dns_name(spec.name, "$node"),
        mpirun=MPIRUN,
        max_bytes=max_bytes,
        # The verdict finds the largest message's row by its size in bytes ("G" is GiB to nccl-tests).
        max_message_bytes=int(max_bytes.removesuffix("G")) * 2**30,
        min_busbw_gb_s=spec.facts.fabric_test_min_busbw_gb_s,
    )
    fabric_context = {
        **context,
        "env": env,
        "entrypoint": script,
        # The entrypoint names its key exchange directory after the JobSet and its attempt.
        "label_env": [
            ("JOBSET_UID", job_kinds.JOBSET_UID_LABEL),
            ("RESTART_ATTEMPT", job_kinds.JOBSET_RESTART_ATTEMPT_LABEL),
        ],
        "ports": [("ssh", NCCL_SSH_PORT)],
        "capabilities": pod_security.FABRIC_TEST_CAPABILITIES,
        "local_checkpoints": None,
        "deadline_s": NCCL_DEADLINE_S,
        "min_busbw_gb_s": spec.facts.fabric_test_min_busbw_gb_s,
    }
    return [_ENV.get_template("nccl-tests.yaml.j2").render(**fabric_context)]


def _render_training(spec: JobSpec, context: dict) -> list[str]:
    preflight, launcher = trainer_entrypoint_args(spec)
    entrypoint = _ENV.get_template("scripts/trainer-entrypoint.sh.j2").render(
        map_exit_codes=spec.api == "pytorchjob",
        exit_do_not_requeue=EXIT_DO_NOT_REQUEUE,
        dns_wait_s=RENDEZVOUS_DNS_WAIT_S,
        rendezvous_host=shlex.quote(spec.rendezvous_host),
        preflight=shlex.join(preflight),
        launcher=shlex.join(launcher),
        attempt_env=do_not_requeue.ATTEMPT_ID_ENV,
        record_check=shlex.join(do_not_requeue.check_argv(spec.train.run_dir)),
    )
    attempt_fields, attempt_value = ATTEMPT_ID_SOURCES[spec.api]
    rendezvous_port_name = (
        job_names.PYTORCHJOB_PORT_NAME if spec.api == "pytorchjob" else job_names.RENDEZVOUS_PORT_NAME
    )
    train_context = {
        **context,
        "env": trainer_env(spec),
        "entrypoint": entrypoint,
        "ports": [
            (rendezvous_port_name, job_names.RENDEZVOUS_PORT),
            (job_names.INPROCESS_STORE_PORT_NAME, spec.inprocess_store_port),
        ],
        "capabilities": pod_security.TRAINER_CAPABILITIES,
        "config_dir": TRAIN_CONFIG_DIR,
        "local_checkpoints": local_checkpoint_volume(spec),
        "label_env": attempt_fields,
        # PyTorchJob: the master is node 0, the Worker replicas are the other nodes.
        "worker_replicas": spec.nodes - 1,
        "coordinator": coordinator_context(spec),
        "attempt_env": {
            do_not_requeue.ATTEMPT_ID_ENV: attempt_value,
            do_not_requeue.FALLBACK_DIR_ENV: do_not_requeue.POD_FALLBACK_DIR,
        },
    }
    config_map = _ENV.get_template("trainer-configmap.yaml.j2").render(
        **context, config_key=TRAIN_CONFIG_KEY, config_path=TRAIN_CONFIG_PATH, train_yaml=spec.train.to_yaml()
    )
    job_template = "jobset.yaml.j2" if spec.api == "jobset" else "pytorchjob.yaml.j2"
    return [config_map, _ENV.get_template(job_template).render(**train_context)]


def local_checkpoint_volume(spec: JobSpec) -> dict | None:
    """The node-local checkpoint tier's volume when the trainer config turns the tier on: a
    hostPath of the reviewed root (infra.pod_security) with the job's own subdirectory mounted at
    checkpoint.local.dir. hostPath rather than a local PersistentVolume: a local PV pins each pod
    to one node through its claim, and a JobSet has no per-pod claims (no volumeClaimTemplates);
    the tier is a cache that may vanish with its node, which is what the replicas and FSx cover."""
    local = spec.train.checkpoint.local
    if not local.enabled:
        return None
    return {"host_path": pod_security.LOCAL_CHECKPOINT_HOST_PATH, "mount_path": local.dir, "sub_path": spec.name}


def nccl_exchange_dir(spec: JobSpec) -> str:
    """Where the fabric test's pods exchange the launcher's public key: in the job's own directory,
    the one part of the shared claim its pods may write."""
    return f"{own_run_dir(spec.name)}/key-exchange"


def nccl_max_bytes(facts: InstanceFacts) -> str:
    """Largest all_reduce message: a power of two at most a quarter of GPU memory (send and
    receive buffers plus NCCL's own), e.g. 16G on 80 GB H100s, 4G on 24 GB A10Gs."""
    gib = 2 ** int(math.floor(math.log2(facts.gpu_memory_gib / 4)))
    return f"{gib}G"


def _json_text(document: dict) -> str:
    return json.dumps(document, indent=2) + "\n"


def write_documents(rendered: RenderedJob, directory: Path, output: str) -> list[Path]:
    """One file per document, named <kind>-<name>.yaml (or .json for `output` json), for
    `render --out DIR`."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for text, document in zip(rendered.texts, rendered.documents, strict=True):
        path = directory / f"{document['kind'].lower()}-{document['metadata']['name']}.{output}"
        path.write_text(text if output == "yaml" else _json_text(document))
        paths.append(path)
    return paths
