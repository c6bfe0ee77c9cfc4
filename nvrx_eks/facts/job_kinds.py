"""The two custom resources a training job is submitted as (JobSet, PyTorchJob): one record each,
read by the templates (through render), the client, the validator and the tests.

Besides the API coordinates, each record names the labels its controller puts on the job's pods,
which the client selects and orders pods by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Api = Literal["jobset", "pytorchjob"]

#: Label the Job controller puts on every pod of an Indexed Job (JobSet pods): the pod's index.
JOB_COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


@dataclass(frozen=True)
class JobKind:
    """A custom resource that runs a training job, and what its controller tells its pods."""

    #: The `--api` value that selects this kind.
    api: Api
    group: str
    version: str
    plural: str
    kind: str
    #: Label the controller puts on the job's pods, valued with the job name.
    pod_label: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def pod_selector(self, name: str) -> str:
        return f"{self.pod_label}={name}"


JOBSET = JobKind("jobset", "jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", "jobset.sigs.k8s.io/jobset-name")
PYTORCHJOB = JobKind("pytorchjob", "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", "training.kubeflow.org/job-name")

#: By `--api` value, in the order the client looks for a job by name.
JOB_KINDS: dict[str, JobKind] = {k.api: k for k in (JOBSET, PYTORCHJOB)}
#: By manifest `kind`.
JOB_KIND_BY_NAME: dict[str, JobKind] = {k.kind: k for k in JOB_KINDS.values()}
#: (apiVersion, kind) of every job document, as a manifest states them.
CUSTOM_KINDS: frozenset[tuple[str, str]] = frozenset((k.api_version, k.kind) for k in JOB_KINDS.values())

#: Labels the JobSet controller puts on its pods: the JobSet's uid and which recreation of it the
#: pod belongs to (0 for the first run).
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
JOBSET_RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
#: The environment variable a JobSet pod reads that attempt from (rendered from the label; the
#: local launcher and the rehearsal set it for each relaunch).
JOBSET_RESTART_ATTEMPT_ENV = "JOBSET_RESTART_ATTEMPT"
#: The Job controller's failure messages for a podFailurePolicy FailJob rule (Kubernetes
#: pkg/controller/job/pod_failure_policy.go), which a JobSet failure-policy rule can match by
#: pattern (onJobFailureMessagePatterns, RE2 syntax).
FAIL_JOB_EXIT_CODE_MESSAGE = (
    "Container {container} for pod {namespace}/{pod} failed with exit code {code} "
    "matching FailJob rule at index {index}"
)
FAIL_JOB_POD_CONDITION_MESSAGE = (
    "Pod {namespace}/{pod} has condition {condition} matching FailJob rule at index {index}"
)
#: Matches the message of a pod failed by a DisruptionTarget rule, and no exit-code message.
DISRUPTED_MESSAGE_PATTERN = "has condition DisruptionTarget matching FailJob rule"
#: Labels the training operator puts on PyTorchJob pods: Master or Worker, and the index within it.
PYTORCHJOB_REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
PYTORCHJOB_REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
