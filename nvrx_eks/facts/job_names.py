"""The naming contract of a rendered job: what its objects, pods, containers and labels are called,
and the coordinator's DNS name that every node rendezvouses at. Render, the client, the validator and the
tests read these; nothing else spells them.
"""

from __future__ import annotations

from nvrx_eks.facts.job_kinds import Api
from nvrx_eks.facts.names import RUNS_DIR

#: Label keys on every object a job consists of, and on its pods.
APP_NAME_LABEL = "app.kubernetes.io/name"
APP_INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
#: Value of MANAGED_BY_LABEL on everything this CLI created; teardown deletes jobs by it.
MANAGED_BY = "nvrx-eks"
MANAGED_BY_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
#: Values of APP_NAME_LABEL: the training job, and the NCCL/EFA fabric test.
TRAINER_APP = "nvrx-eks-trainer"
FABRIC_TEST_APP = "nvrx-eks-nccl-test"
#: Pod labels that tell one job's pods from every other pod: the NetworkPolicy selects by them.
JOB_POD_SELECTOR_KEYS = (APP_NAME_LABEL, APP_INSTANCE_LABEL)
#: Annotation on the job stating its active world size (nodes x GPUs, spares excluded).
WORLD_SIZE_ANNOTATION = "nvrx-eks.io/world-size"
#: Annotation on a job with hot spare nodes: how many of its launched nodes are spares.
SPARE_NODES_ANNOTATION = "nvrx-eks.io/spare-nodes"

#: The replicated job (JobSet) that runs the trainer or the fabric test.
JOBSET_REPLICATED_JOB = "worker"
#: The replicated job (JobSet) of the job's coordinator (workloads.coordinator): one CPU pod on
#: the system nodes that serves the stores every rank depends on. In a PyTorchJob the
#: coordinator is a sidecar container of the master pod, under this name too.
COORDINATOR_REPLICATED_JOB = "coordinator"
COORDINATOR_CONTAINER = "coordinator"
#: The trainer's container in a JobSet; the training operator requires `pytorch` in a PyTorchJob.
TRAINER_CONTAINER = "trainer"
PYTORCHJOB_CONTAINER = "pytorch"
FABRIC_TEST_CONTAINER = "nccl-tests"

#: c10d rendezvous port on pod 0 (ft_launcher's store), and the name of the container port that
#: serves it; the training operator requires this name in a PyTorchJob and takes MASTER_PORT from it.
RENDEZVOUS_PORT = 29500
RENDEZVOUS_PORT_NAME = "rendezvous"
PYTORCHJOB_PORT_NAME = "pytorchjob-port"
#: Container port of the trainer's in-process restart store.
INPROCESS_STORE_PORT_NAME = "inprocess-store"


def trainer_container(api: Api) -> str:
    return PYTORCHJOB_CONTAINER if api == "pytorchjob" else TRAINER_CONTAINER


def run_dir_on_claim(job: str) -> str:
    """The job's own directory relative to the FSx claim's root: its run directory by default,
    and the only place on the claim its pods may write. The name is a DNS label (no `/`, never
    `.` or `..`), so no other job's directory lies inside it or holds it."""
    return f"{RUNS_DIR}/{job}"


def config_map_name(job: str) -> str:
    """The ConfigMap holding the job's trainer config."""
    return f"{job}-config"


def network_policy_name(job: str) -> str:
    """The NetworkPolicy admitting only the job's own pods."""
    return job


def jobset_pod_host(job: str, index: int | str) -> str:
    """The host name of a JobSet pod, by its completion index (a number, or a shell variable in a
    script that loops over them): <jobset>-<replicated job>-<job index 0>-<pod index>."""
    return f"{job}-{JOBSET_REPLICATED_JOB}-0-{index}"


def jobset_pod_dns_name(job: str, index: int | str) -> str:
    """The stable DNS name of a JobSet pod: its host name under the JobSet's headless service."""
    return f"{jobset_pod_host(job, index)}.{job}"


def rendezvous_host(api: Api, job: str) -> str:
    """The coordinator's stable DNS name: its pod's under the JobSet headless service (subdomain
    = JobSet name), or the per-replica service the training operator creates for the PyTorchJob
    master, whose pod carries the coordinator as a sidecar."""
    if api == "jobset":
        return f"{job}-{COORDINATOR_REPLICATED_JOB}-0-0.{job}"
    return f"{job}-master-0"


def rendezvous_endpoint(api: Api, job: str) -> str:
    return f"{rendezvous_host(api, job)}:{RENDEZVOUS_PORT}"
